//! Reading workloads: trace formats parsed in bulk into columns (the simulator itself takes
//! requests as `sim::ArrivingRequest`s from a `sim::RequestSource`).
//!
//! - [`mooncake`]: Mooncake's JSON-lines trace, the rows Python's reader takes on its fast
//!   path; every other line is left to Python.

pub mod mooncake;

pub use mooncake::{MooncakeColumns, read_mooncake_lines};

//! tokenyard-core: the scheduling core of LLM serving, in plain Rust.
//!
//! - [`kv`]: KV-cache memory — Vidur's counting allocator, vLLM V1's prefix-caching block
//!   pool and SGLang's radix cache.
//! - [`sched`]: the step scheduler; [`sim`]: the cluster simulator; [`workload`]: trace
//!   formats read into columns.
//!
//! Nothing here knows about Python; `rust/py` wraps it. Every fallible operation returns
//! [`Result`]; a panic is a bug in this crate.
#![forbid(unsafe_code)]

pub mod error;
pub mod kv;
pub mod sched;
pub mod sim;
pub mod workload;

pub use error::{Error, Result};

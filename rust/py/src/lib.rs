//! `tokenyard._core`: the native module. It converts Python values, maps errors and wraps
//! `tokenyard-core` types; no scheduling logic lives here.

mod convert;
mod errors;
mod exec;
mod kv;
mod plugin;
mod py_callee;
mod sched;
mod sched_aux;
mod sched_config;
mod sched_connector;
mod sched_ec;
mod sched_encoder;
mod sched_hooks;
mod sched_output;
mod sched_session;
mod sim;
mod workload;

use pyo3::prelude::*;

#[pymodule]
fn _core(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add("__version__", env!("CARGO_PKG_VERSION"))?;
    module.add(
        "build_profile",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
    )?;
    kv::register(module)?;
    sched::register(module)?;
    sim::register(module)?;
    exec::register(module)?;
    workload::register(module)?;
    Ok(())
}

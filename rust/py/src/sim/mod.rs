//! `tokenyard._core.simulate`: runs the core simulator on a typed config (`config.rs`) and
//! a stream of request chunks, calling back into Python only through `callbacks.rs`.
//! Conversions only: the policy registry, the plugin adapter and every check live in the
//! core. The GIL is released while the event loop runs; callbacks take it back.

mod callbacks;
mod config;

use numpy::IntoPyArray;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tokenyard_core::sched::PolicyPlugin;
use tokenyard_core::sim::exec::Repeated;
use tokenyard_core::sim::spec::{DraftPricing, SpecExec};
use tokenyard_core::sim::{
    ExecModel, GapHistogram, GlobalPolicy, MAX_CLUSTER_BLOCKS, OpModel, PluginReplica,
    REPLICA_POLICIES, ReplicaPolicy, SimOutput, Simulator,
};

use crate::errors::{ErrorSlot, OrRaise};
use crate::exec::PyCompiledOps;
use crate::plugin::PyPlugin;
use callbacks::{PyExec, PyReplicaHost, PyRoutePlugin, PySimRequestView, PySource};
use config::{PyLinearModel, PyReplicaSpec, PySimConfig, PySpeculativeConfig};

pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<PySimRequestView>()?;
    module.add_class::<PyReplicaSpec>()?;
    module.add_class::<PyLinearModel>()?;
    module.add_class::<PySimConfig>()?;
    module.add_class::<PySpeculativeConfig>()?;
    let registry = PyDict::new(module.py());
    for entry in REPLICA_POLICIES {
        let info = PyDict::new(module.py());
        info.set_item("section", entry.section)?;
        info.set_item("pipeline_parallel", entry.pipeline_parallel)?;
        info.set_item("summary", entry.summary)?;
        registry.set_item(entry.name, info)?;
    }
    module.add("REPLICA_POLICIES", registry)?;
    module.add("GLOBAL_POLICIES", GlobalPolicy::NAMES.to_vec())?;
    module.add("MAX_CLUSTER_BLOCKS", MAX_CLUSTER_BLOCKS)?;
    module.add_function(wrap_pyfunction!(simulate, module)?)
}

/// Runs a simulation; see `tokenyard.simulate` for the config and the result.
#[pyfunction]
#[pyo3(signature = (config, chunks, *, exec_model=None, progress=None, route_plugin=None,
    replica_plugins=None, policy_plugins=None, exec_repeat=1, draft_exec_model=None,
    draft_layer_fraction=None, decode_exec_model=None))]
#[allow(clippy::too_many_arguments)]
fn simulate<'py>(
    py: Python<'py>,
    config: &PySimConfig,
    chunks: &Bound<'py, PyAny>,
    exec_model: Option<&Bound<'py, PyAny>>,
    progress: Option<Py<PyAny>>,
    route_plugin: Option<Py<PyAny>>,
    replica_plugins: Option<Vec<Py<PyAny>>>,
    policy_plugins: Option<Vec<Bound<'py, PyAny>>>,
    exec_repeat: u32,
    draft_exec_model: Option<&Bound<'py, PyCompiledOps>>,
    draft_layer_fraction: Option<f64>,
    decode_exec_model: Option<&Bound<'py, PyCompiledOps>>,
) -> PyResult<Bound<'py, PyDict>> {
    let sim_config = config.inner.clone();
    let error = ErrorSlot::default();
    let mut source = PySource {
        chunks: chunks.try_iter()?.into_any().unbind(),
        progress,
        error: error.clone(),
    };
    let mut exec: Box<dyn ExecModel> = match exec_model {
        None => Box::new(sim_config.exec),
        Some(model) => match model.cast::<PyCompiledOps>() {
            Ok(ops) => {
                let ops: OpModel = ops.get().model();
                ops.validate(sim_config.num_stages).or_raise(py)?;
                Box::new(ops)
            }
            Err(_) => Box::new(PyExec {
                model: model.clone().unbind(),
                error: error.clone(),
            }),
        },
    };
    let replicas: Option<Vec<Box<dyn ReplicaPolicy>>> = replica_plugins.map(|objects| {
        objects
            .into_iter()
            .map(|object| {
                let host = PyReplicaHost {
                    object,
                    error: error.clone(),
                };
                Box::new(PluginReplica::new(host)) as Box<dyn ReplicaPolicy>
            })
            .collect()
    });
    type StepPlugin = Box<dyn PolicyPlugin<u32>>;
    let step_plugins: Option<Vec<StepPlugin>> = policy_plugins
        .map(|objects| {
            objects
                .into_iter()
                .map(|object| {
                    PyPlugin::check(&object, "replica.scheduler.policy_plugin")?;
                    Ok(Box::new(PyPlugin {
                        object: object.unbind(),
                        error: error.clone(),
                    }) as StepPlugin)
                })
                .collect::<PyResult<_>>()
        })
        .transpose()?;
    let route = route_plugin.map(|object| PyRoutePlugin {
        object,
        error: error.clone(),
    });
    // Speculative decoding: the draft work is priced on top of the target's.
    let draft_ops: Option<OpModel> = match draft_exec_model {
        Some(ops) => {
            let ops: OpModel = ops.get().model();
            ops.validate(1).or_raise(py)?;
            Some(ops)
        }
        None => None,
    };
    let pricing = match &sim_config.speculative {
        Some(spec) => Some(
            DraftPricing::for_method(
                spec.method,
                draft_ops.map(|ops| Box::new(ops) as Box<dyn ExecModel>),
                draft_layer_fraction,
            )
            .or_raise(py)?,
        ),
        None => None,
    };
    // Disaggregated serving: the decode pool's own device and layout.
    let mut decode_ops: Option<OpModel> = match (decode_exec_model, &sim_config.pd) {
        (Some(ops), Some(pd)) => {
            let ops: OpModel = ops.get().model();
            ops.validate(pd.decode_num_stages).or_raise(py)?;
            Some(ops)
        }
        _ => None,
    };
    let num_speculative_tokens = sim_config
        .speculative
        .as_ref()
        .map_or(0, |s| s.num_speculative_tokens);
    let result = py.detach(|| {
        // `exec_repeat` (benches/predictor_cost.py): the model's cost, isolated by asking it
        // several times per batch stage for the same answers.
        let mut repeated = Repeated {
            inner: exec.as_mut(),
            times: exec_repeat.max(1),
        };
        let mut spec_exec;
        let exec: &mut dyn ExecModel = match pricing {
            Some(draft) => {
                spec_exec = SpecExec {
                    target: &mut repeated,
                    draft,
                    num_speculative_tokens,
                };
                &mut spec_exec
            }
            None => &mut repeated,
        };
        let sim = match replicas {
            Some(policies) => Simulator::with_replica_policies(sim_config, exec, policies),
            None => Simulator::new(sim_config, exec),
        }?;
        let sim = match route {
            Some(plugin) => sim.with_route_plugin(Box::new(plugin)),
            None => sim,
        };
        let sim = match &mut decode_ops {
            Some(ops) => sim.with_decode_exec(ops),
            None => sim,
        };
        let sim = match step_plugins {
            Some(plugins) => sim.with_policy_plugins(plugins)?,
            None => sim,
        };
        sim.run(&mut source)
    });
    if let Some(err) = error.take() {
        return Err(err);
    }
    to_dict(py, result.or_raise(py)?)
}

/// A dict of `$table`'s columns as numpy arrays, keyed by their field names.
macro_rules! columns {
    ($py:expr, $table:expr, [$($field:ident),* $(,)?]) => {{
        let dict = PyDict::new($py);
        $(dict.set_item(stringify!($field), $table.$field.into_pyarray($py))?;)*
        dict
    }};
}

fn to_dict(py: Python<'_>, out: SimOutput) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    let requests = columns!(
        py,
        out.requests,
        [
            request_id,
            replica,
            arrived_at,
            scheduled_at,
            first_token_at,
            completed_at,
            num_prefill_tokens,
            num_decode_tokens,
            num_restarts,
            prefix_hit_tokens,
            max_token_gap,
            execution_time,
            model_execution_time,
            session_id,
            turn,
            spec_steps,
            spec_draft_tokens,
            spec_accepted_tokens,
            prefill_replica,
            second_token_at,
            kv_transfer_tokens,
            kv_transfer_wait_s,
            kv_transfer_s,
            host_hit_tokens,
            host_load_tokens,
            host_load_wait_s,
            host_load_s,
        ]
    );
    d.set_item("requests", requests)?;

    let edges: Vec<f64> = (0..=GapHistogram::NUM_BUCKETS)
        .map(GapHistogram::bucket_start)
        .collect();
    d.set_item("token_gap_counts", out.token_gaps.counts.into_pyarray(py))?;
    d.set_item("token_gap_edges", edges.into_pyarray(py))?;

    let samples = columns!(
        py,
        out.samples,
        [time, replica, kv_usage, batch_size, num_outstanding]
    );
    d.set_item("samples", samples)?;

    if let Some(trace) = out.stages {
        let stages = columns!(
            py,
            trace,
            [
                replica,
                stage,
                batch_id,
                start,
                duration,
                num_requests,
                num_prefill_tokens,
                num_decode_tokens,
            ]
        );
        d.set_item("stages", stages)?;
    }

    let replicas = columns!(
        py,
        out.replicas,
        [
            busy_time,
            num_batches,
            sum_batch_size,
            num_prefill_tokens,
            num_decode_tokens,
            lora_loads,
            lora_disk_loads,
            lora_load_s,
            host_offloaded_blocks,
            host_loaded_blocks,
        ]
    );
    d.set_item("replicas", replicas)?;

    d.set_item("makespan", out.makespan)?;
    d.set_item("num_events", out.num_events)?;
    d.set_item("num_batches", out.num_batches)?;
    d.set_item("num_skipped_over_length", out.num_skipped_over_length)?;
    Ok(d)
}

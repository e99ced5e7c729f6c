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
    ExecModel, GapHistogram, GlobalPolicy, OpModel, PluginReplica, REPLICA_POLICIES, ReplicaPolicy,
    SimOutput, Simulator,
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
    module.add_function(wrap_pyfunction!(simulate, module)?)
}

/// Runs a simulation; see `tokenyard.simulate` for the config and the result.
#[pyfunction]
#[pyo3(signature = (config, chunks, *, exec_model=None, progress=None, route_plugin=None,
    replica_plugins=None, policy_plugins=None, exec_repeat=1, draft_exec_model=None,
    draft_layer_fraction=None))]
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

fn to_dict(py: Python<'_>, out: SimOutput) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    let t = out.requests;
    let requests = PyDict::new(py);
    requests.set_item("request_id", t.request_id.into_pyarray(py))?;
    requests.set_item("replica", t.replica.into_pyarray(py))?;
    requests.set_item("arrived_at", t.arrived_at.into_pyarray(py))?;
    requests.set_item("scheduled_at", t.scheduled_at.into_pyarray(py))?;
    requests.set_item("first_token_at", t.first_token_at.into_pyarray(py))?;
    requests.set_item("completed_at", t.completed_at.into_pyarray(py))?;
    requests.set_item("num_prefill_tokens", t.num_prefill_tokens.into_pyarray(py))?;
    requests.set_item("num_decode_tokens", t.num_decode_tokens.into_pyarray(py))?;
    requests.set_item("num_restarts", t.num_restarts.into_pyarray(py))?;
    requests.set_item("prefix_hit_tokens", t.prefix_hit_tokens.into_pyarray(py))?;
    requests.set_item("max_token_gap", t.max_token_gap.into_pyarray(py))?;
    requests.set_item("execution_time", t.execution_time.into_pyarray(py))?;
    requests.set_item(
        "model_execution_time",
        t.model_execution_time.into_pyarray(py),
    )?;
    requests.set_item("session_id", t.session_id.into_pyarray(py))?;
    requests.set_item("turn", t.turn.into_pyarray(py))?;
    requests.set_item("spec_steps", t.spec_steps.into_pyarray(py))?;
    requests.set_item("spec_draft_tokens", t.spec_draft_tokens.into_pyarray(py))?;
    requests.set_item(
        "spec_accepted_tokens",
        t.spec_accepted_tokens.into_pyarray(py),
    )?;
    d.set_item("requests", requests)?;

    let edges: Vec<f64> = (0..=GapHistogram::NUM_BUCKETS)
        .map(GapHistogram::bucket_start)
        .collect();
    d.set_item("token_gap_counts", out.token_gaps.counts.into_pyarray(py))?;
    d.set_item("token_gap_edges", edges.into_pyarray(py))?;

    let s = out.samples;
    let samples = PyDict::new(py);
    samples.set_item("time", s.time.into_pyarray(py))?;
    samples.set_item("replica", s.replica.into_pyarray(py))?;
    samples.set_item("kv_usage", s.kv_usage.into_pyarray(py))?;
    samples.set_item("batch_size", s.batch_size.into_pyarray(py))?;
    samples.set_item("num_outstanding", s.num_outstanding.into_pyarray(py))?;
    d.set_item("samples", samples)?;

    if let Some(trace) = out.stages {
        let stages = PyDict::new(py);
        stages.set_item("replica", trace.replica.into_pyarray(py))?;
        stages.set_item("stage", trace.stage.into_pyarray(py))?;
        stages.set_item("batch_id", trace.batch_id.into_pyarray(py))?;
        stages.set_item("start", trace.start.into_pyarray(py))?;
        stages.set_item("duration", trace.duration.into_pyarray(py))?;
        stages.set_item("num_requests", trace.num_requests.into_pyarray(py))?;
        stages.set_item(
            "num_prefill_tokens",
            trace.num_prefill_tokens.into_pyarray(py),
        )?;
        stages.set_item(
            "num_decode_tokens",
            trace.num_decode_tokens.into_pyarray(py),
        )?;
        d.set_item("stages", stages)?;
    }

    let r = out.replicas;
    let replicas = PyDict::new(py);
    replicas.set_item("busy_time", r.busy_time.into_pyarray(py))?;
    replicas.set_item("num_batches", r.num_batches.into_pyarray(py))?;
    replicas.set_item("sum_batch_size", r.sum_batch_size.into_pyarray(py))?;
    replicas.set_item("num_prefill_tokens", r.num_prefill_tokens.into_pyarray(py))?;
    replicas.set_item("num_decode_tokens", r.num_decode_tokens.into_pyarray(py))?;
    replicas.set_item("lora_loads", r.lora_loads.into_pyarray(py))?;
    replicas.set_item("lora_disk_loads", r.lora_disk_loads.into_pyarray(py))?;
    replicas.set_item("lora_load_s", r.lora_load_s.into_pyarray(py))?;
    d.set_item("replicas", replicas)?;

    d.set_item("makespan", out.makespan)?;
    d.set_item("num_events", out.num_events)?;
    d.set_item("num_batches", out.num_batches)?;
    d.set_item("num_skipped_over_length", out.num_skipped_over_length)?;
    Ok(d)
}

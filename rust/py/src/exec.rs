//! Converts the per-operation execution-time model that `tokenyard.predictor` compiles
//! (a dict of plain lists and floats) into the core's [`OpModel`].

use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use tokenyard_core::sim::exec::{
    Cost, Feature, Op, OpModel, Roofline, Scope, Table, evaluate_many,
};
use tokenyard_core::sim::{BatchShape, LoraShape};

use crate::convert::{get, sub};
use crate::errors::{OrRaise, config_error};

pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<PyCompiledOps>()?;
    module.add_function(wrap_pyfunction!(evaluate_ops, module)?)
}

/// A compiled per-operation model (the dict `tokenyard.predictor` builds), converted once.
#[pyclass(name = "CompiledOps", module = "tokenyard._core", frozen)]
pub(crate) struct PyCompiledOps {
    /// A mutex only because the tables cache lookups internally (a `Cell`).
    model: std::sync::Mutex<OpModel>,
}

#[pymethods]
impl PyCompiledOps {
    #[new]
    fn new(spec: &Bound<'_, PyDict>) -> PyResult<Self> {
        let model = op_model(spec)?;
        model.validate(1).or_raise(spec.py())?;
        Ok(Self {
            model: std::sync::Mutex::new(model),
        })
    }

    #[getter]
    fn num_ops(&self) -> usize {
        self.model().ops.len()
    }
}

impl PyCompiledOps {
    /// A copy for one run.
    pub(crate) fn model(&self) -> OpModel {
        self.model.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

pub(crate) fn op_model(d: &Bound<'_, PyDict>) -> PyResult<OpModel> {
    let ops: Bound<'_, PyList> = get(d, "ops")?;
    Ok(OpModel {
        ops: ops
            .iter()
            .map(|op| op_of(op.cast::<PyDict>()?))
            .collect::<PyResult<_>>()?,
        num_layers: get(d, "num_layers")?,
        cpu_overhead_s: get(d, "cpu_overhead_s")?,
    })
}

fn op_of(d: &Bound<'_, PyDict>) -> PyResult<Op> {
    let name: String = get(d, "name")?;
    let scope: String = get(d, "scope")?;
    let kind: String = get(d, "kind")?;
    let cost = match kind.as_str() {
        "roofline" => Cost::Roofline(roofline(&name, d)?),
        "table" => Cost::Table(table(d)?),
        other => {
            return Err(config_error(
                d.py(),
                "execution.ops.kind",
                other,
                "expected 'roofline' or 'table'",
            ));
        }
    };
    Ok(Op {
        scope: Scope::from_name(&scope).ok_or_else(|| {
            config_error(
                d.py(),
                "execution.ops.scope",
                &scope,
                "expected layer, first_stage, last_stage, between_stages or every_stage",
            )
        })?,
        count: get(d, "count")?,
        gate: feature(d.py(), "execution.ops.gate", &get::<String>(d, "gate")?)?,
        cost,
        name,
    })
}

fn feature(py: Python<'_>, field: &'static str, name: &str) -> PyResult<Feature> {
    Feature::from_name(name).ok_or_else(|| {
        let known: Vec<&str> = Feature::ALL.iter().map(|f| f.name()).collect();
        config_error(
            py,
            field,
            name,
            &format!("unknown feature; expected one of {}", known.join(", ")),
        )
    })
}

/// `{feature name: coefficient}` as a dense array.
fn coefficients(d: &Bound<'_, PyDict>, field: &'static str) -> PyResult<[f64; Feature::ALL.len()]> {
    let mut dense = [0.0; Feature::ALL.len()];
    for (name, value) in d.iter() {
        let f = feature(d.py(), field, &name.extract::<String>()?)?;
        dense[f as usize] = value.extract()?;
    }
    Ok(dense)
}

fn roofline(name: &str, d: &Bound<'_, PyDict>) -> PyResult<Roofline> {
    Roofline::new(
        name,
        &coefficients(&sub(d, "flops")?, "execution.ops.flops")?,
        &coefficients(&sub(d, "bytes")?, "execution.ops.bytes")?,
        get(d, "flops_per_s")?,
        get(d, "bytes_per_s")?,
        get(d, "latency_s")?,
    )
    .or_raise(d.py())
}

fn table(d: &Bound<'_, PyDict>) -> PyResult<Table> {
    let y: Option<String> = get(d, "y")?;
    Ok(Table::new(
        feature(d.py(), "execution.ops.x", &get::<String>(d, "x")?)?,
        y.map(|name| feature(d.py(), "execution.ops.y", &name))
            .transpose()?,
        get(d, "xs")?,
        get(d, "ys")?,
        get(d, "values")?,
    ))
}

/// `(total_s, model_s)` per batch shape.
type StageTimes<'py> = (Bound<'py, PyArray1<f64>>, Bound<'py, PyArray1<f64>>);

/// Stage times of many batch shapes under a compiled per-operation model: what the
/// simulator would charge, for evaluation and for checking the Python mirror.
#[pyfunction]
#[pyo3(signature = (spec, shapes, *, stage=0, num_stages=1))]
pub(crate) fn evaluate_ops<'py>(
    py: Python<'py>,
    spec: &Bound<'py, PyDict>,
    shapes: &Bound<'py, PyDict>,
    stage: u32,
    num_stages: u32,
) -> PyResult<StageTimes<'py>> {
    let mut model = op_model(spec)?;
    model.validate(num_stages).or_raise(py)?;
    let column = |key: &'static str| -> PyResult<Vec<u64>> {
        let array: PyReadonlyArray1<'py, u64> = get(shapes, key)?;
        Ok(array.as_slice()?.to_vec())
    };
    let requests = column("num_requests")?;
    let columns = [
        column("num_prefill_tokens")?,
        column("num_decode_tokens")?,
        column("sum_decode_context")?,
        column("sum_prefill_context")?,
        column("sum_prefill_squared")?,
        column("num_padding_rows")?,
    ];
    let n = requests.len();
    // LoRA columns are optional (zero without them).
    let optional = |key: &'static str| -> PyResult<Vec<u64>> {
        match shapes.get_item(key)? {
            Some(_) => column(key),
            None => Ok(vec![0; n]),
        }
    };
    let lora_tokens = optional("num_lora_tokens")?;
    let lora_adapters = optional("num_lora_adapters")?;
    if columns
        .iter()
        .chain([&lora_tokens, &lora_adapters])
        .any(|c| c.len() != n)
    {
        return Err(config_error(
            py,
            "shapes",
            n,
            "every column must have the same length",
        ));
    }
    let shapes = (0..n)
        .map(|i| {
            Ok(BatchShape {
                num_requests: u32::try_from(requests[i]).map_err(|_| {
                    config_error(py, "shapes.num_requests", requests[i], "too large")
                })?,
                num_prefill_tokens: columns[0][i],
                num_decode_tokens: columns[1][i],
                sum_decode_context: columns[2][i],
                sum_prefill_context: columns[3][i],
                sum_prefill_squared: columns[4][i],
                num_padding_rows: columns[5][i],
                lora: LoraShape {
                    num_lora_tokens: lora_tokens[i],
                    num_adapters: u32::try_from(lora_adapters[i]).map_err(|_| {
                        config_error(
                            py,
                            "shapes.num_lora_adapters",
                            lora_adapters[i],
                            "too large",
                        )
                    })?,
                    ..LoraShape::default()
                },
                // Draft passes are priced by the simulator's SpecExec, not per shape here.
                ..BatchShape::default()
            })
        })
        .collect::<PyResult<Vec<_>>>()?;
    let times = py
        .detach(|| evaluate_many(&mut model, &shapes, stage, num_stages))
        .or_raise(py)?;
    let total: Vec<f64> = times.iter().map(|t| t.total_s).collect();
    let model_only: Vec<f64> = times.iter().map(|t| t.model_s).collect();
    Ok((total.into_pyarray(py), model_only.into_pyarray(py)))
}

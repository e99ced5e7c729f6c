//! Converts the per-operation execution-time model that `tokenyard.predictor` compiles
//! (a dict of plain lists and floats) into the core's [`OpModel`].

use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use tokenyard_core::sim::BatchShape;
use tokenyard_core::sim::exec::{Cost, ExecModel, Feature, Op, OpModel, Roofline, Scope, Table};

use crate::errors::{OrRaise, config_error};
use crate::sim::{get, sub};

pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(evaluate_ops, module)?)
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
    if stage >= num_stages {
        return Err(config_error(py, "stage", stage, "must be below num_stages"));
    }
    let column = |key: &'static str| -> PyResult<Vec<u64>> {
        let array: PyReadonlyArray1<'py, u64> = get(shapes, key)?;
        Ok(array.as_slice()?.to_vec())
    };
    let requests = column("num_requests")?;
    let prefill = column("num_prefill_tokens")?;
    let decode = column("num_decode_tokens")?;
    let decode_context = column("sum_decode_context")?;
    let prefill_context = column("sum_prefill_context")?;
    let prefill_squared = column("sum_prefill_squared")?;
    let padding = column("num_padding_rows")?;
    let n = requests.len();
    let lengths = [
        &prefill,
        &decode,
        &decode_context,
        &prefill_context,
        &prefill_squared,
        &padding,
    ];
    if lengths.iter().any(|c| c.len() != n) {
        return Err(config_error(
            py,
            "shapes",
            n,
            "every column must have the same length",
        ));
    }
    let mut total = Vec::with_capacity(n);
    let mut model_only = Vec::with_capacity(n);
    for i in 0..n {
        let shape = BatchShape {
            num_requests: u32::try_from(requests[i])
                .map_err(|_| config_error(py, "shapes.num_requests", requests[i], "too large"))?,
            num_prefill_tokens: prefill[i],
            num_decode_tokens: decode[i],
            sum_decode_context: decode_context[i],
            sum_prefill_context: prefill_context[i],
            sum_prefill_squared: prefill_squared[i],
            num_padding_rows: padding[i],
        };
        let time = model.stage_time(&shape, stage, num_stages).or_raise(py)?;
        total.push(time.total_s);
        model_only.push(time.model_s);
    }
    Ok((total.into_pyarray(py), model_only.into_pyarray(py)))
}

//! Converts the per-operation execution-time model that `tokenyard.predictor` compiles
//! (a dict of plain lists and floats) into the core's [`OpModel`].

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use tokenyard_core::sim::exec::{Cost, Feature, Op, OpModel, Roofline, Scope, Table};

use crate::errors::config_error;
use crate::sim::{get, sub};

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
        "roofline" => Cost::Roofline(roofline(d)?),
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

fn roofline(d: &Bound<'_, PyDict>) -> PyResult<Roofline> {
    Ok(Roofline {
        flops: coefficients(&sub(d, "flops")?, "execution.ops.flops")?,
        bytes: coefficients(&sub(d, "bytes")?, "execution.ops.bytes")?,
        flops_per_s: get(d, "flops_per_s")?,
        bytes_per_s: get(d, "bytes_per_s")?,
        latency_s: get(d, "latency_s")?,
    })
}

fn table(d: &Bound<'_, PyDict>) -> PyResult<Table> {
    let y: Option<String> = get(d, "y")?;
    Ok(Table {
        x: feature(d.py(), "execution.ops.x", &get::<String>(d, "x")?)?,
        y: y.map(|name| feature(d.py(), "execution.ops.y", &name))
            .transpose()?,
        xs: get(d, "xs")?,
        ys: get(d, "ys")?,
        values: get(d, "values")?,
    })
}

//! Python → Rust conversions: request ids, token ids and KV values, counts. Arrays are read
//! in one pass without creating a Python object per element.

use std::fmt;

use numpy::{PyArray1, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyString};

use crate::errors::{config_error, input_error};
use tokenyard_core::kv::TokenId;

/// A request id as Python users give it: an int or a str.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) enum RequestId {
    Int(i64),
    Str(String),
}

impl fmt::Debug for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestId::Int(i) => write!(f, "{i}"),
            // Python's repr, so messages quote ids the way users typed them.
            RequestId::Str(s) if !s.contains(['\'', '\\']) => write!(f, "'{s}'"),
            RequestId::Str(s) => write!(f, "{s:?}"),
        }
    }
}

impl RequestId {
    pub(crate) fn from_py(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        if obj.is_instance_of::<PyString>() {
            return Ok(RequestId::Str(obj.extract()?));
        }
        if obj.is_instance_of::<PyInt>()
            && let Ok(i) = obj.extract::<i64>()
        {
            return Ok(RequestId::Int(i));
        }
        Err(input_error(
            obj.py(),
            "request_id",
            repr(obj),
            "must be an int (64-bit) or a str",
        ))
    }
}

fn repr(obj: &Bound<'_, PyAny>) -> String {
    obj.repr()
        .map_or_else(|_| "<unprintable>".into(), |r| r.to_string())
}

/// Reads a 1-D integer array (any common dtype) or a sequence of ints as `i64`s.
fn int_values(obj: &Bound<'_, PyAny>, arg: &'static str) -> PyResult<Vec<i64>> {
    macro_rules! try_dtype {
        ($($t:ty),*) => {$(
            if let Ok(array) = obj.cast::<PyArray1<$t>>() {
                let array = array.try_readonly()?;
                return Ok(match array.as_slice() {
                    Ok(slice) => slice.iter().map(|&v| v as i64).collect(),
                    Err(_) => array.as_array().iter().map(|&v| v as i64).collect(),
                });
            }
        )*};
    }
    try_dtype!(i64, i32, u32, i16, u16, i8, u8);
    if let Ok(array) = obj.cast::<PyArray1<u64>>() {
        let values = array
            .try_readonly()?
            .as_array()
            .iter()
            .copied()
            .collect::<Vec<u64>>();
        return values
            .into_iter()
            .map(|v| i64::try_from(v).map_err(|_| input_error(obj.py(), arg, v, "exceeds int64")))
            .collect();
    }
    if let Ok(array) = obj.cast::<numpy::PyUntypedArray>() {
        return Err(input_error(
            obj.py(),
            arg,
            format!("array of dtype {} and {} dims", array.dtype(), array.ndim()),
            "must be a 1-D integer array or a sequence of ints",
        ));
    }
    obj.extract::<Vec<i64>>().map_err(|_| {
        input_error(
            obj.py(),
            arg,
            short_repr(obj),
            "must be a 1-D integer array or a sequence of ints",
        )
    })
}

fn short_repr(obj: &Bound<'_, PyAny>) -> String {
    let text = repr(obj);
    if text.len() > 80 {
        format!("{}...", &text[..77])
    } else {
        text
    }
}

/// Token ids: non-negative and below 2^32.
pub(crate) fn token_ids(obj: &Bound<'_, PyAny>, arg: &'static str) -> PyResult<Vec<TokenId>> {
    let values = int_values(obj, arg)?;
    values
        .iter()
        .map(|&v| {
            TokenId::try_from(v)
                .map_err(|_| input_error(obj.py(), arg, v, "token ids must be in [0, 2**32)"))
        })
        .collect()
}

/// KV slot values for the radix cache.
pub(crate) fn kv_values(obj: &Bound<'_, PyAny>, arg: &'static str) -> PyResult<Vec<i64>> {
    int_values(obj, arg)
}

/// A count given as a config field: must be positive.
pub(crate) fn positive_field(py: Python<'_>, field: &'static str, value: i64) -> PyResult<usize> {
    if value < 1 {
        return Err(config_error(py, field, value, "must be at least 1"));
    }
    usize::try_from(value).map_err(|_| config_error(py, field, value, "too large"))
}

/// A count given as an operation argument: must be >= `min`.
pub(crate) fn count_arg(
    py: Python<'_>,
    arg: &'static str,
    value: i64,
    min: i64,
) -> PyResult<usize> {
    if value < min {
        return Err(input_error(
            py,
            arg,
            value,
            &format!("must be at least {min}"),
        ));
    }
    usize::try_from(value).map_err(|_| input_error(py, arg, value, "too large"))
}

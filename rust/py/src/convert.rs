//! Python → Rust conversions: request ids, token ids and KV values, counts. Arrays are read
//! in one pass without creating a Python object per element.

use std::fmt;

use numpy::{PyArray1, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyString};

use crate::errors::{config_error, input_error};
use tokenyard_core::kv::TokenId;

/// A request id as Python users give it: an int or a str.
/// Ordered as vLLM compares ids (strings lexicographically); integers before strings.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
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

    pub(crate) fn into_py(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(match self {
            RequestId::Int(i) => i.into_pyobject(py)?.into_any().unbind(),
            RequestId::Str(s) => s.into_pyobject(py)?.into_any().unbind(),
        })
    }
}

fn repr(obj: &Bound<'_, PyAny>) -> String {
    obj.repr()
        .map_or_else(|_| "<unprintable>".into(), |r| r.to_string())
}

const NOT_INTS: &str = "must be a 1-D integer array or a sequence of ints";

/// Reads a 1-D integer array (any common dtype) or a sequence of ints as `i128`s, for the
/// general (slower) path.
fn read_wide(obj: &Bound<'_, PyAny>, arg: &'static str) -> PyResult<Vec<i128>> {
    let py = obj.py();
    macro_rules! try_dtype {
        ($($t:ty),*) => {$(
            if let Ok(array) = obj.cast::<PyArray1<$t>>() {
                return Ok(array.try_readonly()?.as_array().iter().map(|&v| v as i128).collect());
            }
        )*};
    }
    try_dtype!(i64, i32, u32, u64, i16, u16, i8, u8);
    if let Ok(array) = obj.cast::<numpy::PyUntypedArray>() {
        let what = format!("array of dtype {} and {} dims", array.dtype(), array.ndim());
        return Err(input_error(py, arg, what, NOT_INTS));
    }
    // Most sequences hold ints that fit in 64 bits, which convert far faster than i128.
    if let Ok(values) = obj.extract::<Vec<i64>>() {
        return Ok(values.into_iter().map(i128::from).collect());
    }
    obj.extract()
        .map_err(|_| input_error(py, arg, short_repr(obj), NOT_INTS))
}

/// Converts after checking every value lies in `[min, max]`.
fn narrow<T>(
    py: Python<'_>,
    values: &[i128],
    arg: &'static str,
    (min, max): (i128, i128),
    range: &str,
    cast: impl Fn(i128) -> T,
) -> PyResult<Vec<T>> {
    match values.iter().find(|&&v| v < min || v > max) {
        Some(&v) => Err(input_error(py, arg, v, range)),
        None => Ok(values.iter().map(|&v| cast(v)).collect()),
    }
}

/// Token ids: non-negative and below 2^32. Contiguous int64/int32/uint32 arrays (what
/// engines hold) take a fast path: one OR-reduction to check, one cast to copy, both
/// vectorised on plain x86-64.
pub(crate) fn token_ids(obj: &Bound<'_, PyAny>, arg: &'static str) -> PyResult<Vec<TokenId>> {
    if let Ok(array) = obj.cast::<PyArray1<i64>>() {
        let array = array.try_readonly()?;
        if let Ok(slice) = array.as_slice()
            && slice.iter().fold(0u64, |acc, &v| acc | (v as u64 >> 32)) == 0
        {
            return Ok(slice.iter().map(|&v| v as TokenId).collect());
        }
    } else if let Ok(array) = obj.cast::<PyArray1<i32>>() {
        let array = array.try_readonly()?;
        if let Ok(slice) = array.as_slice()
            && slice.iter().fold(0i32, |acc, &v| acc | v) >= 0
        {
            return Ok(slice.iter().map(|&v| v as TokenId).collect());
        }
    } else if let Ok(array) = obj.cast::<PyArray1<u32>>() {
        let array = array.try_readonly()?;
        if let Ok(slice) = array.as_slice() {
            return Ok(slice.to_vec());
        }
    }
    let values = read_wide(obj, arg)?;
    let range = (0, i128::from(TokenId::MAX));
    narrow(
        obj.py(),
        &values,
        arg,
        range,
        "token ids must be in [0, 2**32)",
        |v| v as TokenId,
    )
}

/// KV slot values for the radix cache; a contiguous int64 array is copied as is.
pub(crate) fn kv_values(obj: &Bound<'_, PyAny>, arg: &'static str) -> PyResult<Vec<i64>> {
    if let Ok(array) = obj.cast::<PyArray1<i64>>() {
        let array = array.try_readonly()?;
        if let Ok(slice) = array.as_slice() {
            return Ok(slice.to_vec());
        }
    }
    let values = read_wide(obj, arg)?;
    let range = (i128::from(i64::MIN), i128::from(i64::MAX));
    narrow(
        obj.py(),
        &values,
        arg,
        range,
        "values must fit in int64",
        |v| v as i64,
    )
}

pub(crate) fn short_repr(obj: &Bound<'_, PyAny>) -> String {
    let text = repr(obj);
    match text.char_indices().nth(77) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}

/// A count given as a config field: an int in `[1, 2**62]` (a bool, a float or a larger int
/// is a `ConfigError` naming the field, never an `OverflowError`).
pub(crate) fn positive_field(value: &Bound<'_, PyAny>, field: &'static str) -> PyResult<usize> {
    int_field(value, field, 1)
}

/// [`positive_field`] where 0 is allowed (and means "none").
pub(crate) fn non_negative_field(value: &Bound<'_, PyAny>, field: &'static str) -> PyResult<usize> {
    int_field(value, field, 0)
}

fn int_field(value: &Bound<'_, PyAny>, field: &'static str, min: i128) -> PyResult<usize> {
    let py = value.py();
    let int = value.is_instance_of::<PyInt>() && !value.is_instance_of::<pyo3::types::PyBool>();
    match int.then(|| value.extract::<i128>().ok()).flatten() {
        Some(v) if (min..=1i128 << 62).contains(&v) => Ok(v as usize),
        _ => Err(config_error(
            py,
            field,
            short_repr(value),
            &format!("must be an int in [{min}, {}]", 1u64 << 62),
        )),
    }
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

/// `dict[key]` converted to `T`; a missing key or a wrong type is a `ConfigError` naming it.
pub(crate) fn get<'py, T: for<'a> FromPyObject<'a, 'py>>(
    dict: &Bound<'py, pyo3::types::PyDict>,
    key: &'static str,
) -> PyResult<T> {
    let value = dict
        .get_item(key)?
        .ok_or_else(|| config_error(dict.py(), key, "missing", "is required"))?;
    value
        .extract::<T>()
        .map_err(|_| config_error(dict.py(), key, short_repr(&value), "has the wrong type"))
}

/// A nested dict: `dict[key]`.
pub(crate) fn sub<'py>(
    dict: &Bound<'py, pyo3::types::PyDict>,
    key: &'static str,
) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
    get(dict, key)
}

/// An int argument in `[min, max]`; anything else (a float, a bool, an int out of range,
/// however large) is an `InputError` naming the argument.
pub(crate) fn int_arg(
    obj: &Bound<'_, PyAny>,
    arg: &'static str,
    min: i128,
    max: i128,
) -> PyResult<i128> {
    let value = if obj.is_instance_of::<PyInt>() && !obj.is_instance_of::<pyo3::types::PyBool>() {
        obj.extract::<i128>().ok()
    } else {
        None
    };
    match value {
        Some(v) if (min..=max).contains(&v) => Ok(v),
        _ => Err(input_error(
            obj.py(),
            arg,
            short_repr(obj),
            &format!("must be an int in [{min}, {max}]"),
        )),
    }
}

//! `_core.read_mooncake_lines`: the Mooncake trace reader's fast path
//! (`tokenyard_core::workload::mooncake`), its columns handed over as numpy arrays.

use numpy::{IntoPyArray, PyArray1};
use pyo3::prelude::*;
use tokenyard_core::workload::read_mooncake_lines as read_lines;

pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(read_mooncake_lines, module)?)
}

type Columns<'py> = (
    Bound<'py, PyArray1<u64>>,
    Bound<'py, PyArray1<f64>>,
    Bound<'py, PyArray1<u32>>,
    Bound<'py, PyArray1<u32>>,
    Bound<'py, PyArray1<u64>>,
    Bound<'py, PyArray1<u64>>,
    usize,
    u64,
    Option<usize>,
);

/// Reads whole lines of `buf` from byte `start` (line `first_line + 1`) into columns; see
/// `tokenyard.workload.traces` for the caller. Returns `(lines, times_s, input_lengths,
/// output_lengths, hash_offsets, hash_ids, end, last_line, handed_back)`.
#[pyfunction]
#[pyo3(signature = (buf, start, first_line, hash_block_size, max_rows, is_final))]
fn read_mooncake_lines<'py>(
    py: Python<'py>,
    buf: &[u8],
    start: usize,
    first_line: u64,
    hash_block_size: u32,
    max_rows: usize,
    is_final: bool,
) -> Columns<'py> {
    let start = start.min(buf.len());
    let c = py.detach(|| read_lines(buf, start, first_line, hash_block_size, max_rows, is_final));
    (
        c.lines.into_pyarray(py),
        c.times_s.into_pyarray(py),
        c.input_lengths.into_pyarray(py),
        c.output_lengths.into_pyarray(py),
        c.hash_offsets.into_pyarray(py),
        c.hash_ids.into_pyarray(py),
        c.end,
        c.last_line,
        c.handed_back,
    )
}

use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use tokenyard_core::kv::{
    BlockId, GroupedComputedBlocks, KvCapacity, KvCoordinator, KvGroupSpec, NULL_BLOCK,
};

use super::block_pool::PyBlockPoolStats;
use super::{allocate_slots, block_ref_count, has_request, of_request, on_request};
use crate::convert::{RequestId, positive_field, short_repr, token_ids as read_token_ids};
use crate::errors::{OrRaise, config_error, invariants, to_py_err};

/// A full-attention KV cache group (vLLM's `FullAttentionSpec`).
#[pyclass(name = "FullAttentionSpec", module = "tokenyard.kv", frozen)]
pub(crate) struct PyFullAttentionSpec;

/// A sliding-window KV cache group: each token attends to the `sliding_window` tokens
/// ending at itself (vLLM's `SlidingWindowSpec`). With `bounded_replay`, the group is not
/// prefix-cached but rebuilt by recomputing a hit's last window (vLLM's
/// `SlidingWindowMLASpec(bounded_replay=True)`).
#[pyclass(name = "SlidingWindowSpec", module = "tokenyard.kv", frozen, get_all)]
pub(crate) struct PySlidingWindowSpec {
    sliding_window: usize,
    bounded_replay: bool,
}

/// A chunked local attention KV cache group (vLLM's `ChunkedLocalAttentionSpec`).
#[pyclass(
    name = "ChunkedLocalAttentionSpec",
    module = "tokenyard.kv",
    frozen,
    get_all
)]
pub(crate) struct PyChunkedLocalAttentionSpec {
    attention_chunk_size: usize,
}

/// A Mamba / linear-attention state group (vLLM's `MambaSpec`): with
/// `mamba_cache_mode="none"` one block per request, not prefix-cached; with `"align"` a
/// state block at each block boundary, prefix-cached (`KvGroupSpec::MambaAlign`); either
/// with speculative state blocks, align with a prefill checkpoint block. A `none` group
/// whose block is shorter than `max_model_len` (`block_covers_request=False`) holds a slot
/// per block, all but the last state's null (`KvGroupSpec::MambaPerBlock`).
#[pyclass(name = "MambaSpec", module = "tokenyard.kv", frozen)]
pub(crate) struct PyMambaSpec {
    spec: KvGroupSpec,
}

/// An encoder-decoder model's cross-attention group: blocks for the request's encoder
/// tokens, allocated once and held to its end (vLLM's `CrossAttentionSpec`).
#[pyclass(name = "CrossAttentionSpec", module = "tokenyard.kv", frozen)]
pub(crate) struct PyCrossAttentionSpec;

/// HiSparse's GPU-resident pages (vLLM 0.33's `HiSparseResidentSpec`): a block per
/// `block_size` tokens, never prefix-cached, counted at the full-sequence admission gate
/// up to `max_admission_blocks` (vLLM's `max_admission_blocks_per_request`).
#[pyclass(
    name = "HiSparseResidentSpec",
    module = "tokenyard.kv",
    frozen,
    get_all
)]
pub(crate) struct PyHiSparseResidentSpec {
    max_admission_blocks: usize,
}

/// HiSparse's hot region (vLLM 0.33's `HiSparseHotSpec`): `blocks_per_request` blocks for
/// a request that reads host-backed history, none otherwise; never prefix-cached.
#[pyclass(name = "HiSparseHotSpec", module = "tokenyard.kv", frozen, get_all)]
pub(crate) struct PyHiSparseHotSpec {
    blocks_per_request: usize,
}

#[pymethods]
impl PyHiSparseResidentSpec {
    #[new]
    #[pyo3(signature = (*, max_admission_blocks))]
    fn new(max_admission_blocks: &Bound<'_, PyAny>) -> PyResult<Self> {
        let max_admission_blocks = positive_field(max_admission_blocks, "max_admission_blocks")?;
        Ok(Self {
            max_admission_blocks,
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "HiSparseResidentSpec(max_admission_blocks={})",
            self.max_admission_blocks
        )
    }
}

#[pymethods]
impl PyHiSparseHotSpec {
    #[new]
    #[pyo3(signature = (*, blocks_per_request))]
    fn new(blocks_per_request: &Bound<'_, PyAny>) -> PyResult<Self> {
        let blocks_per_request = positive_field(blocks_per_request, "blocks_per_request")?;
        Ok(Self { blocks_per_request })
    }

    fn __repr__(&self) -> String {
        format!(
            "HiSparseHotSpec(blocks_per_request={})",
            self.blocks_per_request
        )
    }
}

#[pymethods]
impl PyFullAttentionSpec {
    #[new]
    fn new() -> Self {
        Self
    }

    fn __repr__(&self) -> &'static str {
        "FullAttentionSpec()"
    }
}

#[pymethods]
impl PySlidingWindowSpec {
    #[new]
    #[pyo3(signature = (*, sliding_window, bounded_replay = false))]
    fn new(sliding_window: &Bound<'_, PyAny>, bounded_replay: bool) -> PyResult<Self> {
        let sliding_window = positive_field(sliding_window, "sliding_window")?;
        Ok(Self {
            sliding_window,
            bounded_replay,
        })
    }

    fn __repr__(&self) -> String {
        match self.bounded_replay {
            false => format!("SlidingWindowSpec(sliding_window={})", self.sliding_window),
            true => format!(
                "SlidingWindowSpec(sliding_window={}, bounded_replay=True)",
                self.sliding_window
            ),
        }
    }
}

#[pymethods]
impl PyChunkedLocalAttentionSpec {
    #[new]
    #[pyo3(signature = (*, attention_chunk_size))]
    fn new(attention_chunk_size: &Bound<'_, PyAny>) -> PyResult<Self> {
        let attention_chunk_size = positive_field(attention_chunk_size, "attention_chunk_size")?;
        Ok(Self {
            attention_chunk_size,
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "ChunkedLocalAttentionSpec(attention_chunk_size={})",
            self.attention_chunk_size
        )
    }
}

#[pymethods]
impl PyMambaSpec {
    #[new]
    #[pyo3(signature = (
        *,
        mamba_cache_mode = "none",
        num_speculative_blocks = 0,
        num_prefill_checkpoint_blocks = 0,
        prefill_checkpoint_alignment = None,
        block_covers_request = true,
    ))]
    fn new(
        py: Python<'_>,
        mamba_cache_mode: &str,
        num_speculative_blocks: i64,
        num_prefill_checkpoint_blocks: i64,
        prefill_checkpoint_alignment: Option<i64>,
        block_covers_request: bool,
    ) -> PyResult<Self> {
        let align = match mamba_cache_mode {
            "none" => false,
            "align" => true,
            other => {
                return Err(config_error(
                    py,
                    "mamba_cache_mode",
                    format!("{other:?}"),
                    "must be \"none\" or \"align\" (vLLM 0.33's MambaCacheMode)",
                ));
            }
        };
        let count = |field: &'static str, value: i64| {
            usize::try_from(value).map_err(|_| config_error(py, field, value, "must be >= 0"))
        };
        let alignment = prefill_checkpoint_alignment
            .map(|a| count("prefill_checkpoint_alignment", a))
            .transpose()?;
        let spec = KvGroupSpec::mamba_blocks(
            align,
            block_covers_request,
            count("num_speculative_blocks", num_speculative_blocks)?,
            count(
                "num_prefill_checkpoint_blocks",
                num_prefill_checkpoint_blocks,
            )?,
            alignment,
        )
        .map_err(|e| to_py_err(py, e))?;
        Ok(Self { spec })
    }

    #[getter]
    fn mamba_cache_mode(&self) -> &'static str {
        if self.spec.is_mamba_align() {
            "align"
        } else {
            "none"
        }
    }

    #[getter]
    fn num_speculative_blocks(&self) -> usize {
        self.spec.num_speculative_blocks()
    }

    #[getter]
    fn num_prefill_checkpoint_blocks(&self) -> usize {
        usize::from(self.spec.prefill_checkpoint_alignment().is_some())
    }

    #[getter]
    fn prefill_checkpoint_alignment(&self) -> Option<usize> {
        self.spec.prefill_checkpoint_alignment()
    }

    #[getter]
    fn block_covers_request(&self) -> bool {
        !matches!(self.spec, KvGroupSpec::MambaPerBlock { .. })
    }

    fn __repr__(&self) -> String {
        let mut args = Vec::new();
        if self.spec.is_mamba_align() {
            args.push("mamba_cache_mode='align'".to_string());
        }
        let num_spec = self.spec.num_speculative_blocks();
        if num_spec > 0 {
            args.push(format!("num_speculative_blocks={num_spec}"));
        }
        if let Some(alignment) = self.spec.prefill_checkpoint_alignment() {
            args.push(format!(
                "num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment={alignment}"
            ));
        }
        if !self.block_covers_request() {
            args.push("block_covers_request=False".to_string());
        }
        format!("MambaSpec({})", args.join(", "))
    }
}

#[pymethods]
impl PyCrossAttentionSpec {
    #[new]
    fn new() -> Self {
        Self
    }

    fn __repr__(&self) -> &'static str {
        "CrossAttentionSpec()"
    }
}

/// `obj` as a group spec, or ConfigError naming `field[index]`.
pub(crate) fn group_spec(
    obj: &Bound<'_, PyAny>,
    field: &'static str,
    index: usize,
) -> PyResult<KvGroupSpec> {
    if obj.is_instance_of::<PyFullAttentionSpec>() {
        return Ok(KvGroupSpec::FullAttention);
    }
    if let Ok(spec) = obj.cast::<PySlidingWindowSpec>() {
        let sliding_window = spec.get().sliding_window;
        return Ok(match spec.get().bounded_replay {
            false => KvGroupSpec::SlidingWindow { sliding_window },
            true => KvGroupSpec::SlidingWindowReplay { sliding_window },
        });
    }
    if let Ok(spec) = obj.cast::<PyChunkedLocalAttentionSpec>() {
        return Ok(KvGroupSpec::ChunkedLocalAttention {
            attention_chunk_size: spec.get().attention_chunk_size,
        });
    }
    if let Ok(spec) = obj.cast::<PyMambaSpec>() {
        return Ok(spec.get().spec);
    }
    if obj.is_instance_of::<PyCrossAttentionSpec>() {
        return Ok(KvGroupSpec::CrossAttention);
    }
    if let Ok(spec) = obj.cast::<PyHiSparseResidentSpec>() {
        return Ok(KvGroupSpec::HiSparseResident {
            max_admission_blocks: spec.get().max_admission_blocks,
        });
    }
    if let Ok(spec) = obj.cast::<PyHiSparseHotSpec>() {
        return Ok(KvGroupSpec::HiSparseHot {
            blocks_per_request: spec.get().blocks_per_request,
        });
    }
    Err(config_error(
        obj.py(),
        field,
        format!("{field}[{index}]={}", short_repr(obj)),
        "must be a FullAttentionSpec, SlidingWindowSpec, ChunkedLocalAttentionSpec, MambaSpec, \
         CrossAttentionSpec, HiSparseResidentSpec or HiSparseHotSpec",
    ))
}

fn spec_object(py: Python<'_>, spec: KvGroupSpec) -> PyResult<Py<PyAny>> {
    Ok(match spec {
        KvGroupSpec::FullAttention => Py::new(py, PyFullAttentionSpec)?.into_any(),
        KvGroupSpec::SlidingWindow { sliding_window } => Py::new(
            py,
            PySlidingWindowSpec {
                sliding_window,
                bounded_replay: false,
            },
        )?
        .into_any(),
        KvGroupSpec::SlidingWindowReplay { sliding_window } => Py::new(
            py,
            PySlidingWindowSpec {
                sliding_window,
                bounded_replay: true,
            },
        )?
        .into_any(),
        KvGroupSpec::ChunkedLocalAttention {
            attention_chunk_size,
        } => Py::new(
            py,
            PyChunkedLocalAttentionSpec {
                attention_chunk_size,
            },
        )?
        .into_any(),
        KvGroupSpec::Mamba { .. }
        | KvGroupSpec::MambaPerBlock { .. }
        | KvGroupSpec::MambaAlign { .. } => Py::new(py, PyMambaSpec { spec })?.into_any(),
        KvGroupSpec::CrossAttention => Py::new(py, PyCrossAttentionSpec)?.into_any(),
        KvGroupSpec::HiSparseResident {
            max_admission_blocks,
        } => Py::new(
            py,
            PyHiSparseResidentSpec {
                max_admission_blocks,
            },
        )?
        .into_any(),
        KvGroupSpec::HiSparseHot { blocks_per_request } => {
            Py::new(py, PyHiSparseHotSpec { blocks_per_request })?.into_any()
        }
    })
}

/// A tuple of one numpy array per group.
fn group_arrays<'py, T: AsRef<[BlockId]>>(
    py: Python<'py>,
    tables: impl IntoIterator<Item = T>,
) -> PyResult<Bound<'py, PyTuple>> {
    let arrays: Vec<_> = (tables.into_iter())
        .map(|t| PyArray1::from_slice(py, t.as_ref()))
        .collect();
    PyTuple::new(py, arrays)
}

/// vLLM's KV cache coordinator: one KV cache group per layer kind of a hybrid model,
/// sharing one pool of blocks (block 0 is the null block).
#[pyclass(name = "KvCoordinator", module = "tokenyard.kv")]
pub(crate) struct PyKvCoordinator {
    inner: KvCoordinator<RequestId>,
}

/// The prefix hit agreed across groups, from `KvCoordinator.get_computed_blocks`.
#[pyclass(name = "GroupedComputedBlocks", module = "tokenyard.kv", frozen)]
pub(crate) struct PyGroupedComputedBlocks {
    inner: GroupedComputedBlocks,
}

#[pymethods]
impl PyGroupedComputedBlocks {
    #[getter]
    fn block_ids<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        group_arrays(py, &self.inner.block_ids)
    }

    #[getter]
    fn num_computed_tokens(&self) -> usize {
        self.inner.num_computed_tokens
    }

    fn __repr__(&self) -> String {
        format!(
            "GroupedComputedBlocks(num_computed_tokens={}, block_ids={:?})",
            self.inner.num_computed_tokens, self.inner.block_ids
        )
    }
}

#[pymethods]
impl PyKvCoordinator {
    #[classattr]
    const NULL_BLOCK_ID: BlockId = NULL_BLOCK;

    #[new]
    #[pyo3(
        signature = (
            *, groups, num_blocks, block_size, enable_caching = true, group_block_sizes = None,
            eagle_block_drop = false
        ),
        text_signature = "(*, groups, num_blocks, block_size, enable_caching=True, group_block_sizes=None, eagle_block_drop=False)"
    )]
    fn new(
        py: Python<'_>,
        groups: &Bound<'_, PyAny>,
        num_blocks: &Bound<'_, PyAny>,
        block_size: &Bound<'_, PyAny>,
        enable_caching: bool,
        group_block_sizes: Option<&Bound<'_, PyAny>>,
        eagle_block_drop: bool,
    ) -> PyResult<Self> {
        let num_blocks = positive_field(num_blocks, "num_blocks")?;
        let block_size = positive_field(block_size, "block_size")?;
        if groups.is_instance_of::<pyo3::types::PyString>() {
            return Err(config_error(
                py,
                "groups",
                short_repr(groups),
                "must be a sequence of group specs",
            ));
        }
        let items = groups.try_iter().map_err(|_| {
            config_error(
                py,
                "groups",
                short_repr(groups),
                "must be a sequence of group specs",
            )
        })?;
        let mut specs = Vec::new();
        for (i, item) in items.enumerate() {
            specs.push(group_spec(&item?, "groups", i)?);
        }
        let mut inner =
            KvCoordinator::new(specs, num_blocks, block_size, enable_caching).or_raise(py)?;
        if let Some(sizes) = group_block_sizes.filter(|s| !s.is_none()) {
            let items = sizes.try_iter().map_err(|_| {
                config_error(
                    py,
                    "group_block_sizes",
                    short_repr(sizes),
                    "must be a sequence of block sizes",
                )
            })?;
            let sizes = items
                .map(|item| positive_field(&item?, "group_block_sizes"))
                .collect::<PyResult<Vec<_>>>()?;
            inner.set_group_block_sizes(&sizes).or_raise(py)?;
        }
        if eagle_block_drop {
            inner.set_eagle_block_drop(true).or_raise(py)?;
        }
        Ok(Self { inner })
    }

    /// Whether every group's hits drop EAGLE's trailing block (vLLM's ``use_eagle``).
    #[getter]
    fn eagle_block_drop(&self) -> bool {
        self.inner.eagle_block_drop()
    }

    /// The request's prompt length (vLLM's ``num_prompt_tokens``), which places the partial
    /// tail-block entries of full-attention groups beside differing block sizes under
    /// EAGLE's drop; kept for the id until set again.
    fn set_num_prompt_tokens(
        &mut self,
        request_id: &Bound<'_, PyAny>,
        num_prompt_tokens: usize,
    ) -> PyResult<()> {
        on_request(request_id, |id| {
            self.inner.set_num_prompt_tokens(id, num_prompt_tokens);
            Ok(())
        })
    }

    /// Each group's block size (all ``block_size`` unless ``group_block_sizes`` was given).
    #[getter]
    fn group_block_sizes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.group_block_sizes())
    }

    /// vLLM's ``scheduler_block_size``: the least common multiple of the groups' block
    /// sizes, where prefix hits land.
    #[getter]
    fn scheduler_block_size(&self) -> usize {
        self.inner.scheduler_block_size()
    }

    #[getter]
    fn groups<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let specs = (self.inner.groups().iter())
            .map(|&s| spec_object(py, s))
            .collect::<PyResult<Vec<_>>>()?;
        PyTuple::new(py, specs)
    }

    #[getter]
    fn num_groups(&self) -> usize {
        self.inner.groups().len()
    }

    #[getter]
    fn num_blocks(&self) -> usize {
        self.inner.num_total_blocks() + 1
    }

    #[getter]
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }

    #[getter]
    fn enable_caching(&self) -> bool {
        self.inner.enable_caching()
    }

    #[getter]
    fn num_free_blocks(&self) -> usize {
        self.inner.num_free_blocks()
    }

    #[getter]
    fn num_used_blocks(&self) -> usize {
        self.inner.num_total_blocks() - self.inner.num_free_blocks()
    }

    #[getter]
    fn num_cached_blocks(&self) -> usize {
        self.inner.num_cached_blocks()
    }

    #[getter]
    fn num_requests(&self) -> usize {
        self.inner.num_requests()
    }

    #[getter]
    fn usage(&self) -> f64 {
        self.inner.usage()
    }

    fn stats(&self) -> PyBlockPoolStats {
        self.inner.stats().into()
    }

    #[pyo3(signature = (token_ids, *, extra_key = None))]
    fn get_computed_blocks(
        &mut self,
        token_ids: &Bound<'_, PyAny>,
        extra_key: Option<u64>,
    ) -> PyResult<PyGroupedComputedBlocks> {
        let tokens = read_token_ids(token_ids, "token_ids")?;
        let inner = self.inner.get_computed_blocks(&tokens, extra_key);
        Ok(PyGroupedComputedBlocks { inner })
    }

    #[pyo3(signature = (request_id, num_new_tokens, num_lookahead_tokens = 0, *, token_ids = None, new_computed_blocks = None, extra_key = None, num_encoder_tokens = 0))]
    #[allow(clippy::too_many_arguments)]
    fn allocate_slots<'py>(
        &mut self,
        request_id: &Bound<'py, PyAny>,
        num_new_tokens: i64,
        num_lookahead_tokens: i64,
        token_ids: Option<&Bound<'py, PyAny>>,
        new_computed_blocks: Option<PyRef<'py, PyGroupedComputedBlocks>>,
        extra_key: Option<u64>,
        num_encoder_tokens: usize,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let hit = new_computed_blocks.as_ref().map(|h| &h.inner);
        let new = allocate_slots(
            request_id,
            num_new_tokens,
            num_lookahead_tokens,
            token_ids,
            |id, tokens, num_new, lookahead| {
                self.inner.allocate_slots_in_flight(
                    id,
                    tokens,
                    num_new,
                    lookahead,
                    hit,
                    extra_key,
                    0,
                    num_encoder_tokens,
                )
            },
        )?;
        new.map(|tables| group_arrays(request_id.py(), tables))
            .transpose()
    }

    fn cache_blocks(
        &mut self,
        request_id: &Bound<'_, PyAny>,
        token_ids: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let py = request_id.py();
        let id = RequestId::from_py(request_id)?;
        let tokens = read_token_ids(token_ids, "token_ids")?;
        self.inner.cache_blocks(&id, &tokens).or_raise(py)
    }

    fn free(&mut self, request_id: &Bound<'_, PyAny>) -> PyResult<()> {
        on_request(request_id, |id| self.inner.free(id))
    }

    /// A new step begins (vLLM's `new_step_starts`): Mamba `align` states cached before it
    /// may now be hit by other requests.
    fn new_step_starts(&mut self) {
        self.inner.new_step_starts();
    }

    fn block_ids<'py>(&self, request_id: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyTuple>> {
        let tables = of_request(request_id, |id| self.inner.block_ids(id))?;
        group_arrays(request_id.py(), tables)
    }

    fn num_computed_tokens(&self, request_id: &Bound<'_, PyAny>) -> PyResult<usize> {
        of_request(request_id, |id| self.inner.num_computed_tokens(id))
    }

    fn free_block_ids<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<BlockId>> {
        PyArray1::from_vec(py, self.inner.free_block_ids())
    }

    fn ref_count(&self, py: Python<'_>, block_id: i64) -> PyResult<u32> {
        block_ref_count(py, block_id, |b| self.inner.ref_count(b))
    }

    fn __contains__(&self, request_id: &Bound<'_, PyAny>) -> PyResult<bool> {
        has_request(request_id, |id| self.inner.block_ids(id).is_some())
    }

    fn __len__(&self) -> usize {
        self.inner.num_requests()
    }

    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        invariants(py, self.inner.check_invariants())
    }

    fn __repr__(&self) -> String {
        format!(
            "KvCoordinator(groups={:?}, num_blocks={}, block_size={}, num_free_blocks={}, num_requests={})",
            self.inner.groups(),
            self.inner.num_total_blocks() + 1,
            self.inner.block_size(),
            self.inner.num_free_blocks(),
            self.inner.num_requests()
        )
    }
}

//! `tokenyard.sched`'s multimodal side: a request's `mm_features` and the config's encoder
//! fields as the core's types, the step's encoder outputs as Python values, and the encoder
//! cache on its own (`EncoderCache`, for the reference-model tests). Conversions only.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use tokenyard_core::sched::{EncoderCache, EncoderConfig, MmFeature, SchedulerOutput};

use crate::convert::RequestId;
use crate::errors::{config_error, input_error};

fn short(obj: &Bound<'_, PyAny>) -> String {
    crate::convert::short_repr(obj)
}

/// The config's encoder fields; an object without them (a config-like of an older shape)
/// gets vLLM's defaults.
pub(crate) fn encoder_config(config: &Bound<'_, PyAny>) -> PyResult<EncoderConfig> {
    let py = config.py();
    let count = |name: &'static str| -> PyResult<usize> {
        if !config.hasattr(name)? {
            return Ok(0);
        }
        let value = config.getattr(name)?;
        value
            .extract::<usize>()
            .map_err(|_| config_error(py, name, short(&value), "must be an int >= 0"))
    };
    let disable = if config.hasattr("disable_chunked_mm_input")? {
        let value = config.getattr("disable_chunked_mm_input")?;
        value.extract::<bool>().map_err(|_| {
            config_error(
                py,
                "disable_chunked_mm_input",
                short(&value),
                "must be true or false",
            )
        })?
    } else {
        false
    };
    Ok(EncoderConfig {
        max_num_encoder_input_tokens: count("max_num_encoder_input_tokens")?,
        encoder_cache_size: count("encoder_cache_size")?,
        disable_chunked_mm_input: disable,
    })
}

/// `mm_features`: a sequence of `tokenyard.sched.MmFeature`s, `(offset, length,
/// identifier[, is_embed])` tuples, or vLLM's `MultiModalFeatureSpec`s (their
/// `mm_position` and `identifier`).
pub(crate) fn mm_features(obj: &Bound<'_, PyAny>) -> PyResult<Vec<MmFeature>> {
    let py = obj.py();
    let bad = |what: &Bound<'_, PyAny>, why: &str| input_error(py, "mm_features", short(what), why);
    let items = obj
        .try_iter()
        .map_err(|_| bad(obj, "must be a sequence of MmFeature"))?;
    let mut features = Vec::new();
    for item in items {
        let item = item?;
        let feature = if let Ok(tuple) = item.cast::<PyTuple>() {
            if !(3..=4).contains(&tuple.len()) {
                return Err(bad(
                    &item,
                    "a tuple item is (offset, length, identifier[, is_embed])",
                ));
            }
            let is_embed = if tuple.len() == 4 {
                Some(tuple.get_item(3)?)
            } else {
                None
            };
            feature(
                &item,
                &tuple.get_item(0)?,
                &tuple.get_item(1)?,
                &tuple.get_item(2)?,
                is_embed,
            )?
        } else if item.hasattr("mm_position")? {
            let position = item.getattr("mm_position")?;
            feature(
                &item,
                &position.getattr("offset")?,
                &position.getattr("length")?,
                &item.getattr("identifier")?,
                Some(position.getattr("is_embed")?),
            )?
        } else if item.hasattr("offset")? {
            feature(
                &item,
                &item.getattr("offset")?,
                &item.getattr("length")?,
                &item.getattr("identifier")?,
                item.getattr("is_embed").ok(),
            )?
        } else {
            return Err(bad(
                &item,
                "each item must be an MmFeature or an (offset, length, identifier) tuple",
            ));
        };
        features.push(feature);
    }
    Ok(features)
}

fn feature(
    item: &Bound<'_, PyAny>,
    offset: &Bound<'_, PyAny>,
    length: &Bound<'_, PyAny>,
    identifier: &Bound<'_, PyAny>,
    is_embed: Option<Bound<'_, PyAny>>,
) -> PyResult<MmFeature> {
    let py = item.py();
    let bad = |why: &str| input_error(py, "mm_features", short(item), why);
    let offset = offset
        .extract::<usize>()
        .map_err(|_| bad("offset must be an int >= 0"))?;
    let length = length
        .extract::<usize>()
        .map_err(|_| bad("length must be an int >= 0"))?;
    let identifier = identifier
        .extract::<String>()
        .map_err(|_| bad("identifier must be a str"))?;
    let is_embed = match is_embed {
        Some(mask) if !mask.is_none() => {
            // A list of bools, a numpy bool array or a torch bool tensor (`.tolist()`).
            let mask = if mask.hasattr("tolist")? {
                mask.call_method0("tolist")?
            } else {
                mask
            };
            Some(
                mask.extract::<Vec<bool>>()
                    .map_err(|_| bad("is_embed must be a sequence of bools"))?,
            )
        }
        _ => None,
    };
    Ok(MmFeature {
        offset,
        length,
        identifier,
        is_embed,
    })
}

/// `SchedulerOutput.scheduled_encoder_inputs`: request id -> item indices, in scheduling
/// order.
pub(crate) fn scheduled_encoder_inputs<'py>(
    py: Python<'py>,
    out: &SchedulerOutput<RequestId>,
) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    for (id, inputs) in &out.scheduled_encoder_inputs {
        dict.set_item(id.clone().into_py(py)?, PyList::new(py, inputs)?)?;
    }
    Ok(dict)
}

/// vLLM 0.33's `EncoderCacheManager` on its own: the scheduler's encoder cache, driven
/// directly (tests check it against a reference model).
#[pyclass(name = "EncoderCache", module = "tokenyard.sched")]
pub(crate) struct PyEncoderCache {
    inner: EncoderCache<RequestId>,
}

#[pymethods]
impl PyEncoderCache {
    #[new]
    #[pyo3(signature = (cache_size))]
    fn new(cache_size: usize) -> Self {
        Self {
            inner: EncoderCache::new(cache_size),
        }
    }

    #[getter]
    fn cache_size(&self) -> usize {
        self.inner.cache_size()
    }
    #[getter]
    fn num_free_slots(&self) -> usize {
        self.inner.num_free_slots()
    }
    #[getter]
    fn num_freeable_slots(&self) -> usize {
        self.inner.num_freeable_slots()
    }

    fn check_and_update_cache(
        &mut self,
        request_id: &Bound<'_, PyAny>,
        input_id: usize,
        mm_hash: &str,
    ) -> PyResult<bool> {
        let id = RequestId::from_py(request_id)?;
        Ok(self.inner.check_and_update_cache(&id, input_id, mm_hash))
    }

    fn can_allocate(
        &mut self,
        num_embeds: usize,
        budget: usize,
        num_embeds_to_schedule: usize,
    ) -> bool {
        self.inner
            .can_allocate(num_embeds, budget, num_embeds_to_schedule)
    }

    /// Raises InputError where vLLM asserts: no room (`can_allocate` did not say yes); and
    /// for an identifier already held (with any count), which `check_and_update_cache`
    /// references instead: vLLM's scheduler never allocates one, and a second allocation
    /// would leave a referenced entry on the freeable list.
    fn allocate(
        &mut self,
        request_id: &Bound<'_, PyAny>,
        input_id: usize,
        mm_hash: &str,
        num_embeds: usize,
    ) -> PyResult<()> {
        let py = request_id.py();
        let id = RequestId::from_py(request_id)?;
        if self.inner.contains(mm_hash) {
            return Err(input_error(
                py,
                "mm_hash",
                mm_hash,
                "is already cached: check_and_update_cache references it",
            ));
        }
        if num_embeds > self.inner.num_free_slots() {
            let free = self.inner.num_free_slots();
            return Err(input_error(
                py,
                "num_embeds",
                num_embeds,
                &format!("only {free} slots are free"),
            ));
        }
        self.inner.allocate(&id, input_id, mm_hash, num_embeds);
        Ok(())
    }

    fn free_encoder_input(
        &mut self,
        request_id: &Bound<'_, PyAny>,
        input_id: usize,
        mm_hash: &str,
    ) -> PyResult<()> {
        let id = RequestId::from_py(request_id)?;
        self.inner.free_encoder_input(&id, input_id, mm_hash);
        Ok(())
    }

    fn get_cached_input_ids(&self, request_id: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
        Ok(self
            .inner
            .cached_input_ids(&RequestId::from_py(request_id)?))
    }

    fn get_cached_num_encoder_embeds(&self, mm_hash: &str) -> Option<usize> {
        self.inner.cached_num_embeds(mm_hash)
    }

    fn num_refs(&self, mm_hash: &str) -> usize {
        self.inner.num_refs(mm_hash)
    }

    fn entries(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.inner.entries().map(str::to_owned).collect();
        ids.sort();
        ids
    }

    fn freeable(&self) -> Vec<String> {
        self.inner
            .freeable_ids()
            .into_iter()
            .map(str::to_owned)
            .collect()
    }

    fn get_freed_mm_hashes(&mut self) -> Vec<String> {
        self.inner.take_freed()
    }

    /// Raises InvariantError naming the first broken invariant.
    fn check_invariants(&self, py: Python<'_>) -> PyResult<()> {
        crate::errors::invariants(py, self.inner.check())
    }
}

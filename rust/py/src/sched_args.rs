//! Conversions for `tokenyard.sched.Scheduler`'s request and step calls: a request's
//! `add_request` arguments to a core `RequestSpec`, a step's sampled tokens (mappings or
//! flat arrays) and speculation to `SampledOutput`s and their application, `abort`'s ids,
//! the prefix-cache events. Each names the argument and value it refuses.

use pyo3::prelude::*;
use pyo3::types::{PyList, PyMapping};
use tokenyard_core::kv::KvEvent;
use tokenyard_core::sched::{FinishReason, RequestSpec, SampledOutput};

use super::PyScheduler;
use crate::convert::{RequestId, count_arg, int_arg, kv_values, token_ids};

/// `add_request`'s arguments after the request id, as the core's request.
#[allow(clippy::too_many_arguments)]
pub(crate) fn request_spec(
    prompt_token_ids: &Bound<'_, PyAny>,
    max_tokens: &Bound<'_, PyAny>,
    priority: Option<&Bound<'_, PyAny>>,
    arrival_time: Option<f64>,
    eos_token_id: Option<&Bound<'_, PyAny>>,
    stop_token_ids: Option<&Bound<'_, PyAny>>,
    ignore_eos: bool,
    lora_id: Option<&Bound<'_, PyAny>>,
    mm_features: Option<&Bound<'_, PyAny>>,
    num_computed_tokens: Option<&Bound<'_, PyAny>>,
    resumable: bool,
) -> PyResult<RequestSpec> {
    let py = prompt_token_ids.py();
    let (i64_min, i64_max) = (i64::MIN as i128, i64::MAX as i128);
    Ok(RequestSpec {
        prompt_token_ids: token_ids(prompt_token_ids, "prompt_token_ids")?,
        max_tokens: int_arg(max_tokens, "max_tokens", 1, u32::MAX as i128)? as usize,
        priority: priority
            .map(|p| int_arg(p, "priority", i64_min, i64_max))
            .transpose()?
            .unwrap_or(0) as i64,
        arrival_time: match arrival_time {
            Some(t) if !t.is_finite() => {
                return Err(crate::errors::input_error(
                    py,
                    "arrival_time",
                    t,
                    "must be finite",
                ));
            }
            t => t.unwrap_or(0.0),
        },
        eos_token_id: eos_token_id
            .map(|t| int_arg(t, "eos_token_id", 0, u32::MAX as i128).map(|t| t as u32))
            .transpose()?,
        stop_token_ids: match stop_token_ids {
            Some(ids) => token_ids(ids, "stop_token_ids")?,
            None => Vec::new(),
        },
        ignore_eos,
        lora_id: lora_id
            .map(|l| int_arg(l, "lora_id", 0, i64_max).map(|l| l as u64))
            .transpose()?,
        external_id: None,
        num_deferred_prompt_tokens: 0,
        mm_features: match mm_features {
            Some(items) if !items.is_none() => crate::sched_encoder::mm_features(items)?,
            _ => Vec::new(),
        },
        num_computed_tokens: num_computed_tokens
            .map(|n| int_arg(n, "num_computed_tokens", 0, u32::MAX as i128))
            .transpose()?
            .unwrap_or(0) as usize,
        resumable,
        repetition_detection: None,
        min_tokens: 0,
    })
}

/// `repetition_detection` (`(max_pattern_size, min_pattern_size, min_count)`, vLLM 0.33's
/// `RepetitionDetectionParams`) and `min_tokens` as the core's stop rule; the core checks
/// the settings.
pub(crate) fn repetition_args(
    repetition_detection: Option<&Bound<'_, PyAny>>,
    min_tokens: Option<&Bound<'_, PyAny>>,
) -> PyResult<(Option<tokenyard_core::sched::RepetitionDetection>, usize)> {
    let rule = match repetition_detection {
        Some(obj) if !obj.is_none() => {
            let items: Vec<Bound<'_, PyAny>> = obj.extract().unwrap_or_default();
            if items.len() != 3 {
                return Err(crate::errors::input_error(
                    obj.py(),
                    "repetition_detection",
                    obj.repr()?.to_string(),
                    "must be (max_pattern_size, min_pattern_size, min_count)",
                ));
            }
            let size = |i: usize| {
                int_arg(&items[i], "repetition_detection", 0, u32::MAX as i128).map(|v| v as usize)
            };
            Some(tokenyard_core::sched::RepetitionDetection {
                max_pattern_size: size(0)?,
                min_pattern_size: size(1)?,
                min_count: size(2)?,
            })
        }
        _ => None,
    };
    let min_tokens = min_tokens
        .map(|n| int_arg(n, "min_tokens", 0, u32::MAX as i128))
        .transpose()?
        .unwrap_or(0) as usize;
    Ok((rule, min_tokens))
}

/// `update_from_output`'s `sampled_token_ids`: one output per request, in mapping order.
pub(crate) fn sampled_outputs<'py>(
    sampled_token_ids: &Bound<'py, PyMapping>,
) -> PyResult<Vec<SampledOutput<RequestId>>> {
    let mut outputs = Vec::with_capacity(sampled_token_ids.len()?);
    for item in sampled_token_ids.items()?.iter() {
        let (key, tokens): (Bound<'py, PyAny>, Bound<'py, PyAny>) = item.extract()?;
        let sampled = token_ids(&tokens, "sampled_token_ids")?;
        outputs.push(sampled_output(RequestId::from_py(&key)?, sampled));
    }
    Ok(outputs)
}

/// `update_from_output_arrays`' arguments: `request_ids[i]` sampled `num_sampled[i]` tokens
/// (one each when omitted), taken in order from `sampled_token_ids`.
pub(crate) fn sampled_arrays(
    py: Python<'_>,
    request_ids: &Bound<'_, PyAny>,
    sampled_token_ids: &Bound<'_, PyAny>,
    num_sampled: Option<&Bound<'_, PyAny>>,
    outputs: &mut Vec<SampledOutput<RequestId>>,
) -> PyResult<()> {
    let ids = kv_values(request_ids, "request_ids")?;
    let tokens = token_ids(sampled_token_ids, "sampled_token_ids")?;
    let counts = match num_sampled {
        Some(counts) => kv_values(counts, "num_sampled")?,
        None => vec![1; ids.len()],
    };
    let mismatch = |arg: &'static str, value: usize, want: String| {
        crate::errors::input_error(py, arg, format!("length {value}"), &want)
    };
    if counts.len() != ids.len() {
        let want = format!("must have one count per request id ({})", ids.len());
        return Err(mismatch("num_sampled", counts.len(), want));
    }
    if let Some(&bad) = counts.iter().find(|&&n| n < 0) {
        return Err(crate::errors::input_error(
            py,
            "num_sampled",
            bad,
            "counts must be at least 0",
        ));
    }
    let total: i64 = counts.iter().sum();
    if usize::try_from(total) != Ok(tokens.len()) {
        let want = format!("must hold the {total} tokens num_sampled counts");
        return Err(mismatch("sampled_token_ids", tokens.len(), want));
    }
    // The previous step's outputs are overwritten in place: their token vectors keep
    // their capacity, so a decode step allocates none per request (an allocation and a
    // free per request were a fifth of this call at 1,024 running requests).
    outputs.truncate(ids.len());
    let mut rest = tokens.as_slice();
    for (i, (&id, &n)) in ids.iter().zip(&counts).enumerate() {
        let (mine, after) = rest.split_at(n as usize);
        rest = after;
        match outputs.get_mut(i) {
            Some(output) => {
                output.request_id = RequestId::Int(id);
                output.token_ids.clear();
                output.token_ids.extend_from_slice(mine);
                output.num_rejected_tokens = 0;
                output.spec_token_ids.clear();
            }
            None => outputs.push(sampled_output(RequestId::Int(id), mine.to_vec())),
        }
    }
    Ok(())
}

/// `abort`'s `request_ids`.
pub(crate) fn abort_ids(request_ids: &Bound<'_, PyAny>) -> PyResult<Vec<RequestId>> {
    // One id (an int or a str) or an iterable of them; a str is one id, not its chars.
    let single = request_ids.is_instance_of::<pyo3::types::PyString>()
        || request_ids.is_instance_of::<pyo3::types::PyInt>();
    let ids = if single {
        vec![RequestId::from_py(request_ids)?]
    } else {
        request_ids
            .try_iter()
            .map_err(|_| {
                crate::errors::input_error(
                    request_ids.py(),
                    "request_ids",
                    request_ids
                        .repr()
                        .map_or_else(|_| "?".to_string(), |r| r.to_string()),
                    "must be a request id or an iterable of them",
                )
            })?
            .map(|id| RequestId::from_py(&id?))
            .collect::<PyResult<Vec<_>>>()?
    };
    Ok(ids)
}

/// Merges rejected counts and new drafts into the outputs, adding an entry for a request
/// that sampled nothing this step.
pub(crate) fn add_speculation<'py>(
    outputs: &mut Vec<SampledOutput<RequestId>>,
    num_rejected_tokens: Option<&Bound<'py, PyMapping>>,
    spec_token_ids: Option<&Bound<'py, PyMapping>>,
) -> PyResult<()> {
    let mut position: rustc_hash::FxHashMap<RequestId, usize> = outputs
        .iter()
        .enumerate()
        .map(|(i, o)| (o.request_id.clone(), i))
        .collect();
    let mut entry = |key: &Bound<'py, PyAny>| -> PyResult<usize> {
        let id = RequestId::from_py(key)?;
        Ok(*position.entry(id.clone()).or_insert_with(|| {
            outputs.push(sampled_output(id, Vec::new()));
            outputs.len() - 1
        }))
    };
    let mut rejected = Vec::new();
    if let Some(map) = num_rejected_tokens {
        for item in map.items()?.iter() {
            let (key, n): (Bound<'py, PyAny>, i64) = item.extract()?;
            rejected.push((
                entry(&key)?,
                count_arg(key.py(), "num_rejected_tokens", n, 0)?,
            ));
        }
    }
    let mut drafts = Vec::new();
    if let Some(map) = spec_token_ids {
        for item in map.items()?.iter() {
            let (key, tokens): (Bound<'py, PyAny>, Bound<'py, PyAny>) = item.extract()?;
            drafts.push((entry(&key)?, token_ids(&tokens, "spec_token_ids")?));
        }
    }
    for (i, n) in rejected {
        outputs[i].num_rejected_tokens = n;
    }
    for (i, tokens) in drafts {
        outputs[i].spec_token_ids = tokens;
    }
    Ok(())
}

fn sampled_output(request_id: RequestId, token_ids: Vec<u32>) -> SampledOutput<RequestId> {
    SampledOutput {
        request_id,
        token_ids,
        num_rejected_tokens: 0,
        spec_token_ids: Vec::new(),
    }
}

impl PyScheduler {
    /// Applies one step's outputs; returns the finished requests as `(id, reason)`.
    pub(super) fn apply_outputs<'py>(
        &mut self,
        py: Python<'py>,
        outputs: &[SampledOutput<RequestId>],
    ) -> PyResult<Bound<'py, PyList>> {
        let finished = self
            .inner
            .update_from_output(outputs)
            .map_err(|err| self.raise(py, err))?;
        finished_list(py, finished)
    }
}

/// Finished requests as `update_from_output` returns them: a list of `(id, reason)`.
pub(super) fn finished_list(
    py: Python<'_>,
    finished: Vec<(RequestId, FinishReason)>,
) -> PyResult<Bound<'_, PyList>> {
    let list = PyList::empty(py);
    for (id, reason) in finished {
        list.append((id.into_py(py)?, reason.as_str()))?;
    }
    Ok(list)
}

/// A prefix-cache event as `drain_kv_events` gives it: `(kind, block_hash)`.
pub(crate) fn kv_event(event: KvEvent) -> (&'static str, u128) {
    match event {
        KvEvent::Stored(h) => ("stored", h.0),
        KvEvent::Removed(h) => ("removed", h.0),
        KvEvent::HostStored(h) => ("host_stored", h.0),
        KvEvent::HostRemoved(h) => ("host_removed", h.0),
        KvEvent::AllCleared => ("all_cleared", 0),
    }
}

//! Conversions for streaming-input sessions (`tokenyard_core::sched::SessionUpdate`).

use pyo3::prelude::*;
use tokenyard_core::sched::SessionUpdate;

use crate::convert::{int_arg, token_ids};

/// A session's next input chunk from `Scheduler.resume_session`'s arguments.
pub(crate) fn session_update(
    prompt_token_ids: &Bound<'_, PyAny>,
    max_tokens: &Bound<'_, PyAny>,
    arrival_time: f64,
    eos_token_id: Option<&Bound<'_, PyAny>>,
    stop_token_ids: Option<&Bound<'_, PyAny>>,
    ignore_eos: bool,
) -> PyResult<SessionUpdate> {
    if !arrival_time.is_finite() {
        return Err(crate::errors::input_error(
            prompt_token_ids.py(),
            "arrival_time",
            arrival_time,
            "must be finite",
        ));
    }
    Ok(SessionUpdate {
        prompt_token_ids: token_ids(prompt_token_ids, "prompt_token_ids")?,
        max_tokens: int_arg(max_tokens, "max_tokens", 1, u32::MAX as i128)? as usize,
        arrival_time,
        eos_token_id: eos_token_id
            .map(|t| int_arg(t, "eos_token_id", 0, u32::MAX as i128).map(|t| t as u32))
            .transpose()?,
        stop_token_ids: match stop_token_ids {
            Some(ids) => token_ids(ids, "stop_token_ids")?,
            None => Vec::new(),
        },
        ignore_eos,
        repetition_detection: None,
        min_tokens: 0,
        mm_features: Vec::new(),
    })
}

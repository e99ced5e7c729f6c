//! The linear execution-time model: a handful of per-token coefficients.

use super::{ExecModel, StageTime};
use crate::sim::batch::BatchShape;
use crate::{Error, Result};

/// `model_s = (constant + a·prefill + b·decode + c·Σdecode ctx + d·Σprefill tokens×ctx) /
/// num_stages`, `total_s = model_s + cpu_overhead` (seconds; coefficients per token).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinearModel {
    pub constant_s: f64,
    pub per_prefill_token_s: f64,
    pub per_decode_token_s: f64,
    pub per_decode_context_token_s: f64,
    pub per_prefill_context_token_s: f64,
    pub cpu_overhead_s: f64,
}

impl Default for LinearModel {
    /// Roughly a 7B model on one A100 (vLLM-like): 5 ms per iteration, 0.1 ms per prefill
    /// token, 0.2 ms per decode token, attention reading the context.
    fn default() -> Self {
        Self {
            constant_s: 5e-3,
            per_prefill_token_s: 1e-4,
            per_decode_token_s: 2e-4,
            per_decode_context_token_s: 2e-7,
            per_prefill_context_token_s: 1e-8,
            cpu_overhead_s: 1e-3,
        }
    }
}

impl LinearModel {
    pub fn validate(&self) -> Result<()> {
        let fields = [
            ("exec.constant_s", self.constant_s),
            ("exec.per_prefill_token_s", self.per_prefill_token_s),
            ("exec.per_decode_token_s", self.per_decode_token_s),
            (
                "exec.per_decode_context_token_s",
                self.per_decode_context_token_s,
            ),
            (
                "exec.per_prefill_context_token_s",
                self.per_prefill_context_token_s,
            ),
            ("exec.cpu_overhead_s", self.cpu_overhead_s),
        ];
        for (name, value) in fields {
            if !(value.is_finite() && value >= 0.0) {
                return Err(Error::config(name, value, "must be a finite number >= 0"));
            }
        }
        Ok(())
    }
}

impl ExecModel for LinearModel {
    fn stage_time(
        &mut self,
        shape: &BatchShape,
        _stage: u32,
        num_stages: u32,
    ) -> Result<StageTime> {
        if shape.lora.num_lora_tokens > 0 {
            // Its coefficients were fitted without adapters: a LoRA batch would be priced
            // as a base-model one.
            return Err(Error::config(
                "execution.model",
                "linear",
                "the linear model has no LoRA terms; use roofline, measured or profiled \
                 with a LoRA workload",
            ));
        }
        let decode_rows = (shape.num_decode_tokens + shape.num_padding_rows) as f64;
        let whole = self.constant_s
            + self.per_prefill_token_s * shape.num_prefill_tokens as f64
            + self.per_decode_token_s * decode_rows
            + self.per_decode_context_token_s * shape.sum_decode_context as f64
            + self.per_prefill_context_token_s * shape.sum_prefill_context as f64;
        let model_s = whole / num_stages as f64;
        Ok(StageTime {
            total_s: model_s + self.cpu_overhead_s,
            model_s,
        })
    }
}

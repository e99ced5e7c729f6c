//! The per-operation execution-time model (DESIGN "Execution time", seed 000 §13): a batch
//! stage costs the sum over its operations (norms, projections, attention, MLP, all-reduce,
//! pipeline send, ...) of each operation's time, times how often it runs on the stage.
//!
//! Python builds the model (from a model and a GPU for the roofline, or by training on
//! profiles) and hands it over as arrays: each operation's cost is either a roofline
//! (`max(FLOPs / FLOP rate, bytes / bandwidth) + latency`, FLOPs and bytes linear in the
//! batch's features) or a table interpolated over one or two features.

use std::cell::Cell;

use super::{ExecModel, StageTime};
use crate::sim::batch::BatchShape;
use crate::{Error, Result};

/// What an operation's cost depends on, computed once per batch from its [`BatchShape`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    One,
    /// Rows through the GEMMs: prefill + decode tokens + graph padding rows.
    NumTokens,
    NumPrefillTokens,
    NumDecodeTokens,
    NumRequests,
    /// Query-key pairs of the prefill chunks, causal: Σ chunk × prefix + chunk (chunk + 1) / 2.
    PrefillAttentionPairs,
    /// Keys the decode queries read: Σ (context + 1).
    DecodeAttentionKeys,
    /// Keys a prefill query attends to on average (pairs / prefill tokens).
    PrefillMeanContext,
    /// Keys a decode sequence reads on average (a request verifying speculative drafts is
    /// one sequence of several queries over one read of its KV).
    DecodeMeanContext,
    /// Tokens of requests with a LoRA adapter (rows through the shrink/expand kernels).
    NumLoraTokens,
    /// Distinct LoRA adapters in the batch (each adapter's weights are read once).
    NumLoraAdapters,
    /// Decoding sequences: decode tokens less the speculative drafts among them.
    DecodeSequences,
}

const NUM_FEATURES: usize = 12;

impl Feature {
    pub const ALL: [Feature; NUM_FEATURES] = [
        Feature::One,
        Feature::NumTokens,
        Feature::NumPrefillTokens,
        Feature::NumDecodeTokens,
        Feature::NumRequests,
        Feature::PrefillAttentionPairs,
        Feature::DecodeAttentionKeys,
        Feature::PrefillMeanContext,
        Feature::DecodeMeanContext,
        Feature::NumLoraTokens,
        Feature::NumLoraAdapters,
        Feature::DecodeSequences,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Feature::One => "one",
            Feature::NumTokens => "num_tokens",
            Feature::NumPrefillTokens => "num_prefill_tokens",
            Feature::NumDecodeTokens => "num_decode_tokens",
            Feature::NumRequests => "num_requests",
            Feature::PrefillAttentionPairs => "prefill_attention_pairs",
            Feature::DecodeAttentionKeys => "decode_attention_keys",
            Feature::PrefillMeanContext => "prefill_mean_context",
            Feature::DecodeMeanContext => "decode_mean_context",
            Feature::NumLoraTokens => "num_lora_tokens",
            Feature::NumLoraAdapters => "num_lora_adapters",
            Feature::DecodeSequences => "decode_sequences",
        }
    }

    pub fn from_name(name: &str) -> Option<Feature> {
        Feature::ALL.into_iter().find(|f| f.name() == name)
    }
}

/// The features of one batch, indexed by [`Feature`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Features([f64; NUM_FEATURES]);

impl Features {
    pub fn of(shape: &BatchShape) -> Self {
        let prefill = shape.num_prefill_tokens as f64;
        let decode = shape.num_decode_tokens as f64;
        // Σ c (p + c) − (Σ c² − Σ c) / 2 = Σ c p + Σ c (c + 1) / 2.
        let pairs =
            shape.sum_prefill_context as f64 - (shape.sum_prefill_squared as f64 - prefill) / 2.0;
        let keys = (shape.sum_decode_context + shape.num_decode_tokens) as f64;
        let sequences = (shape.num_decode_tokens - shape.num_spec_decode_tokens) as f64;
        Features([
            1.0,
            (shape.num_prefill_tokens + shape.num_decode_tokens + shape.num_padding_rows) as f64,
            prefill,
            decode,
            shape.num_requests as f64,
            pairs,
            keys,
            if prefill > 0.0 { pairs / prefill } else { 0.0 },
            if sequences > 0.0 {
                keys / sequences
            } else {
                0.0
            },
            shape.lora.num_lora_tokens as f64,
            shape.lora.num_adapters as f64,
            sequences,
        ])
    }

    pub fn get(&self, feature: Feature) -> f64 {
        self.0[feature as usize]
    }
}

/// Where an operation runs, and so how many times per batch stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Once per decoder layer held by the stage.
    Layer,
    /// Once on the first stage (the embedding).
    FirstStage,
    /// Once on the last stage (the LM head, sampling).
    LastStage,
    /// Once on every stage but the last (sending activations to the next stage).
    BetweenStages,
    /// Once on every stage.
    EveryStage,
}

impl Scope {
    pub fn from_name(name: &str) -> Option<Scope> {
        Some(match name {
            "layer" => Scope::Layer,
            "first_stage" => Scope::FirstStage,
            "last_stage" => Scope::LastStage,
            "between_stages" => Scope::BetweenStages,
            "every_stage" => Scope::EveryStage,
            _ => return None,
        })
    }
}

/// `max(Σ flops·feature / flops_per_s, Σ bytes·feature / bytes_per_s) + latency_s`.
///
/// Built by [`Roofline::new`], which keeps only the non-zero terms, each already divided
/// by its rate: a batch stage evaluates a dozen of these, and the event loop spends only a
/// couple of microseconds per batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Roofline {
    compute: Vec<(Feature, f64)>,
    memory: Vec<(Feature, f64)>,
    latency_s: f64,
}

impl Roofline {
    /// `flops[f]` and `bytes[f]` per unit of feature `f`; rates per second. `name` (the
    /// operation's) is for errors.
    pub fn new(
        name: &str,
        flops: &[f64; NUM_FEATURES],
        bytes: &[f64; NUM_FEATURES],
        flops_per_s: f64,
        bytes_per_s: f64,
        latency_s: f64,
    ) -> Result<Self> {
        for rate in [flops_per_s, bytes_per_s] {
            if !(rate.is_finite() && rate > 0.0) {
                return Err(Error::config(
                    "execution.ops.roofline",
                    format!("{name}: {rate}"),
                    "rates must be finite numbers > 0",
                ));
            }
        }
        for &v in flops.iter().chain(bytes).chain([&latency_s]) {
            non_negative("execution.ops.roofline", name, v)?;
        }
        let terms = |coefficients: &[f64; NUM_FEATURES], rate: f64| {
            Feature::ALL
                .into_iter()
                .zip(coefficients)
                .filter(|(_, c)| **c != 0.0)
                .map(|(f, c)| (f, c / rate))
                .collect()
        };
        Ok(Roofline {
            compute: terms(flops, flops_per_s),
            memory: terms(bytes, bytes_per_s),
            latency_s,
        })
    }

    fn time(&self, features: &Features) -> f64 {
        let sum = |terms: &[(Feature, f64)]| -> f64 {
            let mut seconds = 0.0;
            for &(f, per_unit) in terms {
                seconds += per_unit * features.get(f);
            }
            seconds
        };
        sum(&self.compute).max(sum(&self.memory)) + self.latency_s
    }
}

/// Seconds at grid points over one feature (`ys` empty) or two (`values[ix · ys.len() + iy]`),
/// interpolated linearly. Below the grid the edge value holds; above it the last segment is
/// extended, never below the edge value (a noisy last segment must not predict less work
/// for a bigger batch).
#[derive(Debug, Clone)]
pub struct Table {
    pub x: Feature,
    pub y: Option<Feature>,
    pub xs: Vec<f64>,
    pub ys: Vec<f64>,
    pub values: Vec<f64>,
    /// The cell each axis's last lookup found: a replica's batches change little from one
    /// to the next, so the next lookup usually lands there and skips the search.
    hints: [Cell<usize>; 2],
    /// The last lookup's feature values (their bits) and answer: the steps of a decode run
    /// change the context, not the tokens, so a table over tokens is asked the same point
    /// step after step (the answer is the same either way).
    memo: Cell<Option<(u64, u64, f64)>>,
}

impl Table {
    pub fn new(
        x: Feature,
        y: Option<Feature>,
        xs: Vec<f64>,
        ys: Vec<f64>,
        values: Vec<f64>,
    ) -> Self {
        Table {
            x,
            y,
            xs,
            ys,
            values,
            hints: [Cell::new(0), Cell::new(0)],
            memo: Cell::new(None),
        }
    }
}

impl PartialEq for Table {
    fn eq(&self, other: &Self) -> bool {
        (self.x, self.y, &self.xs, &self.ys, &self.values)
            == (other.x, other.y, &other.xs, &other.ys, &other.values)
    }
}

/// Where `value` falls on `axis`: cells `i` and `j = i + 1` (both 0 on a one-point axis)
/// and the weight of `j`, which exceeds 1 above the grid. `hint` is the last `j`: tried
/// first, and the answer is the same either way.
fn locate(axis: &[f64], value: f64, hint: &Cell<usize>) -> (usize, usize, f64) {
    if axis.len() == 1 || value <= axis[0] {
        return (0, 0, 0.0);
    }
    let last = axis.len() - 1;
    let h = hint.get();
    let j = if h >= 1 && h <= last && axis[h - 1] < value && (h == last || value <= axis[h]) {
        h
    } else {
        let j = axis.partition_point(|&a| a < value).min(last);
        hint.set(j);
        j
    };
    let i = j - 1;
    (i, j, (value - axis[i]) / (axis[j] - axis[i]))
}

fn lerp(a: f64, b: f64, w: f64) -> f64 {
    a + (b - a) * w
}

impl Table {
    fn time(&self, features: &Features) -> f64 {
        let x = features.get(self.x);
        let y = self.y.map_or(0.0, |y| features.get(y));
        let key = (x.to_bits(), y.to_bits());
        if let Some((kx, ky, value)) = self.memo.get()
            && (kx, ky) == key
        {
            return value;
        }
        let value = self.interpolate(x, y);
        self.memo.set(Some((key.0, key.1, value)));
        value
    }

    /// The table's value at (`x`, `y`) (`y` unused over one feature).
    fn interpolate(&self, x: f64, y: f64) -> f64 {
        let (xi, xj, wx) = locate(&self.xs, x, &self.hints[0]);
        if self.y.is_none() {
            let at = |w: f64| lerp(self.values[xi], self.values[xj], w);
            let value = at(wx);
            // Inside the grid the clamped value is the value: skip it (the hot path).
            return if wx <= 1.0 { value } else { value.max(at(1.0)) };
        }
        let (yi, yj, wy) = locate(&self.ys, y, &self.hints[1]);
        let ny = self.ys.len();
        let row = |x: usize, w: f64| lerp(self.values[x * ny + yi], self.values[x * ny + yj], w);
        let at = |wx: f64, wy: f64| lerp(row(xi, wy), row(xj, wy), wx);
        let value = at(wx, wy);
        if wx <= 1.0 && wy <= 1.0 {
            value
        } else {
            value.max(at(wx.min(1.0), wy.min(1.0)))
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Cost {
    Roofline(Roofline),
    Table(Table),
}

impl Cost {
    fn time(&self, features: &Features) -> f64 {
        match self {
            Cost::Roofline(r) => r.time(features),
            Cost::Table(t) => t.time(features),
        }
    }
}

/// One operation: its cost, how many times it runs where (`count` per `scope`), and the
/// feature that must be non-zero for it to run at all (no decode attention without decodes).
#[derive(Debug, Clone, PartialEq)]
pub struct Op {
    pub name: String,
    pub scope: Scope,
    pub count: f64,
    pub gate: Feature,
    pub cost: Cost,
}

/// A batch stage's time = Σ over operations of count × runs on this stage × cost, plus the
/// CPU overheads (scheduling, input preparation, sampling, output processing) per stage.
#[derive(Debug, Clone, PartialEq)]
pub struct OpModel {
    pub ops: Vec<Op>,
    pub num_layers: u32,
    pub cpu_overhead_s: f64,
}

impl OpModel {
    /// Checks every array: finite non-negative numbers, strictly increasing axes, sizes that
    /// match. `num_stages` must divide the layers.
    pub fn validate(&self, num_stages: u32) -> Result<()> {
        if self.num_layers == 0 || num_stages == 0 || !self.num_layers.is_multiple_of(num_stages) {
            return Err(Error::config(
                "replica.num_pipeline_stages",
                num_stages,
                format!("must divide the model's {} layers", self.num_layers),
            ));
        }
        non_negative("execution.cpu_overhead_s", "", self.cpu_overhead_s)?;
        self.ops.iter().try_for_each(Op::validate)
    }

    /// Seconds of each operation on `stage` (for breakdowns and tests), in model order.
    pub fn op_times(&self, shape: &BatchShape, stage: u32, num_stages: u32) -> Vec<(&str, f64)> {
        let features = Features::of(shape);
        self.ops
            .iter()
            .map(|op| {
                (
                    op.name.as_str(),
                    self.op_time(op, &features, stage, num_stages),
                )
            })
            .collect()
    }

    fn op_time(&self, op: &Op, features: &Features, stage: u32, num_stages: u32) -> f64 {
        let last = stage + 1 == num_stages;
        let runs = match op.scope {
            Scope::Layer => self.num_layers as f64 / num_stages as f64,
            Scope::FirstStage => f64::from(u8::from(stage == 0)),
            Scope::LastStage => f64::from(u8::from(last)),
            Scope::BetweenStages => f64::from(u8::from(!last)),
            Scope::EveryStage => 1.0,
        };
        if runs == 0.0 || features.get(op.gate) == 0.0 {
            return 0.0;
        }
        runs * op.count * op.cost.time(features)
    }
}

impl ExecModel for OpModel {
    fn stage_time(&mut self, shape: &BatchShape, stage: u32, num_stages: u32) -> Result<StageTime> {
        let features = Features::of(shape);
        let mut model_s = 0.0;
        for op in &self.ops {
            model_s += self.op_time(op, &features, stage, num_stages);
        }
        Ok(StageTime {
            total_s: model_s + self.cpu_overhead_s,
            model_s,
        })
    }
}

impl Op {
    fn validate(&self) -> Result<()> {
        let name = self.name.as_str();
        non_negative("execution.ops.count", name, self.count)?;
        match &self.cost {
            Cost::Roofline(_) => Ok(()), // checked by Roofline::new
            Cost::Table(t) => t.validate(name),
        }
    }
}

impl Table {
    fn validate(&self, name: &str) -> Result<()> {
        increasing(name, "xs", &self.xs)?;
        let expected = match self.y {
            Some(_) => {
                increasing(name, "ys", &self.ys)?;
                self.xs.len() * self.ys.len()
            }
            None => self.xs.len(),
        };
        if self.values.len() != expected {
            return Err(Error::config(
                "execution.ops.values",
                format!("{name}: {} values", self.values.len()),
                format!("expected {expected} (one per grid point)"),
            ));
        }
        self.values
            .iter()
            .try_for_each(|&v| non_negative("execution.ops.values", name, v))
    }
}

fn increasing(name: &str, axis: &'static str, values: &[f64]) -> Result<()> {
    let field = if axis == "xs" {
        "execution.ops.xs"
    } else {
        "execution.ops.ys"
    };
    if values.is_empty() {
        return Err(Error::config(
            field,
            format!("{name}: []"),
            "needs at least one point",
        ));
    }
    let ordered = values.windows(2).all(|w| w[0] < w[1]);
    if !ordered || values.iter().any(|v| !v.is_finite()) {
        return Err(Error::config(
            field,
            format!("{name}: {values:?}"),
            "must be finite and strictly increasing",
        ));
    }
    Ok(())
}

fn non_negative(field: &'static str, name: &str, value: f64) -> Result<()> {
    if value.is_finite() && value >= 0.0 {
        return Ok(());
    }
    Err(Error::config(
        field,
        format!("{name}: {value}"),
        "must be a finite number >= 0",
    ))
}

#[cfg(test)]
mod tests;

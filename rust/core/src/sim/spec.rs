//! Speculative decoding in `vllm_v1` replicas (config `[replica.speculative]`,
//! docs/speculative.md). Between steps every request that sampled gets `k` draft tokens
//! (vLLM's engine hands the drafter's proposals to `update_draft_token_ids`); the step
//! scheduler schedules them with the request's next token within its budget and lookahead
//! slots; when the batch ends a seeded draw decides how many drafts the target accepted:
//! accepted + 1 tokens are emitted at once, the rest are rolled back by the scheduler.
//!
//! Owns: the config ([`SpecConfig`]), the acceptance draws ([`AcceptanceSampler`]), the
//! per-replica bookkeeping of drafts in flight ([`SpecDecoder`]) and the pricing of draft
//! work on top of the target's ([`SpecExec`]). Invariant: a request never emits more than
//! its remaining output, and a step's drafts are judged exactly once (or struck off with
//! the step's work when the request is preempted).

use std::collections::VecDeque;

use super::arena::Requests;
use super::batch::BatchShape;
use super::exec::{ExecModel, StageTime};
use super::request::{ReqIdx, SimRequest};
use super::rng::Rng;
use crate::kv::TokenId;
use crate::sched::{PLACEHOLDER_DRAFT, SampledOutput, Scheduler, SchedulerConfig};
use crate::{Error, Result};

/// The most draft tokens per step (vLLM's proposers use a handful).
pub const MAX_SPEC_TOKENS: u32 = 32;

/// Who proposes the drafts; it decides what the draft work costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecMethod {
    /// A smaller model of the catalog: `k` decode passes of it per step.
    DraftModel,
    /// Prompt-lookup n-grams on the CPU: no GPU time.
    Ngram,
    /// Multi-token-prediction head (DeepSeek-V3 style): `k` passes of one layer.
    Mtp,
    /// EAGLE head: `k` passes of one layer.
    Eagle,
}

impl SpecMethod {
    pub const NAMES: [&'static str; 4] = ["draft_model", "ngram", "mtp", "eagle"];

    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    /// KV slots a step reserves past its scheduled tokens for the drafter's own writes
    /// (vLLM 0.33's `VllmConfig.num_lookahead_tokens`): `k` for the drafters with a forward
    /// pass of their own (a draft model, EAGLE, MTP), none for n-gram prompt lookup.
    pub fn num_lookahead_tokens(self, num_speculative_tokens: u32) -> u32 {
        match self {
            Self::Ngram => 0,
            Self::DraftModel | Self::Mtp | Self::Eagle => num_speculative_tokens,
        }
    }

    pub fn parse(name: &str) -> Result<Self> {
        Ok(match name {
            "draft_model" => Self::DraftModel,
            "ngram" => Self::Ngram,
            "mtp" => Self::Mtp,
            "eagle" => Self::Eagle,
            other => {
                return Err(Error::config(
                    "replica.speculative.method",
                    format!("{other:?}"),
                    "must be one of \"draft_model\", \"ngram\", \"mtp\", \"eagle\"",
                ));
            }
        })
    }
}

/// How many of a step's drafts the target accepts.
#[derive(Debug, Clone, PartialEq)]
pub enum Acceptance {
    /// Each draft accepted with probability `alpha`, independently, until the first reject.
    Rate(f64),
    /// Draft `i` accepted with probability `rates[i]` given that drafts `0..i` were.
    PerPosition(Vec<f64>),
    /// `probs[j]`: probability that exactly `j` of `k` drafts are accepted (`k + 1` entries).
    Distribution(Vec<f64>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct SpecConfig {
    pub method: SpecMethod,
    pub num_speculative_tokens: u32,
    pub acceptance: Acceptance,
}

impl SpecConfig {
    pub fn validate(&self) -> Result<()> {
        let k = self.num_speculative_tokens;
        if !(1..=MAX_SPEC_TOKENS).contains(&k) {
            return Err(Error::config(
                "replica.speculative.num_speculative_tokens",
                k,
                format!("must be in [1, {MAX_SPEC_TOKENS}]"),
            ));
        }
        let probability = |key: &'static str, p: f64| {
            if (0.0..=1.0).contains(&p) {
                Ok(())
            } else {
                Err(Error::config(key, p, "must be a probability in [0, 1]"))
            }
        };
        match &self.acceptance {
            Acceptance::Rate(alpha) => probability("replica.speculative.acceptance_rate", *alpha),
            Acceptance::PerPosition(rates) => {
                let key = "replica.speculative.acceptance_rates";
                if rates.len() != k as usize {
                    return Err(Error::config(
                        key,
                        format!("{rates:?}"),
                        format!("needs one rate per draft position (num_speculative_tokens = {k})"),
                    ));
                }
                rates.iter().try_for_each(|&p| probability(key, p))
            }
            Acceptance::Distribution(probs) => {
                let key = "replica.speculative.accepted_distribution";
                if probs.len() != k as usize + 1 {
                    return Err(Error::config(
                        key,
                        format!("{probs:?}"),
                        format!(
                            "needs k + 1 = {} probabilities (0..=k drafts accepted)",
                            k + 1
                        ),
                    ));
                }
                probs.iter().try_for_each(|&p| probability(key, p))?;
                let total: f64 = probs.iter().sum();
                if (total - 1.0).abs() > 1e-6 {
                    return Err(Error::config(
                        key,
                        format!("{probs:?}"),
                        format!("must sum to 1 (sums to {total})"),
                    ));
                }
                Ok(())
            }
        }
    }
}

/// The step scheduler's config with `k` drafts per step and the method's lookahead slots
/// (`SpecMethod::num_lookahead_tokens`), as vLLM reserves them. With `k` set, the scheduler
/// pads a one-token admission to `1 + k` with placeholder drafts as vLLM 0.33 does
/// (`pad_spec_decode`): a request whose prompt was hit or loaded but its last token, or a
/// one-token prompt beside decodes.
pub fn scheduler_config(config: &SchedulerConfig, spec: &SpecConfig) -> SchedulerConfig {
    SchedulerConfig {
        num_lookahead_tokens: spec
            .method
            .num_lookahead_tokens(spec.num_speculative_tokens)
            as usize,
        num_speculative_tokens: spec.num_speculative_tokens as usize,
        ..config.clone()
    }
}

/// The seeded acceptance draws of one replica.
#[derive(Debug, Clone)]
pub struct AcceptanceSampler {
    acceptance: Acceptance,
    rng: Rng,
}

impl AcceptanceSampler {
    /// Replica `replica`'s own stream of `seed` (distinct replicas draw independently).
    pub fn new(acceptance: Acceptance, seed: u64, replica: u32) -> Self {
        // Apart from the router's stream of the same seed.
        const SALT: u64 = 0x5bec_dec0_de00_0000;
        let stream = seed ^ SALT ^ (replica as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        Self {
            acceptance,
            rng: Rng::new(stream),
        }
    }

    /// How many of `num_drafts` drafts the target accepts (a prefix of them). Fewer drafts
    /// than configured (a step's budget cut them) cap the draw.
    pub fn draw(&mut self, num_drafts: u32) -> u32 {
        let rng = &mut self.rng;
        match &self.acceptance {
            Acceptance::Rate(alpha) => (0..num_drafts)
                .take_while(|_| uniform(rng) < *alpha)
                .count() as u32,
            Acceptance::PerPosition(rates) => rates
                .iter()
                .take(num_drafts as usize)
                .take_while(|&&p| uniform(rng) < p)
                .count() as u32,
            Acceptance::Distribution(probs) => {
                let u = uniform(rng);
                let mut cumulative = 0.0;
                let drawn = probs
                    .iter()
                    .position(|&p| {
                        cumulative += p;
                        u < cumulative
                    })
                    // Rounding left the sum a hair under u: the last outcome.
                    .unwrap_or(probs.len() - 1);
                (drawn as u32).min(num_drafts)
            }
        }
    }
}

/// Uniform in [0, 1) with 53 random bits.
fn uniform(rng: &mut Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Per-request speculative-decoding state and counters (zero when it is off).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SpecCounters {
    /// Drafts verified by the batch the request is in: computed there, but they become
    /// output only if accepted (judged at the batch end).
    pub in_flight_drafts: u32,
    /// The request samples at the end of its batch, so the drafter runs for it then.
    pub proposes: bool,
    /// Steps that verified at least one draft.
    pub num_steps: u32,
    /// Drafts verified, and how many the target accepted (as drawn, before a request's
    /// last step trims what it emits to its remaining output, as vLLM counts them).
    pub num_draft_tokens: u32,
    pub num_accepted_tokens: u32,
}

/// A request of a batch in flight that samples at its end, with the drafts it verifies.
#[derive(Debug, Clone, Copy)]
struct Sampler {
    idx: ReqIdx,
    num_drafts: u32,
    /// The drafts are the scheduler's placeholders (a padded admission): never accepted.
    placeholders: bool,
}

/// A `vllm_v1` replica's speculative decoding: drafts per batch in flight and the draws.
pub struct SpecDecoder {
    k: u32,
    sampler: AcceptanceSampler,
    /// Per batch in flight, oldest first (batches of a replica end in formation order).
    in_flight: VecDeque<Vec<Sampler>>,
    spare: Vec<Vec<Sampler>>,
    outputs: Vec<SampledOutput<ReqIdx>>,
}

impl SpecDecoder {
    pub fn new(config: &SpecConfig, seed: u64, replica: u32) -> Self {
        Self {
            k: config.num_speculative_tokens,
            sampler: AcceptanceSampler::new(config.acceptance.clone(), seed, replica),
            in_flight: VecDeque::new(),
            spare: Vec::new(),
            outputs: Vec::new(),
        }
    }

    /// A new batch: `caught_up` sample at its end; `scheduled_drafts` are the drafts the
    /// scheduler put in it (possibly fewer than proposed, when the budget was short).
    pub fn on_schedule(
        &mut self,
        requests: &mut Requests,
        caught_up: &[ReqIdx],
        scheduled_drafts: &[(ReqIdx, Vec<TokenId>)],
    ) {
        let mut list = self.spare.pop().unwrap_or_default();
        // Both lists follow the step's scheduling order, and a request verifying drafts has
        // caught up: one walk pairs them.
        let mut drafts = scheduled_drafts.iter().peekable();
        for &idx in caught_up {
            let (num_drafts, placeholders) = drafts
                .next_if(|(id, _)| *id == idx)
                .map_or((0, false), |(_, d)| {
                    (d.len() as u32, d.first() == Some(&PLACEHOLDER_DRAFT))
                });
            let counters = &mut requests.get_mut(idx).spec;
            counters.in_flight_drafts = num_drafts;
            counters.proposes = true;
            list.push(Sampler {
                idx,
                num_drafts,
                placeholders,
            });
        }
        debug_assert!(
            drafts.next().is_none(),
            "drafts of a request that did not sample"
        );
        self.in_flight.push_back(list);
    }

    /// A preempted request's step is discarded: its drafts are never judged.
    pub fn strike(&mut self, idx: ReqIdx) {
        for list in &mut self.in_flight {
            list.retain(|s| s.idx != idx);
        }
    }

    /// The oldest batch ended (the simulator already advanced each request by its sampled
    /// token): draws each request's accepted drafts, emits them, hands the scheduler the
    /// sampled tokens, the rejections to roll back and the next step's drafts. Returns the
    /// requests that finished.
    pub fn on_batch_end(
        &mut self,
        scheduler: &mut Scheduler<ReqIdx>,
        requests: &mut Requests,
        token: impl Fn(&SimRequest, u64) -> TokenId,
    ) -> Result<Vec<ReqIdx>> {
        let Some(mut list) = self.in_flight.pop_front() else {
            return Err(Error::Internal(
                "vllm_v1: a batch ended that this replica never formed".into(),
            ));
        };
        let max_model_len = scheduler.config().max_model_len;
        self.outputs.clear();
        for s in &list {
            // Placeholders are verified (and counted, as vLLM's spec-decode stats count
            // them) but never accepted.
            let accepted = if s.placeholders {
                0
            } else {
                self.sampler.draw(s.num_drafts)
            };
            let request = requests.get_mut(s.idx);
            request.accept_drafts(accepted);
            let counters = &mut request.spec;
            counters.proposes = false;
            if s.num_drafts > 0 {
                counters.num_steps += 1;
                counters.num_draft_tokens += s.num_drafts;
                counters.num_accepted_tokens += accepted;
            }
            // vLLM's proposers never draft past max_model_len.
            let start = scheduler.get_request(&s.idx).map_or(0, |r| r.num_tokens());
            let num_tokens = start + accepted as usize + 1;
            let next = (self.k as usize).min(max_model_len.saturating_sub(num_tokens));
            // Each token is the one its position stands for (a conversation turn's output
            // is shared with the next turn: `tokens::shared_output_token`); drafts too,
            // as an accepted draft is the token sampled there.
            let request = requests.get(s.idx);
            let at = |position: usize| token(request, position as u64);
            self.outputs.push(SampledOutput {
                request_id: s.idx,
                token_ids: (start..num_tokens).map(at).collect(),
                num_rejected_tokens: (s.num_drafts - accepted) as usize,
                spec_token_ids: (num_tokens..num_tokens + next).map(at).collect(),
            });
        }
        list.clear();
        self.spare.push(list);
        let finished = scheduler.update_from_output(&self.outputs)?;
        Ok(finished.into_iter().map(|(idx, _)| idx).collect())
    }
}

/// What a step's draft work costs on top of the target's.
pub enum DraftPricing<'a> {
    /// `ngram`: proposed on the CPU; not priced.
    Free,
    /// `draft_model`: `k` decode passes of the draft model (its own execution model).
    DraftModel(Box<dyn ExecModel + 'a>),
    /// `mtp` / `eagle`: `k` passes of a one-layer head, priced as the target's decode time
    /// for the proposing rows times `layer_fraction` (1 / the target's layer count).
    TargetLayer { layer_fraction: f64 },
}

impl<'a> DraftPricing<'a> {
    /// The pricing `method` needs: `draft_model` needs the draft model's execution model,
    /// `mtp` and `eagle` the fraction of the target one layer is.
    pub fn for_method(
        method: SpecMethod,
        draft_model: Option<Box<dyn ExecModel + 'a>>,
        layer_fraction: Option<f64>,
    ) -> Result<Self> {
        match method {
            SpecMethod::Ngram => Ok(Self::Free),
            SpecMethod::DraftModel => draft_model.map(Self::DraftModel).ok_or_else(|| {
                Error::config(
                    "replica.speculative.draft_model",
                    "none",
                    "the draft_model method needs the draft model's execution model",
                )
            }),
            SpecMethod::Mtp | SpecMethod::Eagle => match layer_fraction {
                Some(f) if f > 0.0 && f <= 1.0 => Ok(Self::TargetLayer { layer_fraction: f }),
                other => Err(Error::config(
                    "replica.speculative.method",
                    format!("{other:?}"),
                    "mtp and eagle heads are priced as one target layer: give the fraction \
                     of the target one layer is, in (0, 1]",
                )),
            },
        }
    }
}

/// The target's execution model plus the draft passes of each batch, charged on the last
/// pipeline stage (the drafter runs after the target has sampled).
pub struct SpecExec<'a> {
    pub target: &'a mut dyn ExecModel,
    pub draft: DraftPricing<'a>,
    pub num_speculative_tokens: u32,
}

impl SpecExec<'_> {
    /// The shape of draft pass `pass`: one decode row per proposing request, reading its
    /// context plus the drafts already proposed this step.
    fn pass_shape(shape: &BatchShape, pass: u32) -> BatchShape {
        let rows = shape.num_draft_rows as u64;
        BatchShape {
            num_requests: shape.num_draft_rows,
            num_decode_tokens: rows,
            sum_decode_context: shape.sum_draft_context + rows * pass as u64,
            ..BatchShape::default()
        }
    }

    fn draft_time(&mut self, shape: &BatchShape) -> Result<f64> {
        let mut total = 0.0;
        for pass in 0..self.num_speculative_tokens {
            let pass_shape = Self::pass_shape(shape, pass);
            total += match &mut self.draft {
                DraftPricing::Free => 0.0,
                DraftPricing::DraftModel(model) => model.stage_time(&pass_shape, 0, 1)?.model_s,
                DraftPricing::TargetLayer { layer_fraction } => {
                    // One layer's worth of the whole target's model time for these rows,
                    // priced as one stage so the embedding and the LM head count once
                    // whatever the pipeline (the same draft cost at PP 1 and PP 2).
                    let whole = self.target.stage_time(&pass_shape, 0, 1)?;
                    whole.model_s * *layer_fraction
                }
            };
        }
        Ok(total)
    }
}

impl ExecModel for SpecExec<'_> {
    fn stage_time(&mut self, shape: &BatchShape, stage: u32, num_stages: u32) -> Result<StageTime> {
        let mut time = self.target.stage_time(shape, stage, num_stages)?;
        if stage + 1 == num_stages && shape.num_draft_rows > 0 {
            let draft = self.draft_time(shape)?;
            time.total_s += draft;
            time.model_s += draft;
        }
        Ok(time)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::LinearModel;

    fn rate(alpha: f64, k: u32) -> SpecConfig {
        SpecConfig {
            method: SpecMethod::Ngram,
            num_speculative_tokens: k,
            acceptance: Acceptance::Rate(alpha),
        }
    }

    #[test]
    fn iid_draws_match_the_closed_form_mean() {
        // E[accepted + 1] = (1 - a^(k+1)) / (1 - a); 200k draws: the standard error is
        // below 0.003 for these (a, k), so 0.02 is > 6 sigma (and the seed is fixed).
        for (alpha, k) in [(0.5, 1), (0.7, 3), (0.9, 5)] {
            let mut s = AcceptanceSampler::new(Acceptance::Rate(alpha), 1, 0);
            let n = 200_000;
            let sum: u64 = (0..n).map(|_| s.draw(k) as u64 + 1).sum();
            let mean = sum as f64 / n as f64;
            let expected = (1.0 - f64::powi(alpha, k as i32 + 1)) / (1.0 - alpha);
            assert!(
                (mean - expected).abs() < 0.02,
                "{alpha} {k}: {mean} vs {expected}"
            );
        }
    }

    #[test]
    fn draws_stay_within_the_drafts_and_the_distribution_is_followed() {
        let mut s = AcceptanceSampler::new(Acceptance::Distribution(vec![0.0, 0.0, 1.0]), 3, 1);
        assert_eq!(s.draw(2), 2);
        assert_eq!(s.draw(1), 1, "a budget-cut step caps the draw");
        let mut s = AcceptanceSampler::new(Acceptance::PerPosition(vec![1.0, 0.0, 1.0]), 3, 1);
        assert_eq!(s.draw(3), 1, "stops at the first rejected position");
        let mut s = AcceptanceSampler::new(Acceptance::Rate(1.0), 3, 1);
        assert_eq!(s.draw(4), 4);
        assert_eq!(s.draw(0), 0);
    }

    #[test]
    fn bad_configs_name_their_key() {
        let cases = [
            (rate(0.5, 0), "num_speculative_tokens"),
            (rate(1.5, 2), "acceptance_rate"),
            (
                SpecConfig {
                    acceptance: Acceptance::PerPosition(vec![0.5]),
                    ..rate(0.5, 2)
                },
                "acceptance_rates",
            ),
            (
                SpecConfig {
                    acceptance: Acceptance::Distribution(vec![0.5, 0.4, 0.0]),
                    ..rate(0.5, 2)
                },
                "accepted_distribution",
            ),
        ];
        for (config, key) in cases {
            let err = config.validate().unwrap_err().to_string();
            assert!(err.contains(&format!("replica.speculative.{key}")), "{err}");
        }
        assert!(SpecMethod::parse("medusa").is_err());
        assert_eq!(SpecMethod::parse("eagle").unwrap(), SpecMethod::Eagle);
        // vLLM 0.33 reserves lookahead slots for drafters with a forward pass only.
        assert_eq!(SpecMethod::Ngram.num_lookahead_tokens(4), 0);
        for method in [SpecMethod::DraftModel, SpecMethod::Mtp, SpecMethod::Eagle] {
            assert_eq!(method.num_lookahead_tokens(4), 4);
        }
    }

    #[test]
    fn draft_passes_are_charged_on_the_last_stage_only() {
        let mut target = LinearModel::default();
        let shape = BatchShape {
            num_requests: 2,
            num_decode_tokens: 6,
            sum_decode_context: 600,
            num_draft_rows: 2,
            sum_draft_context: 206,
            ..BatchShape::default()
        };
        let alone = target.stage_time(&shape, 1, 2).unwrap();
        let first = target.stage_time(&shape, 0, 2).unwrap();
        let mut exec = SpecExec {
            target: &mut target,
            draft: DraftPricing::DraftModel(Box::new(LinearModel::default())),
            num_speculative_tokens: 2,
        };
        assert_eq!(exec.stage_time(&shape, 0, 2).unwrap(), first);
        let last = exec.stage_time(&shape, 1, 2).unwrap();
        // Two passes of 2 rows: contexts 206 then 208.
        let d = LinearModel::default();
        let pass = |ctx: f64| {
            d.constant_s + 2.0 * d.per_decode_token_s + ctx * d.per_decode_context_token_s
        };
        let expected = alone.total_s + pass(206.0) + pass(208.0);
        assert!(
            (last.total_s - expected).abs() < 1e-12,
            "{last:?} {expected}"
        );
        let mut free = SpecExec {
            target: &mut LinearModel::default(),
            draft: DraftPricing::Free,
            num_speculative_tokens: 2,
        };
        assert_eq!(free.stage_time(&shape, 1, 2).unwrap(), alone);
    }
}

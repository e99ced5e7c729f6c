//! The discrete-event loop (seed 000 §1, §11, §13). Arrivals are routed by the global
//! scheduler; each replica forms batches while it has fewer than `num_stages` in flight;
//! a batch passes its pipeline stages in order (a stage runs one batch at a time, the
//! others queue), and only the last stage completes it. Events at the same time run in
//! the order they were created, so a run is a pure function of the config and the input.

mod arrivals;
mod build;
mod disagg;
mod events;
mod lazy;
#[cfg(test)]
mod test_log;
#[cfg(test)]
pub(crate) use test_log::{lazy_steps, take_kv_event_log};

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use super::arena::Requests;
use super::batch::{Batch, BatchShape};
use super::config::SimConfig;
use super::disagg::Links;
use super::exec::ExecModel;
use super::global::{ReplicaLoad, RouteInfo, RoutePlugin, Router};
use super::host_tier::HostPorts;
use super::lora;
use super::metrics::{GapHistogram, ReplicaTotals, RequestTable, Samples, StageTrace};
use super::replica::ReplicaPolicy;
use super::request::{ReqIdx, SimRequest};
use super::sessions::{Sessions, Turn};
use super::tokens::prompt_block_hashes;
use crate::{Error, Result};
use events::EventQueue;

/// A request as the workload delivers it.
#[derive(Debug, Clone, PartialEq)]
pub struct ArrivingRequest {
    pub arrived_at: f64,
    pub num_prefill_tokens: u32,
    pub num_decode_tokens: u32,
    pub hash_ids: Vec<u64>,
    /// The conversation (or agent run) this request is a turn of; `None`: independent.
    /// See `super::sessions` for when a turn is sent.
    pub session: Option<u64>,
    /// Think / tool time: a later turn of a session is sent this long after the previous
    /// turn completes; under closed-loop load, a session's first turn waits this long after
    /// its user's previous session ended.
    pub delay_s: f64,
    /// The LoRA adapter the request runs with (`None`: the base model).
    pub lora_id: Option<u64>,
}

impl ArrivingRequest {
    /// An independent request (no session).
    pub fn new(arrived_at: f64, num_prefill_tokens: u32, num_decode_tokens: u32) -> Self {
        Self {
            arrived_at,
            num_prefill_tokens,
            num_decode_tokens,
            hash_ids: Vec::new(),
            session: None,
            delay_s: 0.0,
            lora_id: None,
        }
    }
}

/// Where requests come from, a chunk at a time (the trace is never held whole).
pub trait RequestSource: Send {
    /// The next requests in arrival order, or `None` at the end.
    fn next_chunk(&mut self) -> Result<Option<Vec<ArrivingRequest>>>;

    /// Called before each chunk is pulled, with the number of requests completed so far.
    fn progress(&mut self, _num_completed: u64) -> Result<()> {
        Ok(())
    }
}

/// Everything a run produced.
#[derive(Debug, Default)]
pub struct SimOutput {
    pub requests: RequestTable,
    pub token_gaps: GapHistogram,
    pub samples: Samples,
    pub stages: Option<StageTrace>,
    pub replicas: ReplicaTotals,
    /// Time of the last event.
    pub makespan: f64,
    pub num_events: u64,
    pub num_batches: u64,
    /// Requests left out as longer than a replica can serve (`OverLength::Skip`).
    pub num_skipped_over_length: u64,
}

#[derive(Debug, Clone, Copy)]
enum EventKind {
    /// The stream's next request (open loop), still at the front of the chunk.
    Arrival,
    /// A request whose send time depended on other requests (a later turn of a session, or
    /// closed-loop load), held in `Simulator::deferred`.
    TurnArrival {
        key: u64,
    },
    ReplicaSchedule {
        replica: u32,
    },
    StageArrival {
        replica: u32,
        stage: u32,
        batch: u64,
    },
    StageSchedule {
        replica: u32,
        stage: u32,
    },
    StageEnd {
        replica: u32,
        stage: u32,
        batch: u64,
    },
    BatchEnd {
        replica: u32,
        batch: u64,
    },
    /// A request's KV load into `replica` has landed: from `source` (a prefill replica),
    /// from the replica's host tier, or both.
    KvLanded {
        replica: u32,
        source: Option<u32>,
        request: ReqIdx,
    },
}

struct Replica {
    policy: Box<dyn ReplicaPolicy>,
    /// Pipeline stages (each pool has its own layout) and whether it is a decode replica,
    /// priced by the decode pool's execution model.
    num_stages: u32,
    decode: bool,
    num_running_batches: u32,
    stage_queues: Vec<VecDeque<u64>>,
    stage_busy: Vec<bool>,
    last_sample_at: f64,
    /// The decode window whose requests are settled lazily, if any (`lazy`).
    lazy: Option<lazy::Ledger>,
}

/// Completed requests between two progress reports.
const PROGRESS_EVERY: usize = 4096;

pub struct Simulator<'a> {
    config: SimConfig,
    exec: &'a mut dyn ExecModel,
    /// The decode pool's execution model (its device and layout); `exec` without one.
    decode_exec: Option<&'a mut dyn ExecModel>,
    /// Replicas `0..num_prefill` take arrivals (all of them without disaggregation); the
    /// rest are the decode pool, routed to by `decode_router`.
    num_prefill: usize,
    decode_router: Option<Router>,
    links: Option<Links>,
    /// The replicas' host-tier links (`[replica.kv_offload]`), if any replica has a tier.
    host_ports: Option<HostPorts>,
    requests: Requests,
    replicas: Vec<Replica>,
    router: Router,
    events: EventQueue<EventKind>,
    /// Epoch vectors of ended batches, for the next batches.
    spare_epochs: Vec<Vec<u32>>,
    now: f64,
    batches: FxHashMap<u64, Batch>,
    next_batch_id: u64,
    chunk: VecDeque<ArrivingRequest>,
    next_request_id: u64,
    last_arrival: f64,
    source_done: bool,
    progress_due: bool,
    route_plugin: Option<Box<dyn RoutePlugin + 'a>>,
    sessions: Sessions,
    deferred: FxHashMap<u64, Turn>,
    next_deferred_key: u64,
    out: SimOutput,
}

impl<'a> Simulator<'a> {
    /// Runs until every request has completed.
    pub fn run(mut self, source: &mut dyn RequestSource) -> Result<SimOutput> {
        self.schedule_next_arrival(source)?;
        while let Some(event) = self.events.pop() {
            self.now = event.time;
            self.out.num_events += 1;
            self.handle(event.kind, source)?;
            if self.progress_due {
                self.progress_due = false;
                source.progress(self.out.requests.len() as u64)?;
            }
        }
        if let Some(stuck) = self.requests.first_live() {
            return Err(Error::Stalled(format!(
                "the simulation stalled: {} requests are left that no replica will run, \
                     the first request {} ({} prompt tokens{}, {} output, {} processed, on \
                     replica {}); a {} replica never schedules it (e.g. a restart grew its \
                     prompt past a batch limit)",
                self.requests.num_live(),
                stuck.id,
                stuck.num_prefill_tokens,
                if stuck.num_restarts > 0 {
                    format!(" after {} restarts", stuck.num_restarts)
                } else {
                    String::new()
                },
                stuck.num_decode_tokens,
                stuck.num_processed_tokens,
                stuck.replica,
                self.config.replica_policy.name()
            )));
        }
        source.progress(self.out.requests.len() as u64)?;
        for (r, replica) in self.replicas.iter().enumerate() {
            let allocated = replica.policy.num_allocated_blocks();
            if allocated > 0 {
                return Err(Error::Internal(format!(
                    "replica {r} still holds {allocated} KV blocks after every request was \
                     released (blocks leaked)"
                )));
            }
            let (offloaded, loaded) = replica.policy.host_tier_blocks();
            self.out.replicas.host_offloaded_blocks[r] = offloaded;
            self.out.replicas.host_loaded_blocks[r] = loaded;
        }
        self.out.requests.finish();
        self.out.makespan = self.now;
        self.out.num_batches = self.next_batch_id;
        Ok(self.out)
    }

    fn push(&mut self, time: f64, kind: EventKind) {
        let class = u8::from(!matches!(
            kind,
            EventKind::Arrival | EventKind::TurnArrival { .. }
        ));
        self.events.push(self.now, time, class, kind);
    }

    fn handle(&mut self, kind: EventKind, source: &mut dyn RequestSource) -> Result<()> {
        match kind {
            EventKind::Arrival => self.on_arrival(source),
            EventKind::TurnArrival { key } => {
                let turn = self.deferred.remove(&key).expect("a deferred turn");
                self.admit(turn, source)
            }
            EventKind::ReplicaSchedule { replica } => self.on_replica_schedule(replica),
            EventKind::StageArrival {
                replica,
                stage,
                batch,
            } => {
                self.replicas[replica as usize].stage_queues[stage as usize].push_back(batch);
                self.push(self.now, EventKind::StageSchedule { replica, stage });
                Ok(())
            }
            EventKind::StageSchedule { replica, stage } => self.on_stage_schedule(replica, stage),
            EventKind::StageEnd {
                replica,
                stage,
                batch,
            } => {
                self.replicas[replica as usize].stage_busy[stage as usize] = false;
                self.push(self.now, EventKind::StageSchedule { replica, stage });
                let next = if stage + 1 == self.replicas[replica as usize].num_stages {
                    EventKind::BatchEnd { replica, batch }
                } else {
                    EventKind::StageArrival {
                        replica,
                        stage: stage + 1,
                        batch,
                    }
                };
                self.push(self.now, next);
                Ok(())
            }
            EventKind::BatchEnd { replica, batch } => self.on_batch_end(replica, batch, source),
            EventKind::KvLanded {
                replica,
                source,
                request,
            } => self.on_kv_landed(replica, source, request),
        }
    }

    /// What a router sees of `replicas`; queued prompt tokens cost a pass over each queue,
    /// so they are counted only when the router reads them.
    fn loads(&self, replicas: std::ops::Range<usize>, queued_tokens: bool) -> Vec<ReplicaLoad> {
        self.replicas[replicas]
            .iter()
            .map(|r| ReplicaLoad {
                num_pending: r.policy.num_pending(),
                num_outstanding: r.policy.num_outstanding(),
                queued_prefill_tokens: if queued_tokens {
                    r.policy.pending_prefill_tokens(&self.requests)
                } else {
                    0
                },
                kv_usage: r.policy.kv_usage(),
            })
            .collect()
    }

    fn route(&mut self, request: &SimRequest) -> Result<usize> {
        let queued_tokens =
            self.route_plugin.is_some() || self.config.global_policy.needs_queued_tokens();
        let loads = self.loads(0..self.num_prefill, queued_tokens);
        if let Some(plugin) = &mut self.route_plugin {
            let info = RouteInfo {
                request_id: request.id,
                arrived_at: request.arrived_at,
                num_prefill_tokens: request.num_prefill_tokens,
                num_decode_tokens: request.num_decode_tokens,
                hash_ids: &request.hash_ids,
            };
            let replica = plugin.route(&info, &loads)?;
            if replica >= loads.len() {
                return Err(Error::Plugin(format!(
                    "the routing plugin chose replica {replica} of {}",
                    loads.len()
                )));
            }
            return Ok(replica);
        }
        let hash_block_size = self.config.hash_block_size;
        Ok(self.router.route_hashed(&loads, |block_size| {
            prompt_block_hashes(
                request.id,
                request.num_prefill_tokens,
                request.original_prefill_tokens,
                &request.hash_ids,
                hash_block_size,
                block_size,
                request.lora_id,
            )
        }))
    }

    fn on_replica_schedule(&mut self, replica: u32) -> Result<()> {
        let r = replica as usize;
        while self.replicas[r].num_running_batches < self.replicas[r].num_stages {
            // A lazily settled window's requests are brought up to date before a batch
            // that is not its next step is formed (the policy may read or restart them).
            let lazy = self.replicas[r].lazy.is_some()
                && self.replicas[r].policy.next_batch_continues_window();
            if !lazy && let Some(ledger) = self.replicas[r].lazy.take() {
                ledger.settle_all(&mut self.requests);
            }
            let Some(plan) = self.replicas[r].policy.next_batch(&mut self.requests)? else {
                break;
            };
            if plan.0.is_empty() {
                break;
            }
            let window_step = self.replicas[r].policy.batch_is_window_step();
            let padding = self.replicas[r].policy.padding_rows(&plan, &self.requests);
            let (ids, num_tokens) = plan;
            let lora = self.replicas[r]
                .policy
                .lora_shape(&ids, &num_tokens, &self.requests)?;
            let mut shape = BatchShape::default();
            let mut epochs = self.spare_epochs.pop().unwrap_or_default();
            epochs.clear();
            // The requests of the batch that are not settled lazily: all, or those a lazy
            // window step admitted (listed last).
            let mut first_stepped = 0;
            if let Some(ledger) = self.replicas[r].lazy.as_ref() {
                let admitted = self.replicas[r].policy.window_step_admissions();
                if !window_step || ids.len() != ledger.len() + admitted {
                    return Err(Error::Internal(format!(
                        "replica {r}: a decode window's next step has {} requests, {} were \
                         left in it and it admitted {admitted}",
                        ids.len(),
                        ledger.len()
                    )));
                }
                shape = ledger.shape();
                first_stepped = ledger.len();
            }
            {
                // One pass over the batch's requests: its shape (read before they are
                // marked scheduled, which it does not look at), their marks and restart
                // counts.
                for (&idx, &n) in ids[first_stepped..]
                    .iter()
                    .zip(&num_tokens[first_stepped..])
                {
                    let request = self.requests.get_mut(idx);
                    shape.add(request, n);
                    request.on_batch_schedule(self.now);
                    epochs.push(request.num_restarts);
                }
            }
            shape.num_padding_rows = padding;
            shape.lora = lora;
            let id = self.next_batch_id;
            self.next_batch_id += 1;
            self.sample(r, ids.len());
            self.record_batch(r, &shape);
            self.batches.insert(
                id,
                Batch {
                    id,
                    replica,
                    requests: ids,
                    num_tokens,
                    epochs,
                    shape,
                    stage_time: None,
                    window_step,
                    lazy,
                },
            );
            self.replicas[r].num_running_batches += 1;
            self.push(
                self.now,
                EventKind::StageArrival {
                    replica,
                    stage: 0,
                    batch: id,
                },
            );
        }
        if self.replicas[r].decode || self.host_ports.is_some() {
            self.start_kv_loads(r)?;
        }
        Ok(())
    }

    fn on_stage_schedule(&mut self, replica: u32, stage: u32) -> Result<()> {
        let (r, s) = (replica as usize, stage as usize);
        if self.replicas[r].stage_busy[s] {
            return Ok(());
        }
        let Some(batch_id) = self.replicas[r].stage_queues[s].pop_front() else {
            return Ok(());
        };
        self.replicas[r].stage_busy[s] = true;
        let batch = self.batches.get_mut(&batch_id).expect("a batch in flight");
        let num_stages = self.replicas[r].num_stages;
        let exec = match &mut self.decode_exec {
            Some(decode) if self.replicas[r].decode => &mut **decode,
            _ => &mut *self.exec,
        };
        let time = exec.stage_time(&batch.shape, stage, num_stages)?;
        let time = lora::with_load(time, &batch.shape.lora);
        if !(time.total_s.is_finite() && time.total_s >= 0.0 && time.model_s.is_finite()) {
            return Err(Error::Plugin(format!(
                "the execution-time model returned {} s for a batch stage: times must be \
                 finite and >= 0",
                time.total_s
            )));
        }
        if num_stages == 1 {
            // Charged when the batch ends, in that pass over its requests: between its one
            // stage and its end no other stage runs any of them (a one-stage replica runs
            // one batch at a time), so each request's sum takes the same terms in the same
            // order.
            batch.stage_time = Some(time);
        } else {
            for &idx in &batch.requests {
                let timing = &mut self.requests.get_mut(idx).timing;
                timing.execution_time += time.total_s;
                timing.model_execution_time += time.model_s;
            }
        }
        self.out.replicas.busy_time[r] += time.total_s;
        if let Some(trace) = &mut self.out.stages {
            trace.replica.push(replica);
            trace.stage.push(stage);
            trace.batch_id.push(batch_id);
            trace.start.push(self.now);
            trace.duration.push(time.total_s);
            trace.num_requests.push(batch.shape.num_requests);
            trace
                .num_prefill_tokens
                .push(batch.shape.num_prefill_tokens);
            trace.num_decode_tokens.push(batch.shape.num_decode_tokens);
        }
        self.push(
            self.now + time.total_s,
            EventKind::StageEnd {
                replica,
                stage,
                batch: batch_id,
            },
        );
        Ok(())
    }

    fn on_batch_end(
        &mut self,
        replica: u32,
        batch_id: u64,
        source: &mut dyn RequestSource,
    ) -> Result<()> {
        let r = replica as usize;
        let batch = self.batches.remove(&batch_id).expect("a batch in flight");
        // The requests past the lazily settled ones: all of a stepped batch, those a lazy
        // window step admitted.
        let first_stepped = batch.requests.len() - batch.epochs.len();
        let mut ledger = if batch.lazy {
            let (ledger, time) = (self.replicas[r].lazy.take(), batch.stage_time);
            let (Some(mut ledger), Some(time)) = (ledger, time) else {
                return Err(Error::Internal(
                    "a lazily settled decode step ended without its window or its time".into(),
                ));
            };
            ledger.end_step(self.now, time, &mut self.out.token_gaps);
            Some(ledger)
        } else {
            // A window step's requests that took a token at its end may be settled lazily
            // from here on (`lazy`), if every one of them did.
            batch.window_step.then(|| lazy::Ledger::start(self.now))
        };
        // A lazy step's ledger owes its members steps: it is kept, and the replica ends the
        // window if an admission does not join it (a prefill chunk).
        let droppable = !batch.lazy;
        for ((&idx, &n), &epoch) in batch.requests[first_stepped..]
            .iter()
            .zip(&batch.num_tokens[first_stepped..])
            .zip(&batch.epochs)
        {
            let request = self.requests.get_mut(idx);
            if let Some(time) = batch.stage_time {
                request.timing.execution_time += time.total_s;
                request.timing.model_execution_time += time.model_s;
            }
            if request.num_restarts != epoch {
                if droppable {
                    ledger = None;
                }
                continue; // restarted while this batch ran: its work is discarded
            }
            let first_token = request.timing.first_token_at.is_nan();
            let (completed, gap) = request.on_batch_end(self.now, n);
            if let Some(gap) = gap {
                self.out.token_gaps.record(gap);
            }
            // Its first token gives no gap, but it took one now all the same.
            let took = gap.is_some() || (first_token && !request.timing.first_token_at.is_nan());
            match (&mut ledger, completed, took) {
                (Some(ledger), false, true) => ledger.add(idx, request),
                (Some(_), false, false) if droppable => ledger = None,
                _ => {}
            }
        }
        self.replicas[r].lazy = ledger.filter(|l| l.len() > 0);
        self.replicas[r].num_running_batches -= 1;
        let released = self.replicas[r]
            .policy
            .on_batch_end(&mut self.requests, &batch)?;
        for idx in released {
            // An admission that finished at its first step was never lazy.
            if batch.lazy
                && !batch.requests[first_stepped..].contains(&idx)
                && let Some(ledger) = &mut self.replicas[r].lazy
            {
                ledger.settle_one(idx, &mut self.requests)?;
            }
            self.release(idx, source)?;
            if self.out.requests.len().is_multiple_of(PROGRESS_EVERY) {
                self.progress_due = true;
            }
        }
        let Batch {
            requests: ids,
            num_tokens,
            epochs,
            ..
        } = batch;
        self.replicas[r].policy.recycle((ids, num_tokens));
        if self.spare_epochs.len() < 4 {
            self.spare_epochs.push(epochs);
        }
        let events = self.replicas[r].policy.drain_kv_events();
        #[cfg(test)]
        test_log::log_kv_events(r, batch_id, &events);
        if !events.is_empty() {
            match &mut self.decode_router {
                Some(router) if r >= self.num_prefill => {
                    router.on_kv_events(r - self.num_prefill, &events)
                }
                _ => self.router.on_kv_events(r, &events),
            }
        }
        self.push(self.now, EventKind::ReplicaSchedule { replica });
        Ok(())
    }

    fn release(&mut self, idx: ReqIdx, source: &mut dyn RequestSource) -> Result<()> {
        if self.decode_router.is_some() && !self.requests.get(idx).completed {
            return self.hand_over(idx);
        }
        let request = self.requests.remove(idx);
        if !request.completed {
            return Err(Error::Plugin(format!(
                "replica scheduler released request {} before it completed ({} of {} tokens)",
                request.id,
                request.num_processed_tokens,
                request.total_tokens()
            )));
        }
        self.out.requests.push(&request);
        if request.session.is_some() || self.sessions.is_closed_loop() {
            self.on_turn_done(request.session, source)?;
        }
        Ok(())
    }

    fn sample(&mut self, r: usize, batch_size: usize) {
        let interval = self.config.sample_interval_s;
        let replica = &mut self.replicas[r];
        if self.now - replica.last_sample_at < interval {
            return;
        }
        replica.last_sample_at = self.now;
        let samples = &mut self.out.samples;
        samples.time.push(self.now);
        samples.replica.push(r as u32);
        samples.kv_usage.push(replica.policy.kv_usage());
        samples.batch_size.push(batch_size as u32);
        samples
            .num_outstanding
            .push(replica.policy.num_outstanding() as u32);
    }

    fn record_batch(&mut self, r: usize, shape: &BatchShape) {
        let totals = &mut self.out.replicas;
        totals.num_batches[r] += 1;
        totals.sum_batch_size[r] += shape.num_requests as u64;
        totals.num_prefill_tokens[r] += shape.num_prefill_tokens;
        totals.num_decode_tokens[r] += shape.num_decode_tokens;
        totals.record_lora(r, &shape.lora, self.replicas[r].num_stages);
    }
}

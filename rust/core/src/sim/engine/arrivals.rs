//! Arrivals: reading the request stream, sending each request when its time (or its
//! session's previous turn, or a free closed-loop user) says, and admitting it to a
//! replica (`super::super::sessions` decides the send times).

use super::{ArrivingRequest, EventKind, RequestSource, Simulator};
use crate::sim::config::OverLength;
use crate::sim::lora;
use crate::sim::request::SimRequest;
use crate::sim::sessions::{Intake, Next, Turn};
use crate::{Error, Result};

impl Simulator<'_> {
    /// Pulls the next chunk from the source while the current one is used up.
    fn refill(&mut self, source: &mut dyn RequestSource) -> Result<()> {
        while self.chunk.is_empty() && !self.source_done {
            source.progress(self.out.requests.len() as u64)?;
            match source.next_chunk()? {
                Some(chunk) => self.chunk.extend(chunk),
                None => self.source_done = true,
            }
        }
        Ok(())
    }

    /// Open loop: queues the stream's next lead (a request on its own or a session's first
    /// turn) at its arrival time; later turns read on the way are parked or released by
    /// `Sessions::follow`. Closed loop: free users take sessions.
    pub(super) fn schedule_next_arrival(&mut self, source: &mut dyn RequestSource) -> Result<()> {
        if self.sessions.is_closed_loop() {
            return self.fill_users(source);
        }
        loop {
            self.refill(source)?;
            let Some(next) = self.chunk.front() else {
                return Ok(());
            };
            check_arriving(next, self.next_request_id)?;
            match self.sessions.classify(next) {
                Intake::Lead => {
                    let time = next.arrived_at;
                    self.check_order(time)?;
                    self.push(time, EventKind::Arrival);
                    return Ok(());
                }
                Intake::Follow => {
                    let (id, request) = self.pop_stream();
                    if let Some((time, turn)) = self.sessions.follow(id, request, self.now) {
                        self.push_turn(time, turn);
                    }
                }
            }
        }
    }

    /// Closed loop: each free user takes the stream's next session (its turns are
    /// consecutive in the stream and read at once).
    fn fill_users(&mut self, source: &mut dyn RequestSource) -> Result<()> {
        while self.sessions.has_free_user() {
            self.refill(source)?;
            let Some(next) = self.chunk.front() else {
                return Ok(());
            };
            check_arriving(next, self.next_request_id)?;
            self.check_order(next.arrived_at)?;
            let (id, request) = self.pop_stream();
            let session = request.session;
            let mut rest = Vec::new();
            while let Some(s) = session {
                self.refill(source)?;
                match self.chunk.front() {
                    Some(next) if next.session == Some(s) => {
                        check_arriving(next, self.next_request_id)?;
                        let (id, request) = self.pop_stream();
                        rest.push(Turn {
                            id,
                            request,
                            turn: 0,
                        });
                    }
                    _ => break,
                }
            }
            let lead = Turn {
                id,
                request,
                turn: 0,
            };
            if let Some((time, turn)) = self.sessions.start_session(lead, rest, self.now)? {
                self.push_turn(time, turn);
            }
        }
        Ok(())
    }

    fn check_order(&mut self, arrived_at: f64) -> Result<()> {
        if arrived_at < self.last_arrival {
            let id = self.next_request_id;
            return Err(Error::input(
                "arrived_at",
                arrived_at,
                format!(
                    "request {id} arrives before the previous one ({}): arrivals must \
                     be in time order",
                    self.last_arrival
                ),
            ));
        }
        self.last_arrival = arrived_at;
        Ok(())
    }

    /// The stream's next request with its id (its position in the stream).
    fn pop_stream(&mut self) -> (u64, ArrivingRequest) {
        let request = self.chunk.pop_front().expect("a request in the chunk");
        let id = self.next_request_id;
        self.next_request_id += 1;
        (id, request)
    }

    fn push_turn(&mut self, time: f64, turn: Turn) {
        let key = self.next_deferred_key;
        self.next_deferred_key += 1;
        self.deferred.insert(key, turn);
        self.push(time, EventKind::TurnArrival { key });
    }

    pub(super) fn on_arrival(&mut self, source: &mut dyn RequestSource) -> Result<()> {
        let (id, request) = self.pop_stream();
        let turn = self.sessions.begin(request.session);
        self.admit(Turn { id, request, turn }, source)?;
        self.schedule_next_arrival(source)
    }

    /// A request is sent: checked against the replicas' limits, routed and queued.
    pub(super) fn admit(&mut self, turn: Turn, source: &mut dyn RequestSource) -> Result<()> {
        let Turn {
            id,
            request: arriving,
            turn,
        } = turn;
        // A request naming an adapter the replicas cannot serve is refused, never skipped.
        lora::check_request(self.config.lora.as_ref(), id, arriving.lora_id)?;
        let (prefill, decode) = (arriving.num_prefill_tokens, arriving.num_decode_tokens);
        let mut request = SimRequest::new(
            id,
            self.now,
            arriving.num_prefill_tokens,
            arriving.num_decode_tokens,
            arriving.hash_ids,
        );
        request.session = arriving.session;
        request.turn = turn;
        request.lora_id = arriving.lora_id;
        // The router places every request, as a deployment's does; the replica then
        // rejects one it can never serve, so a rejection still takes its routing turn.
        let replica = self.route(&request)?;
        if let Some(reason) = self.never_served(prefill, decode) {
            if self.config.over_length == OverLength::Skip {
                self.out.num_skipped_over_length += 1;
                // A skipped turn ends at once, so its session goes on.
                return self.on_turn_done(arriving.session, source);
            }
            return Err(Error::Rejected {
                request: id,
                reason: format!(
                    "request {id} ({prefill} prompt + {decode} output tokens) can never run on \
                     a replica: {reason}; shorten it, raise the setting, or set \
                     replica.over_length = \"skip\""
                ),
            });
        }
        request.replica = replica as u32;
        let idx = self.requests.insert(request);
        self.replicas[replica]
            .policy
            .add_request(&mut self.requests, idx)?;
        self.push(
            self.now,
            EventKind::ReplicaSchedule {
                replica: replica as u32,
            },
        );
        Ok(())
    }

    /// Why no replica can ever serve a request of these lengths: the deployment's limit
    /// first, alike for every policy, then the policy's own (memory, batch limits).
    fn never_served(&self, prefill: u32, decode: u32) -> Option<String> {
        if let Some(limit) = &self.config.request_limit
            && prefill as u64 + decode as u64 > limit.max_tokens
        {
            return Some(format!("it exceeds {}", limit.setting));
        }
        self.config.replica_policy.request_limit(prefill, decode)
    }

    /// A turn of `session` (or a request on its own) is over: the next turn is sent, or
    /// under closed-loop load its user takes the next session.
    pub(super) fn on_turn_done(
        &mut self,
        session: Option<u64>,
        source: &mut dyn RequestSource,
    ) -> Result<()> {
        match self.sessions.complete(session, self.now) {
            Next::Nothing => Ok(()),
            Next::Send((time, turn)) => {
                self.push_turn(time, turn);
                Ok(())
            }
            Next::UserFree => self.fill_users(source),
        }
    }
}

/// A request as read from the stream must have a time and tokens.
fn check_arriving(request: &ArrivingRequest, id: u64) -> Result<()> {
    if !(request.arrived_at.is_finite() && request.arrived_at >= 0.0) {
        return Err(Error::input(
            "arrived_at",
            request.arrived_at,
            format!("request {id}: must be a finite time >= 0"),
        ));
    }
    if request.num_prefill_tokens == 0 || request.num_decode_tokens == 0 {
        return Err(Error::input(
            "num_tokens",
            format!(
                "{}/{}",
                request.num_prefill_tokens, request.num_decode_tokens
            ),
            format!("request {id}: prefill and decode tokens must both be >= 1"),
        ));
    }
    if !(request.delay_s.is_finite() && request.delay_s >= 0.0) {
        return Err(Error::input(
            "delay_s",
            request.delay_s,
            format!("request {id}: a think time must be finite and >= 0"),
        ));
    }
    if request.session.is_some_and(|s| s > i64::MAX as u64) {
        return Err(Error::input(
            "session",
            request.session.unwrap_or_default(),
            format!("request {id}: session ids must be < 2^63"),
        ));
    }
    Ok(())
}

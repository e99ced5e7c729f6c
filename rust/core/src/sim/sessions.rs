//! Conversations, agents and closed-loop load: when each turn is sent.
//!
//! A session is a chain of requests (turns) sharing a session id, in stream order. A turn
//! after the first is sent `delay_s` (think or tool time) after the previous turn of its
//! session completes, and never before its own `arrived_at`; turns of one session never
//! overlap. Under closed-loop load (`SimConfig::concurrency`), a fixed number of users each
//! take the next session from the stream (a request without a session is a session of one
//! turn), run its turns, then take the next after the delay of its first turn; at most that
//! many sessions are in flight.

use std::collections::VecDeque;

use rustc_hash::{FxHashMap, FxHashSet};

use super::engine::ArrivingRequest;
use crate::{Error, Result};

/// A request read from the stream with its position in it (the id users see).
#[derive(Debug)]
pub struct Turn {
    pub id: u64,
    pub request: ArrivingRequest,
    /// Position in its session (0 = first turn).
    pub turn: u32,
}

#[derive(Debug)]
struct SessionState {
    /// A turn was sent (or is due) and has not completed.
    busy: bool,
    last_completed_at: f64,
    num_turns: u32,
    /// Later turns read from the stream, waiting for the busy one.
    parked: VecDeque<Turn>,
}

#[derive(Debug, Default)]
pub struct Sessions {
    states: FxHashMap<u64, SessionState>,
    /// Closed-loop load: users without a session (`None`: open loop).
    free_users: Option<u32>,
    /// Closed-loop load: users have started a session before (the first ones start at
    /// their first turn's `arrived_at`, with no think time).
    started: u32,
    concurrency: u32,
    /// Closed-loop load: sessions that have ended (a turn of one read later means the
    /// stream did not keep a session's turns together).
    ended: FxHashSet<u64>,
}

/// What the stream's next request is to the simulator.
pub enum Intake {
    /// Starts a session or is on its own: it arrives at its `arrived_at` (open loop).
    Lead,
    /// A later turn of a session already seen: the engine hands it to `follow`.
    Follow,
}

impl Sessions {
    pub fn new(concurrency: Option<u32>) -> Self {
        Self {
            free_users: concurrency,
            concurrency: concurrency.unwrap_or(0),
            ..Self::default()
        }
    }

    pub fn is_closed_loop(&self) -> bool {
        self.free_users.is_some()
    }

    /// Whether `request` (the stream's next, open loop) starts something or follows a turn.
    pub fn classify(&self, request: &ArrivingRequest) -> Intake {
        match request.session {
            Some(s) if self.states.contains_key(&s) => Intake::Follow,
            _ => Intake::Lead,
        }
    }

    /// A lead arrives: its session (if any) starts; returns its turn number.
    pub fn begin(&mut self, session: Option<u64>) -> u32 {
        let Some(s) = session else { return 0 };
        self.states.insert(
            s,
            SessionState {
                busy: true,
                last_completed_at: f64::NEG_INFINITY,
                num_turns: 1,
                parked: VecDeque::new(),
            },
        );
        0
    }

    /// A later turn read from the stream (open loop): parked behind a busy turn, or released
    /// at once with its send time (`now` at the earliest).
    pub fn follow(&mut self, id: u64, request: ArrivingRequest, now: f64) -> Option<(f64, Turn)> {
        let session = request.session.expect("a follow-up has a session");
        let state = self.states.get_mut(&session).expect("a seen session");
        let turn = Turn {
            id,
            request,
            turn: 0,
        };
        if state.busy || !state.parked.is_empty() {
            state.parked.push_back(turn);
            return None;
        }
        Some(release(state, turn, now))
    }

    /// The turn of `session` completed at `now`: returns the next turn to send, if one is
    /// parked; under closed-loop load, `Done` when the session (or lone request) is over and
    /// its user is free.
    pub fn complete(&mut self, session: Option<u64>, now: f64) -> Next {
        let Some(s) = session else {
            return self.user_freed();
        };
        let Some(state) = self.states.get_mut(&s) else {
            return self.user_freed();
        };
        state.busy = false;
        state.last_completed_at = now;
        if let Some(turn) = state.parked.pop_front() {
            return Next::Send(release(state, turn, now));
        }
        if self.free_users.is_some() {
            self.states.remove(&s);
            self.ended.insert(s);
            return self.user_freed();
        }
        Next::Nothing
    }

    fn user_freed(&mut self) -> Next {
        match &mut self.free_users {
            Some(free) => {
                *free += 1;
                Next::UserFree
            }
            None => Next::Nothing,
        }
    }

    /// Closed loop: a free user takes `lead` (the stream's next request) and `rest` (the
    /// following turns of its session, read ahead). Returns the lead's send time.
    pub fn start_session(
        &mut self,
        lead: Turn,
        rest: Vec<Turn>,
        now: f64,
    ) -> Result<Option<(f64, Turn)>> {
        let Some(free) = &mut self.free_users else {
            return Ok(None);
        };
        if *free == 0 {
            return Ok(None);
        }
        *free -= 1;
        // The first `concurrency` sessions start at once; later ones after the think time.
        let earliest = if self.started < self.concurrency {
            0.0
        } else {
            now + lead.request.delay_s
        };
        self.started = self.started.saturating_add(1);
        let send_at = lead.request.arrived_at.max(earliest).max(now);
        if let Some(s) = lead.request.session {
            let state = if self.states.contains_key(&s) {
                Some("is still running")
            } else if self.ended.contains(&s) {
                Some("has ended")
            } else {
                None
            };
            if let Some(state) = state {
                return Err(Error::input(
                    "session",
                    s,
                    format!(
                        "request {}: under closed-loop load the turns of a session must be \
                         consecutive in the stream (as a sessions workload writes them; a \
                         session trace interleaves them), and session {s} {state}",
                        lead.id
                    ),
                ));
            }
            let mut parked = VecDeque::from(rest);
            for (k, turn) in parked.iter_mut().enumerate() {
                turn.turn = k as u32 + 1;
            }
            self.states.insert(
                s,
                SessionState {
                    busy: true,
                    last_completed_at: f64::NEG_INFINITY,
                    num_turns: 1 + parked.len() as u32,
                    parked,
                },
            );
        }
        Ok(Some((send_at, lead)))
    }

    /// Users free to take a session (closed loop).
    pub fn has_free_user(&self) -> bool {
        self.free_users.is_some_and(|free| free > 0)
    }
}

/// What follows a completed turn.
pub enum Next {
    Nothing,
    /// Send this turn at this time.
    Send((f64, Turn)),
    /// Closed loop: a user is free to take the stream's next session.
    UserFree,
}

/// Marks `state` busy with `turn`, numbering it (closed-loop turns are numbered when read)
/// and timing it: its think time after the previous turn, not before its own arrival.
fn release(state: &mut SessionState, mut turn: Turn, now: f64) -> (f64, Turn) {
    state.busy = true;
    if turn.turn == 0 {
        turn.turn = state.num_turns;
        state.num_turns += 1;
    }
    let send_at = turn
        .request
        .arrived_at
        .max(state.last_completed_at + turn.request.delay_s)
        .max(now);
    (send_at, turn)
}

//! Sessions and closed-loop load (`super::sessions`) in hand-computed scenarios.

use super::tests::{VecSource, close, config, linear, req, run, times};
use super::*;
use crate::sched::SchedulerConfig;

fn v1() -> ReplicaPolicyConfig {
    ReplicaPolicyConfig::VllmV1(SchedulerConfig {
        block_size: 4,
        num_blocks: 64,
        max_model_len: 64,
        enable_prefix_caching: true,
        ..SchedulerConfig::without_vllm_reservations()
    })
}

/// One replica under `linear(constant, prefill, decode)` with one hash id per KV block.
fn cfg(constant: f64, prefill: f64, decode: f64) -> SimConfig {
    let mut cfg = config(v1(), 1, linear(constant, prefill, decode));
    cfg.hash_block_size = 4;
    cfg
}

fn turn(at: f64, prefill: u32, decode: u32, session: u64, delay: f64) -> ArrivingRequest {
    ArrivingRequest {
        session: Some(session),
        delay_s: delay,
        ..req(at, prefill, decode)
    }
}

fn with_ids(mut request: ArrivingRequest, ids: &[u64]) -> ArrivingRequest {
    request.hash_ids = ids.to_vec();
    request
}

/// (id, arrived_at, prefix_hit_tokens, session, turn) per request, by id.
fn rows(out: &SimOutput) -> Vec<(u64, f64, u32, i64, u32)> {
    let t = &out.requests;
    let mut rows: Vec<_> = (0..t.len())
        .map(|i| {
            (
                t.request_id[i],
                t.arrived_at[i],
                t.prefix_hit_tokens[i],
                t.session_id[i],
                t.turn[i],
            )
        })
        .collect();
    rows.sort_by_key(|r| r.0);
    rows
}

#[test]
fn the_second_turn_is_sent_a_think_time_after_the_first_completes_and_hits_its_output() {
    // Block size 4, one id per 4 tokens; the session's ids grow turn by turn.
    // Turn 1: prompt 8 (ids 10, 11), 5 outputs (ids 12, 13 cover positions 8..16).
    //   Prefill 8: 1 + 0.1·8 = 1.8 s (first token); 4 decodes of 1.2 s: done at 6.6 s.
    //   Computed tokens: 8 + 4 fed outputs = 12: blocks 0, 1, 2 are full and cached.
    // Turn 2: prompt 16 = 8 + 5 outputs + 3 new tokens, same ids 10..13; think time 0.5 s:
    //   sent at 7.1 s, hits 12 tokens (3 blocks: its prompt repeats turn 1's output),
    //   prefills 4: 1.4 s (first token at 8.5 s), one decode of 1.2 s: done at 9.7 s.
    let out = run(
        cfg(1.0, 0.1, 0.2),
        vec![
            with_ids(turn(0.0, 8, 5, 42, 0.0), &[10, 11, 12, 13]),
            with_ids(turn(0.0, 16, 2, 42, 0.5), &[10, 11, 12, 13]),
        ],
    );
    let t = times(&out);
    assert!(close(t[0].1, 1.8) && close(t[0].2, 6.6), "{t:?}");
    assert!(close(t[1].1, 8.5) && close(t[1].2, 9.7), "{t:?}");
    let r = rows(&out);
    assert!(
        close(r[1].1, 7.1),
        "turn 2 sent at completion + think time: {r:?}"
    );
    assert_eq!((r[0].2, r[0].3, r[0].4), (0, 42, 0));
    assert_eq!(
        (r[1].2, r[1].3, r[1].4),
        (12, 42, 1),
        "hit = prompt + fed output"
    );
}

#[test]
fn without_output_ids_the_next_turn_hits_only_the_previous_prompt() {
    // Same as above, but turn 1's ids cover only its prompt: its outputs are its own tokens.
    let out = run(
        cfg(1.0, 0.1, 0.2),
        vec![
            with_ids(turn(0.0, 8, 5, 42, 0.0), &[10, 11]),
            with_ids(turn(0.0, 16, 2, 42, 0.5), &[10, 11, 12, 13]),
        ],
    );
    assert_eq!(rows(&out)[1].2, 8, "{:?}", rows(&out));
}

#[test]
fn a_timestamped_turn_waits_for_its_parent_but_not_past_its_own_time() {
    // Turn 1 (prompt 8, 5 outputs) completes at 6.6 s as above. A turn stamped 3.0 s is
    // sent when turn 1 completes; one stamped 20 s at 20 s. A lone request at 1 s is not held
    // back by the parked turn.
    let setup = || cfg(1.0, 0.1, 0.2);
    let early = run(
        setup(),
        vec![
            turn(0.0, 8, 5, 7, 0.0),
            req(1.0, 4, 1),
            turn(3.0, 4, 1, 7, 0.0),
        ],
    );
    let r = rows(&early);
    assert!(
        close(r[1].1, 1.0),
        "the lone request arrives on time: {r:?}"
    );
    let parent_done = times(&early)[0].2;
    assert!(
        close(r[2].1, parent_done),
        "{r:?}, parent done at {parent_done}"
    );
    let late = run(
        setup(),
        vec![turn(0.0, 8, 5, 7, 0.0), turn(20.0, 4, 1, 7, 0.0)],
    );
    assert!(close(rows(&late)[1].1, 20.0));
}

#[test]
fn turns_of_interleaved_sessions_never_overlap_and_are_numbered_in_order() {
    let mut requests = Vec::new();
    for k in 0..4u32 {
        for s in 0..3u64 {
            requests.push(turn(0.1 * s as f64, 6 + k, 3, s, 0.25));
        }
    }
    let out = run(cfg(0.5, 0.01, 0.02), requests);
    let t = &out.requests;
    assert_eq!(t.len(), 12);
    for s in 0..3i64 {
        let mut turns: Vec<(u32, f64, f64)> = (0..t.len())
            .filter(|&i| t.session_id[i] == s)
            .map(|i| (t.turn[i], t.arrived_at[i], t.completed_at[i]))
            .collect();
        turns.sort_by_key(|x| x.0);
        assert_eq!(turns.iter().map(|x| x.0).collect::<Vec<_>>(), [0, 1, 2, 3]);
        for pair in turns.windows(2) {
            assert!(
                close(pair[1].1, pair[0].2 + 0.25),
                "session {s}: each turn is sent 0.25 s after the previous completes: {turns:?}"
            );
        }
    }
}

#[test]
fn closed_loop_keeps_at_most_n_requests_in_flight_and_sends_on_completion() {
    // One user, three lone requests with a 2 s think time: each is sent 2 s after the
    // previous one completes (the first at once, whatever the stream's times say).
    let mut c = cfg(1.0, 0.0, 0.0);
    c.concurrency = Some(1);
    let requests = vec![
        ArrivingRequest {
            delay_s: 2.0,
            ..req(0.0, 4, 2)
        };
        3
    ];
    let out = run(c, requests);
    // Each request: a prefill (1 s) then one decode (1 s).
    assert_eq!(times(&out), [(0, 1.0, 2.0), (1, 5.0, 6.0), (2, 9.0, 10.0)]);

    let mut c = cfg(1.0, 0.0, 0.0);
    c.concurrency = Some(2);
    let out = run(c, vec![req(0.0, 4, 2); 5]);
    let t = &out.requests;
    let mut events: Vec<(f64, i32)> = (0..t.len())
        .flat_map(|i| [(t.arrived_at[i], 1), (t.completed_at[i], -1)])
        .collect();
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut in_flight = 0;
    for (_, delta) in events {
        in_flight += delta;
        assert!(in_flight <= 2);
    }
}

#[test]
fn closed_loop_sessions_run_their_turns_then_the_user_takes_the_next_session() {
    // One user: session 1 (two turns, 1 s think time), then session 2 (its first turn
    // waits 3 s after session 1 ends).
    let mut c = cfg(1.0, 0.0, 0.0);
    c.concurrency = Some(1);
    let out = run(
        c,
        vec![
            turn(0.0, 4, 2, 1, 0.0),
            turn(0.0, 8, 2, 1, 1.0),
            turn(0.0, 4, 2, 2, 3.0),
        ],
    );
    let r = rows(&out);
    let t = times(&out);
    assert!(
        close(r[1].1, t[0].2 + 1.0) && close(r[2].1, t[1].2 + 3.0),
        "{r:?} {t:?}"
    );
    assert_eq!(
        r.iter().map(|x| (x.3, x.4)).collect::<Vec<_>>(),
        [(1, 0), (1, 1), (2, 0)]
    );
}

#[test]
fn closed_loop_refuses_a_session_whose_turns_are_not_consecutive() {
    let mut c = cfg(1.0, 0.0, 0.0);
    c.concurrency = Some(2);
    let mut exec = c.exec;
    let sim = Simulator::new(c, &mut exec).unwrap();
    let err = sim
        .run(&mut VecSource(Some(vec![
            // Session 1 is still running when session 2 ends and its user reads on.
            turn(0.0, 4, 10, 1, 0.0),
            turn(0.0, 4, 2, 2, 0.0),
            turn(0.0, 4, 2, 1, 0.0),
        ])))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("consecutive") && err.contains("session"),
        "{err}"
    );
}

#[test]
fn closed_loop_refuses_a_turn_of_a_session_that_has_ended() {
    // One user: session 1, then session 2, then session 1 again (an interleaved trace).
    let mut c = cfg(1.0, 0.0, 0.0);
    c.concurrency = Some(1);
    let mut exec = c.exec;
    let sim = Simulator::new(c, &mut exec).unwrap();
    let err = sim
        .run(&mut VecSource(Some(vec![
            turn(0.0, 4, 2, 1, 0.0),
            turn(0.0, 4, 2, 2, 0.0),
            turn(0.0, 4, 2, 1, 0.0),
        ])))
        .unwrap_err()
        .to_string();
    assert!(err.contains("session 1 has ended"), "{err}");
}

#[test]
fn a_skipped_over_length_turn_lets_its_session_go_on() {
    let mut c = cfg(1.0, 0.0, 0.0);
    c.over_length = OverLength::Skip;
    let out = run(
        c,
        vec![
            turn(0.0, 4, 2, 1, 0.0),
            turn(0.0, 100, 2, 1, 0.0),
            turn(0.0, 4, 2, 1, 0.5),
        ],
    );
    assert_eq!(out.num_skipped_over_length, 1);
    let r = rows(&out);
    assert_eq!(r.len(), 2);
    assert!(close(r[1].1, times(&out)[0].2 + 0.5), "{r:?}");
}

#[test]
fn bad_think_times_and_session_ids_are_input_errors() {
    for (bad, field) in [
        (turn(0.0, 4, 2, 1, -1.0), "delay_s"),
        (turn(0.0, 4, 2, 1, f64::NAN), "delay_s"),
        (turn(0.0, 4, 2, u64::MAX, 0.0), "session"),
    ] {
        let c = cfg(1.0, 0.0, 0.0);
        let mut exec = c.exec;
        let sim = Simulator::new(c, &mut exec).unwrap();
        let err = sim.run(&mut VecSource(Some(vec![bad]))).unwrap_err();
        assert!(err.to_string().contains(field), "{err}");
    }
    let mut c = cfg(1.0, 0.0, 0.0);
    c.concurrency = Some(0);
    let mut exec = c.exec;
    assert!(Simulator::new(c, &mut exec).is_err());
}

//! vLLM 0.33's prefix-cache rules for EAGLE/MTP drafters (`sched::prefix_rules`): hash
//! look-ahead, the trailing-block drop, the re-prefillable lag; hand-checkable numbers.

use super::*;
use crate::sched::*;

fn cfg(lookahead: usize, drop: bool) -> SchedulerConfig {
    SchedulerConfig {
        block_size: 2,
        max_num_batched_tokens: 16,
        enable_prefix_caching: true,
        num_hash_lookahead_tokens: lookahead,
        eagle_block_drop: drop,
        ..config()
    }
}

fn request(tokens: &[u32], max_tokens: usize) -> RequestSpec {
    RequestSpec {
        prompt_token_ids: tokens.to_vec(),
        max_tokens,
        ignore_eos: true,
        ..RequestSpec::default()
    }
}

#[test]
fn a_lookahead_block_is_published_once_its_next_token_exists() {
    // vLLM's `test_scheduler_publishes_lookahead_blocks_at_allocation`: block size 2, L = 1,
    // prompt [0, 1, 2, 3]. Block [2, 4) waits for token 4, the first sampled one, and is
    // cached at the allocation after it is sampled.
    let mut s = Scheduler::new(cfg(1, false), false).unwrap();
    s.add_request(0, request(&[0, 1, 2, 3], 3)).unwrap();
    s.schedule().unwrap();
    assert_eq!(s.num_cached_prefix_tokens(&[0, 1, 2, 3, 5, 7], None), 2);
    s.update_from_output(&[sample(0, 5)]).unwrap();
    // Sampled, not yet allocated past: still 2.
    assert_eq!(s.num_cached_prefix_tokens(&[0, 1, 2, 3, 5, 7], None), 2);
    s.schedule().unwrap();
    assert_eq!(s.num_cached_prefix_tokens(&[0, 1, 2, 3, 5, 7], None), 4);
    assert_eq!(s.num_cached_prefix_tokens(&[0, 1, 2, 3, 6, 7], None), 2);
    s.check_invariants().unwrap();
}

#[test]
fn without_lookahead_the_same_stream_caches_by_the_blocks_own_tokens() {
    let mut s = Scheduler::new(cfg(0, false), false).unwrap();
    s.add_request(0, request(&[0, 1, 2, 3], 3)).unwrap();
    s.schedule().unwrap();
    assert_eq!(s.num_cached_prefix_tokens(&[0, 1, 2, 3, 5, 7], None), 4);
    assert_eq!(s.num_cached_prefix_tokens(&[0, 1, 2, 3, 6, 7], None), 4);
}

#[test]
fn a_lookahead_hit_never_reaches_the_last_lookahead_tokens() {
    // A resend of the cached [0..8) (L = 2): hashable blocks end at 8 - 2 = 6 at most.
    let mut s = Scheduler::new(cfg(2, false), false).unwrap();
    let tokens: Vec<u32> = (0..8).collect();
    s.add_request(0, request(&tokens, 1)).unwrap();
    run_step(&mut s);
    assert_eq!(s.num_cached_prefix_tokens(&tokens, None), 6);
    let longer: Vec<u32> = (0..12).collect();
    // Block [6, 8) was hashed with tokens 8, 9 of the first request? No: it had only 8
    // tokens (and the sampled 7), so [6, 8) never got a hash.
    assert_eq!(s.num_cached_prefix_tokens(&longer, None), 6);
}

#[test]
fn the_trailing_block_drop_loses_the_last_hit_block() {
    // vLLM's `FullAttentionManager.find_longest_cache_hit` with `drop_eagle_block`.
    let mut s = Scheduler::new(cfg(0, true), false).unwrap();
    let tokens: Vec<u32> = (0..8).collect();
    s.add_request(0, request(&tokens, 1)).unwrap();
    run_step(&mut s);
    let longer: Vec<u32> = (0..12).collect();
    // 4 cached blocks match, the last is dropped.
    assert_eq!(s.num_cached_prefix_tokens(&longer, None), 6);
    // A resend: 3 blocks match (never the last token), 2 remain.
    assert_eq!(s.num_cached_prefix_tokens(&tokens, None), 4);
    // Admitted with the drop: computes from token 6.
    s.add_request(1, request(&longer, 1)).unwrap();
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(1, 6)]);
    s.check_invariants().unwrap();
}

#[test]
fn reprefillable_tokens_stay_out_of_the_cache() {
    // Multi-module MTP, k = 3: vLLM's `num_reprefillable_tokens` = 2.
    let config = SchedulerConfig {
        num_prefill_lookahead: 3,
        ..cfg(0, false)
    };
    let mut s = Scheduler::new(config, false).unwrap();
    let tokens: Vec<u32> = (0..8).collect();
    s.add_request(0, request(&tokens, 4)).unwrap();
    s.schedule().unwrap();
    let longer: Vec<u32> = (0..12).collect();
    // 8 computed, 6 cacheable: 3 blocks.
    assert_eq!(s.num_cached_prefix_tokens(&longer, None), 6);
}

#[test]
fn drafts_in_flight_do_not_stand_in_for_reprefillable_tokens() {
    // Multi-module MTP, k = 3 (2 re-prefillable tokens), 3 drafts. vLLM 0.33's
    // `allocate_slots` caches `min(computed + new, request.num_tokens)` and its one-group
    // `get_num_cacheable_tokens` then subtracts the 2: the drafts scheduled past the 9 known
    // tokens never cover them (issue 30, `vllm_adapter_diff.py --eagle drop --mtp`, seed 4).
    let config = SchedulerConfig {
        num_prefill_lookahead: 3,
        num_speculative_tokens: 3,
        ..cfg(0, false)
    };
    let mut s = Scheduler::new(config, false).unwrap();
    let tokens: Vec<u32> = (0..8).collect();
    s.add_request(0, request(&tokens, 50)).unwrap();
    s.schedule().unwrap();
    let drafted = SampledOutput {
        request_id: 0,
        token_ids: vec![100],
        spec_token_ids: vec![101, 102, 103],
        ..Default::default()
    };
    s.update_from_output(&[drafted]).unwrap();
    let probe: Vec<u32> = (0..8).chain(100..104).collect();
    // 8 computed, 6 cacheable: 3 blocks.
    assert_eq!(s.num_cached_prefix_tokens(&probe, None), 6);
    let out = s.schedule().unwrap();
    assert_eq!(scheduled(&out), [(0, 4)], "one new token plus three drafts");
    // 12 computed of 9 tokens: min(12, 9) - 2 = 7 cacheable, still 3 blocks (not
    // min(12 - 2, 9) = 9, 4 blocks).
    assert_eq!(s.num_cached_prefix_tokens(&probe, None), 6);
    let verified = SampledOutput {
        request_id: 0,
        token_ids: vec![101, 102, 103, 104],
        ..Default::default()
    };
    s.update_from_output(&[verified]).unwrap();
    // All accepted: 12 landed of 13 tokens, 10 cacheable, 5 blocks (the probe's last token
    // is never a hit).
    let probe: Vec<u32> = (0..8).chain(100..105).collect();
    assert_eq!(s.num_cached_prefix_tokens(&probe, None), 10);
    s.check_invariants().unwrap();
}

#[test]
fn the_update_completes_lookahead_hashes_with_the_sampled_token() {
    // Speculative decoding on: the update caches the landed tokens' blocks, hashed with the
    // token sampled past them (vLLM's `update_from_output` -> `cache_blocks`, whose block
    // hasher ran when the token was appended), before the finished request frees them.
    let config = SchedulerConfig {
        num_speculative_tokens: 2,
        ..cfg(1, false)
    };
    let mut s = Scheduler::new(config, false).unwrap();
    s.add_request(0, request(&[0, 1, 2, 3], 1)).unwrap();
    s.schedule().unwrap();
    let finished = s.update_from_output(&[sample(0, 5)]).unwrap();
    assert_eq!(finished, [(0, FinishReason::Length)]);
    assert_eq!(s.num_cached_prefix_tokens(&[0, 1, 2, 3, 5, 7], None), 4);
    assert_eq!(s.num_cached_prefix_tokens(&[0, 1, 2, 3, 6, 7], None), 2);
}

#[test]
fn lookahead_blocks_are_hit_after_preemption_as_before() {
    let mut s = Scheduler::new(cfg(1, false), false).unwrap();
    let tokens: Vec<u32> = (0..9).collect();
    s.add_request(0, request(&tokens, 1)).unwrap();
    run_step(&mut s);
    // [0..8) cached with its look-ahead tokens: a request sharing 9 tokens hits 8.
    let sibling: Vec<u32> = (0..9).chain([50, 51]).collect();
    assert_eq!(s.num_cached_prefix_tokens(&sibling, None), 8);
    s.add_request(1, request(&sibling, 1)).unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(1, 3)]);
}

#[test]
fn the_rules_are_refused_where_they_mean_nothing() {
    let refused = |config: SchedulerConfig, field: &str| {
        let err = Scheduler::<u32>::new(config, false)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains(field), "{err}");
    };
    let off = SchedulerConfig {
        enable_prefix_caching: false,
        ..cfg(1, false)
    };
    refused(off, "num_hash_lookahead_tokens");
    let radix = SchedulerConfig {
        prefix_cache: PrefixCache::Radix,
        ..cfg(1, false)
    };
    refused(radix, "num_hash_lookahead_tokens");
    refused(cfg(1, true), "eagle_block_drop");
    let drop_off = SchedulerConfig {
        enable_prefix_caching: false,
        ..cfg(0, true)
    };
    refused(drop_off, "eagle_block_drop");
    let mtp = SchedulerConfig {
        num_prefill_lookahead: 3,
        ..cfg(0, true)
    };
    refused(mtp, "block_size");
    // Look-ahead hashes (L = k = 3, as vLLM sets them for 3-module MTP) over blocks of 2:
    // vLLM's coordinator raises too, the drafter's groups staying EAGLE groups; and so
    // does the setter on a built scheduler. Blocks of 3 are served.
    let mtp_lookahead = SchedulerConfig {
        num_prefill_lookahead: 3,
        ..cfg(3, false)
    };
    refused(mtp_lookahead.clone(), "block_size");
    let mut s = Scheduler::<u32>::new(
        SchedulerConfig {
            num_prefill_lookahead: 3,
            ..cfg(0, false)
        },
        false,
    )
    .unwrap();
    let err = s.set_num_hash_lookahead_tokens(3).unwrap_err().to_string();
    assert!(err.contains("block_size"), "{err}");
    assert_eq!(s.num_hash_lookahead_tokens(), 0);
    let wide = SchedulerConfig {
        block_size: 3,
        ..mtp_lookahead
    };
    assert!(Scheduler::<u32>::new(wide, false).is_ok());
}

#[test]
fn the_lookahead_changes_only_with_no_request_holding_blocks() {
    let mut s = Scheduler::new(cfg(0, false), false).unwrap();
    s.set_num_hash_lookahead_tokens(1).unwrap();
    assert_eq!(s.num_hash_lookahead_tokens(), 1);
    s.add_request(0, request(&[0, 1, 2, 3], 3)).unwrap();
    s.schedule().unwrap();
    assert!(s.set_num_hash_lookahead_tokens(2).is_err());
    assert_eq!(s.num_hash_lookahead_tokens(), 1);
    assert_eq!(s.num_cached_prefix_tokens(&[0, 1, 2, 3, 5, 7], None), 2);
}

#[test]
fn hybrid_groups_hash_with_the_lookahead() {
    use crate::kv::KvGroupSpec;
    let groups = vec![
        KvGroupSpec::FullAttention,
        KvGroupSpec::SlidingWindow { sliding_window: 8 },
    ];
    let hybrid = SchedulerConfig {
        kv_groups: groups,
        num_blocks: 128,
        ..cfg(1, false)
    };
    let mut s = Scheduler::new(hybrid, false).unwrap();
    s.add_request(0, request(&[0, 1, 2, 3], 3)).unwrap();
    s.schedule().unwrap();
    assert_eq!(s.num_cached_prefix_tokens(&[0, 1, 2, 3, 5, 7], None), 2);
    s.update_from_output(&[sample(0, 5)]).unwrap();
    s.schedule().unwrap();
    assert_eq!(s.num_cached_prefix_tokens(&[0, 1, 2, 3, 5, 7], None), 4);
    assert_eq!(s.num_cached_prefix_tokens(&[0, 1, 2, 3, 6, 7], None), 2);
}

#[test]
fn hybrid_groups_each_drop_eagles_block() {
    // vLLM 0.33's `HybridKVCacheCoordinator.find_longest_cache_hit` with `use_eagle`: full
    // attention (blocks of 2) beside a window of 8 (4 blocks, 5 with EAGLE's). Prompt 0..8
    // is cached (4 blocks). A query of 10 tokens: full attention reads up to 10 tokens
    // (the candidate 9 plus a block's margin, within the 5 hashed blocks), finds 4 blocks
    // and drops one: 6; the window then needs 5 blocks, finds a run of 4 from block 0 and
    // drops one: 6. Without the drop both groups serve 8.
    use crate::kv::KvGroupSpec;
    let groups = vec![
        KvGroupSpec::FullAttention,
        KvGroupSpec::SlidingWindow { sliding_window: 8 },
    ];
    let prompt: Vec<u32> = (0..8).collect();
    let query: Vec<u32> = (0..10).collect();
    let hit_with = |drop: bool, num_prefill_lookahead: usize| {
        let config = SchedulerConfig {
            kv_groups: groups.clone(),
            num_blocks: 128,
            num_prefill_lookahead,
            ..cfg(0, drop)
        };
        let mut s = Scheduler::new(config, false).unwrap();
        s.add_request(0, request(&prompt, 3)).unwrap();
        s.schedule().unwrap();
        s.num_cached_prefix_tokens(&query, None)
    };
    assert_eq!(hit_with(false, 0), 8);
    assert_eq!(hit_with(true, 0), 6);
    // A multi-module MTP drafter's re-prefillable token (`num_prefill_lookahead` 2): the
    // dropping groups cache 8 - 1 = 7 tokens (3 full blocks; `get_num_cacheable_tokens`),
    // so full attention finds 3 and drops one (4), and the window's run of 3 from block 0
    // loses one (4).
    assert_eq!(hit_with(true, 2), 4);
}

#[test]
fn a_session_keeps_the_hash_its_dropped_token_completed_until_recomputed() {
    // Spec decoding on (the update caches), L = 1, block size 2: prompt [0, 1, 2] samples
    // 3 (computed), then stops on 4 (max_tokens 2), which completes block [2, 4)'s hash
    // in the update. The next chunk drops token 4: the block stays cached under its old
    // hash (vLLM keeps it), and the session's new continuation does not hit it.
    let config = SchedulerConfig {
        num_speculative_tokens: 1,
        ..cfg(1, false)
    };
    let mut s = Scheduler::new(config, false).unwrap();
    let spec = RequestSpec {
        resumable: true,
        ..request(&[0, 1, 2], 2)
    };
    s.add_request(0, spec).unwrap();
    s.schedule().unwrap();
    s.update_from_output(&[sample(0, 3)]).unwrap();
    s.schedule().unwrap();
    let parked = s.update_from_output(&[sample(0, 4)]).unwrap();
    assert_eq!(parked, [(0, FinishReason::Length)]);
    assert_eq!(s.num_cached_prefix_tokens(&[0, 1, 2, 3, 4, 9], None), 4);
    let update = SessionUpdate {
        prompt_token_ids: vec![42, 43],
        max_tokens: 2,
        ignore_eos: true,
        ..SessionUpdate::default()
    };
    s.resume_session(&0, update).unwrap();
    assert_eq!(
        s.get_request(&0).unwrap().all_token_ids,
        [0, 1, 2, 3, 42, 43]
    );
    s.schedule().unwrap();
    assert_eq!(
        s.num_cached_prefix_tokens(&[0, 1, 2, 3, 42, 43, 9], None),
        2
    );
    assert_eq!(s.num_cached_prefix_tokens(&[0, 1, 2, 3, 4, 9], None), 4);
    s.check_invariants().unwrap();
}

#[test]
fn the_lookahead_set_on_a_built_scheduler_moves_the_mamba_split() {
    // FA + a Mamba `align` group, blocks of 16, a 100-token prompt: the last reusable state
    // is at (100 - 1) / 16 * 16 = 96 without a look-ahead, and at (100 - 5) / 16 * 16 = 80
    // with 5 (vLLM 0.33's `get_mamba_prefill_checkpoint_position`), whichever way it is set.
    use crate::kv::KvGroupSpec;
    let hybrid = SchedulerConfig {
        kv_groups: vec![KvGroupSpec::FullAttention, KvGroupSpec::MAMBA_ALIGN],
        block_size: 16,
        num_blocks: 100,
        max_model_len: 256,
        max_num_batched_tokens: 256,
        mamba_align: Some(MambaAlignSplit::new(16)),
        ..cfg(0, false)
    };
    let first_chunk = |s: &mut Scheduler<u32>| {
        s.add_request(0, request(&(0..100).collect::<Vec<_>>(), 1))
            .unwrap();
        scheduled(&s.schedule().unwrap())
    };
    let mut s = Scheduler::new(hybrid.clone(), false).unwrap();
    assert_eq!(first_chunk(&mut s), [(0, 96)]);
    let mut s = Scheduler::new(hybrid.clone(), false).unwrap();
    s.set_num_hash_lookahead_tokens(5).unwrap();
    assert_eq!(s.mamba_split_rule().unwrap().checkpoint_position(100), 80);
    assert_eq!(first_chunk(&mut s), [(0, 80)]);
    let built = SchedulerConfig {
        num_hash_lookahead_tokens: 5,
        ..hybrid
    };
    assert_eq!(
        first_chunk(&mut Scheduler::new(built, false).unwrap()),
        [(0, 80)]
    );
}

#[test]
fn the_lookahead_setter_keeps_the_pools_reprefillable_lag() {
    // Built for 3-module MTP (vLLM's coordinator reads `num_reprefillable_tokens` = 2 once);
    // the scheduler's `num_prefill_lookahead` assigned 1 apart, then look-ahead hashes of 2
    // set: the pool still lags 2 tokens. A 12-token prompt under a budget of 8 computes 8,
    // of which 6 are cacheable (3 blocks), not 8, though the hashes reach 10.
    let config = SchedulerConfig {
        num_prefill_lookahead: 3,
        max_num_batched_tokens: 8,
        ..cfg(0, false)
    };
    let mut s = Scheduler::new(config, false).unwrap();
    s.set_num_prefill_lookahead(1);
    s.set_num_hash_lookahead_tokens(2).unwrap();
    s.add_request(0, request(&(0..12).collect::<Vec<_>>(), 4))
        .unwrap();
    assert_eq!(scheduled(&s.schedule().unwrap()), [(0, 8)]);
    let longer: Vec<u32> = (0..16).collect();
    assert_eq!(s.num_cached_prefix_tokens(&longer, None), 6);
    // Built with a look-ahead of 1 (no lag), the same run caches 8.
    let config = SchedulerConfig {
        num_prefill_lookahead: 1,
        max_num_batched_tokens: 8,
        ..cfg(2, false)
    };
    let mut s = Scheduler::new(config, false).unwrap();
    s.add_request(0, request(&(0..12).collect::<Vec<_>>(), 4))
        .unwrap();
    s.schedule().unwrap();
    assert_eq!(s.num_cached_prefix_tokens(&longer, None), 8);
}

#[test]
fn reprefillable_tokens_beside_a_mamba_checkpoint_block_are_refused_by_their_field() {
    use crate::kv::KvGroupSpec;
    // Served beside a Mamba align group (tests/test_integrations_vllm_mamba_mtp.py); beside
    // one with a prefill checkpoint block, refused.
    let checkpoint = KvGroupSpec::mamba(true, 0, 1, Some(1)).unwrap();
    let config = SchedulerConfig {
        kv_groups: vec![KvGroupSpec::FullAttention, checkpoint],
        block_size: 16,
        num_blocks: 100,
        max_model_len: 256,
        max_num_batched_tokens: 256,
        mamba_align: Some(MambaAlignSplit::new(16)),
        num_prefill_lookahead: 3,
        ..cfg(0, true)
    };
    let err = Scheduler::<u32>::new(config, false)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("num_prefill_lookahead"), "{err}");
}

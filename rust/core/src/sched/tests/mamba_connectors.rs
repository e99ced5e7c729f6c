//! Mamba `align` groups beside a KV connector (vLLM 0.33's `_get_local_prefix_cache_hit`
//! and the `hit_diverged` fallback in `schedule()`): which boundary an admission resumes at
//! when the groups' own hits differ. vLLM's cases, blocks of 16, a 64-token prefix seeded
//! a block per step and some of its blocks evicted.

use std::sync::{Arc, Mutex};

use super::*;
use crate::kv::{BlockHash, BlockId, KvGroupSpec, hash_full_blocks};
use crate::sched::{ExternalTokens, KvConnector};

/// Offers `offer` tokens synchronously (shared, so seeding can run with none) and says
/// whether it restores lagging recurrent states.
struct StateConnector {
    offer: Arc<Mutex<usize>>,
    divergent: bool,
}

impl KvConnector<u32> for StateConnector {
    fn get_num_new_matched_tokens(
        &mut self,
        _: &Request<u32>,
        _: usize,
    ) -> crate::Result<Option<ExternalTokens>> {
        Ok(Some(ExternalTokens {
            num_tokens: *self.offer.lock().unwrap(),
            load_async: false,
        }))
    }

    fn request_finished(&mut self, _: &Request<u32>, _: &[BlockId]) -> crate::Result<bool> {
        Ok(false)
    }

    fn supports_divergent_local_hybrid_hits(&self) -> bool {
        self.divergent
    }
}

fn tokens(num_blocks: u32) -> Vec<u32> {
    (0..16 * num_blocks).collect()
}

fn hashes(num_blocks: u32) -> Vec<BlockHash> {
    let mut hashes = Vec::new();
    hash_full_blocks(&mut hashes, &tokens(num_blocks), 16, None);
    hashes
}

/// FA + Mamba `align`, blocks of 16, budget 16; a 64-token prompt run a block per step to
/// its end, so both groups cache all four boundaries. Returns the scheduler with the
/// connector's offer set to `offer` and each step's FA and Mamba blocks.
fn seeded(offer: usize, divergent: bool) -> (Scheduler<u32>, Vec<BlockId>, Vec<BlockId>) {
    let cfg = SchedulerConfig {
        kv_groups: vec![KvGroupSpec::FullAttention, KvGroupSpec::MAMBA_ALIGN],
        enable_prefix_caching: true,
        block_size: 16,
        num_blocks: 100,
        max_model_len: 256,
        max_num_batched_tokens: 16,
        ..config()
    };
    let mut s = Scheduler::new(cfg, false).unwrap();
    let shared = Arc::new(Mutex::new(0));
    let connector = StateConnector {
        offer: shared.clone(),
        divergent,
    };
    s.set_connector(Box::new(connector)).unwrap();
    let fill = RequestSpec {
        prompt_token_ids: tokens(4),
        max_tokens: 1,
        ..RequestSpec::default()
    };
    s.add_request(0, fill).unwrap();
    let mut mamba = Vec::new();
    let mut fa = Vec::new();
    for step in 0..4 {
        let out = s.schedule().unwrap();
        assert_eq!(scheduled(&out), [(0, 16)]);
        let tables = s.group_block_ids(&0);
        mamba.push(tables[1][step]);
        fa = tables[0].clone();
        answer_step(&mut s, out);
    }
    assert!(s.get_request(&0).is_none(), "the seed finished");
    *shared.lock().unwrap() = offer;
    (s, fa, mamba)
}

/// The replay of `num_blocks` blocks of the prefix: where its admission resumes.
fn resume_at(s: &mut Scheduler<u32>, num_blocks: u32) -> usize {
    let replay = RequestSpec {
        prompt_token_ids: tokens(num_blocks),
        max_tokens: 1,
        ..RequestSpec::default()
    };
    s.add_request(1, replay).unwrap();
    let out = s.schedule().unwrap();
    let new = &out.scheduled_new_reqs[0];
    assert_eq!(new.request_id, 1);
    new.num_computed_tokens
}

#[test]
fn a_mamba_hit_deeper_than_full_attention_resumes_at_the_common_boundary() {
    // FA tail and the middle states evicted: FA hits 2 blocks, Mamba 4. FA's blocks past
    // 32 are gone, so the hit is the boundary both groups hold: 16; an offered block adds
    // 16 on top of it.
    for (offer, expected) in [(0, 16), (16, 32)] {
        let (mut s, fa, mamba) = seeded(offer, true);
        s.kv_evict_blocks(&[fa[2], fa[3], mamba[1], mamba[2]])
            .unwrap();
        let (_, lengths) = s.kv_hits_per_group(&hashes(5), 79).unwrap();
        assert_eq!(lengths, [32, 64]);
        assert_eq!(resume_at(&mut s, 5), expected, "offer {offer}");
    }
}

#[test]
fn a_deeper_full_attention_hit_is_kept_only_if_a_capable_connector_loads_past_it() {
    // Every state but block 0's evicted: FA hits 4 blocks, Mamba 1. A connector that
    // restores states and loads a block resumes at 64 + 16; loading nothing, or unable to
    // restore states, the common boundary 16 (+ 16 loaded).
    for (divergent, offer, num_blocks, expected) in
        [(true, 0, 5, 16), (true, 16, 6, 80), (false, 16, 6, 32)]
    {
        let (mut s, _, mamba) = seeded(offer, divergent);
        s.kv_evict_blocks(&mamba[1..]).unwrap();
        let (_, lengths) = s.kv_hits_per_group(&hashes(num_blocks), 79).unwrap();
        assert_eq!(lengths, [64, 16]);
        let hits = s.stats().prefix_cache_hits;
        let at = resume_at(&mut s, num_blocks);
        assert_eq!(at, expected, "{divergent} {offer} {num_blocks}");
        // The lookup counts once, the local hit taken (not the loaded tokens).
        assert_eq!(
            s.stats().prefix_cache_hits - hits,
            (expected - offer) as u64
        );
        s.check_invariants().unwrap();
    }
}

#[test]
fn per_group_hits_and_evictions_need_several_groups() {
    let mut s = Scheduler::<u32>::new(config(), false).unwrap();
    let err = s.kv_evict_blocks(&[1]).unwrap_err();
    assert!(err.to_string().contains("kv_groups"), "{err}");
    assert!(s.kv_hits_per_group(&hashes(2), 31).is_err());
}

#[test]
fn a_prefix_seeded_outside_the_scheduler_is_hit_by_its_requests() {
    // vLLM's `_seed_hybrid_prefix`: the KV manager driven directly, a block per call.
    let (mut s, _, _) = seeded(0, true);
    s.kv_evict_blocks(
        &s.kv_block_states()
            .iter()
            .enumerate()
            .map(|(b, _)| b as BlockId)
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let fill: u32 = 9;
    let mut mamba = Vec::new();
    for step in 0..4 {
        let given = if step == 0 { tokens(4) } else { Vec::new() };
        let new = s
            .kv_allocate_outside(&fill, &given, 16, None)
            .unwrap()
            .unwrap();
        assert_eq!((new[0].len(), new[1].len()), (1, 1));
        mamba.push(new[1][0]);
        assert_eq!(s.kv_block_tables(&fill).unwrap()[1].len(), step + 1);
        assert_eq!(s.kv_outside_tokens(&fill), Some((64, 16 * (step + 1))));
        // vLLM's `req_to_blocks` holds it: the inspection calls list it.
        assert_eq!(s.kv_request_ids(), [fill]);
    }
    // More tokens than it has, or a request the scheduler holds, are refused.
    assert!(s.kv_allocate_outside(&fill, &[], 1, None).is_err());
    s.kv_free_outside(&fill).unwrap();
    assert!(s.kv_block_tables(&fill).is_none());
    assert!(s.kv_outside_tokens(&fill).is_none() && s.kv_request_ids().is_empty());
    s.kv_evict_blocks(&mamba[1..]).unwrap();
    let (_, lengths) = s.kv_hits_per_group(&hashes(5), 79).unwrap();
    assert_eq!(lengths, [64, 16]);
    assert_eq!(resume_at(&mut s, 5), 16);
    assert!(s.kv_allocate_outside(&1, &[], 1, None).is_err());
    s.check_invariants().unwrap();
}

#[test]
fn a_chunk_across_a_shared_prefix_junction_stops_at_its_block_floor() {
    // vLLM's junction stop: a prefix FA caches past the agreed hit ends at 40; a chunk
    // from 0 stops at 32 (block-floored), so the state there is cached. A junction inside
    // the chunk's first block floors to its start: no stop.
    let split = crate::sched::MambaAlignSplit::new(16).rule(0);
    assert_eq!(split.split_at_junction(0, 64, 100, 100, 8192, 40), 32);
    assert_eq!(split.split_at_junction(0, 64, 100, 100, 8192, 8), 64);
    assert_eq!(split.split_at_junction(0, 64, 100, 100, 8192, 0), 64);
    // Past the chunk's end, or at its start: no stop.
    assert_eq!(split.split_at_junction(16, 32, 100, 100, 8192, 80), 32);
}

#[test]
fn a_state_computed_in_this_step_is_not_hit_by_another_request_in_it() {
    // vLLM 0.33's `cached_blocks_this_step`: two prompts sharing 48 tokens arrive together;
    // the first's state at 48 is cached when its chunk is allocated, but computed only by
    // this step, so the second waits for the next step (where it hits 48).
    let cfg = SchedulerConfig {
        kv_groups: vec![KvGroupSpec::FullAttention, KvGroupSpec::MAMBA_ALIGN],
        enable_prefix_caching: true,
        block_size: 16,
        num_blocks: 100,
        max_model_len: 256,
        max_num_batched_tokens: 256,
        mamba_align: Some(crate::sched::MambaAlignSplit::new(16)),
        ..config()
    };
    let mut s = Scheduler::<u32>::new(cfg, false).unwrap();
    let spec = |tail: u32| RequestSpec {
        prompt_token_ids: [tokens(3), vec![1000 + tail; 11]].concat(),
        max_tokens: 1,
        ..RequestSpec::default()
    };
    s.add_request(0, spec(0)).unwrap();
    s.add_request(1, spec(1)).unwrap();
    let out = run_step(&mut s);
    assert_eq!(scheduled(&out), [(0, 48)]);
    let out = s.schedule().unwrap();
    let new: Vec<_> = out
        .scheduled_new_reqs
        .iter()
        .map(|r| (r.request_id, r.num_computed_tokens))
        .collect();
    assert_eq!(new, [(1, 48)]);
}

/// vLLM sizes a Mamba `align` group at two states a request (`MambaSpec.
/// max_memory_usage_bytes`), not a block per table slot: with FA + align on 10 blocks of
/// 16 that hold KV, a request of 8 x 16 = 128 tokens needs 8 + 2 = 10 and fits (a block
/// per slot would be 16); of 129 tokens, 9 + 2 = 11 and is refused at validation.
#[test]
fn an_align_group_counts_two_states_towards_the_longest_request() {
    let cfg = |max_model_len| SchedulerConfig {
        kv_groups: vec![KvGroupSpec::FullAttention, KvGroupSpec::MAMBA_ALIGN],
        enable_prefix_caching: true,
        block_size: 16,
        num_blocks: 10,
        reserve_null_block: false,
        max_model_len,
        max_num_batched_tokens: 16,
        ..config()
    };
    assert_eq!(cfg(128).num_kv_blocks(), 10);
    assert_eq!(cfg(128).blocks_per_request(128), 10);
    assert!(cfg(128).validate().is_ok());
    let err = cfg(129).validate().unwrap_err().to_string();
    assert!(err.contains("needs 11 blocks"), "{err}");
}

//! The KV cache groups of a hybrid model, and what each kind of layer needs of its blocks
//! (vLLM 0.33's `single_type_kv_cache_manager.py`): which leading tokens it no longer
//! attends to (`get_num_skipped_tokens`), how many blocks it holds for a number of token
//! slots, and how it finds a prefix-cache hit (`find_longest_cache_hit` of
//! `FullAttentionManager`, `SlidingWindowManager`, `ChunkedLocalAttentionManager`). A
//! cross-attention group (`CrossAttentionManager`) is sized by encoder tokens instead
//! (`GroupSlots`) and never hits.
//!
//! The finders read the pool only through `lookup`, which answers the cached block of one
//! block index for every group of a spec group, or `None` when any of them misses (vLLM's
//! `BlockPool.get_cached_block`).

use super::block_pool::BlockId;

/// The block id that stands for "no block" in a block table: vLLM's null block, the
/// pool's block 0, never allocated, whose slots an attention kernel may read but never
/// attends to.
pub const NULL_BLOCK: BlockId = 0;

/// One KV cache group's layer kind (vLLM's `KVCacheSpec` subclasses). All groups share
/// the pool's block size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvGroupSpec {
    /// Every token attends to every earlier one: blocks are held until the request ends.
    FullAttention,
    /// Each token attends to the `sliding_window` tokens ending at itself: blocks wholly
    /// before the window are freed and replaced by the null block.
    SlidingWindow { sliding_window: usize },
    /// A sliding window that is not prefix-cached but rebuilt by bounded replay (vLLM
    /// 0.33's `SlidingWindowMLASpec(bounded_replay=True)`, DeepSeek-V4.1): its blocks never
    /// enter the cache nor limit a hit; after a hit the scheduler recomputes the hit's last
    /// `sliding_window` tokens (`prefix_replay_tokens`) to rebuild this group's window,
    /// keeping the other groups' hit blocks. Blocks leave the window as in `SlidingWindow`.
    SlidingWindowReplay { sliding_window: usize },
    /// Tokens attend within their chunk of `attention_chunk_size` tokens (Llama 4's local
    /// layers): blocks before the current chunk are freed.
    ChunkedLocalAttention { attention_chunk_size: usize },
    /// A recurrent (Mamba, linear-attention) state of constant size: one block per
    /// request, as vLLM's `MambaManager` holds it with `mamba_cache_mode="none"` (its
    /// block covers `max_model_len` tokens), and `num_speculative_blocks` more for the
    /// states after each draft token under speculative decoding (vLLM 0.33's
    /// `MambaSpec.num_speculative_blocks`, `num_speculative_tokens` of the config). Its
    /// states are not prefix-cached.
    Mamba { num_speculative_blocks: usize },
    /// A `none`-mode state whose block is shorter than `max_model_len`: vLLM 0.33's
    /// `MambaManager` then allocates as full attention does, a slot per block of the slots
    /// (lookahead included) plus `num_speculative_blocks`, and frees every block before the
    /// last computed token's state (`get_num_skipped_tokens`: `n - 1`) to a null block. Not
    /// prefix-cached, no admission cap.
    MambaPerBlock { num_speculative_blocks: usize },
    /// A recurrent state kept at block boundaries for prefix caching (vLLM 0.33's
    /// `MambaManager` with `mamba_cache_mode="align"`): the table has a slot per block of
    /// the request's tokens, null but for the block holding the running state (and, until
    /// the next allocation frees it, the state it was copied from). A block at index `i`
    /// holds the state after `(i + 1) * block_size` tokens and is cached under that
    /// block's hash once full; a hit needs only the state block at its end.
    ///
    /// `num_speculative_blocks` (vLLM's `MambaSpec.num_speculative_blocks`) more blocks
    /// follow the running state for the draft tokens' states: the table's last
    /// `1 + num_speculative_blocks` slots, moved to its end as the state advances
    /// (`MambaManager._relocate_speculative_block`). With `prefill_checkpoint_alignment`
    /// (vLLM's `num_prefill_checkpoint_blocks = 1` and its `prefill_checkpoint_alignment`),
    /// the backend writes the state of the last reusable boundary from inside a prompt's
    /// final chunk into one more block (`MambaManager._checkpoints`), so that chunk need
    /// not stop there (`sched::mamba_align`).
    MambaAlign {
        num_speculative_blocks: usize,
        prefill_checkpoint_alignment: Option<usize>,
    },
    /// Cross-attention of an encoder-decoder model (Whisper; vLLM 0.33's
    /// `CrossAttentionManager`): the keys and values of the request's encoder output, one
    /// slot per encoder token. Its blocks are allocated once, when the encoder inputs are
    /// scheduled, for exactly those tokens (the allocation's `num_encoder_tokens`, not its
    /// decoder slots), and held until the request ends. Never prefix-cached.
    CrossAttention,
    /// HiSparse's GPU-resident pages (vLLM 0.33's `HiSparseResidentSpec` and
    /// `HiSparseResidentManager`): a page per block of the request's tokens, as full
    /// attention holds them, but never prefix-cached (the host source group caches), and
    /// counted at the full-sequence admission gate only up to `max_admission_blocks` (the
    /// spec's `max_admission_blocks_per_request`: older pages are expected to move to host).
    /// A connector load keeps the loaded pages on host but the last (`coordinator_hisparse`).
    HiSparseResident { max_admission_blocks: usize },
    /// HiSparse's hot region (vLLM 0.33's `HiSparseHotSpec` and `HiSparseHotManager`):
    /// `blocks_per_request` blocks, taken only once the request must read host-backed
    /// history (a connector load; a host prefix hit, not modelled) and held to its end;
    /// none otherwise. Never prefix-cached.
    HiSparseHot { blocks_per_request: usize },
}

impl KvGroupSpec {
    /// A Mamba group in vLLM's `mamba_cache_mode="none"` without speculative state blocks.
    pub const MAMBA: Self = Self::Mamba {
        num_speculative_blocks: 0,
    };

    /// A Mamba group in vLLM's `mamba_cache_mode="align"` without speculative state blocks
    /// or a prefill checkpoint block.
    pub const MAMBA_ALIGN: Self = Self::MambaAlign {
        num_speculative_blocks: 0,
        prefill_checkpoint_alignment: None,
    };

    /// vLLM 0.33's `MambaSpec` as a group: `align` for `mamba_cache_mode="align"`, with
    /// `num_speculative_blocks`, and in align mode `num_prefill_checkpoint_blocks` (0 or 1:
    /// vLLM's `MambaManager` reserves at most one) at `prefill_checkpoint_alignment`.
    /// Refuses what would not change the answer (a checkpoint block in `none` mode, which
    /// vLLM ignores; a checkpoint without its alignment or the reverse) and values out of
    /// range, naming the field.
    pub fn mamba(
        align: bool,
        num_speculative_blocks: usize,
        num_prefill_checkpoint_blocks: usize,
        prefill_checkpoint_alignment: Option<usize>,
    ) -> crate::Result<Self> {
        Self::mamba_blocks(
            align,
            true,
            num_speculative_blocks,
            num_prefill_checkpoint_blocks,
            prefill_checkpoint_alignment,
        )
    }

    /// [`Self::mamba`] with `block_covers_request`: `false` for a `none`-mode group whose
    /// block is shorter than `max_model_len` ([`Self::MambaPerBlock`]); refused with
    /// `align` (an align group always has a slot per block).
    pub fn mamba_blocks(
        align: bool,
        block_covers_request: bool,
        num_speculative_blocks: usize,
        num_prefill_checkpoint_blocks: usize,
        prefill_checkpoint_alignment: Option<usize>,
    ) -> crate::Result<Self> {
        let checkpoint = num_prefill_checkpoint_blocks > 0;
        let refuse = |field, value: String, reason: &str| {
            Err(crate::Error::config(field, value, reason.to_string()))
        };
        if num_prefill_checkpoint_blocks > 1 {
            return refuse(
                "num_prefill_checkpoint_blocks",
                num_prefill_checkpoint_blocks.to_string(),
                "must be 0 or 1 (vLLM 0.33's MambaManager reserves one checkpoint block)",
            );
        }
        if checkpoint && !align {
            return refuse(
                "num_prefill_checkpoint_blocks",
                "1".into(),
                "needs mamba_cache_mode='align' (vLLM 0.33 ignores it in 'none' mode)",
            );
        }
        match prefill_checkpoint_alignment {
            Some(0) => {
                return refuse(
                    "prefill_checkpoint_alignment",
                    "0".into(),
                    "must be at least 1 token",
                );
            }
            Some(a) if !checkpoint => {
                return refuse(
                    "prefill_checkpoint_alignment",
                    a.to_string(),
                    "needs num_prefill_checkpoint_blocks=1",
                );
            }
            None if checkpoint => {
                return refuse(
                    "prefill_checkpoint_alignment",
                    "None".into(),
                    "must be set with num_prefill_checkpoint_blocks=1 (vLLM takes no \
                     checkpoint without it)",
                );
            }
            _ => {}
        }
        if num_speculative_blocks > super::MAX_NUM_BLOCKS {
            return refuse(
                "num_speculative_blocks",
                num_speculative_blocks.to_string(),
                "is larger than any pool",
            );
        }
        if align && !block_covers_request {
            return refuse(
                "block_covers_request",
                "False".into(),
                "is for mamba_cache_mode='none' (an align group holds a slot per block)",
            );
        }
        Ok(match align {
            false if block_covers_request => Self::Mamba {
                num_speculative_blocks,
            },
            false => Self::MambaPerBlock {
                num_speculative_blocks,
            },
            true => Self::MambaAlign {
                num_speculative_blocks,
                prefill_checkpoint_alignment,
            },
        })
    }

    /// vLLM's `get_num_skipped_tokens`: leading tokens the next token no longer attends to.
    pub fn num_skipped_tokens(&self, num_computed_tokens: usize) -> usize {
        match *self {
            Self::FullAttention | Self::Mamba { .. } | Self::CrossAttention => 0,
            Self::HiSparseResident { .. } | Self::HiSparseHot { .. } => 0,
            // Only the last computed token's state is needed (vLLM's MambaManager).
            Self::MambaAlign { .. } | Self::MambaPerBlock { .. } => {
                num_computed_tokens.saturating_sub(1)
            }
            Self::SlidingWindow { sliding_window }
            | Self::SlidingWindowReplay { sliding_window } => {
                (num_computed_tokens + 1).saturating_sub(sliding_window)
            }
            Self::ChunkedLocalAttention {
                attention_chunk_size,
            } => num_computed_tokens / attention_chunk_size * attention_chunk_size,
        }
    }

    /// [`Self::num_skipped_tokens`] with a window's trailing edge extended by
    /// `extra_retained_tokens` (vLLM 0.33's `SlidingWindowSpec.extra_retained_tokens`: a
    /// multi-module MTP drafter may re-prefill that many tokens below the window, so their
    /// blocks are kept though not attended). Other kinds ignore it.
    pub fn num_skipped_tokens_retaining(
        &self,
        num_computed_tokens: usize,
        extra_retained_tokens: usize,
    ) -> usize {
        let skipped = self.num_skipped_tokens(num_computed_tokens);
        match self.is_sliding_window() {
            true => skipped.saturating_sub(extra_retained_tokens),
            false => skipped,
        }
    }

    /// [`Self::max_admission_blocks`] with a window's `extra_retained_tokens` counted, as
    /// vLLM's `max_admission_blocks_per_request` counts them.
    pub fn max_admission_blocks_retaining(
        &self,
        max_in_flight_tokens: usize,
        block_size: usize,
        extra_retained_tokens: usize,
    ) -> Option<usize> {
        let extra = if self.is_sliding_window() {
            extra_retained_tokens
        } else {
            0
        };
        self.max_admission_blocks(max_in_flight_tokens + extra, block_size)
    }

    /// A sliding window, prefix-cached or rebuilt by bounded replay.
    pub fn is_sliding_window(&self) -> bool {
        matches!(
            self,
            Self::SlidingWindow { .. } | Self::SlidingWindowReplay { .. }
        )
    }

    /// Blocks a request needs for `num_slots` token slots (including skipped ones, which
    /// hold the null block); for cross-attention, `num_slots` are encoder tokens. A Mamba
    /// `align` table has this many slots (its speculative ones after a slot per block), of
    /// which a few hold blocks (vLLM's `cdiv(num_tokens, block_size) +
    /// num_speculative_blocks`).
    pub fn num_required_blocks(&self, num_slots: usize, block_size: usize) -> usize {
        match *self {
            _ if num_slots == 0 => 0,
            Self::Mamba {
                num_speculative_blocks,
            } => 1 + num_speculative_blocks,
            Self::MambaAlign {
                num_speculative_blocks,
                ..
            }
            | Self::MambaPerBlock {
                num_speculative_blocks,
            } => num_slots.div_ceil(block_size) + num_speculative_blocks,
            // Only a request required to read from host holds one (`hot_blocks`).
            Self::HiSparseHot { .. } => 0,
            _ => num_slots.div_ceil(block_size),
        }
    }

    /// The draft-token state blocks of a Mamba group (vLLM's
    /// `MambaSpec.num_speculative_blocks`), 0 for other groups.
    pub fn num_speculative_blocks(&self) -> usize {
        match *self {
            Self::Mamba {
                num_speculative_blocks,
            }
            | Self::MambaPerBlock {
                num_speculative_blocks,
            }
            | Self::MambaAlign {
                num_speculative_blocks,
                ..
            } => num_speculative_blocks,
            _ => 0,
        }
    }

    /// The token alignment of the prefill checkpoints a Mamba `align` group's backend
    /// writes from inside a chunk (vLLM's `MambaSpec.prefill_checkpoint_alignment` with
    /// `num_prefill_checkpoint_blocks > 0`), `None` when it writes none.
    pub fn prefill_checkpoint_alignment(&self) -> Option<usize> {
        match *self {
            Self::MambaAlign {
                prefill_checkpoint_alignment,
                ..
            } => prefill_checkpoint_alignment,
            _ => None,
        }
    }

    /// Whether its full blocks enter the prefix cache. vLLM's `reachable_block_mask` caches
    /// a window group's blocks only where a hit could use them: with a window of one
    /// token a hit needs no earlier block, so none is cached (nor, then, ever hit).
    pub(super) fn caches_blocks(&self) -> bool {
        !matches!(
            self,
            Self::Mamba { .. }
                | Self::MambaPerBlock { .. }
                | Self::CrossAttention
                | Self::SlidingWindow { sliding_window: 1 }
                | Self::SlidingWindowReplay { .. }
                | Self::HiSparseResident { .. }
                | Self::HiSparseHot { .. }
        )
    }

    /// vLLM 0.33's HiSparse device groups (`HiSparseResidentSpec`, `HiSparseHotSpec`).
    pub fn is_hisparse(&self) -> bool {
        matches!(
            self,
            Self::HiSparseResident { .. } | Self::HiSparseHot { .. }
        )
    }

    /// The hot region a request required to read from host holds (vLLM 0.33's
    /// `HiSparseHotManager.blocks_per_request`), `None` for other groups.
    pub fn hot_blocks(&self) -> Option<usize> {
        match *self {
            Self::HiSparseHot { blocks_per_request } => Some(blocks_per_request),
            _ => None,
        }
    }

    /// vLLM 0.33's Mamba `align` group (`MambaManager` with `mamba_cache_mode="align"`).
    pub fn is_mamba_align(&self) -> bool {
        matches!(self, Self::MambaAlign { .. })
    }

    /// Whether the group holds a recurrent state (vLLM's `MambaSpec`, either mode).
    pub fn is_mamba(&self) -> bool {
        matches!(
            self,
            Self::Mamba { .. } | Self::MambaPerBlock { .. } | Self::MambaAlign { .. }
        )
    }

    /// A `none`-mode Mamba group, not prefix-cached (vLLM's `MambaManager` outside align
    /// mode), whether its block covers the request or not.
    pub fn is_mamba_none(&self) -> bool {
        matches!(self, Self::Mamba { .. } | Self::MambaPerBlock { .. })
    }

    /// vLLM 0.33's `KVCacheSpec.prefix_replay_tokens`: the tokens of a hit the scheduler
    /// recomputes to rebuild this group (the window of a bounded-replay group), else 0.
    pub fn prefix_replay_tokens(&self) -> usize {
        match *self {
            Self::SlidingWindowReplay { sliding_window } => sliding_window,
            _ => 0,
        }
    }

    pub(super) fn is_full_attention(&self) -> bool {
        matches!(self, Self::FullAttention)
    }

    /// The most blocks that are not the null block a request of this group holds right
    /// after an allocation that added `num_slots_added` slots (new tokens + lookahead),
    /// when the bound exists (sliding window, chunked local, Mamba). Derived in docs/kv.md.
    pub fn max_live_blocks(&self, num_slots_added: usize, block_size: usize) -> Option<usize> {
        match *self {
            Self::FullAttention | Self::CrossAttention | Self::HiSparseResident { .. } => None,
            Self::HiSparseHot { blocks_per_request } => Some(blocks_per_request),
            Self::SlidingWindow { sliding_window }
            | Self::SlidingWindowReplay { sliding_window } => Some(
                (sliding_window + num_slots_added)
                    .saturating_sub(2)
                    .div_ceil(block_size)
                    + 1,
            ),
            Self::ChunkedLocalAttention {
                attention_chunk_size,
            } => Some(if attention_chunk_size % block_size == 0 {
                (attention_chunk_size + num_slots_added - 1).div_ceil(block_size)
            } else {
                (attention_chunk_size + num_slots_added - 2).div_ceil(block_size) + 1
            }),
            Self::Mamba {
                num_speculative_blocks,
            } => Some(1 + num_speculative_blocks),
            // The block of the last computed token's state, the blocks of the slots added
            // after it, then the speculative ones (a sliding window of 2 tokens and those).
            Self::MambaPerBlock {
                num_speculative_blocks,
            } => Some(num_slots_added.div_ceil(block_size) + 1 + num_speculative_blocks),
            // The running state and the state it was copied from (freed at the next
            // allocation), the draft tokens' states and the prefill checkpoint (vLLM
            // 0.33's `MambaSpec.max_memory_usage_bytes` in align mode).
            Self::MambaAlign {
                num_speculative_blocks,
                prefill_checkpoint_alignment,
            } => Some(
                2 + num_speculative_blocks + usize::from(prefill_checkpoint_alignment.is_some()),
            ),
        }
    }

    /// vLLM 0.33's `max_admission_blocks_per_request` (`kv_cache_interface.py`): the most
    /// blocks the full-sequence admission gate counts for one request of this group, with
    /// `max_in_flight_tokens` scheduled but not yet processed (out-of-window blocks are
    /// freed on the processed-token basis). `None`: no cap (full attention, Mamba).
    pub fn max_admission_blocks(
        &self,
        max_in_flight_tokens: usize,
        block_size: usize,
    ) -> Option<usize> {
        match *self {
            Self::FullAttention
            | Self::Mamba { .. }
            | Self::MambaPerBlock { .. }
            | Self::MambaAlign { .. }
            | Self::CrossAttention => None,
            Self::HiSparseHot { .. } => None,
            Self::HiSparseResident {
                max_admission_blocks,
            } => Some(max_admission_blocks),
            Self::SlidingWindow { sliding_window }
            | Self::SlidingWindowReplay { sliding_window } => {
                Some((sliding_window - 1 + max_in_flight_tokens).div_ceil(block_size) + 1)
            }
            Self::ChunkedLocalAttention {
                attention_chunk_size,
            } => Some((attention_chunk_size + max_in_flight_tokens).div_ceil(block_size)),
        }
    }

    /// Checks the spec's own values (the message names `{list}[index]`, `list` being the
    /// field that holds the groups).
    pub(crate) fn check(&self, list: &'static str, index: usize) -> crate::Result<()> {
        let (field, value) = match *self {
            Self::SlidingWindow { sliding_window }
            | Self::SlidingWindowReplay { sliding_window } => ("sliding_window", sliding_window),
            Self::ChunkedLocalAttention {
                attention_chunk_size,
            } => ("attention_chunk_size", attention_chunk_size),
            Self::Mamba {
                num_speculative_blocks,
            }
            | Self::MambaPerBlock {
                num_speculative_blocks,
            } => ("num_speculative_blocks", num_speculative_blocks),
            Self::MambaAlign {
                num_speculative_blocks,
                prefill_checkpoint_alignment,
            } => {
                if prefill_checkpoint_alignment == Some(0) {
                    return Err(crate::Error::config(
                        list,
                        format!("{list}[{index}].prefill_checkpoint_alignment=0"),
                        "must be at least 1 token",
                    ));
                }
                ("num_speculative_blocks", num_speculative_blocks)
            }
            Self::HiSparseResident {
                max_admission_blocks,
            } => ("max_admission_blocks", max_admission_blocks),
            Self::HiSparseHot { blocks_per_request } => ("blocks_per_request", blocks_per_request),
            _ => return Ok(()),
        };
        // The draft-token state blocks may be 0; the windows may not.
        let least = usize::from(field != "num_speculative_blocks");
        if value < least || value > super::MAX_NUM_BLOCKS {
            return Err(crate::Error::config(
                list,
                format!("{list}[{index}].{field}={value}"),
                format!("must be between {least} and {}", super::MAX_NUM_BLOCKS),
            ));
        }
        Ok(())
    }
}

/// vLLM 0.33's `get_mamba_prefill_checkpoint_position` (`kv_cache_interface.py`): the
/// last boundary of `hash_block_size` tokens within `num_tokens` whose Mamba state can be
/// reused, leaving a token for the logits (or the hash look-ahead) and, with EAGLE's block
/// drop, one block less.
pub fn mamba_checkpoint_position(
    num_tokens: usize,
    hash_block_size: usize,
    drop_eagle_block: bool,
    num_hash_lookahead_tokens: usize,
) -> usize {
    let proof_limit = if drop_eagle_block {
        num_tokens
    } else {
        num_tokens.saturating_sub(num_hash_lookahead_tokens.max(1))
    };
    let position = proof_limit / hash_block_size * hash_block_size;
    match drop_eagle_block {
        true => position.saturating_sub(hash_block_size),
        false => position,
    }
}

/// vLLM 0.33's `is_mamba_prefill_checkpoint_valid`: whether a backend writing checkpoints
/// at multiples of `alignment` tokens past a chunk's start can export the state at
/// `checkpoint` from inside the chunk `[start, end)` (block-aligned start, a block of
/// state past the chunk's initial state, strictly inside it).
pub fn mamba_checkpoint_valid(
    start: usize,
    end: usize,
    checkpoint: usize,
    block_size: usize,
    alignment: usize,
) -> bool {
    let (start_i, block) = (start as i64, block_size as i64);
    let initial_state_col = (start_i - 1).div_euclid(block);
    let checkpoint_col = end.div_ceil(block_size) as i64 - 2;
    start.is_multiple_of(block_size)
        && checkpoint_col > initial_state_col
        && start + block_size <= checkpoint
        && start < checkpoint
        && checkpoint < end
        && (checkpoint - start).is_multiple_of(alignment)
}

/// The token slots an allocation asks of each group: decoder slots, and for
/// cross-attention groups the encoder tokens (vLLM's coordinator passes
/// `num_encoder_tokens` to its `CrossAttentionManager`, `num_tokens` to the others). A
/// Mamba `align` group is sized without the `lookahead` slots (vLLM's
/// `num_tokens_main_model`: draft models have no Mamba layers, and lookahead slots would
/// break the block alignment).
#[derive(Debug, Clone, Copy)]
pub(super) struct GroupSlots {
    pub(super) decoder: usize,
    pub(super) encoder: usize,
    pub(super) lookahead: usize,
}

impl GroupSlots {
    pub(super) fn decoder(decoder: usize) -> Self {
        Self {
            decoder,
            encoder: 0,
            lookahead: 0,
        }
    }

    pub(super) fn of(self, spec: &KvGroupSpec) -> usize {
        match spec {
            KvGroupSpec::CrossAttention => self.encoder,
            KvGroupSpec::MambaAlign { .. } => self.decoder.saturating_sub(self.lookahead),
            _ => self.decoder,
        }
    }
}

/// Groups with one spec and one block size, looked up together (vLLM's `SpecGroup`).
#[derive(Debug, Clone)]
pub(super) struct SpecGroup {
    pub(super) spec: KvGroupSpec,
    pub(super) group_ids: Vec<usize>,
    /// The member groups' block size.
    pub(super) block_size: usize,
}

/// vLLM's `HybridKVCacheCoordinator.verify_and_split_kv_cache_groups`: groups of equal
/// spec (vLLM's spec holds the block size, so equal block size too) batched, full
/// attention first (a stable sort, so otherwise in group order).
pub(super) fn spec_groups(groups: &[KvGroupSpec], block_sizes: &[usize]) -> Vec<SpecGroup> {
    let mut out: Vec<SpecGroup> = Vec::new();
    for (i, (spec, &block_size)) in groups.iter().zip(block_sizes).enumerate() {
        match (out.iter_mut()).find(|g| g.spec == *spec && g.block_size == block_size) {
            Some(group) => group.group_ids.push(i),
            None => out.push(SpecGroup {
                spec: *spec,
                group_ids: vec![i],
                block_size,
            }),
        }
    }
    out.sort_by_key(|g| !g.spec.is_full_attention());
    out
}

/// The hit of one spec group: a block table per member group, and its length in tokens.
pub(super) struct GroupHit {
    pub(super) blocks: Vec<Vec<BlockId>>,
    pub(super) num_tokens: usize,
}

/// One spec group's `find_longest_cache_hit` over the first `num_hashes` block hashes
/// (those are the request's full blocks), no longer than `max_length` tokens and a
/// multiple of `alignment` tokens (vLLM's `alignment_tokens`: the scheduler block size, the
/// block size itself unless groups differ in it). `lookup(i)` answers block index i's
/// cached block for every member group, or `None`. `drop_eagle_block`: vLLM's EAGLE drop,
/// the hit's last block (`max_length` then reaches a block past the candidate hit).
#[allow(clippy::too_many_arguments)]
pub(super) fn find_longest_cache_hit(
    spec: KvGroupSpec,
    num_groups: usize,
    block_size: usize,
    alignment: usize,
    num_hashes: usize,
    max_length: usize,
    drop_eagle_block: bool,
    mut lookup: impl FnMut(usize) -> Option<Vec<BlockId>>,
) -> GroupHit {
    // Whether `n` blocks end on the alignment (always, when it is the block size).
    let aligned = |n: usize| alignment == block_size || (n * block_size).is_multiple_of(alignment);
    let max_blocks = (max_length / block_size).min(num_hashes);
    let mut blocks = vec![Vec::new(); num_groups];
    match spec {
        KvGroupSpec::FullAttention => {
            for i in 0..max_blocks {
                let Some(found) = lookup(i) else { break };
                blocks.iter_mut().zip(found).for_each(|(t, b)| t.push(b));
            }
            // vLLM drops EAGLE's block (one block: no partial hash hits here), rounds the
            // hit down to the alignment and keeps the blocks covering it.
            let mut hit = blocks[0].len() * block_size;
            if drop_eagle_block && hit > 0 {
                hit -= block_size;
            }
            let hit = hit - hit % alignment;
            blocks
                .iter_mut()
                .for_each(|t| t.truncate(hit.div_ceil(block_size)));
            return GroupHit {
                blocks,
                num_tokens: hit,
            };
        }
        KvGroupSpec::SlidingWindow { sliding_window } => {
            // The hit's last `need` blocks must all be cached; those before it are nulls.
            // Searched right to left, the first run long enough wins; a run reaching
            // block 0 is a hit even if shorter.
            // EAGLE needs one block more, dropped once found (`_contiguous_blocks_for_hit`).
            let need = (sliding_window - 1).div_ceil(block_size) + usize::from(drop_eagle_block);
            blocks
                .iter_mut()
                .for_each(|t| t.resize(max_blocks, NULL_BLOCK));
            let mut run = 0;
            let mut end = None;
            for i in (0..max_blocks).rev() {
                match lookup(i) {
                    // vLLM starts a run only where its end (after EAGLE's drop) is aligned.
                    Some(_) if run == 0 && !aligned(i + usize::from(!drop_eagle_block)) => {}
                    Some(found) => {
                        blocks.iter_mut().zip(found).for_each(|(t, b)| t[i] = b);
                        run += 1;
                        if run >= need {
                            end = Some(i + run);
                            break;
                        }
                    }
                    None => run = 0,
                }
            }
            // A run from block 0 too short for the window is a hit, cut to the alignment.
            let align_down = |n: usize| (0..=n).rev().find(|&n| aligned(n)).unwrap_or(0);
            let mut end = end.unwrap_or_else(|| align_down(run));
            if drop_eagle_block && end > 0 {
                end = align_down(end - 1);
            }
            blocks.iter_mut().for_each(|t| t.truncate(end));
        }
        KvGroupSpec::ChunkedLocalAttention {
            attention_chunk_size,
        } => {
            // Blocks before the chunk of the hit's end are nulls; the rest must be cached.
            let chunk_start = max_length / attention_chunk_size * attention_chunk_size;
            let first = chunk_start / block_size;
            blocks.iter_mut().for_each(|t| t.resize(first, NULL_BLOCK));
            for i in first..max_blocks {
                let Some(found) = lookup(i) else { break };
                blocks.iter_mut().zip(found).for_each(|(t, b)| t.push(b));
            }
        }
        KvGroupSpec::MambaAlign { .. } => {
            // vLLM's `MambaManager.find_longest_cache_hit`: right to left, the first cached
            // state ending on the alignment wins (beside differing block sizes a state off
            // the scheduler block grid is passed over); the blocks before it are nulls (a
            // state needs no earlier block).
            for i in (0..max_blocks).rev() {
                if !aligned(i + 1) {
                    continue;
                }
                if let Some(found) = lookup(i) {
                    blocks.iter_mut().zip(found).for_each(|(t, b)| {
                        t.resize(i, NULL_BLOCK);
                        t.push(b);
                    });
                    break;
                }
            }
        }
        // Never cached (the coordinator refuses prefix caching beside them).
        KvGroupSpec::Mamba { .. } | KvGroupSpec::MambaPerBlock { .. } => {}
        KvGroupSpec::CrossAttention => {}
        KvGroupSpec::HiSparseResident { .. } | KvGroupSpec::HiSparseHot { .. } => {}
        // Never cached, so it never limits the hit: no blocks of it are adopted.
        KvGroupSpec::SlidingWindowReplay { .. } => {
            return GroupHit {
                blocks,
                num_tokens: max_length,
            };
        }
    }
    let num_tokens = blocks[0].len() * block_size;
    GroupHit { blocks, num_tokens }
}

#[cfg(test)]
#[path = "layer_groups_tests.rs"]
mod tests;

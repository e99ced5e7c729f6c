//! Which KV cache groups EAGLE's trailing-block drop acts in (vLLM 0.33's
//! `KVCacheGroupSpec.is_eagle_group`, read by `KVCacheCoordinator.__init__` into
//! `drop_eagle_group_ids`).
//!
//! vLLM drops in the groups flagged as the drafter's (EAGLE/MTP) groups, all of them when
//! none is flagged; the groups sharing one spec are looked up together, so a spec group
//! drops when any member is flagged (`HybridKVCacheCoordinator
//! .verify_and_split_kv_cache_groups`, `SpecGroup.use_eagle`). A group that does not drop
//! takes no proof margin and no `eagle_verified` mark, and a chunked local attention group
//! may stand beside the drop only unflagged (vLLM's `ChunkedLocalAttentionManager` asserts
//! `drop_eagle_block is False`).
//!
//! Invariant: `eagle_groups` has one flag per group and at least one is set.

use super::{KvCoordinator, KvGroupSpec, RequestKey, SpecGroup};
use crate::{Error, Result};

impl<R: RequestKey> KvCoordinator<R> {
    /// Sets vLLM's `is_eagle_group` of each group: the groups EAGLE's block drop
    /// ([`Self::set_eagle_block_drop`]) acts in. Empty or all `false`: every group, as
    /// vLLM falls back to when none is flagged. Only while no request holds blocks.
    ///
    /// Errors: `ConfigError` naming `is_eagle_group` for a length other than the groups',
    /// for a flagged chunked local attention group while the drop is on (vLLM's manager
    /// asserts it never drops), or while a request holds blocks.
    pub fn set_eagle_groups(&mut self, flags: &[bool]) -> Result<()> {
        let field = "is_eagle_group";
        if !flags.is_empty() && flags.len() != self.groups.len() {
            return Err(Error::config(
                field,
                format!("{flags:?}"),
                format!("must have one flag per KV group ({})", self.groups.len()),
            ));
        }
        let flags = match flags.iter().any(|&f| f) {
            true => flags.to_vec(),
            false => vec![true; self.groups.len()],
        };
        if let Some(g) =
            chunked_local_flagged(&self.groups, &flags).filter(|_| self.sizes.drop_eagle)
        {
            return Err(Error::config(
                field,
                format!("{flags:?}"),
                format!(
                    "groups[{g}] is chunked local attention, which vLLM 0.33's hybrid \
                     coordinator serves only outside EAGLE's block drop"
                ),
            ));
        }
        if flags != self.eagle_groups && self.num_requests() > 0 {
            return Err(Error::config(
                field,
                format!("{flags:?}"),
                "the EAGLE groups change only while no request holds blocks",
            ));
        }
        self.eagle_groups = flags;
        Ok(())
    }

    /// Each group's `is_eagle_group` ([`Self::set_eagle_groups`]; all `true` unless set).
    pub fn eagle_groups(&self) -> &[bool] {
        &self.eagle_groups
    }

    /// Whether `group`'s hits drop EAGLE's block: the drop is on and a member group is
    /// flagged (vLLM's `SpecGroup.use_eagle`).
    pub(super) fn drops_in(&self, group: &SpecGroup) -> bool {
        self.sizes.drop_eagle && group.group_ids.iter().any(|&g| self.eagle_groups[g])
    }

    /// The first chunked local attention group flagged as an EAGLE group, which the drop
    /// may not act in.
    pub(super) fn flagged_chunked_local(&self) -> Option<usize> {
        chunked_local_flagged(&self.groups, &self.eagle_groups)
    }
}

fn chunked_local_flagged(groups: &[KvGroupSpec], flags: &[bool]) -> Option<usize> {
    let chunked = |s: &KvGroupSpec| matches!(s, KvGroupSpec::ChunkedLocalAttention { .. });
    (groups.iter().zip(flags)).position(|(s, &flag)| flag && chunked(s))
}

"""The replica scheduler's config: the policy (a name from the registry in the Rust core,
or a plugin), and one section per engine in that engine's own words (``vllm_v1`` is
``tokenyard.sched.SchedulerConfig``; ``vidur``; ``sglang``; ``plugin``). Only the selected
policy's section is read.

The one-level keys of older config files (``[replica.scheduler] max_num_seqs = 64``) are
moved into the selected policy's section (``translate_legacy_scheduler``, and for dotted
overrides ``move_legacy_keys``/``section_path``); a key that policy would ignore is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from tokenyard import _core
from tokenyard._checks import check_key_choice, check_key_int, check_key_number, fail
from tokenyard.sched import SchedulerConfig

__all__ = [
    "GLOBAL_POLICIES",
    "LEGACY_KEYS",
    "REPLICA_POLICIES",
    "PluginSchedulerConfig",
    "ReplicaSchedulerConfig",
    "SglangSchedulerConfig",
    "VidurSchedulerConfig",
    "check_policy",
    "move_legacy_keys",
    "pipeline_parallel",
    "policy_section",
    "section_path",
    "translate_legacy_scheduler",
]

#: The built-in policies, from the registry in the Rust core.
GLOBAL_POLICIES: tuple[str, ...] = tuple(_core.GLOBAL_POLICIES)
REPLICA_POLICIES: tuple[str, ...] = tuple(_core.REPLICA_POLICIES)

#: Size limits: nothing the simulator allocates grows past these.
MAX_REPLICAS = 4096
MAX_TOKENS = 2**24  # one request's tokens, a batch's token budget
MAX_BLOCKS = 2**26  # KV blocks of one replica
MAX_BLOCK_SIZE = 2**16


def check_policy(where: str, policy: str, names: tuple[str, ...]) -> None:
    if policy not in names and ":" not in policy:
        raise fail(
            where,
            f"must be one of {', '.join(names)} or 'module:Class', got {policy!r}",
            policy,
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class VidurSchedulerConfig:
    """Vidur's knobs, shared by its five schedulers (``vllm``, ``sarathi``, ``orca``,
    ``lightllm``, ``faster_transformer``) under Vidur's names."""

    block_size: int = 16
    #: KV blocks per replica; 0 = from the memory planner.
    num_blocks: int = 0
    #: Requests holding memory at once.
    batch_size_cap: int = 128
    watermark_blocks_fraction: float = 0.01
    #: vllm / lightllm: (padded) tokens in a prefill batch.
    max_tokens_in_batch: int = 4096
    #: sarathi: token budget per batch.
    chunk_size: int = 512
    #: lightllm: decode batches before a waiting prefill runs.
    max_waiting_iters: int = 10
    #: vllm / sarathi: a preempted request restarts as "recompute" (its whole prompt) or as
    #: "vidur" (Vidur 0.0.26: only the prompt tokens processed so far; docs/simulate.md).
    restart: str = "recompute"

    def check(self, where: str) -> None:
        check_key_choice(f"{where}.restart", self.restart, ("recompute", "vidur"))
        check_key_int(f"{where}.block_size", self.block_size, low=1, high=MAX_BLOCK_SIZE)
        check_key_int(f"{where}.num_blocks", self.num_blocks, low=0, high=MAX_BLOCKS)
        for name in ("batch_size_cap", "max_tokens_in_batch", "chunk_size"):
            check_key_int(f"{where}.{name}", getattr(self, name), low=1, high=MAX_TOKENS)
        check_key_int(f"{where}.max_waiting_iters", self.max_waiting_iters, low=0, high=MAX_TOKENS)
        check_key_number(
            f"{where}.watermark_blocks_fraction", self.watermark_blocks_fraction, low=0, high=0.99
        )


#: SGLang's default CUDA-graph batch sizes (decode batches are padded up to one).
SGLANG_GRAPH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 256)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SglangSchedulerConfig:
    """SGLang's knobs, under SGLang's names."""

    page_size: int = 16
    #: KV pages per replica; 0 = from the memory planner.
    num_pages: int = 0
    max_running_requests: int = 256
    #: Extend (prefill) tokens per prefill batch.
    chunked_prefill_size: int = 2048
    #: Decode batches are padded up to these sizes for their cost.
    cuda_graph_bs: tuple[int, ...] = SGLANG_GRAPH_SIZES

    def check(self, where: str) -> None:
        check_key_int(f"{where}.page_size", self.page_size, low=1, high=MAX_BLOCK_SIZE)
        check_key_int(f"{where}.num_pages", self.num_pages, low=0, high=MAX_BLOCKS)
        for name in ("max_running_requests", "chunked_prefill_size"):
            check_key_int(f"{where}.{name}", getattr(self, name), low=1, high=MAX_TOKENS)
        sizes = self.cuda_graph_bs
        if any(s < 1 or s > MAX_TOKENS for s in sizes) or list(sizes) != sorted(set(sizes)):
            raise fail(
                f"{where}.cuda_graph_bs",
                f"must be increasing ints in [1, {MAX_TOKENS}], got {list(sizes)}",
                sizes,
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class PluginSchedulerConfig:
    """A ``module:Class`` replica policy: the memory it is told it has, and its own
    options (keyword arguments of its constructor)."""

    block_size: int = 16
    #: 0 = from the memory planner.
    num_blocks: int = 0
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def check(self, where: str) -> None:
        check_key_int(f"{where}.block_size", self.block_size, low=1, high=MAX_BLOCK_SIZE)
        check_key_int(f"{where}.num_blocks", self.num_blocks, low=0, high=MAX_BLOCKS)


def default_vllm_v1() -> SchedulerConfig:
    """The simulator's ``vllm_v1`` section: vLLM's defaults for online serving, with the KV
    blocks (``num_blocks = 0``) and ``max_model_len = 0`` (``max_request_tokens``) taken
    from the replica."""
    return SchedulerConfig(max_num_batched_tokens=2048, num_blocks=0, max_model_len=0)


#: The one-level (legacy) keys of ``[replica.scheduler]`` and, per section, the key each
#: becomes. A key the selected policy's section lacks is refused, never ignored.
LEGACY_KEYS: dict[str, dict[str, str]] = {
    "block_size": {
        "vidur": "block_size",
        "vllm_v1": "block_size",
        "sglang": "page_size",
        "plugin": "block_size",
    },
    "num_blocks": {
        "vidur": "num_blocks",
        "vllm_v1": "num_blocks",
        "sglang": "num_pages",
        "plugin": "num_blocks",
    },
    "batch_size_cap": {"vidur": "batch_size_cap"},
    "watermark_blocks_fraction": {"vidur": "watermark_blocks_fraction"},
    "max_tokens_in_batch": {"vidur": "max_tokens_in_batch"},
    "chunk_size": {"vidur": "chunk_size"},
    "max_waiting_iters": {"vidur": "max_waiting_iters"},
    "restart": {"vidur": "restart"},
    "max_num_batched_tokens": {
        "vllm_v1": "max_num_batched_tokens",
        "sglang": "chunked_prefill_size",
    },
    "max_num_seqs": {"vllm_v1": "max_num_seqs", "sglang": "max_running_requests"},
    "long_prefill_token_threshold": {"vllm_v1": "long_prefill_token_threshold"},
    "enable_chunked_prefill": {"vllm_v1": "enable_chunked_prefill"},
    "enable_prefix_caching": {"vllm_v1": "enable_prefix_caching"},
    "prefix_cache": {"vllm_v1": "prefix_cache"},
    "scheduling_policy": {"vllm_v1": "policy"},
    "graph_batch_sizes": {"sglang": "cuda_graph_bs"},
}


def pipeline_parallel(policy: str) -> bool:
    """Whether a replica policy (or a plugin) runs under pipeline parallelism."""
    return ":" in policy or bool(_core.REPLICA_POLICIES[policy]["pipeline_parallel"])


def policy_section(policy: str) -> str:
    """The config section of a replica policy: ``vllm_v1``, ``vidur``, ``sglang`` or
    ``plugin``."""
    if ":" in policy:
        return "plugin"
    return str(_core.REPLICA_POLICIES[policy]["section"])


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReplicaSchedulerConfig:
    """The replica scheduler: ``policy`` (a name in the core's registry, or
    ``"module:Class"``), the longest request, and one section per engine in that engine's
    own words. Only the selected policy's section is used; the others are inert."""

    policy: str = "vllm_v1"
    #: Longest request (prompt + output), at most the model's context length; unset: the
    #: model's context length. Every policy refuses a longer request at arrival; the
    #: planner sizes batches for it, orca and faster_transformer reserve it, vllm_v1 uses
    #: it as max_model_len unless that is set.
    max_request_tokens: int | None = None
    #: ``tokenyard.sched.SchedulerConfig`` itself (``docs/embedding.md``).
    vllm_v1: SchedulerConfig = dataclasses.field(default_factory=default_vllm_v1)
    #: vllm_v1: a ``"module:Class"`` step-scheduler policy plugin (``order_waiting``,
    #: ``preemption_order``): the same class ``tokenyard.sched.Scheduler(plugin=...)``
    #: takes, built per replica with ``policy_plugin_options``.
    policy_plugin: str | None = None
    policy_plugin_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    vidur: VidurSchedulerConfig = dataclasses.field(default_factory=VidurSchedulerConfig)
    sglang: SglangSchedulerConfig = dataclasses.field(default_factory=SglangSchedulerConfig)
    plugin: PluginSchedulerConfig = dataclasses.field(default_factory=PluginSchedulerConfig)

    @property
    def section(self) -> str:
        return policy_section(self.policy)

    @property
    def block_size(self) -> int:
        """The selected policy's KV block (page) size."""
        section = self.section
        if section == "vllm_v1":
            return self.vllm_v1.block_size
        if section == "sglang":
            return self.sglang.page_size
        return int(getattr(self, section).block_size)

    @property
    def num_blocks(self) -> int:
        """The selected policy's KV blocks per replica (0: from the planner)."""
        section = self.section
        if section == "sglang":
            return self.sglang.num_pages
        return int(getattr(self, section).num_blocks)

    def request_limit(
        self, model_name: str, context_length: int, where: str = "replica.scheduler"
    ) -> tuple[int, str]:
        """The longest request a replica serves and the setting that makes it so:
        ``vllm_v1.max_model_len`` where that policy sets it, else ``max_request_tokens``,
        else the model's context length (as vLLM's ``max_model_len`` and SGLang's
        ``context_length`` default to it).

        Raises:
            ConfigError: a setting exceeds the model's context length (vLLM 0.33 refuses
                such a ``max_model_len`` at start-up unless ``VLLM_ALLOW_LONG_MAX_MODEL_LEN=1``,
                SGLang such a ``context_length`` unless
                ``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1``; vLLM's own bound is
                ``max_position_embeddings`` times a ``linear``/``dynamic`` RoPE factor, and
                at most the tokenizer's ``model_max_length``).
        """
        settings = [(f"{where}.max_request_tokens", self.max_request_tokens)]
        if self.section == "vllm_v1":
            max_model_len = self.vllm_v1.max_model_len or None  # 0: unset
            settings.insert(0, (f"{where}.vllm_v1.max_model_len", max_model_len))
        for key, value in settings:
            if value is not None and value > context_length:
                raise fail(
                    key,
                    f"must be at most {model_name}'s context length of {context_length} "
                    "tokens (its max_position_embeddings; catalog context_length)",
                    value,
                )
        for key, value in settings:
            if value is not None:
                return value, f"{key} = {value}"
        return context_length, (
            f"{model_name}'s context length of {context_length} tokens (the default of "
            f"{where}.max_request_tokens)"
        )

    def check(self, where: str) -> None:
        check_policy(f"{where}.policy", self.policy, REPLICA_POLICIES)
        if self.max_request_tokens is not None:
            check_key_int(
                f"{where}.max_request_tokens", self.max_request_tokens, low=2, high=MAX_TOKENS
            )
        self.vidur.check(f"{where}.vidur")
        self.sglang.check(f"{where}.sglang")
        self.plugin.check(f"{where}.plugin")
        self._check_vllm_v1(f"{where}.vllm_v1")
        if self.policy_plugin is not None and (
            self.policy != "vllm_v1" or ":" not in self.policy_plugin
        ):
            raise fail(
                f"{where}.policy_plugin",
                f"must be 'module:Class' with policy = 'vllm_v1' (the step scheduler's plugin), "
                f"got {self.policy_plugin!r} with policy {self.policy!r}",
                self.policy_plugin,
            )
        if self.policy_plugin_options and self.policy_plugin is None:
            raise fail(
                f"{where}.policy_plugin_options",
                "applies to a policy_plugin, and none is set",
                dict(self.policy_plugin_options),
            )
        if self.vidur.restart != "recompute" and self.policy in (
            "orca",
            "lightllm",
            "faster_transformer",
        ):
            raise fail(
                f"{where}.vidur.restart",
                f"applies to vllm and sarathi (the policies that preempt), not {self.policy}, "
                f"which would ignore it",
                self.vidur.restart,
            )
        if self.policy == "lightllm" and self.vidur.block_size != 1:
            raise fail(
                f"{where}.vidur.block_size",
                f"must be 1 for lightllm (it manages memory per token), "
                f"got {self.vidur.block_size}",
                self.vidur.block_size,
            )

    def _check_vllm_v1(self, where: str) -> None:
        c = self.vllm_v1
        check_key_int(f"{where}.block_size", c.block_size, low=1, high=MAX_BLOCK_SIZE)
        check_key_int(f"{where}.num_blocks", c.num_blocks, low=0, high=MAX_BLOCKS)
        check_key_int(f"{where}.max_model_len", c.max_model_len, low=0, high=MAX_TOKENS)
        check_key_int(
            f"{where}.max_num_batched_tokens", c.max_num_batched_tokens, low=1, high=MAX_TOKENS
        )
        check_key_int(f"{where}.max_num_seqs", c.max_num_seqs, low=0, high=MAX_TOKENS)
        if c.long_prefill_token_threshold_adaptive and c.long_prefill_token_threshold == 0:
            raise fail(
                f"{where}.long_prefill_token_threshold_adaptive",
                "floors long_prefill_token_threshold at a fair share of the step, and that is "
                "0 (no cap): it would change nothing; set long_prefill_token_threshold too",
                c.long_prefill_token_threshold_adaptive,
            )
        if c.max_num_batched_tokens < c.max_num_seqs:
            # vLLM 0.33's SchedulerConfig refuses it too: a deployment vLLM will not start.
            raise fail(
                f"{where}.max_num_batched_tokens",
                f"must be >= max_num_seqs ({c.max_num_seqs}), as vLLM requires; got "
                f"{c.max_num_batched_tokens} (lower max_num_seqs, or raise this)",
                c.max_num_batched_tokens,
            )
        if c.max_loras != 0:
            # vLLM keeps it in LoRAConfig, with the host cache and the rank beside it.
            raise fail(
                f"{where}.max_loras",
                f"is set in [replica.lora] (max_loras, beside max_cpu_loras and "
                f"max_lora_rank); leave it at 0 here, got {c.max_loras!r}",
                c.max_loras,
            )
        if c.num_speculative_tokens != 0:
            raise fail(
                f"{where}.num_speculative_tokens",
                f"is set in [replica.speculative] (num_speculative_tokens, beside the method and "
                f"its acceptance); leave it at 0 here, got {c.num_speculative_tokens!r}",
                c.num_speculative_tokens,
            )
        for name in ("num_prefill_lookahead", "num_hash_lookahead_tokens"):
            value = getattr(c, name)
            if value != 0:
                # vLLM 0.33 derives both from the speculative config (VllmConfig's
                # properties of those names); the simulator does too (replica_plan.replica_spec).
                raise fail(
                    f"{where}.{name}",
                    "is derived from [replica.speculative] as vLLM derives it (EAGLE: 1, "
                    "multi-module MTP: num_speculative_tokens; set eagle_block_drop = true "
                    f"for vLLM's disable_lookahead_block_hashes); leave it at 0, got {value!r}",
                    value,
                )
        unsupported = (
            ("async_scheduling", c.async_scheduling, False),
            ("num_lookahead_tokens", c.num_lookahead_tokens, 0),
        )
        for name, value, default in unsupported:
            if value != default:
                raise fail(
                    f"{where}.{name}",
                    f"is not simulated yet (it would change nothing); leave it at {default!r}, "
                    f"got {value!r}",
                    value,
                )


def translate_legacy_scheduler(mapping: Any, where: str) -> Any:
    """``[replica.scheduler]`` with its one-level keys (``max_num_seqs = 64``) moved into
    the selected policy's section (``vllm_v1.max_num_seqs = 64``). A key that section does
    not have would be ignored, so it is refused, saying where it belongs."""
    if not isinstance(mapping, Mapping):
        return mapping  # the typed reader reports it
    table = dict(mapping)
    policy = table.get("policy", ReplicaSchedulerConfig.policy)
    if not isinstance(policy, str):
        return table
    check_policy(f"{where}.policy", policy, REPLICA_POLICIES)
    section = policy_section(policy)
    for key in [k for k in table if k in LEGACY_KEYS]:
        value = table.pop(key)
        target = LEGACY_KEYS[key].get(section)
        if target is None:
            owners = ", ".join(f"{where}.{s}.{k}" for s, k in LEGACY_KEYS[key].items())
            raise fail(
                f"{where}.{key}",
                f"does not apply to the {policy} scheduler, which would ignore it; it is {owners}",
                value,
            )
        nested = table.setdefault(section, {})
        if not isinstance(nested, Mapping):
            continue  # the typed reader reports the bad section
        nested = table[section] = dict(nested)
        if target in nested:
            raise fail(
                f"{where}.{key}",
                f"is given twice: here and as {where}.{section}.{target}; keep one",
                value,
            )
        nested[target] = value
    return table


def move_legacy_keys(document: dict[str, Any]) -> None:
    """Moves ``[replica.scheduler]``'s one-level keys into their sections, in place, in a
    simulation document (or one nested under ``simulation``); others are left alone."""
    for holder in (document, document.get("simulation")):
        replica = holder.get("replica") if isinstance(holder, dict) else None
        if isinstance(replica, dict) and isinstance(replica.get("scheduler"), Mapping):
            replica["scheduler"] = translate_legacy_scheduler(
                replica["scheduler"], "replica.scheduler"
            )


def section_path(
    document: Mapping[str, Any], keys: list[str], policy_overrides: Mapping[str, Any]
) -> list[str]:
    """``[..., "replica", "scheduler", legacy]`` as the path in the selected policy's
    section (the policy from the overrides, else the document); other paths unchanged."""
    if len(keys) < 3 or keys[-3:-1] != ["replica", "scheduler"] or keys[-1] not in LEGACY_KEYS:
        return keys
    table: Any = document
    for key in keys[:-1]:
        table = table.get(key) if isinstance(table, Mapping) else None
    policy = policy_overrides.get(".".join(keys[:-1]))
    if policy is None:
        policy = table.get("policy") if isinstance(table, Mapping) else None
    policy = policy if isinstance(policy, str) else ReplicaSchedulerConfig.policy
    if policy not in REPLICA_POLICIES and ":" not in policy:
        return keys  # the typed reader names the bad policy
    target = LEGACY_KEYS[keys[-1]].get(policy_section(policy))
    return keys if target is None else [*keys[:-1], policy_section(policy), target]

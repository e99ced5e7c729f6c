"""``[replica.speculative]``: speculative decoding in ``vllm_v1`` replicas
(``docs/speculative.md``).

Each step a decoding request verifies ``num_speculative_tokens`` drafts with its next token;
a seeded draw (from the simulation's ``seed``) decides how many the target accepts. The
acceptance is given as exactly one of: ``acceptance_rate`` (each draft accepted with that
probability, independently, until the first rejection), ``acceptance_rates`` (one
conditional rate per draft position) or ``accepted_distribution`` (the probabilities of
accepting 0, 1, ..., k drafts). ``method`` decides what the draft work costs.
"""

from __future__ import annotations

import dataclasses
import math

from tokenyard import _core
from tokenyard._checks import check_key_choice, check_key_int, check_key_number, fail

__all__ = ["SPEC_METHODS", "SpeculativeConfig"]

#: ``draft_model``: a catalog model proposes (k decode passes of it per step); ``ngram``:
#: prompt lookup on the CPU (no GPU time); ``mtp`` / ``eagle``: a one-layer head (k passes,
#: each priced as one layer of the target).
SPEC_METHODS = ("draft_model", "ngram", "mtp", "eagle")
#: The most drafts per step (the core's limit).
MAX_SPEC_TOKENS = 32


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpeculativeConfig:
    """Off unless ``method`` is set; every other key then needs it, and it needs them."""

    method: str | None = None
    num_speculative_tokens: int | None = None
    #: A catalog model name (``draft_model`` only).
    draft_model: str | None = None
    acceptance_rate: float | None = None
    acceptance_rates: tuple[float, ...] | None = None
    accepted_distribution: tuple[float, ...] | None = None

    @property
    def enabled(self) -> bool:
        return self.method is not None

    def num_lookahead_tokens(self) -> int:
        """KV slots a step reserves past its scheduled tokens for the drafter's own writes,
        as vLLM 0.33 does (``VllmConfig.num_lookahead_tokens``): ``k`` for a drafter with a
        forward pass (``draft_model``, ``mtp``, ``eagle``), none for ``ngram`` or without
        speculation. The core's ``SpecMethod::num_lookahead_tokens`` is the same rule."""
        if self.method is None or self.method == "ngram":
            return 0
        return self.num_speculative_tokens or 0

    def num_prefill_lookahead_tokens(self, num_mtp_layers: int) -> int:
        """Prefill tokens past a chunk the drafter reads, as vLLM 0.33 computes them
        (``VllmConfig.num_prefill_lookahead_tokens``, ``vllm/config/vllm.py``): 0 unless
        the drafter reads the target's hidden states (``use_eagle()``: ``eagle``, ``mtp``);
        ``num_speculative_tokens`` for multi-module MTP (``use_multi_module_mtp()``:
        ``min(num_mtp_layers, k) > 1``, each module reading one token further); else 1.
        The step scheduler's ``num_prefill_lookahead``."""
        if self.method not in ("eagle", "mtp"):
            return 0
        k = self.num_speculative_tokens or 0
        return k if self.method == "mtp" and min(num_mtp_layers, k) > 1 else 1

    def num_hash_lookahead_tokens(
        self, num_mtp_layers: int, *, prefix_caching: bool, kv_connector: bool
    ) -> int:
        """Tokens past each block its hash covers, as vLLM 0.33 computes them
        (``VllmConfig.num_hash_lookahead_tokens``): the prefill look-ahead when the
        drafter needs EAGLE's trailing-block drop (``use_eagle_block_drop()``: ``eagle``,
        ``mtp``) and prefix caching is on, 0 with a KV connector (P/D) or otherwise."""
        if not prefix_caching or kv_connector:
            return 0
        return self.num_prefill_lookahead_tokens(num_mtp_layers)

    def scheduler_lookahead(
        self, num_mtp_layers: int, *, prefix_caching: bool, kv_connector: bool
    ) -> tuple[int, int]:
        """The step scheduler's ``(num_prefill_lookahead, num_hash_lookahead_tokens)`` as
        vLLM 0.33 derives them from the speculative config (``docs/speculative.md``,
        "Prefix caching under EAGLE and MTP"). ``prefix_caching``: the replica's prefix
        cache is on and look-ahead hashes are not disabled (the ``vllm_v1`` section's
        ``eagle_block_drop`` is vLLM's ``disable_lookahead_block_hashes``);
        ``kv_connector``: P/D's connector, beside which vLLM keeps the legacy hashes."""
        return (
            self.num_prefill_lookahead_tokens(num_mtp_layers),
            self.num_hash_lookahead_tokens(
                num_mtp_layers, prefix_caching=prefix_caching, kv_connector=kv_connector
            ),
        )

    def check(self, where: str, policy: str) -> None:
        """Raises ConfigError naming the key of the first bad value."""
        if self.method is None:
            for name in (
                "num_speculative_tokens",
                "draft_model",
                "acceptance_rate",
                "acceptance_rates",
                "accepted_distribution",
            ):
                if getattr(self, name) is not None:
                    raise fail(
                        f"{where}.{name}",
                        f"applies only with a speculative method; set {where}.method or remove it",
                        getattr(self, name),
                    )
            return
        check_key_choice(f"{where}.method", self.method, SPEC_METHODS)
        if policy != "vllm_v1":
            raise fail(
                f"{where}.method",
                f"speculative decoding runs in vllm_v1 replicas only, not {policy!r} "
                "(replica.scheduler.policy)",
                self.method,
            )
        if self.num_speculative_tokens is None:
            raise fail(f"{where}.num_speculative_tokens", "is required with a method", None)
        k = check_key_int(
            f"{where}.num_speculative_tokens",
            self.num_speculative_tokens,
            low=1,
            high=MAX_SPEC_TOKENS,
        )
        if self.method == "draft_model" and not self.draft_model:
            raise fail(f"{where}.draft_model", "the draft_model method needs a catalog model", None)
        if self.method != "draft_model" and self.draft_model is not None:
            raise fail(
                f"{where}.draft_model",
                f"applies to method = 'draft_model', not {self.method!r}",
                self.draft_model,
            )
        self._check_acceptance(where, k)

    def _check_acceptance(self, where: str, k: int) -> None:
        given = [
            name
            for name in ("acceptance_rate", "acceptance_rates", "accepted_distribution")
            if getattr(self, name) is not None
        ]
        if len(given) != 1:
            raise fail(
                f"{where}.acceptance_rate",
                "give exactly one of acceptance_rate, acceptance_rates, accepted_distribution"
                f" (given: {', '.join(given) or 'none'})",
                given,
            )
        if self.acceptance_rate is not None:
            check_key_number(f"{where}.acceptance_rate", self.acceptance_rate, low=0, high=1)
        for name, length in (("acceptance_rates", k), ("accepted_distribution", k + 1)):
            values = getattr(self, name)
            if values is None:
                continue
            if len(values) != length:
                raise fail(
                    f"{where}.{name}",
                    f"needs {length} values for num_speculative_tokens = {k}, got {len(values)}",
                    values,
                )
            for i, p in enumerate(values):
                check_key_number(f"{where}.{name}[{i}]", p, low=0, high=1)
        dist = self.accepted_distribution
        if dist is not None and not math.isclose(sum(dist), 1.0, abs_tol=1e-6):
            raise fail(
                f"{where}.accepted_distribution",
                f"the probabilities must sum to 1, got {sum(dist)}",
                dist,
            )

    def to_core(self, *, mtp_as_draft_model: bool = False) -> _core.SpeculativeConfig | None:
        """The core's config, or None when off. ``mtp_as_draft_model``: the MTP module is
        priced as a model of its own (``ModelSpec.mtp_drafter()``), which the core runs
        through its ``draft_model`` mechanism (the same ``k`` lookahead slots)."""
        if self.method is None or self.num_speculative_tokens is None:
            return None
        method = "draft_model" if self.method == "mtp" and mtp_as_draft_model else self.method
        return _core.SpeculativeConfig(
            method=method,
            num_speculative_tokens=self.num_speculative_tokens,
            acceptance_rate=self.acceptance_rate,
            acceptance_rates=self.acceptance_rates,
            accepted_distribution=self.accepted_distribution,
        )

"""The fractions of the datasheet peaks that the roofline's kernels reach
(``Efficiencies``), shared by ``roofline.py`` and its building blocks in
``roofline_builder.py``."""

from __future__ import annotations

import dataclasses

from tokenyard.errors import ConfigError

__all__ = ["MIN_EFFICIENCY", "Efficiencies"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Efficiencies:
    """Fractions of the datasheet peaks that kernels reach. Defaults: cuBLAS GEMMs reach
    70-80% of dense peak at serving sizes; memory-bound kernels 80-90% of HBM bandwidth
    (tokenyard's decode kernel measured 86-91% on an H100, benches/RESULTS.md); flash
    attention 40-60% of peak on long prompts; NCCL rings about 70% of the link."""

    gemm: float = 0.7
    attention: float = 0.5
    memory: float = 0.85
    network: float = 0.7

    def check(self, where: str) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not (isinstance(value, (int, float)) and MIN_EFFICIENCY <= value <= 1):
                raise ConfigError(
                    f"{where}.{field.name}: must be in [{MIN_EFFICIENCY}, 1], got {value!r}",
                    field=f"{where}.{field.name}",
                    value=repr(value),
                )


#: No kernel runs at under 1% of its roofline; a lower efficiency is a typo (1e-300 would
#: price a prefill at 1e299 s).
MIN_EFFICIENCY = 0.01

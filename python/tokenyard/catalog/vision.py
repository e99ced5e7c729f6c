"""A vision-language model's vision tower (``ModelSpec.vision``): its shape as the
checkpoint's ``vision_config`` gives it, its weights, and how many tokens an image becomes.

Invariant: a ``VisionEncoder`` is valid once built (every count an integer >= 1, the heads
divide the width); ``image_tokens`` is the Hugging Face image processor's arithmetic, exact.

Two towers are read (issue 29, item 1):

- ``qwen3_vl`` (Qwen3-VL, ``Qwen3VLVisionModel``): a Conv3d patch embedding with bias,
  learned position embeddings (``num_position_embeddings``), ``depth`` blocks of LayerNorm,
  full bidirectional attention (``qkv`` and ``proj`` with bias) and a GELU MLP
  (``linear_fc1``, ``linear_fc2``), a patch merger (LayerNorm, two linears) that turns each
  ``spatial_merge_size^2`` patches into one LM token of ``out_hidden_size``, and one more
  merger per ``deepstack_visual_indexes`` entry (its norm over the merged width), whose
  outputs are added to the LM's first hidden states.
- ``qwen2_5_vl`` (Qwen2.5-VL, ``Qwen2_5_VisionTransformerPretrainedModel``): a Conv3d
  without bias, blocks of RMSNorm, attention (windowed within ``window_size`` pixels except
  in ``fullatt_block_indexes``) and a SwiGLU MLP with biases, then one merger (RMSNorm, two
  linears).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from tokenyard.catalog.layers import _fail as _spec_fail
from tokenyard.catalog.layers import check_count
from tokenyard.errors import ConfigError

__all__ = ["VISION_KINDS", "VisionEncoder", "smart_resize"]

VISION_KINDS = ("qwen3_vl", "qwen2_5_vl")
#: The image processors' pixel bounds by tower (``preprocessor_config.json``): Qwen2.5-VL's
#: ``min_pixels`` 3136 (56 x 56) and ``max_pixels`` 12845056 (28 x 28 x 16384); Qwen3-VL's
#: ``size`` ``shortest_edge`` 65536 and ``longest_edge`` 16777216 (both in pixels).
DEFAULT_PIXELS = {"qwen3_vl": (65_536, 16_777_216), "qwen2_5_vl": (3_136, 12_845_056)}


def _fail(field: str, problem: str, value: object) -> ConfigError:
    return _spec_fail("vision_config", field, problem, value)


def smart_resize(
    height: int, width: int, *, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """The size the Qwen2-VL image processor resizes an image to (``smart_resize`` in
    ``transformers/models/qwen2_vl/image_processing_qwen2_vl.py``, which Qwen2.5-VL and
    Qwen3-VL use, as does vLLM 0.33's token count): each side rounded to a multiple of
    ``factor`` (patch x merge), then scaled down (or up) with the aspect ratio kept until
    the area is within ``[min_pixels, max_pixels]``. One difference: the first rounding
    here is at least ``factor`` (``qwen_vl_utils``' form); transformers 5.19 rounds a side
    under ``factor / 2`` to 0 and so rescales to ``min_pixels`` (13 x 2600 at factor 28:
    28 x 812 there, 28 x 2604 here).

    Raises:
        ConfigError: a side < 1, or an aspect ratio above 200 (the processor refuses it).
    """
    if height < 1 or width < 1:
        raise ConfigError(f"image size {width}x{height}: sides must be >= 1", field="images")
    if max(height, width) / min(height, width) > 200:
        raise ConfigError(
            f"image size {width}x{height}: aspect ratio must be <= 200 (the Qwen image "
            "processor refuses it)",
            field="images",
        )
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True, kw_only=True)
class VisionEncoder:
    """A vision tower (module docstring), in its ``vision_config``'s words.

    Raises:
        ConfigError: a field of the wrong type or out of range (``vision_config.<key>``).
    """

    kind: str
    depth: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    patch_size: int
    spatial_merge_size: int
    temporal_patch_size: int
    out_hidden_size: int
    in_channels: int = 3
    #: Qwen3-VL's learned position table (rows of ``hidden_size``); 0: none.
    num_position_embeddings: int = 0
    #: Qwen3-VL's ``deepstack_visual_indexes``: blocks whose output a merger of its own
    #: feeds to the LM.
    deepstack_layers: tuple[int, ...] = ()
    #: Qwen2.5-VL: attention within windows of ``window_size`` pixels, except in
    #: ``fullatt_blocks``; 0: every block attends over the whole image.
    window_size: int = 0
    fullatt_blocks: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in VISION_KINDS:
            raise _fail("model_type", f"must be one of {', '.join(VISION_KINDS)}", self.kind)
        for field in dataclasses.fields(self):
            if field.name in ("kind", "deepstack_layers", "fullatt_blocks"):
                continue
            low = 0 if field.name in ("num_position_embeddings", "window_size") else 1
            check_count("vision_config", field.name, getattr(self, field.name), low)
        if self.hidden_size % self.num_heads:
            raise _fail(
                "hidden_size",
                f"must be a multiple of num_heads ({self.num_heads})",
                self.hidden_size,
            )
        for name in ("deepstack_layers", "fullatt_blocks"):
            listed = getattr(self, name)
            if not isinstance(listed, tuple) or any(
                isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < self.depth
                for i in listed
            ):
                raise _fail(name, f"must list block indexes in [0, depth={self.depth})", listed)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def merged_size(self) -> int:
        """The merger's input width: ``spatial_merge_size^2`` patches side by side."""
        return self.hidden_size * self.spatial_merge_size**2

    @property
    def patch_values(self) -> int:
        """Values one patch carries into the patch embedding (the Conv3d's ``k``)."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def num_mergers(self) -> int:
        return 1 + len(self.deepstack_layers)

    @property
    def gated_mlp(self) -> bool:
        """SwiGLU MLP (Qwen2.5-VL) rather than a two-matrix GELU MLP (Qwen3-VL)."""
        return self.kind == "qwen2_5_vl"

    def block_parameters(self) -> tuple[int, int]:
        """(linear weights, norm and bias weights) of one block."""
        h, i = self.hidden_size, self.intermediate_size
        mlp_matrices = 3 if self.gated_mlp else 2
        linear = 4 * h * h + mlp_matrices * h * i
        biases = 4 * h + (2 * i if self.gated_mlp else i) + h
        norms = 2 * h if self.kind == "qwen2_5_vl" else 4 * h  # RMSNorm x2 / LayerNorm x2
        return linear, biases + norms

    def merger_parameters(self) -> tuple[int, int]:
        """(linear weights, norm and bias weights) of all mergers (the main one and each
        deepstack one: LayerNorm over ``hidden_size`` for the main, over the merged width
        for the deepstack ones; Qwen2.5-VL's an RMSNorm over ``hidden_size``)."""
        m, out = self.merged_size, self.out_hidden_size
        linear = m * m + m * out
        biases = m + out
        main_norm = self.hidden_size if self.kind == "qwen2_5_vl" else 2 * self.hidden_size
        deepstack_norm = 2 * m
        n = self.num_mergers
        return n * linear, n * biases + main_norm + (n - 1) * deepstack_norm

    def edge_parameters(self) -> int:
        """The patch embedding (and its bias in Qwen3-VL) and the position table."""
        conv = self.patch_values * self.hidden_size
        bias = self.hidden_size if self.kind == "qwen3_vl" else 0
        return conv + bias + self.num_position_embeddings * self.hidden_size

    def parameter_split(self, tp: int = 1) -> tuple[int, int]:
        """(linear weights, other weights) on one TP rank: vLLM shards the blocks' and the
        mergers' linears by TP (``ColumnParallelLinear``/``RowParallelLinear``; its default
        ``mm_encoder_tp_mode="weights"``) and keeps norms and the patch embedding whole."""
        block_linear, block_other = self.block_parameters()
        merger_linear, merger_other = self.merger_parameters()
        linear = math.ceil((self.depth * block_linear + merger_linear) / tp)
        return linear, self.depth * block_other + merger_other + self.edge_parameters()

    def parameters(self) -> int:
        """All the tower's weights."""
        return sum(self.parameter_split(1))

    def pixel_bounds(self) -> tuple[int, int]:
        """``(min_pixels, max_pixels)`` of the checkpoint's image processor (its defaults)."""
        return DEFAULT_PIXELS[self.kind]

    def image_tokens(
        self,
        width: int,
        height: int,
        *,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
    ) -> int:
        """LM tokens one image becomes (the ``<|image_pad|>`` tokens the processor puts in
        the prompt): the patches the tower runs, the resized image's ``(H / patch) x
        (W / patch)`` (one temporal patch: a still image is repeated ``temporal_patch_size``
        times), over ``spatial_merge_size^2``. The chat template's
        ``<|vision_start|>``/``<|vision_end|>`` around them are text tokens."""
        low, high = self.pixel_bounds()
        factor = self.patch_size * self.spatial_merge_size
        h, w = smart_resize(
            height,
            width,
            factor=factor,
            min_pixels=low if min_pixels is None else min_pixels,
            max_pixels=high if max_pixels is None else max_pixels,
        )
        patches = (h // self.patch_size) * (w // self.patch_size)
        return patches // self.spatial_merge_size**2

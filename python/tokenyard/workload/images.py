"""Images in a synthetic workload's requests: how many a request carries and how many
prompt tokens each becomes (``ImageInputs``; docs/workloads.md, "Images").

Invariant: the workload layer only adds each image's vision tokens to its request's
prefill tokens (they hold KV like text, as vLLM places them in the prompt); what the
vision encoder costs is the predictor's (``predictor/vision.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import final

from tokenyard._checks import check_int, check_number, field_error
from tokenyard.catalog.vision import VisionEncoder
from tokenyard.errors import ConfigError
from tokenyard.workload.lengths import LengthDistribution

__all__ = ["ImageInputs"]

#: The most vision tokens one image may become.
MAX_IMAGE_TOKENS = 1 << 20
MAX_SIDE = 1 << 16


@final
@dataclass(frozen=True, kw_only=True)
class ImageInputs:
    """Images per request: with probability ``share`` a request carries ``count`` images
    (a ``LengthDistribution``, >= 1; default one), each either ``width x height`` pixels,
    mapped to vision tokens by the model's image processor (``VisionEncoder.image_tokens``:
    Qwen's ``smart_resize`` within ``min_pixels``/``max_pixels``, default the checkpoint's),
    or a fixed ``tokens_per_image``. The tokens are added to the request's prompt.

    ``vision`` is the model's tower, set by the simulator (``load_workload(...,
    vision=...)``), not by the config.

    Raises:
        ConfigError: neither or both of the size and ``tokens_per_image``, a value out of
            range.
    """

    share: float = 1.0
    count: LengthDistribution = field(
        default_factory=lambda: LengthDistribution(kind="fixed", value=1)
    )
    width: int | None = None
    height: int | None = None
    tokens_per_image: int | None = None
    min_pixels: int | None = None
    max_pixels: int | None = None
    vision: VisionEncoder | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        owner = "ImageInputs"
        check_number(owner, "share", self.share, low=0.0, high=1.0)
        if not isinstance(self.count, LengthDistribution):
            value = self.count
            raise field_error(
                owner, "count", f"must be a LengthDistribution, got {type(value).__name__}", value
            )
        sized = self.width is not None or self.height is not None
        if sized == (self.tokens_per_image is not None):
            raise field_error(
                owner,
                "tokens_per_image" if not sized else "width",
                "give either width and height (pixels) or tokens_per_image",
                self.tokens_per_image if not sized else self.width,
            )
        if sized:
            check_int(owner, "width", self.width, low=1, high=MAX_SIDE)
            check_int(owner, "height", self.height, low=1, high=MAX_SIDE)
        else:
            check_int(
                owner, "tokens_per_image", self.tokens_per_image, low=1, high=MAX_IMAGE_TOKENS
            )
            for name in ("min_pixels", "max_pixels"):
                if getattr(self, name) is not None:
                    value = getattr(self, name)
                    raise field_error(owner, name, "applies to width and height only", value)
        for name in ("min_pixels", "max_pixels"):
            if getattr(self, name) is not None:
                check_int(owner, name, getattr(self, name), low=1, high=MAX_SIDE**2)
        if self.vision is not None and not isinstance(self.vision, VisionEncoder):
            raise field_error(owner, "vision", "must be a VisionEncoder or None", self.vision)
        if sized and self.vision is not None:
            self.tokens()  # an impossible size fails here, at config time

    def tokens(self) -> int:
        """Vision tokens per image.

        Raises:
            ConfigError: a size without the model's vision tower to map it.
        """
        if self.tokens_per_image is not None:
            return self.tokens_per_image
        if self.vision is None:
            raise ConfigError(
                "images.width: mapping pixels to tokens needs the model's vision tower (the "
                "simulator passes it); give images.tokens_per_image to use the workload alone",
                field="width",
                value=repr(self.width),
            )
        try:
            return self.vision.image_tokens(
                int(self.width or 0),
                int(self.height or 0),
                min_pixels=self.min_pixels,
                max_pixels=self.max_pixels,
            )
        except ConfigError as exc:
            raise ConfigError(exc.message, field="width", value=repr(self.width)) from None

    def patches(self) -> int:
        """Patches the vision tower runs per image (``tokens x spatial_merge_size^2``)."""
        merge = 2 if self.vision is None else self.vision.spatial_merge_size
        return self.tokens() * merge**2

    def describe(self) -> dict[str, object]:
        """The config fields that are set (a mapping ``load_workload`` accepts)."""
        found: dict[str, object] = {"share": self.share, "count": self.count.describe()}
        for name in ("width", "height", "min_pixels", "max_pixels", "tokens_per_image"):
            if getattr(self, name) is not None:
                found[name] = getattr(self, name)
        return found

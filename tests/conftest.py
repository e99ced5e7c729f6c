"""Session setup shared by the test files.

Without a GPU, the Triton kernels of ``tokenyard.kernels`` run in Triton's interpreter on
CPU tensors. ``triton.jit`` reads ``TRITON_INTERPRET`` when the kernels are defined, so it
is set here, before any test module imports ``tokenyard.kernels``. torch is optional: the
rest of the suite does not need it.
"""

from __future__ import annotations

import importlib.util
import os

if importlib.util.find_spec("torch") is not None:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")

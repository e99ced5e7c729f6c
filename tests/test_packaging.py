"""Where ``tokenyard.kernels`` comes from.

The kernels live in the repository's top-level ``kernels/`` (DESIGN's layout), and the wheel
ships them as ``tokenyard.kernels``: ``python/tokenyard/kernels/`` is a real directory of
per-file symlinks into ``kernels/``. maturin copies symlinked files into the wheel but does not
walk symlinked directories, so one link per module is what makes the wheel complete; these
tests keep the links and the modules in step.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "kernels"
LINKS = ROOT / "python" / "tokenyard" / "kernels"


def _kernels_origin() -> Path:
    spec = importlib.util.find_spec("tokenyard.kernels")  # imports tokenyard, not torch
    assert spec is not None, "tokenyard.kernels is missing from the installed package"
    assert spec.origin is not None
    return Path(spec.origin)


def _modules(directory: Path) -> set[str]:
    return {p.name for p in directory.glob("*.py")}


def test_every_kernel_module_has_a_link_in_the_package() -> None:
    assert _modules(KERNELS), "kernels/ holds no modules"
    assert _modules(LINKS) == _modules(KERNELS), (
        "python/tokenyard/kernels/ must hold one symlink per kernels/*.py "
        "(cd python/tokenyard/kernels && ln -s ../../../kernels/NAME.py .)"
    )
    for link in LINKS.iterdir():
        if link.name == "__pycache__":
            continue
        assert link.is_symlink(), f"{link} is a copy, not a symlink into kernels/"
        target = os.readlink(link)
        assert not os.path.isabs(target), f"{link} -> {target}: links must be relative"
        assert link.resolve() == (KERNELS / link.name).resolve()


def test_the_installed_package_resolves_to_the_top_level_kernels() -> None:
    origin = _kernels_origin()
    if not origin.is_relative_to(ROOT / "python"):
        pytest.skip(f"not a development install (tokenyard.kernels from {origin})")
    assert origin.resolve() == (KERNELS / "__init__.py").resolve()


def test_the_kernels_import_as_tokenyard_kernels() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    import tokenyard.kernels as kernels
    import tokenyard.kernels.reference as reference

    assert callable(kernels.store_kv)
    assert callable(kernels.paged_decode_attention)
    assert callable(kernels.paged_prefill_attention)
    assert kernels.reference is reference
    origin = _kernels_origin()
    if origin.is_relative_to(ROOT / "python"):
        assert Path(kernels.__file__).resolve().parent == KERNELS.resolve()
        assert Path(reference.__file__).resolve().parent == KERNELS.resolve()


@pytest.mark.parametrize("package", ["tokenyard.search", "tokenyard.profiler"])
def test_lazy_packages_export_every_name_and_import_nothing_until_asked(package: str) -> None:
    """The command line imports these packages to list their subcommands: importing one
    must not import its modules (start-up), and every name of its `__all__` must still
    resolve, to the object its module defines."""
    import importlib

    code = (
        f"import sys, {package} as p\n"
        f"print(sorted(m for m in sys.modules if m.startswith('{package}.')))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert loaded.strip() == "[]", loaded
    module = importlib.import_module(package)
    for name in module.__all__:
        value = getattr(module, name)
        assert getattr(importlib.import_module(module._EXPORTS[name]), name) is value
        assert name in dir(module)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = module.nope

"""The wheel users install (docs/install.md), checked as they would use it.

`make wheel` (a step of `make test`) builds it into dist/: abi3, linked by zig against old
glibc symbols. These tests read its tags and the glibc symbol versions its extension needs,
then install it into a fresh venv outside the repository and run the README's first
simulation, the docs' Python examples and the shipped example configs from there.

The fresh venv installs the wheel alone (``--no-deps --no-index``: nothing is downloaded) and
reaches its dependencies through a ``.pth`` line naming this interpreter's site-packages (the
repository's .venv). Lines of a ``.pth`` file are plain path entries, so the editable install's
own ``tokenyard.pth`` in there is not processed: ``tokenyard`` comes from the wheel, which a
test checks. Under `make test` (``TOKENYARD_WHEEL_DIR`` set) a missing wheel fails; a plain
``pytest`` without one in dist/ skips these tests.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.test_docs import examples

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "docs" / "examples"
LINKS = ROOT / "python" / "tokenyard" / "examples"
#: The oldest glibc the wheel must install on: Amazon Linux 2's (RHEL 8 has 2.28, Ubuntu
#: 20.04 2.31; pip refuses a manylinux_2_X wheel where glibc is older than 2.X).
OLDEST_GLIBC = (2, 26)
#: The oldest CPython the wheel is for (``requires-python``); abi3 covers every later one.
OLDEST_PYTHON = "cp310"
#: Whether this Python has the measured tables (the ``measured`` extra: 3.11 to 3.13).
MEASURED = importlib.util.find_spec("aiconfigurator_core") is not None


def _wheel() -> Path:
    configured = os.environ.get("TOKENYARD_WHEEL_DIR")
    folder = Path(configured) if configured else ROOT / "dist"
    found = sorted(folder.glob("tokenyard-*.whl"))
    if not found:
        if configured:
            pytest.fail(f"no wheel in {folder}: `make wheel` should have built it")
        pytest.skip("no wheel in dist/: `make wheel` builds it (`make test` does, then runs this)")
    if len(found) > 1:
        pytest.fail(f"more than one wheel in {folder}: {[p.name for p in found]}")
    return found[0]


@pytest.fixture(scope="module")
def wheel() -> Path:
    return _wheel()


def _tags(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/WHEEL"))
        text = z.read(name).decode()
    return re.findall(r"^Tag: (\S+)$", text, re.MULTILINE)


def _glibc_versions_needed(library: bytes) -> set[tuple[int, int]]:
    """The ``GLIBC_x.y`` symbol versions an ELF shared library needs (what ``objdump -T``
    shows and auditwheel checks)."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection

    needed = set()
    elf = ELFFile(io.BytesIO(library))
    for section in elf.iter_sections():
        if isinstance(section, GNUVerNeedSection):
            for _, auxiliaries in section.iter_versions():
                for aux in auxiliaries:
                    match = re.fullmatch(r"GLIBC_(\d+)\.(\d+)(?:\.\d+)?", aux.name)
                    if match:
                        needed.add((int(match[1]), int(match[2])))
    return needed


def _manylinux_glibc(platform: str) -> tuple[int, int]:
    """``manylinux_2_17_x86_64`` -> (2, 17); the legacy aliases too (PEP 600)."""
    legacy = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
    match = re.fullmatch(r"manylinux_(\d+)_(\d+)_\w+", platform)
    if match:
        return (int(match[1]), int(match[2]))
    return legacy[platform.split("_", 1)[0]]


def test_the_wheel_is_abi3_for_python_3_10_up_and_manylinux_old_enough(wheel: Path) -> None:
    tags = _tags(wheel)
    assert tags, f"{wheel.name}: no Tag in its WHEEL file"
    for tag in tags:
        python, abi, platform = tag.split("-")
        assert (python, abi) == (OLDEST_PYTHON, "abi3"), (
            f"{tag}: one abi3 wheel must serve CPython 3.10+ (pyo3's abi3-py310 feature)"
        )
        assert platform.startswith("manylinux"), f"{tag}: not a manylinux wheel"
        assert _manylinux_glibc(platform) <= OLDEST_GLIBC, (
            f"{tag}: pip refuses it on glibc {OLDEST_GLIBC[0]}.{OLDEST_GLIBC[1]} "
            "(Amazon Linux 2); build with `make wheel` (maturin --zig --compatibility)"
        )


def test_the_extension_needs_no_glibc_newer_than_its_tag_promises(wheel: Path) -> None:
    """The tag is a promise; the symbol versions are what the dynamic loader checks. A wheel
    linked on this machine's glibc (2.36) without zig needs GLIBC_2.34 symbols."""
    with zipfile.ZipFile(wheel) as z:
        libraries = [n for n in z.namelist() if n.endswith(".so")]
        assert libraries == ["tokenyard/_core.abi3.so"], libraries
        library = libraries[0]
        needed = _glibc_versions_needed(z.read(library))
    assert needed, "no GLIBC symbol versions found: not a glibc-linked library?"
    promised = min(_manylinux_glibc(tag.split("-")[2]) for tag in _tags(wheel))
    newest = max(needed)
    assert newest <= promised, (
        f"_core.abi3.so needs GLIBC_{newest[0]}.{newest[1]}, newer than its tag's "
        f"{promised[0]}.{promised[1]}"
    )


def test_every_docs_example_config_has_a_link_in_the_package_and_is_in_the_wheel(
    wheel: Path,
) -> None:
    configs = sorted(p.name for p in EXAMPLES.glob("*.toml"))
    assert configs, "docs/examples/ holds no configs"
    links = sorted(p.name for p in LINKS.glob("*.toml"))
    assert links == configs, (
        "python/tokenyard/examples/ must hold one symlink per docs/examples/*.toml "
        "(cd python/tokenyard/examples && ln -s ../../../docs/examples/NAME.toml .)"
    )
    for name in links:
        link = LINKS / name
        assert link.is_symlink(), f"{link} is a copy, not a symlink into docs/examples/"
        assert not os.path.isabs(os.readlink(link)), f"{link}: links must be relative"
        assert link.resolve() == (EXAMPLES / name).resolve()
    with zipfile.ZipFile(wheel) as z:
        for name in configs:
            shipped = z.read(f"tokenyard/examples/{name}")
            assert shipped == (EXAMPLES / name).read_bytes(), f"{name}: the wheel's copy differs"


# ---- installed into a fresh venv ------------------------------------------------------


@dataclass(frozen=True)
class Installed:
    """A venv outside the repository with the wheel installed; ``run`` runs a command in
    ``home`` (the user's folder) with the venv first on PATH."""

    venv: Path
    home: Path
    env: dict[str, str]

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def run(self, *argv: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(a) for a in argv],
            cwd=self.home,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if check and done.returncode != 0:
            pytest.fail(
                f"{' '.join(map(str, argv))} exited {done.returncode}\n"
                f"stdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-4000:]}"
            )
        return done


def _install_wheel(python: Path, wheel: Path) -> None:
    """The wheel alone into ``python``'s venv (which has no pip of its own), offline."""
    pip = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check"]
    subprocess.run([*pip, "install", "--quiet", "--no-deps", "--no-index", wheel], check=True)


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    base = tmp_path_factory.mktemp("installed")
    assert not base.resolve().is_relative_to(ROOT), f"{base} must be outside the repository"
    venv, home = base / "venv", base / "home"
    home.mkdir()
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = venv / "bin" / "python"
    _install_wheel(python, wheel)
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = sysconfig.get_paths()
    (Path(site) / "_dependencies.pth").write_text(f"{ours['purelib']}\n{ours['platlib']}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {
        "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        "TOKENYARD_CACHE_DIR": str(base / "cache"),  # a first run, as after an install
        # Warnings are errors, as in the test suite; without the measured tables a default
        # run warns so (MeasuredUnavailableWarning, a UserWarning), as it should.
        "PYTHONWARNINGS": "error" if MEASURED else "error,default::UserWarning",
        "MPLBACKEND": "Agg",
    }
    return Installed(venv, home, env)


def test_tokenyard_imports_from_the_wheel_not_the_repository(installed: Installed) -> None:
    code = "import tokenyard; print(tokenyard.__file__); print(tokenyard.build_profile)"
    out = installed.run(installed.python, "-c", code).stdout.split()
    assert Path(out[0]).is_relative_to(installed.venv), out[0]
    assert out[1] == "release"


def test_the_readme_first_run_from_the_installed_wheel(installed: Installed) -> None:
    """README "A first run": `tokenyard simulate --output results --plots`, as written. The
    first run after the install builds the measured tables and says so on stderr; the next
    one loads them and does not. Its figures are the development build's."""
    first = installed.run("tokenyard", "simulate", "--output", "results", "--plots")
    lines = first.stdout.splitlines()
    assert lines[0] == (
        "tokenyard simulate: 4 x llama-2-7b on a100-80gb (TP 1, PP 1), vllm_v1 replicas, "
        "round_robin routing, 10,000 requests"
    )
    if MEASURED:
        assert lines[1].startswith("execution model: measured: a100_sxm, vllm "), lines[1]
        assert "building measured tables for llama-2-7b on a100_sxm" in first.stderr
    else:  # Python 3.10: the extra installs nothing (docs/install.md)
        assert lines[1] == "execution model: roofline calibrated to measured tables", lines[1]
    for name in ("report.html", "summary.json", "requests.parquet", "config.json"):
        assert (installed.home / "results" / name).is_file(), name

    again = installed.run("tokenyard", "simulate", "--requests", "100", "--no-progress")
    assert "building measured tables" not in again.stderr, again.stderr

    wheel_summary = json.loads((installed.home / "results" / "summary.json").read_text())
    dev = subprocess.run(
        [sys.executable, "-m", "tokenyard", "simulate", "--json", "--no-progress"],
        cwd=installed.home,
        capture_output=True,
        text=True,
        check=True,
    )
    dev_summary = json.loads(dev.stdout)
    for key in ("latency_s", "throughput", "goodput", "preemption", "makespan_s"):
        assert wheel_summary[key] == dev_summary[key], (
            f"{key}: the installed wheel and the development build differ (a stale wheel? "
            "`make wheel` rebuilds it)"
        )


def test_the_docs_python_examples_run_from_the_installed_wheel(installed: Installed) -> None:
    """Every ```python block of README.md and docs/*.md (tests/test_docs.py's), each in a
    fresh namespace, in one process of the installed venv."""
    blocks = installed.home / "blocks.json"
    blocks.write_text(json.dumps(examples()))
    runner = (
        "import json, sys, traceback\n"
        "failed = []\n"
        "for name, code in json.load(open(sys.argv[1])):\n"
        "    try:\n"
        "        exec(compile(code, name, 'exec'), {})\n"
        "    except BaseException:\n"
        "        failed.append(name)\n"
        "        traceback.print_exc()\n"
        "print('failed:', failed)\n"
        "sys.exit(1 if failed else 0)\n"
    )
    done = installed.run(installed.python, "-c", runner, blocks, check=False)
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-6000:]}"


def test_the_shipped_example_configs_run_from_the_installed_wheel(installed: Installed) -> None:
    """docs/examples/ travels as tokenyard/examples/: `python -m tokenyard.examples` names
    the folder, and the configs run from there (made small: fewer requests and probes)."""
    folder = Path(installed.run(installed.python, "-m", "tokenyard.examples").stdout.strip())
    assert folder.is_relative_to(installed.venv), folder
    assert sorted(p.name for p in folder.glob("*.toml")) == sorted(
        p.name for p in EXAMPLES.glob("*.toml")
    )
    routing = installed.run(
        "tokenyard", "simulate", folder / "routing.toml", "--requests", "300", "--no-progress"
    )
    assert "8 x llama-3.1-8b on a100-80gb" in routing.stdout
    small = ["--set", "simulation.workload.num_requests=100", "--set", "search.max_simulations=2"]
    capacity = installed.run(
        "tokenyard", "search", "capacity", folder / "search_capacity.toml", "--no-progress", *small
    )
    assert capacity.stdout.strip(), capacity.stderr
    code = (
        "import sys; from tokenyard.search import load_search_config; "
        "print(type(load_search_config(sys.argv[1])).__name__)"
    )
    installed.run(installed.python, "-c", code, folder / "search_deployments.toml")


def _python_3_12() -> str | None:
    """A CPython 3.12 on this machine (PATH, else pyenv's versions), or None."""
    candidates = [shutil.which("python3.12")]
    pyenv = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    candidates += sorted(str(p) for p in Path(pyenv).glob("versions/3.12*/bin/python3.12"))
    for candidate in filter(None, candidates):
        code = "import sys; print(sys.version_info[:2])"
        probe = subprocess.run([candidate, "-c", code], capture_output=True, text=True)
        if probe.returncode == 0 and probe.stdout.strip() == "(3, 12)":
            return candidate
    return None


def test_the_abi3_extension_loads_on_python_3_12(wheel: Path, tmp_path: Path) -> None:
    """The same wheel installs on CPython 3.12 and its extension works there. Only the
    extension: the dependencies are installed for this interpreter alone (3.11 here), and
    the check must not download them."""
    python312 = _python_3_12()
    if python312 is None:
        pytest.skip("no CPython 3.12 on this machine")
    venv = tmp_path / "venv312"
    subprocess.run([python312, "-m", "venv", "--without-pip", venv], check=True)
    python = venv / "bin" / "python"
    _install_wheel(python, wheel)
    code = (
        "import importlib.util, sys, sysconfig, pathlib\n"
        "so = pathlib.Path(sysconfig.get_paths()['platlib']) / 'tokenyard' / '_core.abi3.so'\n"
        "spec = importlib.util.spec_from_file_location('tokenyard._core', so)\n"
        "core = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(core)\n"
        "allocator = core.CountingAllocator(num_blocks=10)\n"
        "allocator.allocate('r', 3)\n"
        "print(sys.version_info[:2], core.__version__, allocator.num_free_blocks)\n"
    )
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split()[:2] == ["(3,", "12)"]
    assert out.split()[-1] == "7"

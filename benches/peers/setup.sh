#!/usr/bin/env bash
# Bench-only environment for benches/kv_peers.py: tokenyard next to the peers it is
# compared with (vLLM V1's KV-cache manager, SGLang's RadixCache), in one venv that
# is never a dependency of the project itself.
#
#   bash benches/peers/setup.sh          # create or refresh <repo>/.venv-bench
#   BENCH_VENV=/elsewhere bash ...       # another location
#   BENCH_SKIP_TOKENYARD=1 bash ...      # peers only (tokenyard not built)
#
# Idempotent: each step leaves a marker (or checks the installed version) and is
# skipped when already done, so a re-run costs a few seconds. tokenyard is rebuilt
# only when its sources changed.
#
# Why it looks the way it does (see also /work/shared/peers/NOTES.md):
# - Only PyPI is reachable. `pip install torch` gives the CUDA build; it runs on CPU.
# - vLLM and SGLang pin different torch patch releases (2.14.0 vs 2.14.1) and
#   transformers ranges; one process needs one of each. We take torch 2.14.1 and
#   transformers 5.19.0, which satisfy SGLang exactly and vLLM's transformers range.
#   Neither peer runs native kernels here: the code under test is pure Python.
# - vLLM is installed --no-deps (its full dependency set is GPU serving: flashinfer,
#   torchvision, ...); we add only what `vllm.v1.core` and `vllm.v1.request` import,
#   at the version ranges vLLM itself declares.
# - SGLang's wheel is unpacked, not installed: its dependency set is also the full
#   GPU server, and sglang_peer.py stubs the few native modules on its import path.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${BENCH_VENV:-$REPO/.venv-bench}"
PY="$VENV/bin/python"

TORCH_VERSION=2.14.1
TRANSFORMERS_VERSION=5.19.0
VLLM_VERSION=0.33.0
SGLANG_VERSION=0.5.23

# What `import vllm.v1.core.kv_cache_manager, vllm.v1.request` needs, found by
# importing until nothing was missing. Versions come from vLLM's own metadata.
VLLM_RUNTIME_DEPS=(
  aiohttp cachetools cbor2 cloudpickle fastapi llguidance msgspec openai oss-harmony
  partial-json-parser pillow prometheus_client psutil py-cpuinfo pybase64 pydantic
  pyzmq regex requests transformers xgrammar
)
# vLLM's optional hash for --prefix-caching-hash-algo xxhash / xxhash_cbor.
VLLM_OPTIONAL_DEPS=(xxhash)
# What sglang.srt.mem_cache.radix_cache imports beyond the above (NOTES.md).
SGLANG_RUNTIME_DEPS=(orjson ipython traitlets pygments dill)

log() { printf '[setup] %s\n' "$*"; }
# pip's resolver lists every vLLM/SGLang requirement we deliberately skip (or
# satisfy with a neighbouring version); drop that noise, keep real errors.
pip_q() {
  "$PY" -m pip --disable-pip-version-check -q "$@" \
    2> >(grep -vE "^(vllm|sglang) [0-9.]+ requires |dependency resolver does not" >&2)
}
installed_version() {
  "$PY" -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null || true
}

# --- venv ---------------------------------------------------------------------------
if [[ ! -x "$PY" ]]; then
  log "creating $VENV"
  python3 -m venv "$VENV"
  pip_q install --upgrade pip
fi

# Every later install goes through these pins, so no dependency can swap torch or
# transformers underneath the peers.
CONSTRAINTS="$VENV/bench-constraints.txt"
printf 'torch==%s\ntransformers==%s\n' "$TORCH_VERSION" "$TRANSFORMERS_VERSION" >"$CONSTRAINTS"

# --- numpy + torch ------------------------------------------------------------------
if [[ "$(installed_version torch)" != "$TORCH_VERSION" ]]; then
  log "installing numpy, torch==$TORCH_VERSION (CUDA build from PyPI; used on CPU)"
  pip_q install -c "$CONSTRAINTS" numpy "torch==$TORCH_VERSION"
else
  log "torch $TORCH_VERSION present"
fi

# --- vLLM -----------------------------------------------------------------------------
VLLM_MARKER="$VENV/.vllm-$VLLM_VERSION-ready"
if [[ ! -f "$VLLM_MARKER" ]]; then
  if [[ "$(installed_version vllm)" != "$VLLM_VERSION" ]]; then
    log "installing vllm==$VLLM_VERSION --no-deps"
    pip_q install --no-deps "vllm==$VLLM_VERSION"
  fi
  # Turn the bare names above into vLLM's declared requirements (with extras,
  # version ranges and markers), so we install what vLLM was tested with.
  mapfile -t VLLM_REQS < <("$PY" - "${VLLM_RUNTIME_DEPS[@]}" <<'PYEOF'
import importlib.metadata as md
import re
import sys

wanted = {re.sub(r"[-_.]+", "-", n).lower() for n in sys.argv[1:]}
found = set()
for req in md.requires("vllm") or []:
    if "extra ==" in req:
        continue
    name = re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.-]+", req).group()).lower()
    if name in wanted:
        found.add(name)
        print(req)
for name in sorted(wanted - found):  # not declared by vLLM: take the latest
    print(name)
PYEOF
  )
  log "installing vLLM runtime deps: ${VLLM_RUNTIME_DEPS[*]} ${VLLM_OPTIONAL_DEPS[*]}"
  pip_q install -c "$CONSTRAINTS" "${VLLM_REQS[@]}" "${VLLM_OPTIONAL_DEPS[@]}"
  # -P: the repository root holds a `kernels` package that shadows the one vLLM probes for.
  "$PY" -P -c "import vllm.v1.core.kv_cache_manager, vllm.v1.request, vllm.utils.hashing" \
    2>/dev/null || { log "ERROR: vllm.v1.core still fails to import"; exit 1; }
  touch "$VLLM_MARKER"
else
  log "vllm $VLLM_VERSION present"
fi

# --- SGLang -----------------------------------------------------------------------------
SGLANG_SRC="$VENV/sglang_src"
SGLANG_MARKER="$SGLANG_SRC/.sglang-$SGLANG_VERSION-ready"
if [[ ! -f "$SGLANG_MARKER" ]]; then
  log "unpacking sglang==$SGLANG_VERSION (Python sources only) into $SGLANG_SRC"
  pip_q install --no-deps -c "$CONSTRAINTS" "${SGLANG_RUNTIME_DEPS[@]}"
  TMP="$(mktemp -d)"
  trap 'rm -rf "$TMP"' EXIT
  pip_q download --no-deps "sglang==$SGLANG_VERSION" -d "$TMP"
  rm -rf "$SGLANG_SRC"
  mkdir -p "$SGLANG_SRC"
  # The .so files are the Rust tree core, gRPC server etc.: built against a
  # specific torch/CUDA, and not what sglang_peer.py benchmarks.
  "$PY" - "$TMP"/sglang-"$SGLANG_VERSION"-*.whl "$SGLANG_SRC" <<'PYEOF'
import sys
import zipfile

wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as zf:
    members = [n for n in zf.namelist() if n.startswith("sglang/") and not n.endswith(".so")]
    zf.extractall(dest, members)
print(f"[setup] extracted {len(members)} files")
PYEOF
  (cd "$REPO/benches/peers" && SGLANG_SRC="$SGLANG_SRC" "$PY" -c "import sglang_peer") \
    || { log "ERROR: sglang radix_cache does not import with the stubs"; exit 1; }
  touch "$SGLANG_MARKER"
else
  log "sglang $SGLANG_VERSION sources present"
fi

# --- tokenyard ------------------------------------------------------------------------
if [[ -n "${BENCH_SKIP_TOKENYARD:-}" ]]; then
  log "BENCH_SKIP_TOKENYARD set: not building tokenyard"
  exit 0
fi
if [[ ! -f "$REPO/pyproject.toml" ]]; then
  log "WARNING: no pyproject.toml in $REPO; tokenyard not installed (run kv_peers.py --peers-only)"
  exit 0
fi

# Fingerprint of everything that goes into the wheel; rebuild only when it moves.
# (Tracked and untracked-but-not-ignored files, so uncommitted edits count.)
fingerprint() {
  (cd "$REPO" && git ls-files -co --exclude-standard -- \
      Cargo.toml Cargo.lock pyproject.toml rust python 2>/dev/null \
    | grep -v '\.so$' | sort | xargs -r -d '\n' sha256sum 2>/dev/null | sha256sum | cut -c1-16)
}
TY_MARKER="$VENV/.tokenyard-build"
FP="$(fingerprint)"
if [[ -f "$TY_MARKER" && "$(cat "$TY_MARKER")" == "$FP" ]] \
    && "$PY" -c "import tokenyard.kv" 2>/dev/null; then
  log "tokenyard up to date ($("$PY" -c 'import tokenyard; print(tokenyard.__version__)'))"
  exit 0
fi

if ! "$PY" -c "import maturin" 2>/dev/null && [[ ! -x "$VENV/bin/maturin" ]]; then
  pip_q install "maturin>=1.9,<2"
fi
# `maturin develop` would target whichever venv is active; building a wheel and
# installing it here keeps the project's own .venv untouched. A private cargo target
# dir keeps this release build from racing a concurrent `maturin develop` over
# target/maturin (seen here: one deleted the other's lib_core.so mid-build).
WHEEL_DIR="$(mktemp -d)"
log "building tokenyard wheel (release)"
if (cd "$REPO" && CARGO_TARGET_DIR="$VENV/cargo-target" "$VENV/bin/maturin" build --release \
      --interpreter "$PY" -o "$WHEEL_DIR" >"$WHEEL_DIR/build.log" 2>&1); then
  pip_q install --force-reinstall --no-deps "$WHEEL_DIR"/tokenyard-*.whl
  echo "$FP" >"$TY_MARKER"
  log "tokenyard $("$PY" -c 'import tokenyard; print(tokenyard.__version__)') installed"
  rm -rf "$WHEEL_DIR"
else
  tail -n 30 "$WHEEL_DIR/build.log" >&2
  log "WARNING: tokenyard did not build (log: $WHEEL_DIR/build.log); peers are ready,"
  log "         run benches/kv_peers.py --peers-only"
fi

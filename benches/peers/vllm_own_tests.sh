#!/usr/bin/env bash
# vLLM 0.33.0's own tests/v1/core/ (every file), run on vLLM's Scheduler and on tokenyard's
# (tokenyard.integrations.vllm.TokenyardScheduler), with a line per file and the cases that
# pass on vLLM and fail on tokenyard listed.
#
#   bash benches/peers/vllm_own_tests.sh [pytest -k expression]
#   FILES="tests/v1/core/test_scheduler.py" bash benches/peers/vllm_own_tests.sh   # some files
#   SKIP_VLLM=1 bash benches/peers/vllm_own_tests.sh   # tokenyard's side only, vLLM's kept
#   SUITE=connectors bash benches/peers/vllm_own_tests.sh   # vLLM's connector tests instead
#
# SUITE=connectors runs, instead of tests/v1/core, every test file of vLLM's KV-connector,
# offloading, EC-connector, streaming-input and speculative-decoding test folders that
# names a scheduler (`Scheduler(`, `create_scheduler`, `scheduler_cls`), with the pytest
# plugin benches/peers/vllm_own_tests_swap.py on tokenyard's side (it rebinds
# `Scheduler`/`AsyncScheduler` in vLLM's test modules and their helpers, e.g.
# tests/v1/kv_connector/unit/utils.py::create_scheduler); results go to
# $CACHE/results/connectors-*.
#
# Needs the bench venv with vLLM 0.33.0 (benches/peers/setup.sh, or VENV=...) and a built
# tokenyard (maturin develop): tokenyard is taken from python/ on PYTHONPATH. Fetches the
# vLLM sdist once (its tests/ are not in the wheel) into CACHE (default
# ~/.cache/tokenyard-vllm-tests), installs pytest, einops and tblib into the venv if missing,
# and points facebook/opt-125m (the tests' default model) at a local config.json in an
# offline Hugging Face cache: no weights, no network after the first fetch.
#
# The tokenyard run copies benches/peers/vllm_own_tests_conftest.py beside vLLM's tests as
# tests/v1/core/conftest.py: it makes tests/v1/core/utils.py::create_scheduler build
# TokenyardScheduler unless a test names another class, rebinds `Scheduler` in the test
# modules that build vLLM's Scheduler themselves, and records in each case whether it built a
# tokenyard scheduler. No test is changed or skipped. A file none of whose cases builds one
# tests vLLM's own classes (KV cache utilities, the encoder cache manager, ...): it is
# reported apart, as "no scheduler involved".
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
VENV="${VENV:-$REPO/.venv-bench}"
PY="$VENV/bin/python"
CACHE="${CACHE:-$HOME/.cache/tokenyard-vllm-tests}"
VERSION=0.33.0
SDIST="vllm-$VERSION.tar.gz"
SHA256=f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112
FILTER="${1:-}"

mkdir -p "$CACHE"
cd "$CACHE"
if [[ ! -f "$SDIST" ]]; then
    # The index's simple page lists the file; `pip download --no-binary` would try to
    # build it (minutes, then fails without a GPU toolchain).
    index="$("$PY" -m pip config get global.index-url 2>/dev/null || true)"
    index="${index:-https://pypi.org/simple}"
    url="$(curl -fsSL -H 'Accept: text/html' "${index%/}/vllm/" \
        | grep -o "href=\"[^\"]*$SDIST[^\"]*\"" | head -1 | sed 's/^href="//; s/"$//; s/#.*//')"
    case "$url" in http*) ;; *) url="${index%/simple*}/${url#/}" ;; esac
    curl -fsSL -o "$SDIST.part" "$url"
    echo "$SHA256  $SDIST.part" | sha256sum -c - >/dev/null
    mv "$SDIST.part" "$SDIST"
fi
SRC="$CACHE/vllm-$VERSION"
if [[ ! -d "$SRC/tests" ]]; then
    tar xzf "$SDIST" "vllm-$VERSION/tests"
fi
"$PY" -c 'import pytest, einops, tblib' 2>/dev/null || "$PY" -m pip install -q pytest einops tblib

# facebook/opt-125m's config.json in an offline Hugging Face cache (the scheduler tests
# build a ModelConfig from it; weights are never read).
SNAP="$CACHE/hf/hub/models--facebook--opt-125m/snapshots/0000000000000000000000000000000000000000"
if [[ ! -f "$SNAP/config.json" ]]; then
    mkdir -p "$SNAP" "$CACHE/hf/hub/models--facebook--opt-125m/refs"
    printf 0000000000000000000000000000000000000000 \
        > "$CACHE/hf/hub/models--facebook--opt-125m/refs/main"
    cat > "$SNAP/config.json" <<'EOF'
{"_name_or_path": "facebook/opt-125m", "activation_dropout": 0.0,
 "activation_function": "relu", "architectures": ["OPTForCausalLM"],
 "attention_dropout": 0.0, "bos_token_id": 2, "do_layer_norm_before": true,
 "dropout": 0.1, "eos_token_id": 2, "enable_bias": true, "ffn_dim": 3072,
 "hidden_size": 768, "init_std": 0.02, "layer_norm_elementwise_affine": true,
 "layerdrop": 0.0, "max_position_embeddings": 2048, "model_type": "opt",
 "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 1,
 "prefix": "</s>", "torch_dtype": "float16", "transformers_version": "4.21.0.dev0",
 "use_cache": true, "vocab_size": 50272, "word_embed_proj_dim": 768}
EOF
fi

export HF_HUB_OFFLINE=1 HF_HOME="$CACHE/hf" VLLM_TARGET_DEVICE=cpu VLLM_LOGGING_LEVEL=ERROR
# TOKENYARD_PYTHON: another tokenyard python/ tree (e.g. a copy of an earlier build).
export PYTHONPATH="${TOKENYARD_PYTHON:-$REPO/python}${PYTHONPATH:+:$PYTHONPATH}"
OUT="$CACHE/results"
mkdir -p "$OUT"
cd "$SRC"
SUITE="${SUITE:-core}"
# Both suites' swaps live in benches/peers (the core conftest imports the plugin's pieces).
export PYTHONPATH="$PYTHONPATH:$HERE"
case "$SUITE" in
core)
    PREFIX="" PLUGIN=() ;;
connectors)
    ROOT="tests/v1/kv_connector tests/v1/simple_kv_offload tests/v1/ec_connector"
    ROOT="$ROOT tests/v1/streaming_input tests/v1/spec_decode"
    PREFIX=connectors- PLUGIN=(-p vllm_own_tests_swap) ;;
*) echo "SUITE must be core or connectors, got $SUITE" >&2; exit 2 ;;
esac
if [[ -n "${FILES:-}" ]]; then
    read -r -a TESTS <<<"$FILES"
elif [[ "$SUITE" == core ]]; then
    mapfile -t TESTS < <(find tests/v1/core -name 'test_*.py' | sort)
else
    # shellcheck disable=SC2086
    mapfile -t TESTS < <(grep -rlE --include='test_*.py' 'create_scheduler|Scheduler\(|scheduler_cls' \
        $ROOT | sort)
fi
# A file that cannot be collected here (a missing dependency) is reported, not fatal.
args=(-q -p no:cacheprovider -W ignore -o junit_family=xunit1 --continue-on-collection-errors
    "${TESTS[@]}")
[[ -n "$FILTER" ]] && args+=(-k "$FILTER")

rm -f tests/v1/core/conftest.py
# SKIP_VLLM=1: keep the previous run's vLLM results (vLLM's side does not change).
if [[ -z "${SKIP_VLLM:-}" || ! -f "$OUT/${PREFIX}vllm.xml" ]]; then
    "$PY" -m pytest "${args[@]}" --junitxml="$OUT/${PREFIX}vllm.xml" \
        >"$OUT/${PREFIX}vllm.log" 2>&1 || true
fi
[[ "$SUITE" == core ]] && cp "$HERE/vllm_own_tests_conftest.py" tests/v1/core/conftest.py
"$PY" -m pytest "${PLUGIN[@]}" "${args[@]}" --junitxml="$OUT/${PREFIX}tokenyard.xml" \
    >"$OUT/${PREFIX}tokenyard.log" 2>&1 || true
rm -f tests/v1/core/conftest.py

"$PY" - "$OUT/${PREFIX}vllm.xml" "$OUT/${PREFIX}tokenyard.xml" "$SUITE" <<'EOF' \
    | tee "$OUT/${PREFIX}summary.txt"
import sys
import xml.etree.ElementTree as ET


def outcomes(path):
    result, built = {}, set()
    for case in ET.parse(path).getroot().iter("testcase"):
        # classname: tests.v1.core[.prefix_cache].test_x[.TestClass]
        # (a file that failed to collect: no classname, the module as the name).
        # Names are relative to tests/v1/core, or to tests/v1 for the connector suite.
        parts = (case.get("classname") or case.get("name")).split(".")
        stem = max(i for i, p in enumerate(parts) if p.startswith("test_"))
        name = "/".join(parts[skip : stem + 1]) + ".py::" + (
            case.get("name") if case.get("classname") else "(collection)"
        )
        bad = case.find("failure") is not None or case.find("error") is not None
        skipped = case.find("skipped") is not None
        result[name] = "failed" if bad else "skipped" if skipped else "passed"
        for prop in case.iter("property"):
            if prop.get("name") == "tokenyard_scheduler" and prop.get("value") == "1":
                built.add(name)
    return result, built


skip = 3 if sys.argv[3] == "core" else 2
vllm, _ = outcomes(sys.argv[1])
tokenyard, built = outcomes(sys.argv[2])
on_vllm = {n for n, o in vllm.items() if o == "passed"}
on_tokenyard = {n for n, o in tokenyard.items() if o == "passed"}
files = sorted({n.split("::")[0] for n in vllm})
print(f"cases: {len(vllm)}")
print(f"passed on vLLM's Scheduler:      {len(on_vllm)}")
print(f"passed on TokenyardScheduler:    {len(on_tokenyard)}")
print(f"  of those that pass on vLLM:    {len(on_vllm & on_tokenyard)}")
print("per file: cases | pass on vLLM | of those, pass through the adapter | of those, built")
print("a TokenyardScheduler | cases that built one")
rows = {True: [], False: []}
for file in files:
    cases = {n for n in vllm if n.startswith(file + "::")}
    ours = cases & on_vllm
    row = (
        f"  {file}: {len(cases)} | {len(ours)} | {len(ours & on_tokenyard)}"
        f" | {len(ours & on_tokenyard & built)} | {len(cases & built)}"
    )
    rows[bool(cases & built)].append(row)
print("scheduler involved:")
print("\n".join(rows[True]) or "  (none)")
print("no scheduler involved (vLLM's own classes; the adapter is never built):")
print("\n".join(rows[False]) or "  (none)")
lost = sorted(on_vllm - on_tokenyard)
print(f"pass on vLLM, fail on tokenyard: {len(lost)}")
for name in lost:
    print(f"  {name}{'' if name in built else '  (no tokenyard scheduler built)'}")
EOF

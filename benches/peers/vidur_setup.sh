#!/usr/bin/env bash
# Bench-only environment for benches/sim_vidur.py: Vidur (microsoft/vidur, PyPI 0.0.26)
# in its own venv, plus the profiling data it would otherwise download, synthesised.
#
#   bash benches/peers/vidur_setup.sh          # create or refresh <repo>/.venv-vidur
#   VIDUR_VENV=/elsewhere bash ...             # another location
#
# Idempotent: a re-run checks the installed version and the data's marker (~1 s).
#
# Why it looks the way it does (see also /work/shared/peers/NOTES.md, "Vidur"):
# - Its own venv, not .venv-bench: vidur pulls pandas, scikit-learn, streamlit, wandb ...
#   whose pins must not move the torch/transformers set the vLLM/SGLang peers run on.
#   The venv is listed in .git/info/exclude (local to this checkout), not .gitignore.
# - Vidur 0.0.26 downloads its per-operation GPU profiles from a model hub at start-up,
#   which is unreachable here. vidur_peer.py points huggingface_hub.snapshot_download
#   at the folders written below. The data is *synthesised* (a roofline model of
#   Llama-2-7B on an A100-80GB, deterministic: no randomness at all), never committed,
#   and only needs the schema Vidur's sklearn predictor reads (the columns of
#   vidur/profiling/*'s outputs and of data/profiling/compute/a100/.../mlp.csv in
#   microsoft/vidur). Vidur's simulated times are therefore not real A100 figures; the
#   benchmark compares simulator speed, not fidelity.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${VIDUR_VENV:-$REPO/.venv-vidur}"
PY="$VENV/bin/python"
VIDUR_VERSION=0.0.26
DATA="$VENV/vidur_profiling"

log() { printf '[vidur-setup] %s\n' "$*"; }
installed_version() {
  "$PY" -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null || true
}

# --- keep the venv out of git without touching .gitignore ---------------------------
EXCLUDE="$(cd "$REPO" && git rev-parse --git-path info/exclude 2>/dev/null || true)"
if [[ -n "$EXCLUDE" && "$VENV" == "$REPO/"* ]]; then
  [[ "$EXCLUDE" = /* ]] || EXCLUDE="$REPO/$EXCLUDE"
  ENTRY="/${VENV#"$REPO/"}/"
  mkdir -p "$(dirname "$EXCLUDE")"
  if ! grep -qxF "$ENTRY" "$EXCLUDE" 2>/dev/null; then
    echo "$ENTRY" >>"$EXCLUDE"
    log "added $ENTRY to $EXCLUDE"
  fi
fi

# --- venv + vidur -------------------------------------------------------------------
if [[ ! -x "$PY" ]]; then
  log "creating $VENV"
  python3 -m venv "$VENV"
  "$PY" -m pip --disable-pip-version-check -q install --upgrade pip
fi
if [[ "$(installed_version vidur)" != "$VIDUR_VERSION" ]]; then
  log "installing vidur==$VIDUR_VERSION and its declared dependencies"
  "$PY" -m pip --disable-pip-version-check -q install "vidur==$VIDUR_VERSION"
else
  log "vidur $VIDUR_VERSION present"
fi

# --- synthesised profiling data -----------------------------------------------------
# Bump DATA_VERSION when the formulas below change; the marker then forces a rewrite.
DATA_VERSION=1
MARKER="$DATA/.ready-v$DATA_VERSION"
if [[ -f "$MARKER" ]]; then
  log "profiling data present ($DATA)"
else
  log "synthesising profiling data into $DATA"
  rm -rf "$DATA"
  "$PY" - "$DATA" <<'PYEOF'
"""Vidur's four profile tables for meta-llama/Llama-2-7b-hf on an A100-80GB (TP 1).

Every time is a roofline estimate in milliseconds, per layer:
    max(flops / (peak_tflops * mfu), bytes / (hbm_bandwidth * mbu)) + launch overhead.
No randomness: the same formulas give the same files on every machine.
"""

import json
import sys
from pathlib import Path

import pandas as pd

out = Path(sys.argv[1])
MODEL = "meta-llama/Llama-2-7b-hf"
H, FFN, HEADS, KV_HEADS, VOCAB = 4096, 11008, 32, 32, 32768  # Vidur's Llama2_7BModelConfig
HEAD_DIM = H // HEADS
PEAK_FLOPS, MFU = 312e12, 0.7  # A100 dense fp16
HBM_BYTES_S, MBU = 2.0e12, 0.8  # A100-80GB HBM2e
LAUNCH_MS = 0.005
BYTES = 2  # fp16


def roofline_ms(flops: float, nbytes: float) -> float:
    return max(flops / (PEAK_FLOPS * MFU), nbytes / (HBM_BYTES_S * MBU)) * 1e3 + LAUNCH_MS


def matmul_ms(n: int, k: int, m: int) -> float:
    return roofline_ms(2.0 * n * k * m, BYTES * (k * m + n * k + n * m))


def elementwise_ms(n_values_moved: float) -> float:
    return roofline_ms(n_values_moved, BYTES * n_values_moved)


def stats(prefix: str, median: float) -> dict:
    # Vidur reads only the median; the others keep the profiler's column set.
    return {f"time_stats.{prefix}.{s}": median for s in ("min", "max", "mean", "median")} | {
        f"time_stats.{prefix}.std": 0.0
    }


# mlp.csv: per-token-count costs of the linear layers and element-wise ops.
num_tokens = sorted({*range(1, 33), *range(32, 4097, 32)})
rows = []
for n in num_tokens:
    row = {}
    row |= stats("emb", elementwise_ms(2 * n * H))
    row |= stats("input_layernorm", elementwise_ms(2 * n * H))
    row |= stats("attn_pre_proj", matmul_ms(n, H, H + 2 * KV_HEADS * HEAD_DIM))
    row |= stats("attn_rope", elementwise_ms(2 * n * (H + KV_HEADS * HEAD_DIM)))
    row |= stats("attn_post_proj", matmul_ms(n, H, H))
    row |= stats("post_attention_layernorm", elementwise_ms(2 * n * H))
    row |= stats("mlp_up_proj", matmul_ms(n, H, 2 * FFN))
    row |= stats("mlp_act", elementwise_ms(3 * n * FFN))
    row |= stats("mlp_down_proj", matmul_ms(n, FFN, H))
    row |= stats("add", elementwise_ms(3 * n * H))
    row |= {
        "n_head": HEADS,
        "n_kv_head": KV_HEADS,
        "n_embd": H,
        "n_expanded_embd": FFN,
        "vocab_size": VOCAB,
        "use_gated_mlp": True,
        "num_tokens": n,
        "num_tensor_parallel_workers": 1,
    }
    rows.append(row)
mlp = pd.DataFrame(rows)

# attention.csv: prefill rows (one request, a chunk over a cached prefix) and decode
# rows (a batch of one-token queries over equal contexts), as vidur.profiling.attention
# writes them.
KV_BYTES_PER_TOKEN = 2 * BYTES * KV_HEADS * HEAD_DIM


def attention_row(batch_size: int, chunk: int, kv: int) -> dict:
    is_prefill = chunk > 0
    if is_prefill:
        ctx = kv + chunk
        flops = 4.0 * HEADS * HEAD_DIM * chunk * (kv + chunk / 2)
        prefill = roofline_ms(flops, KV_BYTES_PER_TOKEN * ctx + 2 * BYTES * chunk * H)
        decode = 0.0
        saved = chunk
    else:
        flops = 4.0 * HEADS * HEAD_DIM * batch_size * kv
        decode = roofline_ms(flops, KV_BYTES_PER_TOKEN * batch_size * kv)
        prefill = 0.0
        saved = batch_size
    row = {}
    row |= stats("attn_prefill", prefill)
    row |= stats("attn_decode", decode)
    row |= stats("attn_kv_cache_save", elementwise_ms(2 * saved * KV_HEADS * HEAD_DIM))
    return row | {
        "n_embd": H,
        "n_q_head": HEADS,
        "n_kv_head": KV_HEADS,
        "block_size": 16,
        "num_tensor_parallel_workers": 1,
        "max_model_len": 4096,
        "batch_size": batch_size,
        "prefill_chunk_size": chunk,
        "kv_cache_size": kv,
        "is_prefill": is_prefill,
        "attention_backend": "synthetic_roofline",
    }


rows = []
for chunk in [*range(32, 4097, 32)]:
    for kv in range(0, 4097 - chunk, 256):
        rows.append(attention_row(1, chunk, kv))
for batch_size in [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128]:
    for kv in range(256, 4097, 256):
        rows.append(attention_row(batch_size, 0, kv))
attention = pd.DataFrame(rows)


# Network tables: unused with one GPU per replica (Vidur trains them only for TP/PP > 1),
# but their files must exist. NCCL-like alpha-beta costs over NVLink.
def collective_rows(collective: str, workers: int, devices_per_node: int) -> list:
    return [
        stats(collective, 0.01 + size / 150e9 * 1e3)
        | {
            "size": size,
            "num_workers": workers,
            "devices_per_node": devices_per_node,
            "collective": collective,
        }
        for size in (2**p for p in range(10, 31))
    ]


all_reduce = pd.DataFrame(
    [r for w in (1, 2, 4, 8) for r in collective_rows("all_reduce", w, w)]
    + collective_rows("all_reduce", 2, 1)
)
send_recv = pd.DataFrame(
    collective_rows("send_recv", 2, 2) + collective_rows("send_recv", 2, 1)
)

compute = out / "compute"
network = out / "network"
compute.mkdir(parents=True)
network.mkdir(parents=True)
mlp.to_csv(compute / "mlp.csv.xz", index=False, compression="xz")
attention.to_csv(compute / "attention.csv.xz", index=False, compression="xz")
all_reduce.to_csv(network / "all_reduce.csv.xz", index=False, compression="xz")
send_recv.to_csv(network / "send_recv.csv.xz", index=False, compression="xz")
(compute / "config.json").write_text(
    json.dumps({"model": MODEL, "device_sku": "a100", "source": "synthetic roofline"}) + "\n"
)
(network / "config.json").write_text(
    json.dumps({"sku": "a100_pairwise_nvlink", "source": "synthetic alpha-beta"}) + "\n"
)
print(f"[vidur-setup] mlp {len(mlp)} rows, attention {len(attention)} rows -> {out}")
PYEOF
  touch "$MARKER"
fi
log "ready: $PY (vidur $(installed_version vidur))"

#!/usr/bin/env bash
# One lent GPU, one call: the engine's steps (for benches/engine_vs_measured.py), the paged
# attention kernels' share of HBM bandwidth, and `tokenyard profile` of one model's layers.
# Run from the repository root with the native extension in python/tokenyard (carried):
#   bash benches/gpu_session.sh OUT_DIR
# Each part has its own time limit so one slow part cannot starve the others.
set -u
out=${1:?usage: gpu_session.sh OUT_DIR}
mkdir -p "$out/engine"
export PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
  python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__, torch.cuda.get_device_name())"
} >"$out/env.txt" 2>&1
model=${MODEL:-llama-3.1-8b}
start=$SECONDS
timeout 210 python3 benches/engine_gpu.py --model "$model" --requests "${REQUESTS:-128}" \
  --out "$out/engine" >"$out/engine.log" 2>&1
echo "engine: rc $? in $((SECONDS - start)) s" >>"$out/env.txt"
start=$SECONDS
timeout 150 python3 benches/kernels_gpu.py --json "$out/kernels.json" >"$out/kernels.log" 2>&1
echo "kernels: rc $? in $((SECONDS - start)) s" >>"$out/env.txt"
start=$SECONDS
timeout 110 python3 -m tokenyard profile --model "$model" --grid default --repeats 5 \
  --no-progress -o "$out/profile.csv" >"$out/profile.log" 2>&1
echo "profile: rc $? in $((SECONDS - start)) s" >>"$out/env.txt"
cat "$out/env.txt"

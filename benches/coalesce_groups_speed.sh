#!/bin/bash
# Replay speed of coalesced decode steps over KV groups (benches/RESULTS.md, "Coalesced
# decode steps over KV groups"): 5 interleaved rounds of {old, new} x {gpt-oss-20b groups
# on, groups off, the built-in job}, each a fresh interpreter pinned to core 1. OLD: a copy
# of an older build's python/tokenyard folder's parent (its extension inside). Prints
# round, build, job, the summary's wall_s, a hash of the summary without wall times, and
# the process's elapsed seconds.
cd "$(dirname "$0")/.." || exit 1
OLD=${OLD:-/tmp/ms-old}
G='--set replica.model="openai/gpt-oss-20b" --set replica.device="h100-sxm"'
for round in 1 2 3 4 5; do
  for build in old new; do
    pp=""; [ $build = old ] && pp="PYTHONPATH=$OLD"
    for job in on off builtin; do
      case $job in
        on) args="$G --set replica.hybrid_kv_cache_manager=true";;
        off) args="$G --set replica.hybrid_kv_cache_manager=false";;
        builtin) args="";;
      esac
      start=$(date +%s.%N)
      out=$(eval env $pp taskset -c 1 .venv/bin/python -m tokenyard simulate $args --json --no-progress 2>/dev/null)
      end=$(date +%s.%N)
      wall=$(echo "$out" | python3 -c "import sys,json;t=sys.stdin.read();d=json.loads(t[t.find('{'):t.rfind('}')+1]);import hashlib
def strip(x):
    if isinstance(x, dict): return {k: strip(v) for k, v in x.items() if 'wall' not in k}
    if isinstance(x, list): return [strip(v) for v in x]
    return x
print(d.get('wall_s'), hashlib.md5(json.dumps(strip(d), sort_keys=True).encode()).hexdigest()[:10])")
      echo "$round $build $job $wall $(echo "$end - $start" | bc)"
    done
  done
done

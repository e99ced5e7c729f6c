"""The default job under an older build and this one, interleaved, each pinned to core 1:
does the typed config / GIL release (issue 14) change the replay speed or the answer?

    pip install --no-deps --target /tmp/ty-old tokenyard-<old>.whl   # e.g. a wheel of 2f09a63
    .venv/bin/python benches/typed_config_speed.py 5 [/tmp/ty-old]

Prints the medians of the Rust loop's wall time (``summary["wall_s"]``) and of the whole
``simulate()`` call, the ratio, and the first run's headline numbers of each side (they
must be equal: the change is not meant to move any number).
"""

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

PY = str(Path(sys.executable))
OLD = sys.argv[2] if len(sys.argv) > 2 else "/tmp/ty-old"
code = (
    "import json,sys,time;from tokenyard.simulation import SimulationConfig, simulate;"
    "c=SimulationConfig();t=time.perf_counter();r=simulate(c);"
    "print(json.dumps({'wall_s':r.summary['wall_s'],'total_s':time.perf_counter()-t,"
    "'ttft':r.summary['latency_s']['ttft']['mean'],'n':r.summary['num_requests'],"
    "'e2e':r.summary['latency_s']['e2e']['p99']}))"
)
out = {"old": [], "new": []}
for _ in range(int(sys.argv[1])):
    for side in ("old", "new"):
        env = dict(os.environ)
        if side == "old":
            env["PYTHONPATH"] = OLD
        res = subprocess.run(
            ["taskset", "-c", "1", PY, "-c", code],
            env=env,
            capture_output=True,
            text=True,
            cwd="/tmp",
            check=True,
        )
        out[side].append(json.loads(res.stdout.strip().splitlines()[-1]))
for side, runs in out.items():
    print(
        side,
        "loop wall_s median",
        statistics.median(r["wall_s"] for r in runs),
        "simulate() median",
        statistics.median(r["total_s"] for r in runs),
        runs[0],
    )
print(
    "ratio new/old loop:",
    statistics.median(r["wall_s"] for r in out["new"])
    / statistics.median(r["wall_s"] for r in out["old"]),
)

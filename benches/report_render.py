"""Reports as a person sees them, and what they cost on a big run.

1. The README's first run with ``--plots``, its ``report.html`` rendered by headless
   Chromium (Debian's ``chromium`` package) to a PNG, and the same for a ``tokenyard
   compare`` of two routing policies; the PNGs go to ``--images`` (``docs/images`` for the
   docs).
2. A 1M-request run (the ``sim_scale.py`` job under ``vllm``): how long ``write_report``
   takes and how big the report is.

    .venv/bin/python benches/report_render.py --images docs/images [--requests 1000000]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sim_scale import job, workload

from tokenyard.cli import main as cli_main
from tokenyard.report import compare_runs, write_report
from tokenyard.simulation import config_from_mapping, simulate


def render(page: Path, png: Path, height: int) -> None:
    """``page`` as Chromium draws it, 1200 pixels wide, to ``png``."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        print("skipped rendering: no chromium (apt-get install chromium)", file=sys.stderr)
        return
    subprocess.run(
        [
            browser,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--window-size=1200,{height}",
            f"--screenshot={png}",
            page.resolve().as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    print(f"rendered {page} -> {png}")


def readme_run(work: Path, images: Path) -> None:
    run = work / "results"
    args = ["simulate", "--output", str(run), "--plots", "png,svg", "--no-progress"]
    assert cli_main(args) == 0
    other = work / "least_kv_load"
    assert cli_main([*args[:2], str(other), *args[3:], "--global-policy", "least_kv_load"]) == 0
    text, page = compare_runs([run, other], output=work / "compare")
    print(text)
    images.mkdir(parents=True, exist_ok=True)
    for name in ("latency", "over_time", "replicas"):
        shutil.copy(run / "plots" / f"{name}.png", images / f"first_run_{name}.png")
    render(run / "report.html", images / "report.png", 3600)
    if page is not None:
        render(page, images / "compare.png", 2400)


def big_run(requests: int, work: Path) -> None:
    start = time.perf_counter()
    result = simulate(config_from_mapping(job("vllm", workload(requests))))
    simulated = time.perf_counter() - start
    folder = work / "big"
    result.write(folder)
    start = time.perf_counter()
    page = write_report(folder, ["png"])
    report_s = time.perf_counter() - start
    size = page.stat().st_size + sum(p.stat().st_size for p in (folder / "plots").iterdir())
    print(
        f"{requests:,} requests: simulated in {simulated:.1f} s; report in {report_s:.1f} s, "
        f"{size / 1e6:.2f} MB (report.html {page.stat().st_size / 1e6:.2f} MB)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", default="benches/out/report", help="where the PNGs go")
    parser.add_argument("--requests", type=int, default=1_000_000, help="the big run's size")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        readme_run(work, Path(args.images))
        big_run(args.requests, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())

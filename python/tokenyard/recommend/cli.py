"""``tokenyard recommend``: the planner's question on the command line (docs/recommend.md).

    tokenyard recommend --model llama-3.1-70b --system h200_sxm --gpus 16 \\
        --isl 4000 --osl 500 --ttft 1.0 --tpot 0.05 --framework vllm --out rec/
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from tokenyard.errors import ConfigError, TokenyardError

__all__ = [
    "add_parser",
    "length_distribution",
    "plot_formats",
    "run_command",
    "slo_bounds",
]

#: Synthetic requests verified when --requests is not given.
DEFAULT_REQUESTS = 4000


EPILOG = """\
Lengths (--isl/--osl): 4000 (fixed), lognormal:median=4000,sigma=0.5, uniform:low=100,high=8000,
zipf:low=16,high=1024,theta=1.1. SLOs: --ttft/--tpot/--e2e seconds at --percentile (p90 by
default), or --slo KEY=SECONDS with KEY such as ttft_p99 or tpot_mean (repeatable).
A point is recommended only if a simulation of the whole load (the whole trace, or
--requests synthetic requests) at (1 - margin) x its capacity met every SLO.
"""


def add_parser(commands: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = commands.add_parser(
        "recommend",
        help="the best aggregated and disaggregated deployment for a model, GPUs, load and SLOs",
        description="Search aggregated and disaggregated (xPyD) layouts for a model on "
        "GPU systems under latency SLOs: a steady-state estimate prunes them, the "
        "survivors' capacities are simulated on the load, and the best are verified on "
        "the whole load with a margin and printed with their launch lines.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", required=True, help="a catalog model, HF id or config.json")
    p.add_argument(
        "--system",
        action="append",
        required=True,
        metavar="GPU",
        help="a GPU (catalog name, or aiconfigurator's system name such as h200_sxm); repeatable",
    )
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument("--gpus", type=int, help="the GPU budget: layouts that divide it")
    size.add_argument("--rate", type=float, metavar="QPS", help="requests/s to serve")
    size.add_argument("--concurrency", type=int, help="users to serve (a closed loop)")
    load = p.add_argument_group("load (lengths, a trace or a workload file)")
    load.add_argument("--isl", metavar="DIST", help="prompt tokens: N or KIND:k=v,...")
    load.add_argument("--osl", metavar="DIST", help="output tokens: N or KIND:k=v,...")
    load.add_argument(
        "--requests",
        type=int,
        help=f"synthetic requests verified (with --isl/--osl; default {DEFAULT_REQUESTS})",
    )
    load.add_argument("--trace", metavar="FILE", help="a request trace (the whole is verified)")
    load.add_argument(
        "--trace-format",
        choices=("vidur", "mooncake", "azure"),
        help="the format of --trace (default vidur)",
    )
    load.add_argument("--workload", metavar="FILE", help="a [workload] table (TOML/YAML/JSON)")
    load.add_argument(
        "--sample",
        type=int,
        default=1000,
        help="requests the search simulates per run (the first of a trace; default 1000)",
    )
    slo = p.add_argument_group("SLOs (seconds)")
    slo.add_argument("--ttft", type=float, help="time to first token bound")
    slo.add_argument("--tpot", type=float, help="time per output token bound")
    slo.add_argument("--e2e", type=float, help="end-to-end latency bound")
    slo.add_argument(
        "--percentile",
        help="the statistic of --ttft/--tpot/--e2e: 50, 90, 99, mean or max (default 90)",
    )
    slo.add_argument(
        "--slo", action="append", default=[], metavar="KEY=S", help="e.g. ttft_p99=2.0"
    )
    p.add_argument("--framework", choices=("vllm", "sglang"), default="vllm")
    p.add_argument(
        "--margin",
        type=float,
        default=0.10,
        help="verify and recommend at (1 - margin) x capacity (default 0.10)",
    )
    p.add_argument("--top-k", type=int, default=4, help="layouts simulated per kind (default 4)")
    p.add_argument("--show", type=int, default=3, help="points verified per kind (default 3)")
    p.add_argument("--no-disagg", action="store_true", help="aggregated layouts only")
    p.add_argument(
        "--mtp-acceptance",
        type=float,
        help="try MTP speculative decoding (models with an MTP module) at this acceptance",
    )
    p.add_argument("--dtype", help="weights dtype (default: the checkpoint's)")
    p.add_argument("--kv-cache-dtype", help="KV cache dtype (default: the weights')")
    p.add_argument(
        "--execution", default="auto", help="execution model (docs/predictor.md; default auto)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, help="local worker processes (default: all cores)")
    p.add_argument("--ray", nargs="?", const="auto", metavar="ADDRESS", help="run on Ray")
    p.add_argument("--out", metavar="DIR", help="write the table, launch scripts and configs")
    p.add_argument(
        "--plots",
        metavar="FMT",
        help="formats of --out's frontier chart, comma-separated (png, svg, pdf) or none; "
        "default png where matplotlib is installed",
    )
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    return p


def plot_formats(args: argparse.Namespace) -> tuple[str, ...]:
    """The formats of ``--out``'s ``frontier.<fmt>``: ``--plots`` (``none``: no chart), or
    png when matplotlib is installed.

    Raises:
        ConfigError: ``--plots`` without ``--out``, an unknown format, or ``--plots``
            without matplotlib.
    """
    if args.plots is None:
        if not args.out:
            return ()
        import importlib.util

        return ("png",) if importlib.util.find_spec("matplotlib") else ()
    formats = tuple(f.strip().lstrip(".").lower() for f in args.plots.split(",") if f.strip())
    if formats == ("none",):
        return ()
    if not args.out:
        raise ConfigError("--plots needs --out DIR", field="--plots", value=repr(args.plots))
    bad = [f for f in formats if f not in ("png", "svg", "pdf")]
    if bad or not formats:
        raise ConfigError(
            f"--plots: formats are png, svg, pdf or none, got {args.plots!r}",
            field="--plots",
            value=repr(args.plots),
        )
    from tokenyard.search.plots import _pyplot

    _pyplot()  # refused before the search when matplotlib is missing
    return formats


def length_distribution(text: str, flag: str) -> dict[str, Any]:
    """``4000`` -> fixed; ``lognormal:median=4000,sigma=0.5`` -> that distribution.

    Raises:
        ConfigError: not of either form (field ``flag``).
    """
    from tokenyard.workload.lengths import LENGTH_KINDS

    text = text.strip()
    try:
        return {"kind": "fixed", "value": int(text)}
    except ValueError:
        pass
    kind, _, rest = text.partition(":")
    if kind not in LENGTH_KINDS or not rest:
        raise ConfigError(
            f"{flag}: expected a token count or KIND:key=value,... with KIND one of "
            f"{', '.join(LENGTH_KINDS)}, got {text!r}",
            field=flag,
            value=repr(text),
        )
    out: dict[str, Any] = {"kind": kind}
    for part in rest.split(","):
        key, eq, value = part.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not eq or not key.strip() or not math.isfinite(number):
            raise ConfigError(
                f"{flag}: {part!r} is not key=number in {text!r}", field=flag, value=repr(text)
            )
        out[key.strip()] = int(number) if number.is_integer() and key != "sigma" else number
    return out


def slo_bounds(args: argparse.Namespace) -> dict[str, float]:
    """The SLO keys (``ttft_p90_s``) from ``--ttft/--tpot/--e2e`` at ``--percentile`` and
    ``--slo KEY=S``.

    Raises:
        ConfigError: a bad percentile or ``--slo`` entry (the key checked later).
    """
    if args.percentile is not None and all(v is None for v in (args.ttft, args.tpot, args.e2e)):
        raise ConfigError(
            "--percentile: applies to --ttft/--tpot/--e2e, none given (--slo names its own "
            "statistic, e.g. ttft_p99=2.0)",
            field="--percentile",
            value=repr(args.percentile),
        )
    stat = str("90" if args.percentile is None else args.percentile).strip().lower()
    stat = {"50": "p50", "90": "p90", "99": "p99"}.get(stat, stat)
    if stat not in ("p50", "p90", "p99", "mean", "max"):
        raise ConfigError(
            f"--percentile: must be 50, 90, 99, mean or max, got {args.percentile!r}",
            field="--percentile",
            value=repr(args.percentile),
        )
    bounds = {
        f"{name}_{stat}_s": value
        for name, value in (("ttft", args.ttft), ("tpot", args.tpot), ("e2e", args.e2e))
        if value is not None
    }
    for item in args.slo:
        key, eq, value = item.partition("=")
        try:
            seconds = float(value)
        except ValueError:
            seconds = math.nan
        if not eq or not math.isfinite(seconds):
            raise ConfigError(
                f"--slo: expected KEY=SECONDS such as ttft_p99=2.0, got {item!r}",
                field="--slo",
                value=repr(item),
            )
        key = key.strip()
        bounds[key if key.endswith("_s") else f"{key}_s"] = seconds
    return bounds


def _workload(args: argparse.Namespace) -> dict[str, Any]:
    given = [f for f, v in (("--trace", args.trace), ("--workload", args.workload)) if v]
    if args.isl or args.osl:
        given.append("--isl/--osl")
    if len(given) != 1:
        raise ConfigError(
            f"--isl/--osl, --trace, --workload: give exactly one load, got {given or 'none'}",
            field="--isl",
        )
    if args.requests is not None and not (args.isl or args.osl):
        raise ConfigError(
            f"--requests: sizes a synthetic --isl/--osl load; {given[0]} sets its own",
            field="--requests",
            value=str(args.requests),
        )
    if args.trace_format is not None and not args.trace:
        raise ConfigError(
            "--trace-format: applies to --trace only",
            field="--trace-format",
            value=repr(args.trace_format),
        )
    if args.trace:
        path = Path(args.trace)
        if not path.is_file():
            raise ConfigError(f"--trace: no file {path}", field="--trace", value=str(path))
        fmt = args.trace_format or "vidur"
        return {"kind": "trace", "format": fmt, "path": str(path.absolute())}
    if args.workload:
        return _workload_file(Path(args.workload))
    if not (args.isl and args.osl):
        raise ConfigError("--isl/--osl: give both", field="--isl" if not args.isl else "--osl")
    requests = DEFAULT_REQUESTS if args.requests is None else args.requests
    if requests < 10:
        raise ConfigError(
            f"--requests: must be at least 10, got {requests}",
            field="--requests",
            value=str(requests),
        )
    return {
        "kind": "synthetic",
        "num_requests": requests,
        "seed": args.seed,
        "arrival": {"kind": "poisson", "qps": 1.0},
        "prompt_tokens": length_distribution(args.isl, "--isl"),
        "output_tokens": length_distribution(args.osl, "--osl"),
    }


def _workload_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"--workload: no file {path}", field="--workload", value=str(path))
    from tokenyard._checks import read_document

    try:
        data = read_document(path, what="--workload")
    except ConfigError as error:
        raise ConfigError(str(error), field="--workload", value=str(path)) from None
    if not isinstance(data, dict):
        raise ConfigError(f"--workload: {path} holds no table", field="--workload", value=str(path))
    workload = dict(data.get("workload", data))
    if "path" in workload:  # relative to the file, as in a simulation config
        workload["path"] = str((path.parent / str(workload["path"])).absolute())
    return workload


def run_command(args: argparse.Namespace) -> int:
    from tokenyard.recommend.recommend import Ask, recommend
    from tokenyard.recommend.table import format_table, rows, write_outputs

    try:
        replica: dict[str, Any] = {}
        if args.dtype:
            replica["dtype"] = args.dtype
        if args.kv_cache_dtype:
            replica["kv_cache_dtype"] = args.kv_cache_dtype
        plots = plot_formats(args)
        if args.workers is not None and args.ray:
            raise ConfigError(
                "--workers: sets local worker processes; --ray runs on the Ray cluster's",
                field="--workers",
                value=str(args.workers),
            )
        written: list[str] = []
        ask = Ask(
            model=args.model,
            systems=tuple(args.system),
            workload=_workload(args),
            slo=slo_bounds(args),
            framework=args.framework,
            gpus=args.gpus,
            rate=args.rate,
            concurrency=args.concurrency,
            margin=args.margin,
            sample=args.sample,
            top_k=args.top_k,
            show=args.show,
            execution={"model": args.execution},
            replica=replica,
            disaggregated=not args.no_disagg,
            mtp_acceptance=args.mtp_acceptance,
            seed=args.seed,
        )
        result = recommend(
            ask,
            executor="ray" if args.ray else None,
            workers=args.workers,
            ray_address=args.ray,
        )
        table = rows(result)
        text = format_table(result, table)
        if args.out:
            written = write_outputs(result, table, args.out, text, plots)
    except TokenyardError as exc:
        print(f"tokenyard recommend: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(table, indent=2, default=str))
    else:
        print(text)
        if args.out:
            print(f"wrote {args.out}/: {', '.join(written)}")
    return 0 if result.points else 1

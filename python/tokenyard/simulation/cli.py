"""``tokenyard simulate``: run a simulation from a TOML/YAML config (or the built-in default)
with flag overrides, show progress, print a summary table, write the result files."""

from __future__ import annotations

import argparse
import errno
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from tokenyard._output import write_text
from tokenyard.errors import ConfigError, OutputError, TokenyardError
from tokenyard.simulation.config import (
    apply_overrides,
    config_from_mapping,
    default_workload,
    parse_set_options,
    read_config_file,
)
from tokenyard.simulation.results import SimulationResult, trace_events_in
from tokenyard.simulation.run import simulate

__all__ = ["add_parser", "run_command"]


def _epilog() -> str:
    from tokenyard import _core

    policies = "\n".join(
        f"  {name:<19} [replica.scheduler.{info['section']}] {info['summary']}"
        for name, info in _core.REPLICA_POLICIES.items()
    )
    return f"""\
Config keys (file sections, or --set with dotted names; see docs/simulate.md):
  seed
  cluster.num_replicas, cluster.global_scheduler.{{policy,balance,options}}
  replica.{{model,device,tensor_parallel_size,num_pipeline_stages,expert_parallel_size,
    data_parallel_size,memory_margin_fraction,dtype,kv_cache_dtype,over_length}}
  replica.scheduler.{{policy,max_request_tokens}} and the policy's own section:
    replica.scheduler.vllm_v1.*  (tokenyard.sched.SchedulerConfig: max_num_seqs, ...)
    replica.scheduler.vidur.*    (block_size, num_blocks, batch_size_cap, chunk_size, restart, ...)
    replica.scheduler.sglang.*   (page_size, max_running_requests, chunked_prefill_size, ...)
    replica.scheduler.plugin.*   (block_size, num_blocks, options)
  execution.model = auto (default: measured if the tables cover the replica, else roofline)
    | measured | roofline | linear | profiled | module:callable
  execution.measured.{{system,framework,version,data_dir}}, execution.efficiency.*,
  execution.cpu.*, execution.{{constant_s,per_prefill_token_s,...}} (linear only)
  workload.* (docs/workloads.md), metrics.{{sample_interval_s,record_stages,slo_ttft_s,slo_tpot_s,
    trace_events,trace_window_s,trace_requests,trace_max_events}}

Global policies: {", ".join(_core.GLOBAL_POLICIES)}, or module:Class.
Replica policies (or module:Class):
{policies}
"""


def add_parser(commands: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = commands.add_parser(
        "simulate",
        help="replay a workload through a simulated cluster",
        description="Replay a trace or a synthetic workload through a simulated cluster. "
        "Without a config file, runs the built-in default: 4 Llama-2-7B replicas on "
        "A100-80GB under vLLM V1 scheduling, 10,000 synthetic requests at 20 QPS.",
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("config", nargs="?", help="a .toml, .yaml or .yml config file")
    p.add_argument("--output", "-o", metavar="DIR", help="write the result files into DIR")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help='set a config key (dotted name; VALUE is read as TOML: 4, 0.5, true, "x", '
        "[1, 2]; a bare word is a string). Repeatable; wins over the file and the flags.",
    )
    p.add_argument("--replicas", type=int, help="cluster.num_replicas")
    p.add_argument("--global-policy", help="cluster.global_scheduler.policy")
    p.add_argument("--replica-policy", help="replica.scheduler.policy")
    p.add_argument(
        "--requests",
        type=int,
        help="workload.num_requests (synthetic), num_sessions (sessions) or limit (trace)",
    )
    p.add_argument("--qps", type=float, help="arrival rate (synthetic) or target_qps (trace)")
    p.add_argument("--trace", metavar="PATH", help="replay this trace instead of the workload")
    p.add_argument(
        "--trace-format",
        choices=("vidur", "mooncake", "azure"),
        default=None,
        help="format of --trace (default: the config's trace format, else vidur)",
    )
    p.add_argument("--seed", type=int, help="seed (routing, synthetic workload)")
    p.add_argument(
        "--stage-trace", action="store_true", help="also write trace.json (Chrome/Perfetto)"
    )
    p.add_argument(
        "--trace-events",
        metavar="FILE",
        help="write a Chrome / Perfetto trace-event JSON of the run to FILE (open it in "
        "ui.perfetto.dev; metrics.trace_events)",
    )
    p.add_argument(
        "--trace-window",
        metavar="START:END",
        help="with --trace-events: only simulated seconds START to END (metrics.trace_window_s)",
    )
    p.add_argument(
        "--trace-requests",
        metavar="A:B",
        help="with --trace-events: only requests A to B-1 and the batches while they ran "
        "(metrics.trace_requests)",
    )
    p.add_argument(
        "--plots",
        nargs="?",
        const="png",
        metavar="FORMATS",
        help="with --output: also draw the plots (png, svg or png,svg; default png) and "
        "write DIR/report.html (docs/simulate.md#reports)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _overrides(args: argparse.Namespace, workload: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if args.replicas is not None:
        out["cluster.num_replicas"] = args.replicas
    if args.global_policy is not None:
        out["cluster.global_scheduler.policy"] = args.global_policy
    if args.replica_policy is not None:
        out["replica.scheduler.policy"] = args.replica_policy
    if args.seed is not None:
        out["seed"] = args.seed
    if args.stage_trace:
        out["metrics.record_stages"] = True
    out.update(_trace_overrides(args))
    is_trace = workload.get("kind") == "trace"
    if args.requests is not None:
        count = "workload.num_sessions" if workload.get("kind") == "sessions" else None
        out[count or ("workload.limit" if is_trace else "workload.num_requests")] = args.requests
    if args.qps is not None:
        out["workload.target_qps" if is_trace else "workload.arrival.qps"] = args.qps
    out.update(parse_set_options(args.overrides))
    return out


def _range(text: str, flag: str, kind: type) -> list[Any]:
    """``"A:B"`` -> ``[A, B]`` (numbers of ``kind``); a ConfigError names the flag."""
    start, sep, end = text.partition(":")
    try:
        if not sep:
            raise ValueError(text)
        return [kind(start), kind(end)]
    except ValueError:
        noun = "seconds" if kind is float else "request ids"
        raise ConfigError(
            f"{flag}: must be START:END ({noun}), got {text!r}", field=flag, value=repr(text)
        ) from None


def _trace_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """``--trace-events`` and its bounds as metrics keys; the window and range need it."""
    out: dict[str, Any] = {}
    for flag, value in (
        ("--trace-window", args.trace_window),
        ("--trace-requests", args.trace_requests),
    ):
        if value is not None and args.trace_events is None:
            raise ConfigError(f"{flag}: needs --trace-events FILE", field=flag, value=repr(value))
    if args.trace_events is not None:
        # From the shell's folder, not the config's (as --trace).
        out["metrics.trace_events"] = str(Path(args.trace_events).absolute())
    if args.trace_window is not None:
        out["metrics.trace_window_s"] = _range(args.trace_window, "--trace-window", float)
    if args.trace_requests is not None:
        out["metrics.trace_requests"] = _range(args.trace_requests, "--trace-requests", int)
    return out


def _trace_sampling(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A trace's KV use is each batch's own when every batch is sampled: a run writing
    trace events samples every batch (``metrics.sample_interval_s = 0``) unless the config
    or ``--set`` gives an interval."""
    metrics = data.get("metrics") or {}
    traced = overrides.get("metrics.trace_events") or metrics.get("trace_events")
    if traced and "sample_interval_s" not in metrics:
        return {"metrics.sample_interval_s": 0.0, **overrides}
    return overrides


class _ProgressBar:
    def __init__(self, total: int | None, enabled: bool):
        self.total, self.enabled = total, enabled and sys.stderr.isatty()
        self.start = time.perf_counter()

    def __call__(self, done: int) -> None:
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.start
        if self.total:
            filled = int(30 * done / self.total)
            bar = "#" * filled + "." * (30 - filled)
            text = f"\r[{bar}] {done:,}/{self.total:,} requests  {elapsed:.1f} s"
        else:
            text = f"\r{done:,} requests  {elapsed:.1f} s"
        sys.stderr.write(text)
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def _plot_formats(args: argparse.Namespace) -> tuple[str, ...]:
    """The --plots formats, checked before the run (it needs --output and matplotlib)."""
    if args.plots is None:
        return ()
    from tokenyard.report.plots import _pyplot, parse_formats

    formats = parse_formats(args.plots)
    if not args.output:
        raise ConfigError(
            "--plots: needs --output DIR (the plots and report.html go there)",
            field="--plots",
            value=repr(args.plots),
        )
    _pyplot()
    return formats


def _trace_workload(workload: Any, args: argparse.Namespace) -> dict[str, Any]:
    """``--trace PATH``: a trace section keeps its options (limit, target_qps, ...) and
    takes the new path (and ``--trace-format`` if given); any other workload is replaced."""
    fmt = args.trace_format
    path = str(Path(args.trace).absolute())  # from the shell's folder, not the config's
    if isinstance(workload, dict) and workload.get("kind") == "trace":
        merged = dict(workload, path=path)
        if fmt is not None:
            merged["format"] = fmt
        return merged
    replaced: dict[str, Any] = {"kind": "trace", "format": fmt or "vidur", "path": path}
    # Load wrappers apply to any workload: the new trace keeps them.
    for key in ("closed_loop", "lora"):
        if isinstance(workload, dict) and key in workload:
            replaced[key] = workload[key]
    return replaced


def check_output_dir(path: str | Path) -> None:
    """Checks before a run that the results folder can be written (it, or the nearest
    folder above it that exists, is a writable folder), so a bad path fails in a second,
    not after the simulation: an ``OutputError`` naming it. Nothing is created here."""
    folder = Path(path).absolute()
    existing = folder
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        err = NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(existing))
        raise OutputError.of(err, folder)
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutputError.of(
            PermissionError(errno.EACCES, "Permission denied", str(existing)), folder
        )


def _write_outputs(args: argparse.Namespace, result: SimulationResult, formats: Any) -> None:
    result.write(args.output)
    argv = getattr(args, "argv", None)
    if argv is not None:
        write_text(args.output, "command.txt", shlex.join(["tokenyard", *argv]) + "\n")
    if formats:
        from tokenyard.report import write_report

        write_report(args.output, formats)


def run_command(args: argparse.Namespace) -> int:
    try:
        formats = _plot_formats(args)
        data = read_config_file(args.config) if args.config else {"workload": default_workload()}
        if args.trace:
            data["workload"] = _trace_workload(data.get("workload"), args)
        overrides = _trace_sampling(data, _overrides(args, data["workload"]))
        config = config_from_mapping(apply_overrides(data, overrides))
        if args.output:
            check_output_dir(args.output)
            # Refused before the run rather than after it (SimulationResult.write).
            traced = config.metrics.trace_events
            trace_events_in(args.output, config.path(traced) if traced else None)
        total = config.workload.get("num_requests") or config.workload.get("limit")
        bar = _ProgressBar(total if isinstance(total, int) else None, not args.no_progress)
        try:
            result = simulate(config, progress=bar)
        finally:
            bar.close()
        if args.output:
            try:
                _write_outputs(args, result, formats)
            except OSError as exc:
                raise OutputError.of(exc, args.output) from None
    except TokenyardError as exc:
        print(f"tokenyard simulate: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result.summary, indent=2) if args.json else format_summary(result))
    if args.output:
        trace = ", trace.json" if result.stages is not None else ""
        report = ", report.html, plots/" if args.plots is not None else ""
        if config.metrics.trace_events:
            report += f"; trace events: {config.metrics.trace_events}"
        note = (
            f"wrote {args.output}/: requests.parquet, requests.csv, summary.json, "
            f"samples.parquet, token_gaps.parquet, config.json{trace}{report}"
        )
        if args.json:  # stdout stays one JSON document
            print(note, file=sys.stderr)
        else:
            print(f"\n{note}")
    return 0


def format_summary(result: SimulationResult) -> str:
    s = result.summary
    c = s["config"]
    lat = s["latency_s"]
    layout = c.get("layout") or f"TP {c['tensor_parallel_size']}, PP {c['num_pipeline_stages']}"
    lines = [
        f"tokenyard simulate: {c['num_replicas']} x {c['model']} on {c['device']}"
        f" ({layout}), "
        f"{c['replica_policy']} replicas, {c['global_policy']} routing, "
        f"{s['num_requests']:,} requests",
        f"execution model: {c['execution']['label']}",
    ]
    if c["execution"].get("a2a"):  # attention DP: what priced the experts' all-to-all
        lines.append(f"  expert all-to-all: {c['execution']['a2a']}")
    why_not = c["execution"].get("why_not_measured")
    if why_not:  # auto fell back to the roofline: say why on the banner, not only in the JSON
        lines.append(f"  not measured: {why_not}")
    lines += [f"note: {note}" for note in c.get("notes", [])]
    lines += [
        f"simulated {s['makespan_s']:.1f} s in {s['wall_s']:.2f} s of wall time "
        f"({s['requests_per_wall_s'] or 0:,.0f} requests per wall second)",
    ]
    skipped = s.get("num_skipped_over_length", 0)
    if skipped:
        lines.append(
            f"skipped {skipped:,} requests longer than a replica serves "
            '(replica.over_length = "skip"; not in the figures below)'
        )
    loop = c["workload"].get("closed_loop")
    if loop:
        lines.append(f"closed-loop load: {loop['concurrency']:,} users")
    lines += [
        "",
        f"{'latency (s)':<20}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}",
    ]
    for label, key in (
        ("TTFT", "ttft"),
        ("TPOT", "tpot"),
        ("TBT (all tokens)", "tbt"),
        ("end to end", "e2e"),
        ("scheduling delay", "scheduling_delay"),
    ):
        row = lat[key]
        lines.append(
            f"{label:<20}{row['mean']:>10.4f}{row['p50']:>10.4f}{row['p90']:>10.4f}"
            f"{row['p99']:>10.4f}"
        )
    t, g, r = s["throughput"], s["goodput"], s["replicas"]
    busy = r["busy_fraction"]
    lora = s.get("lora")
    lines += [
        "",
        f"throughput: {t['requests_per_s']:.2f} req/s, prompt {t['prompt_tokens_per_s']:,.0f} "
        f"tok/s, decode {t['decode_tokens_per_s']:,.0f} tok/s; prefix-cache hit rate "
        f"{t['prefix_hit_rate']:.1%}",
        f"goodput (TTFT <= {g['slo_ttft_s']} s and TPOT <= {g['slo_tpot_s']} s): "
        f"{g['requests_per_s']:.2f} req/s ({g['fraction']:.1%} of requests)",
        f"preemptions: {s['preemption']['num_restarts']} restarts of "
        f"{s['preemption']['requests_restarted']} requests",
        f"replicas: busy {min(busy):.0%}-{max(busy):.0%}; KV usage mean "
        f"{r['kv_usage']['mean']:.0%}, p99 {r['kv_usage']['p99']:.0%}; batch size mean "
        f"{r['batch_size']['mean']:.1f}, p99 {r['batch_size']['p99']:.0f}",
    ]
    if "sessions" in s:
        lines += _session_lines(s["sessions"])
    offload = s.get("kv_offload")
    if offload is not None:
        lines.append(
            f"host KV tier: hits {offload['gpu_hit_rate']:.1%} on GPU + "
            f"{offload['host_hit_rate']:.1%} in host memory of prompt tokens; "
            f"{offload['offloaded_gb']:,.1f} GB offloaded, {offload['loaded_gb']:,.1f} GB "
            f"loaded back (load p50 {offload['load_s']['p50'] * 1e3:.1f} ms)"
        )
    if lora is not None:
        lines.append(
            f"LoRA: {lora['adapter_loads']:,} adapter loads ({lora['disk_loads']:,} from disk), "
            f"{lora['load_time_s']:.2f} s loading ({lora['load_fraction_of_busy']:.1%} of busy "
            "time)"
        )
    return "\n".join(lines)


def _session_lines(sessions: dict[str, Any]) -> list[str]:
    """The summary's ``sessions`` section: completion times and the first turns' TTFT."""
    time_s, turns = sessions["session_time_s"], sessions["num_turns"]
    per_turn = ", ".join(
        f"{k}: {v['ttft_mean']:.3f} s ({v['prefix_hit_rate']:.0%} hit)"
        for k, v in list(sessions["per_turn"].items())[:4]
    )
    return [
        f"sessions: {sessions['num_sessions']:,} of {turns['mean']:.1f} turns on average; "
        f"session time mean {time_s['mean']:.1f} s, p90 {time_s['p90']:.1f} s",
        f"TTFT by turn: {per_turn}",
    ]

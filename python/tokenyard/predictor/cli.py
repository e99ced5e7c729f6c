"""``tokenyard predictor``: check a predictor against profiles, or show one's breakdown.

tokenyard predictor eval --profiles profile.csv [--tp 1] [--holdout 0.2] [--json out.json]
tokenyard predictor show --model llama-2-7b --device a100-80gb [--tp 2] [--prefill 2048]
    [--execution auto|measured|roofline|datasheet]
tokenyard predictor calibrate [--framework vllm] [--out calibration.toml]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from tokenyard.errors import TokenyardError

__all__ = ["add_parser", "run_command"]


def add_parser(commands: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = commands.add_parser(
        "predictor",
        help="evaluate or inspect execution-time predictors",
        description="Held-out error of the profiled predictor per operation (eval), the "
        "per-operation times of the simulator's predictor for one batch (show), or the roofline "
        "calibration refitted to the installed measured tables (calibrate). See "
        "docs/predictor.md.",
    )
    actions = p.add_subparsers(dest="action", required=True)
    ev = actions.add_parser("eval", help="held-out error per operation on profile files")
    ev.add_argument("--profiles", nargs="+", required=True, help="profile CSVs or folders")
    ev.add_argument("--tp", type=int, default=1, help="tensor-parallel rows to use")
    ev.add_argument("--model", help="keep only rows of this model (our format)")
    ev.add_argument("--regressor", default="auto", help="auto or one regressor")
    ev.add_argument("--holdout", type=float, default=0.2, help="held-out share of shapes")
    ev.add_argument("--seed", type=int, default=0, help="split and regressor seed")
    ev.add_argument("--json", help="also write the errors to this JSON file")
    show = actions.add_parser("show", help="time per operation for one batch")
    show.add_argument("--model", required=True, help="catalog model name or config.json")
    show.add_argument("--device", required=True, help="catalog GPU name")
    show.add_argument("--tp", type=_count, default=1, help="tensor-parallel size")
    show.add_argument("--pp", type=_count, default=1, help="pipeline stages")
    show.add_argument("--prefill", type=_size, default=0, help="prefill tokens (one chunk)")
    show.add_argument("--prefix", type=_size, default=0, help="cached tokens before the chunk")
    show.add_argument("--decode", type=_size, default=0, help="decode requests")
    show.add_argument("--context", type=_size, default=1024, help="each decode's context")
    show.add_argument(
        "--execution",
        default="auto",
        choices=("auto", "measured", "roofline", "datasheet"),
        help="the predictor (as the simulator resolves execution.model; datasheet: the "
        "roofline at constant efficiencies)",
    )
    show.add_argument("--framework", default="", help="measured tables' framework")
    show.add_argument(
        "--dtype", default="auto", help="replica.dtype (auto: the checkpoint's, else bf16)"
    )
    from tokenyard.catalog.quant import QUANTIZATION_CHOICES

    others = ", ".join(c for c in QUANTIZATION_CHOICES if c != "auto")
    show.add_argument(
        "--quantization",
        default="auto",
        help=f"replica.quantization: auto (the checkpoint's), {others}",
    )
    cal = actions.add_parser("calibrate", help="refit the roofline to the measured tables")
    cal.add_argument("--framework", default="vllm", help="whose kernels (vllm, sglang, trtllm)")
    cal.add_argument("--out", help="write the TOML here (default: print it)")
    return p


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text}")
    return value


def _size(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 1 << 24:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, 16777216], got {text}")
    return value


def _eval(args: argparse.Namespace) -> int:
    from tokenyard.predictor import TrainingOptions, holdout_errors, read_profiles

    profiles = read_profiles(args.profiles, model=args.model, tensor_parallel_size=args.tp)
    options = TrainingOptions(regressor=args.regressor, seed=args.seed)
    errors = holdout_errors(profiles, options=options, holdout_fraction=args.holdout)
    print(f"device {profiles.device}, model {profiles.model or '-'}, TP {args.tp}")
    if not errors:
        print("no operation has the 5 distinct shapes a held-out split needs: use a bigger grid")
        return 0
    print(f"{'op':<16} {'regressor':<18} {'train':>6} {'test':>5} {'MAPE %':>8} {'p90 %':>8}")
    for e in errors:
        print(
            f"{e.op:<16} {e.regressor:<18} {e.num_train:>6} {e.num_test:>5} "
            f"{100 * e.mape:>8.2f} {100 * e.p90_ape:>8.2f}"
        )
    if args.json:
        with open(args.json, "w") as out:
            json.dump([dataclasses.asdict(e) for e in errors], out, indent=1)
    return 0


def _show(args: argparse.Namespace) -> int:
    from tokenyard.predictor import batch_features
    from tokenyard.simulation import config_from_mapping
    from tokenyard.simulation.execution import build_predictor, choose_execution

    execution: dict[str, Any] = {"model": args.execution}
    if args.execution == "datasheet":
        execution = {"model": "roofline", "efficiency": {}}
    if args.framework:
        execution["measured"] = {"framework": args.framework}
    config = config_from_mapping(
        {
            "replica": {
                "model": args.model,
                "device": args.device,
                "tensor_parallel_size": args.tp,
                "num_pipeline_stages": args.pp,
                "dtype": args.dtype,
                "quantization": args.quantization,
            },
            "execution": execution,
        }
    )
    choice = choose_execution(config)
    predictor = build_predictor(config, choice)
    if predictor is None:  # pragma: no cover - auto/measured/roofline always compile
        return 2
    p, d, prefix = args.prefill, args.decode, args.prefix if args.prefill else 0
    features = batch_features(
        num_requests=int(p > 0) + d,
        num_prefill_tokens=p,
        num_decode_tokens=d,
        sum_decode_context=d * args.context,
        sum_prefill_context=p * (prefix + p),
        sum_prefill_squared=p * p,
        num_padding_rows=0,
    )
    sources = {op.name: op.source for op in predictor.ops}
    print(f"execution model: {choice.label()}")
    if choice.reason:  # auto fell back to the roofline: say why
        print(f"  not measured: {choice.reason}")
    for stage in range(args.pp):
        total, model_s = predictor.stage_time(features, stage, args.pp)
        print(f"stage {stage}: {1e3 * total:.3f} ms ({1e3 * model_s:.3f} ms on the GPU)")
        for op, seconds in predictor.op_times(features, stage, args.pp).items():
            if seconds:
                print(f"  {op:<16} {1e3 * seconds:>10.3f} ms  {sources.get(op, '')}")
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    import datetime

    from tokenyard.catalog import device
    from tokenyard.errors import ConfigError
    from tokenyard.predictor.calibration import calibration_toml, fit_calibration
    from tokenyard.predictor.measured.data import (
        SYSTEM_OF_DEVICE,
        package_root,
        package_version,
        resolve_source,
    )

    root = package_root()
    if root is None:
        raise ConfigError(
            "calibrate needs the measured tables: pip install 'tokenyard[measured]'",
            field="calibrate",
        )
    version = package_version()
    fits = [
        fit_calibration(
            resolve_source(
                root, system, args.framework, "latest", where="calibrate", field="calibrate"
            ),
            device(name),
            note=f" of aiconfigurator-core {version}",
        )
        for name, system in SYSTEM_OF_DEVICE.items()
    ]
    header = (
        "Roofline efficiency curves fitted to measured kernel tables "
        "(tokenyard.predictor.calibration).\n"
        f"Generated by `tokenyard predictor calibrate` on {datetime.date.today()} from "
        f"aiconfigurator-core {version}\n"
        f"(NVIDIA, Apache-2.0; measured tables under aiconfigurator_core/systems/data/, "
        f"{args.framework} kernels).\n"
        "Each value is a fraction of the device's datasheet peak in devices.toml; see "
        "docs/predictor.md.\n"
        "Devices under [proxies] have no tables of their own and borrow another device's "
        "fractions."
    )
    text = calibration_toml(fits, header)
    if args.out:
        with open(args.out, "w") as out:
            out.write(text)
    else:
        sys.stdout.write(text)
    return 0


def run_command(args: argparse.Namespace) -> int:
    try:
        action = {"eval": _eval, "show": _show, "calibrate": _calibrate}[args.action]
        return action(args)
    except TokenyardError as exc:
        print(f"tokenyard predictor: error: {exc}", file=sys.stderr)
        return 2

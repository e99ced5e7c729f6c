"""``tokenyard predictor``: check a predictor against profiles, or show one's breakdown.

tokenyard predictor eval --profiles profile.csv [--tp 1] [--holdout 0.2] [--json out.json]
tokenyard predictor show --model llama-2-7b --device a100-80gb [--tp 2] [--prefill 2048]
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
        description="Held-out error of the profiled predictor per operation (eval), or the "
        "per-operation times of the roofline predictor for one batch (show). See "
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
    show = actions.add_parser("show", help="roofline time per operation for one batch")
    show.add_argument("--model", required=True, help="catalog model name")
    show.add_argument("--device", required=True, help="catalog GPU name")
    show.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    show.add_argument("--pp", type=int, default=1, help="pipeline stages")
    show.add_argument("--prefill", type=int, default=0, help="prefill tokens (one prompt)")
    show.add_argument("--decode", type=int, default=0, help="decode requests")
    show.add_argument("--context", type=int, default=1024, help="each decode's context")
    return p


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
    from tokenyard.catalog import device, model
    from tokenyard.predictor import batch_features, roofline_predictor

    predictor = roofline_predictor(
        model(args.model, field="model"),
        device(args.device, field="device"),
        tensor_parallel_size=args.tp,
        num_pipeline_stages=args.pp,
    )
    p, d = args.prefill, args.decode
    features = batch_features(
        num_requests=int(p > 0) + d,
        num_prefill_tokens=p,
        num_decode_tokens=d,
        sum_decode_context=d * args.context,
        sum_prefill_context=p * p,
        sum_prefill_squared=p * p,
        num_padding_rows=0,
    )
    for stage in range(args.pp):
        total, model_s = predictor.stage_time(features, stage, args.pp)
        print(f"stage {stage}: {1e3 * total:.3f} ms ({1e3 * model_s:.3f} ms on the GPU)")
        for op, seconds in predictor.op_times(features, stage, args.pp).items():
            if seconds:
                print(f"  {op:<16} {1e3 * seconds:>10.3f} ms")
    return 0


def run_command(args: argparse.Namespace) -> int:
    try:
        return _eval(args) if args.action == "eval" else _show(args)
    except TokenyardError as exc:
        print(f"tokenyard predictor: error: {exc}", file=sys.stderr)
        return 2

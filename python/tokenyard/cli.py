"""The ``tokenyard`` command."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # `tokenyard ... | head`: the reader left; end quietly, as Unix tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


def _main(argv: Sequence[str] | None) -> int:
    parser = argparse.ArgumentParser(prog="tokenyard", description=__doc__)
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    commands = parser.add_subparsers(dest="command")
    demo = commands.add_parser("demo", help="run a shared-prefix stream through the KV layer")
    demo.add_argument("--requests", type=int, default=2_000, help="number of requests")
    demo.add_argument("--seed", type=int, default=0, help="workload seed")
    from tokenyard.simulation.cli import add_parser, run_command

    add_parser(commands)
    from tokenyard.profiler import cli as profile_cli

    profile_cli.add_parser(commands)
    from tokenyard.predictor import cli as predictor_cli

    predictor_cli.add_parser(commands)
    from tokenyard.search import cli as search_cli

    search_cli.add_parser(commands)
    from tokenyard.recommend import cli as recommend_cli

    recommend_cli.add_parser(commands)
    from tokenyard.report import cli as report_cli

    report_cli.add_parsers(commands)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv  # the command line as given, for the report's "reproduce" section

    if args.version:
        from tokenyard import __version__, build_profile

        print(f"tokenyard {__version__} ({build_profile})")
        return 0
    if args.command == "simulate":
        return run_command(args)
    if args.command == "profile":
        return profile_cli.run_command(args)
    if args.command == "predictor":
        return predictor_cli.run_command(args)
    if args.command == "search":
        return search_cli.run_command(args)
    if args.command == "recommend":
        return recommend_cli.run_command(args)
    if args.command == "report":
        return report_cli.run_report(args)
    if args.command == "compare":
        return report_cli.run_compare(args)
    if args.command == "demo":
        from tokenyard.demo import DemoWorkload
        from tokenyard.demo import main as demo_main

        if args.requests < 1:
            parser.error(f"--requests must be at least 1, got {args.requests}")
        demo_main(DemoWorkload(num_requests=args.requests, seed=args.seed))
        return 0
    parser.print_help()
    return 2

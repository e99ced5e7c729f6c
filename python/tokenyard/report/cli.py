"""``tokenyard report`` and ``tokenyard compare``: plots and HTML from results folders.

tokenyard report results/ [--plots png,svg]
tokenyard compare runs/rr runs/affinity [--output runs/compare] [--plots png,svg]
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tokenyard.errors import OutputError, TokenyardError

__all__ = ["add_parsers", "run_compare", "run_report"]


def add_parsers(commands: Any) -> None:
    report = commands.add_parser(
        "report",
        help="plots and a self-contained HTML report of a results folder",
        description="Draws a run's plots into DIR/plots and writes DIR/report.html (the "
        "summary, the plots, the config and the command to reproduce it). DIR is what "
        "`tokenyard simulate --output DIR` wrote. See docs/simulate.md#reports.",
    )
    report.add_argument("run", metavar="DIR", help="a results folder")
    report.add_argument("--plots", default="png", help="formats: png, svg or png,svg")
    compare = commands.add_parser(
        "compare",
        help="two or more runs side by side",
        description="The headline metrics of two or more results folders side by side, "
        "each with its change against the first and the best marked; with --output, "
        "overlaid plots and OUT/compare.html. See docs/simulate.md#reports.",
    )
    compare.add_argument("runs", metavar="DIR", nargs="+", help="results folders")
    compare.add_argument("--output", "-o", metavar="OUT", help="write plots and compare.html")
    compare.add_argument("--plots", default="png", help="formats: png, svg or png,svg")


def run_report(args: argparse.Namespace) -> int:
    from tokenyard.report import parse_formats, write_report

    try:
        page = write_report(args.run, parse_formats(args.plots))
    except TokenyardError as exc:
        print(f"tokenyard report: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"tokenyard report: error: {OutputError.of(exc, args.run)}", file=sys.stderr)
        return 2
    print(f"wrote {page} and {page.parent / 'plots'}/")
    return 0


def run_compare(args: argparse.Namespace) -> int:
    from tokenyard.report import compare_runs, parse_formats

    try:
        text, page = compare_runs(args.runs, output=args.output, formats=parse_formats(args.plots))
    except TokenyardError as exc:
        print(f"tokenyard compare: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"tokenyard compare: error: {OutputError.of(exc, args.output)}", file=sys.stderr)
        return 2
    print(text)
    if page is not None:
        print(f"\nwrote {page} and {page.parent / 'plots'}/")
    return 0

"""Plots and self-contained HTML reports of simulation runs, and side-by-side comparisons
(``docs/simulate.md#reports``).

    from tokenyard.report import compare_runs, write_report

    write_report("results")                       # results/plots/*.png + results/report.html
    text, page = compare_runs(["runs/rr", "runs/affinity"], output="runs/compare")
    print(text)                                   # the headline metrics side by side
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tokenyard._output import staged_output
from tokenyard.errors import ConfigError
from tokenyard.report.html import compare_html, comparison_rows, run_html, wins
from tokenyard.report.plots import FORMATS, parse_formats, write_plots
from tokenyard.report.run import Run, load_run

__all__ = [
    "FORMATS",
    "Run",
    "compare_runs",
    "compare_text",
    "load_run",
    "parse_formats",
    "write_plots",
    "write_report",
]


def write_report(run_dir: str | Path, formats: Sequence[str] = ("png",)) -> Path:
    """Draws the run's plots into ``run_dir/plots`` and writes ``run_dir/report.html``.
    Both are renamed in at the end (``tokenyard._output``): a link already there is
    replaced, not written through, and ``plots/`` holds only this report's plots.

    Raises:
        ConfigError: ``run_dir`` is not a results folder, or a bad format.
        OSError: a file could not be written.
    """
    formats = _check(formats)
    run = load_run(run_dir)
    with staged_output(run.path) as staging:
        plots = write_plots([run], staging / "plots", formats)
        (staging / "report.html").write_text(run_html(run, plots))
    return run.path / "report.html"


def _check(formats: Sequence[str]) -> tuple[str, ...]:
    return parse_formats(",".join(formats)) if formats else ("png",)


def _names(dirs: Sequence[str | Path]) -> list[str]:
    """Each folder's name, or its path where two folders share a name."""
    names = [Path(d).resolve().name for d in dirs]
    if len(set(names)) == len(names):
        return names
    return [str(d) for d in dirs]


def compare_text(runs: Sequence[Run]) -> str:
    """The headline metrics of ``runs`` side by side, with each one's change against the
    first run and a ``*`` on the best (all of them where several tie)."""
    rows = comparison_rows(runs)
    width = max(12, *(len(r.name) + 1 for r in runs))
    lines = [f"{'metric':<24}" + "".join(f"{r.name:>{width}}{'':10}" for r in runs)]
    for row in rows:
        cells = []
        for i, (value, change) in enumerate(zip(row["values"], row["changes"], strict=True)):
            text = row["format"].format(value) + ("*" if i in row["best"] else " ")
            delta = f" ({change:+.1%})" if i > 0 and change is not None else ""
            cells.append(f"{text:>{width}}{delta:<10}")
        lines.append(f"{row['metric']:<24}" + "".join(cells).rstrip())
    lines += ["", f"best (*): {wins(runs, rows)}; in brackets the change against {runs[0].name}"]
    return "\n".join(lines)


def compare_runs(
    dirs: Sequence[str | Path],
    *,
    output: str | Path | None = None,
    formats: Sequence[str] = ("png",),
) -> tuple[str, Path | None]:
    """Compares two or more results folders: the terminal table, and with ``output`` the
    overlaid plots and ``output/compare.html``.

    Raises:
        ConfigError: fewer than two folders, a folder that is not a results folder, or a
            bad format.
        OSError: a file could not be written.
    """
    if len(dirs) < 2:
        raise ConfigError(
            f"compare: needs at least two results folders, got {len(dirs)}",
            field="runs",
            value=repr(list(map(str, dirs))),
        )
    formats = _check(formats)
    runs = [load_run(d, name) for d, name in zip(dirs, _names(dirs), strict=True)]
    text = compare_text(runs)
    if output is None:
        return text, None
    with staged_output(output) as staging:  # as write_report writes
        plots = write_plots(runs, staging / "plots", formats)
        (staging / "compare.html").write_text(compare_html(runs, plots))
    return text, Path(output) / "compare.html"

"""``paraplan calibrate RUNS.json --cluster C -o PROFILE.yaml``: a profile fitted on the team's own runs.

RUNS.json is in the published calibration file's format (``paraplan validate``'s input), every run
measured on cluster C. The fit is the project's own (``hardware_profiles.calibrate.fit``), started
from and pulled towards C as it loads today (its calibrated factors are the priors), and the result
is C with the refitted factors, written as a new profile under its own name, loadable with
``--cluster PROFILE.yaml``. The command prints the error on the team's runs before and after, and on
the published runs of C before and after; a refit that makes the published set worse by more than
``PUBLISHED_WORSE_BY`` is reported as such (a warning, and ``published_worse`` in ``--json``).
``--report FILE.html`` also writes the calibration report (``app/formats/calibration_report.py``): the
runs' predicted-vs-measured scatter before and after, the factors and the published-set figures.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
import yaml

import hardware_profiles
from app.formats.calibration import PUBLISHED_RUNS, PUBLISHED_WORSE_BY, published_runs, refit, score_problem
from app.formats.inputs import InputError, load_cluster
from app.formats.validation import read_runs

EXIT_INPUT = 2


def _fail(field: str, reason: str) -> None:
    click.echo(f"error: {field}: {reason}", err=True)
    sys.exit(EXIT_INPUT)


def _team_runs(path: str) -> list:
    try:
        runs = read_runs(path)
    except InputError as exc:
        _fail(exc.field, exc.reason)
    if not runs:
        _fail("RUNS", "holds no runs to fit on")
    for i, r in enumerate(runs):
        if r.problem is not None:
            _fail(f"runs[{i}] ({r.name})", r.problem)
    return runs


@click.command()
@click.argument("runs_file", metavar="RUNS.json")
@click.option("--cluster", required=True, help="The profile the runs were measured on (name or file).")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Where to write the fitted profile (YAML).")
@click.option("--name", default=None, help="The new profile's name (default: the output file's stem).")
@click.option("--published", type=click.Path(dir_okay=False), default=None,
              help="Published runs to check the refit against (default: the shared calibration file).")
@click.option("--max-evals", default=8000, show_default=True, type=click.IntRange(10, 100_000),
              help="At most this many candidate factor sets scored.")
@click.option("--report", "report_file", type=click.Path(dir_okay=False), default=None,
              help="Also write the HTML calibration report (predicted-vs-measured scatter before and after).")
@click.option("--json", "as_json", is_flag=True, help="Print the fit as JSON.")
def calibrate(runs_file, cluster, output, name, published, max_evals, report_file, as_json) -> None:
    """Refit a cluster profile's efficiency factors on your own measured runs."""
    runs = _team_runs(runs_file)
    try:
        start = load_cluster(cluster)
    except InputError as exc:
        _fail("cluster" if exc.field == "cluster" else exc.field, exc.reason)
    for i, r in enumerate(runs):  # as POST .../measurements refuses it: a run no fit can score
        if (problem := score_problem(r, start)) is not None:
            _fail(f"runs[{i}] ({r.name}).config", problem)
    name = name or Path(output).stem
    if name in hardware_profiles.names():
        _fail("--name", f"{name!r} is a shipped profile; the fitted profile needs a name of its own "
                        "(its shipped calibration would be merged over the fitted factors)")
    pub_runs = published_runs(start.calibrate_from or start.name, Path(published) if published else PUBLISHED_RUNS)
    if published and not pub_runs:
        _fail("--published", f"holds no runs of {start.name}")

    fitted, report = _fit_with_progress(
        lambda progress: refit(start, runs, name=name, origin=Path(runs_file).name, published=pub_runs,
                               max_evals=max_evals, progress=progress), max_evals, as_json)
    Path(output).write_text(yaml.safe_dump(fitted, sort_keys=False, allow_unicode=True))
    report = {**report, "profile": str(output)}
    if report_file:
        from app.formats.calibration_report import render_calibration_report

        try:
            Path(report_file).write_text(render_calibration_report(report), encoding="utf-8")
        except OSError as exc:
            _fail("--report", f"cannot write {report_file} ({exc.strerror})")
    pub, worse = report["published"], report["published_worse"]
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        _print_report(report)
    if worse:
        click.echo(f"warning: the refit makes the published {start.name} runs worse: MAPE "
                   f"{pub['mape_before']:.3f} -> {pub['mape_after']:.3f} (more than +{PUBLISHED_WORSE_BY}); "
                   "the measured cluster differs from the published ones, or the runs pull factors they "
                   "do not constrain", err=True)


def _fit_with_progress(run_fit, max_evals, quiet):
    """``run_fit(progress)`` with a progress bar on a terminal stderr."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    console = Console(stderr=True)
    if quiet or not console.is_terminal:
        return run_fit(None)
    with Progress(TextColumn("fitting"), BarColumn(), MofNCompleteColumn(), console=console,
                  transient=True) as bar:
        task = bar.add_task("fitting", total=max_evals)
        return run_fit(lambda n: bar.update(task, completed=min(n, max_evals)))


def _print_report(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    out = Console()
    out.print(f"{r['runs']} measured runs on {r['cluster']}: MAPE [b]{r['mape_before']:.3f}[/b] -> "
              f"[b]{r['mape_after']:.3f}[/b]; wrote {r['profile']} (profile {r['name']!r})", highlight=False)
    if r["published"]:
        p = r["published"]
        out.print(f"published {r['cluster']} runs ({p['runs']}): MAPE {p['mape_before']:.3f} -> "
                  f"{p['mape_after']:.3f}", highlight=False)
    t = Table(title="factors", title_justify="left")
    for col in ("factor", "before", "after"):
        t.add_column(col, justify="left" if col == "factor" else "right")
    for k, v in r["factors"].items():
        t.add_row(k, f"{v['before']:.4g}", f"{v['after']:.4g}")
    out.print(t)

"""The ``paraplan`` command line (contract: shared/CONTRACT.md, "Command line").

Machine-readable output goes to stdout with ``--json``; tables otherwise. Bad input is a one-line
message on stderr naming the field, and exit code 2; never a traceback.
"""

from __future__ import annotations

import json
import sys

import click
from rich.console import Console
from rich.table import Table

from costmodel import evaluate as evaluate_config

from .inputs import InputError, check_devices, load_cluster, load_config, load_model
from .validation import read_runs, score_runs

EXIT_INPUT = 2
out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


def _fail(exc: InputError) -> None:
    err.print(f"[red]error:[/red] {exc}", highlight=False)
    sys.exit(EXIT_INPUT)


def _print_json(data) -> None:
    click.echo(json.dumps(data, indent=2, allow_nan=False))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="paraplan")
def main() -> None:
    """ParaPlan: parallel-strategy planning for large-model training on Ascend and GPU clusters."""


def _fmt(x, spec: str = ".3f") -> str:
    return "—" if x is None else format(x, spec)


def _evaluation_tables(res: dict) -> None:
    status = "[green]feasible[/green]" if res["feasible"] else "[red]infeasible[/red]"
    out.print(f"{status}  step {_fmt(res['step_time_s'])} s  ·  {_fmt(res['tokens_per_s'], ',.0f')} tokens/s  ·  "
              f"{_fmt(res['tokens_per_s_per_device'], ',.1f')} tokens/s/device  ·  MFU {_fmt(res['mfu'])}  ·  "
              f"HFU {_fmt(res['hfu'])}")
    for r in res["infeasible_reasons"]:
        out.print(f"  [red]{r['code']}[/red]: {r['message']}", highlight=False)
    for w in res["warnings"]:
        out.print(f"  [yellow]warning[/yellow]: {w}", highlight=False)
    if res["step_time_s"] is None:
        return
    t = Table(title="time per step", title_justify="left")
    t.add_column("part")
    t.add_column("seconds", justify="right")
    t.add_column("share", justify="right")
    for k, v in res["time"].items():
        t.add_row(k.removesuffix("_s"), f"{v:.3f}", f"{v / res['step_time_s']:.1%}")
    t.add_row("[b]step[/b]", f"[b]{res['step_time_s']:.3f}[/b]", "100%")
    out.print(t)
    mem = res["memory"]
    m = Table(title=f"memory at the peak stage (capacity {mem['capacity_gib']:.1f} GiB)", title_justify="left")
    for k in ("peak_gib", "params_gib", "grads_gib", "optimizer_gib", "activations_gib"):
        m.add_column(k.removesuffix("_gib"), justify="right")
    m.add_row(*(f"{mem[k]:.1f}" for k in ("peak_gib", "params_gib", "grads_gib", "optimizer_gib", "activations_gib")))
    out.print(m)
    stages = mem["per_stage_peak_gib"] or []
    out.print("per-stage peak GiB: " + " ".join(f"{v:.1f}" for v in stages), highlight=False)


@main.command()
@click.option("--model", required=True, help="Preset name, or a JSON/YAML model spec file.")
@click.option("--cluster", required=True, help="Profile name (hardware_profiles/), or a profile file.")
@click.option("--devices", required=True, type=int, help="Number of devices.")
@click.option("--config", "config", required=True, help="Training config: a JSON/YAML file or inline JSON.")
@click.option("--seq-length", type=int, default=None, help="Override the model's seq_length.")
@click.option("--json", "as_json", is_flag=True, help="Print the evaluation result as JSON.")
def evaluate(model, cluster, devices, config, seq_length, as_json) -> None:
    """Evaluate one training config: step time, throughput, MFU/HFU, time and memory breakdown."""
    try:
        if seq_length is not None and seq_length <= 0:
            raise InputError("seq_length", "must be a positive integer")
        spec = load_model(model, seq_length)
        profile = load_cluster(cluster)
        cfg = load_config(config)
        check_devices(devices)
    except InputError as exc:
        _fail(exc)
    result = evaluate_config(spec, profile, devices, cfg)
    if as_json:
        _print_json(result)
    else:
        _evaluation_tables(result)


@main.command()
@click.argument("runs_file", metavar="RUNS.json")
@click.option("--json", "as_json", is_flag=True, help="Print the contract's JSON report.")
@click.option("--worst", default=10, show_default=True, help="How many of the worst runs to list.")
def validate(runs_file, as_json, worst) -> None:
    """Score the cost model against published training runs (tokens/s per device)."""
    try:
        runs = read_runs(runs_file)
    except InputError as exc:
        _fail(exc)
    report = score_runs(runs)
    if as_json:
        public = {**report, "runs": [{k: r.get(k) for k in ("name", "cluster", "predicted", "reported",
                                                              "error", "feasible")} for r in report["runs"]]}
        _print_json(public)
        return
    out.print(f"MAPE [b]{report['mape']:.3f}[/b] over {report['count']} runs; "
              f"{report['infeasible']} predicted not to fit")
    t = Table(title="by cluster", title_justify="left")
    t.add_column("cluster")
    t.add_column("runs", justify="right")
    t.add_column("MAPE", justify="right")
    for c, v in report["by_cluster"].items():
        t.add_row(c, str(sum(1 for r in report["runs"] if r["cluster"] == c)), f"{v:.3f}")
    out.print(t)
    ranked = sorted(report["runs"], key=lambda r: -(1.0 if r["error"] is None else abs(r["error"])))
    w = Table(title=f"worst {min(worst, len(ranked))} runs", title_justify="left")
    for col, just in (("run", "left"), ("cluster", "left"), ("predicted", "right"), ("reported", "right"),
                      ("error", "right"), ("fits", "left")):
        w.add_column(col, justify=just, overflow="fold")
    for r in ranked[:worst]:
        w.add_row(r["name"], r["cluster"], _fmt(r["predicted"], ",.1f"), f"{r['reported']:,.1f}",
                  _fmt(r["error"], "+.1%"), "yes" if r["feasible"] else "[red]no[/red]")
    out.print(w)
    for r in report["runs"]:
        if r.get("problem") or not r["feasible"]:
            why = r.get("problem") or "; ".join(x["message"] for x in r.get("infeasible_reasons", []))
            out.print(f"  [yellow]{r['name']}[/yellow]: {why}", highlight=False)


if __name__ == "__main__":
    main()

"""``paraplan plan``: capacity planning over a range of device counts (``search.capacity``).

Prints a table (devices, layout, tokens/s, MFU, raw and effective days and device-hours, goodput fraction, interruptions
over the run, checkpoint interval, effective cost, Pareto and deadline marks; docs/guides/goodput.md) and the
chosen count, or with ``--json`` the plan's JSON (``app.formats.plan``). Bad input: ``error: <field>:
<reason>`` on stderr and exit 2. A rich progress bar (device counts done) on stderr when it is a terminal.
"""

from __future__ import annotations

import json
import sys

import click
from rich.console import Console
from rich.table import Table

from search import SpaceError
from search.capacity import PlanError, PlanRequest
from search.frameworks import FRAMEWORKS, default_framework
from search.margin import DEFAULT_MEMORY_MARGIN_GIB, margin_problem

from app.formats.bounds import flag_problems
from app.formats.inputs import InputError, load_cluster, load_model
from app.formats.plan import parse_tokens, plan_result, tokens_text

from ..common import check_jobs, jobs_option, parse_fix
from ..console import stdout_console
from ..resilience_flags import resilience_flags, resilience_from_flags

EXIT_INPUT = 2
err = Console(stderr=True, soft_wrap=True)


def _fail(field: str, reason: str) -> None:
    err.print(f"[red]error:[/red] {field}: {reason}", highlight=False)
    sys.exit(EXIT_INPUT)


def layout_cell(cfg: dict) -> str:
    """tp/pp/vpp/cp/ep/dp/mbs of a config, as the plan table and report show it."""
    return "/".join(str(cfg.get(k, 1)) for k in ("tp", "pp", "vpp", "cp", "ep", "dp", "micro_batch_size"))


def _money(x) -> str:
    return "—" if x is None else f"{x:,.0f}"


def plan_table(plan: dict) -> Table:
    """One row per device count; a count where nothing fits says why in the layout column."""
    deadline = plan["inputs"].get("deadline_days")
    t = Table(title=f"capacity plan: {tokens_text(plan['inputs']['tokens'])} tokens on {plan['inputs']['cluster']}",
              title_justify="left")
    for col in ("devices", "tp/pp/vpp/cp/ep/dp/mbs", "tokens/s", "MFU", "days", "eff. days", "device-hours",
                "eff. device-hours", "goodput", "interrupt.", "ckpt every", "eff. cost", "pareto", "deadline"):
        t.add_column(col, justify="left" if col.startswith("tp") else "right", overflow="fold")
    for p in plan["points"]:
        mark = "✓" if p["devices"] == plan["chosen"] else ""
        if not p["feasible"]:
            t.add_row(f"{p['devices']:,}", f"[red]{p['reason']}[/red]", *["—"] * 10, "", "")
            continue
        eff = p.get("effective_days") is not None
        t.add_row(f"{p['devices']:,}{' *' if mark else ''}", layout_cell(p["config"]), f"{p['tokens_per_s']:,.0f}",
                  f"{p['evaluation']['mfu']:.3f}", f"{p['days']:.1f}",
                  f"{p['effective_days']:.1f}" if eff else "never", f"{p['device_hours']:,.0f}",
                  f"{p['effective_device_hours']:,.0f}" if eff else "—", f"{p['goodput_fraction']:.3f}",
                  f"{p['interruptions']:,.{1 if p['interruptions'] < 10 else 0}f}" if eff else "—",
                  f"{p['checkpoint_interval_s'] / 60:.1f} min" if eff else "—", _money(p.get("effective_cost")),
                  "✓" if p["pareto"] else "", "" if deadline is None else ("✓" if p["meets_deadline"] else "✗"))
    return t


def _run(req: PlanRequest) -> dict:
    if not err.is_terminal:
        return plan_result(req)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("planning device counts"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=err, transient=True) as bar:
        task = bar.add_task("plan", total=None)
        return plan_result(req, progress=lambda done, total: bar.update(task, completed=done, total=total))


@click.command()
@click.option("--model", required=True, help="Preset name, or a JSON/YAML model spec file.")
@click.option("--cluster", required=True, help="Profile name (hardware_profiles/), or a profile file.")
@click.option("--tokens", required=True, help="Tokens to train: a number or with a suffix K, M, B, T (19T, 500B).")
@click.option("--devices-min", type=int, default=None, help="Smallest device count (default: one node).")
@click.option("--devices-max", type=int, default=None, help="Largest device count (default: 16384).")
@click.option("--devices-step", type=int, default=None,
              help="Step between counts (default: the node size × the smallest power of two giving ≤ 32 counts).")
@click.option("--deadline-days", type=float, default=None, help="Days the training must finish in.")
@click.option("--price-per-device-hour", type=float, default=None, help="Price of one device-hour (any currency).")
@click.option("--global-batch-tokens", default=None,
              help="Tokens per step, held across counts (default: the preset's published batch, else 4M).")
@click.option("--precision", type=click.Choice(["bf16", "fp8"]), default="bf16", show_default=True)
@click.option("--moe-load-imbalance", type=float, default=None, help="max/mean routed tokens per EP rank (≥ 1).")
@click.option("--seq-length", type=int, default=None, help="Override the model's seq_length.")
@click.option("--memory-margin-gib", type=float, default=DEFAULT_MEMORY_MARGIN_GIB, show_default=True,
              help="Headroom (GiB) the chosen configs keep (docs/search.md).")
@click.option("--framework", type=click.Choice(FRAMEWORKS), default=None,
              help="Training framework planned for (default: mindspeed for Ascend profiles, megatron otherwise).")
@click.option("--fix", "fix", multiple=True, metavar="KEY=VALUE",
              help="Pin a config field at every count (repeatable), over the planning pins (docs/guides/capacity.md"
                   "): e.g. --fix tp=1, or --fix 'offload_modules=[\"core_attn\"]' to plan with offload.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@jobs_option
@resilience_flags()
def plan(model, cluster, tokens, devices_min, devices_max, devices_step, deadline_days, price_per_device_hour,
         global_batch_tokens, precision, moe_load_imbalance, seq_length, memory_margin_gib, framework, fix,
         as_json, jobs, **resilience) -> None:
    """Plan capacity: the best config per device count, days, device-hours, cost and the Pareto front."""
    try:
        for name, problem in flag_problems(devices=devices_min, seq_length=seq_length,
                                           moe_load_imbalance=moe_load_imbalance):
            raise InputError("devices_min" if name == "devices" else name, problem)
        for name, problem in flag_problems(devices=devices_max):
            raise InputError("devices_max", problem)
        if (problem := margin_problem(memory_margin_gib)) is not None:
            raise InputError("memory_margin_gib", problem)
        check_jobs(jobs)
        tokens_n = parse_tokens(tokens)
        batch = None if global_batch_tokens is None else parse_tokens(global_batch_tokens, "global_batch_tokens")
        spec = load_model(model, seq_length)
        profile = load_cluster(cluster)
        req = PlanRequest(spec=spec, profile=profile, tokens=tokens_n, devices_min=devices_min, devices_max=devices_max,
                          devices_step=devices_step, deadline_days=deadline_days,
                          price_per_device_hour=price_per_device_hour, global_batch_tokens=batch, precision=precision,
                          moe_load_imbalance=moe_load_imbalance, memory_margin_gib=memory_margin_gib,
                          framework=framework or default_framework(profile.name), fixed=parse_fix(fix),
                          resilience=resilience_from_flags(resilience), jobs=jobs)
        req.resolved()  # every input checked before the first search
        result = _run(req)
    except InputError as exc:
        _fail(exc.field, exc.reason)
    except (PlanError, SpaceError) as exc:
        _fail(exc.field, str(exc).split(": ", 1)[1])
    if as_json:
        click.echo(json.dumps(result, indent=2, allow_nan=False))
        return
    out = stdout_console()
    out.print(plan_table(result), soft_wrap=False)
    chosen = result["chosen"]
    out.print(f"chosen: [b]{chosen:,}[/b] devices ({result['chosen_reason']})" if chosen is not None
              else f"chosen: none ({result['chosen_reason']})", highlight=False)
    raw = result.get("chosen_without_failures")
    if raw != chosen:
        out.print(f"without failures the same rule would choose {'none' if raw is None else f'{raw:,}'} devices "
                  f"(docs/guides/goodput.md)", highlight=False)
    out.print(f"Pareto front (days against device-hours): {', '.join(f'{d:,}' for d in result['pareto']) or 'empty'}; "
              f"plan time {result['plan_time_s']:.1f} s; planning pins {json.dumps(result['planning_fixed'])}",
              highlight=False)

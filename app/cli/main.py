"""The ``paraplan`` command line (contract: shared/CONTRACT.md, "Command line").

Machine-readable output goes to stdout with ``--json``; tables otherwise. Bad input is a one-line
message on stderr naming the field, and exit code 2; never a traceback.
"""

from __future__ import annotations

import sys

import click
from rich.table import Table

from costmodel.runtime import tune_allocator
from search import ENGINES, SearchRequest, SpaceError, run_search, validate_fixed
from search.engine import AUTO_EXHAUSTIVE_MAX, DEFAULT_TOP_K, DEFAULT_TRIALS, SAMPLERS
from search.frameworks import FRAMEWORKS, default_framework
from search.margin import DEFAULT_MEMORY_MARGIN_GIB, margin_problem

from app.formats.bounds import flag_problems
from app.formats.describe import config_brief, layout_brief, margin_mark, variant_brief
from app.formats.inputs import (InputError, check_config_data, check_config_for_model, check_devices, load_cluster,
                                load_config, load_model)
from app.formats.results import check_finite
from app.formats.results import evaluate as evaluate_config
from app.formats.validation import cross_validated, cv_folds, factors_at_bound, read_runs, score_runs

from .common import (EXIT_NO_FIT, check_jobs, err, fail, given, jobs_option, out, parse_fix, print_json,
                     unused_option)
from .console import drop_stdout, longest_word, wrappable
from .resilience_flags import resilience_flags, resilience_from_flags

class _Group(click.Group):
    """The command group; a reader that closes stdout early (``paraplan evaluate ... | head -1``) is not an
    error: the command stops writing and exits 0 (click's own handling exits 1)."""

    def invoke(self, ctx):
        try:
            value = super().invoke(ctx)
            sys.stdout.flush()  # the last buffered output meets the closed pipe here, not at interpreter exit
            return value
        except BrokenPipeError:
            drop_stdout()
            ctx.exit(0)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="paraplan")
def main() -> None:
    """ParaPlan: parallel-strategy planning for large-model training on Ascend and GPU clusters."""
    tune_allocator()


def _fmt(x, spec: str = ".3f") -> str:
    return "—" if x is None else format(x, spec)


# The parts of an evaluation's peak memory, in the order the tables show them; they add up to peak_gib.
MEMORY_PARTS = ("params_gib", "grads_gib", "optimizer_gib", "activations_gib", "buffers_gib", "overhead_gib")


def _evaluation_tables(res: dict) -> None:
    status = "[green]feasible[/green]" if res["feasible"] else "[red]infeasible[/red]"
    out.print(f"{status}  step {_fmt(res['step_time_s'])} s  ·  {_fmt(res['tokens_per_s'], ',.0f')} tokens/s  ·  "
              f"{_fmt(res['tokens_per_s_per_device'], ',.1f')} tokens/s/device  ·  MFU {_fmt(res['mfu'])}  ·  "
              f"HFU {_fmt(res['hfu'])}")
    for r in res["infeasible_reasons"]:
        out.print(f"  [red]{r['code']}[/red]: {r['message']}", highlight=False)
    for w in res["warnings"]:
        out.print(f"  [yellow]warning[/yellow]: {w}", highlight=False)
    if (routing := res.get("moe_routing")) is not None:
        out.print(f"  expert load max/mean per EP rank: {routing['imbalance']:.3f} with {routing['expert_placement']} "
                  f"placement (contiguous {routing['imbalance_contiguous']:.3f}, balanced "
                  f"{routing['imbalance_balanced']:.3f})", highlight=False)
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
    m = Table(title=f"memory at the peak stage (capacity {mem['capacity_gib']:.1f} GiB; the parts add up to the peak)",
              title_justify="left")
    for k in ("peak_gib", *MEMORY_PARTS):
        m.add_column(k.removesuffix("_gib"), justify="right")
    m.add_row(*(_fmt(mem.get(k), ".1f") for k in ("peak_gib", *MEMORY_PARTS)))
    out.print(m)
    stages = mem["per_stage_peak_gib"] or []
    out.print("per-stage peak GiB: " + " ".join(f"{v:.1f}" for v in stages), highlight=False)
    if (offloaded := mem.get("per_stage_offloaded_gib")) is not None:  # offload_modules: what went to the host
        out.print("per-stage offloaded GiB: " + " ".join(f"{v:.1f}" for v in offloaded), highlight=False)
        out.print("per-stage peak GiB without offload: "
                  + " ".join(f"{v:.1f}" for v in mem.get("per_stage_peak_without_offload_gib") or []), highlight=False)
        out.print(f"host memory per node: {mem['host_per_node_gib']:.1f} of {mem['host_capacity_gib']:.1f} GiB",
                  highlight=False)


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
        for name, problem in flag_problems(devices=devices, seq_length=seq_length):
            raise InputError(name, problem)
        spec = load_model(model, seq_length)
        profile = load_cluster(cluster)
        cfg = load_config(config)
        check_config_for_model(spec, cfg)
        check_devices(devices)
    except InputError as exc:
        fail(exc)
    result = evaluate_config(spec, profile, devices, cfg)
    try:
        check_finite(result, profile)  # a degenerate profile: exit 2 naming the fact, not nulls
    except InputError as exc:
        fail(exc)
    if as_json:
        print_json(result)
    else:
        _evaluation_tables(result)


@main.command()
@click.argument("runs_file", metavar="RUNS.json")
@click.option("--json", "as_json", is_flag=True, help="Print the contract's JSON report.")
@click.option("--worst", default=10, show_default=True, help="How many of the worst runs to list.")
@click.option("--cv", "with_cv", is_flag=True,
              help="Also cross-validate: refit each shipped profile without each source's runs and score "
                   "that source with the refit (leave-one-source-out; a few minutes).")
def validate(runs_file, as_json, worst, with_cv) -> None:
    """Score the cost model against published training runs (tokens/s per device)."""
    try:
        runs = read_runs(runs_file)
    except InputError as exc:
        fail(exc)
    report = score_runs(runs)
    report["factors_at_bound"] = factors_at_bound(sorted({r["cluster"] for r in report["runs"]}))
    if with_cv:
        report["cv"] = _cross_validate_with_progress(runs)
        for r in report["runs"]:
            r["cv_error"] = report["cv"]["errors"].get(r["name"])
    if as_json:
        keys = ("name", "cluster", "predicted", "reported", "error", "feasible") + (("cv_error",) if with_cv else ())
        public = {**report, "runs": [{k: r.get(k) for k in keys} for r in report["runs"]]}
        if with_cv:
            public["cv"] = {k: v for k, v in report["cv"].items() if k != "errors"}
        print_json(public)
        return
    _validation_tables(report, worst, with_cv)


def _cross_validate_with_progress(runs) -> dict:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    total = cv_folds(runs)
    if not err.is_terminal:
        err.print(f"cross-validating: {total} refits (leave-one-source-out)", highlight=False)
        return cross_validated(runs)
    with Progress(TextColumn("cross-validating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as bar:
        task = bar.add_task("cv", total=total)
        return cross_validated(runs, progress=lambda cluster, source: bar.advance(task))


def _validation_tables(report: dict, worst: int, with_cv: bool) -> None:
    cv = report.get("cv")
    head = f"MAPE [b]{report['mape']:.3f}[/b] over {report['count']} runs"
    if cv:
        head += f", cross-validated [b]{cv['mape']:.3f}[/b] ({cv['method']})"
    out.print(head + f"; {report['infeasible']} predicted not to fit")
    t = Table(title="by cluster", title_justify="left")
    for col in ("cluster", "runs", "MAPE") + (("CV MAPE",) if cv else ()):
        t.add_column(col, justify="left" if col == "cluster" else "right")
    for c, v in report["by_cluster"].items():
        row = [c, str(sum(1 for r in report["runs"] if r["cluster"] == c)), f"{v:.3f}"]
        if cv:
            row.append(_fmt(cv["by_cluster"].get(c), ".3f"))
        t.add_row(*row)
    out.print(t)
    ranked = sorted(report["runs"], key=lambda r: -(1.0 if r["error"] is None else abs(r["error"])))
    w = Table(title=f"worst {min(worst, len(ranked))} runs", title_justify="left")
    for col, just in (("run", "left"), ("cluster", "left"), ("predicted", "right"), ("reported", "right"),
                      ("error", "right")) + ((("CV error", "right"),) if cv else ()) + (("fits", "left"),):
        w.add_column(col, justify=just, overflow="fold")
    for r in ranked[:worst]:
        row = [r["name"], r["cluster"], _fmt(r["predicted"], ",.1f"), f"{r['reported']:,.1f}", _fmt(r["error"], "+.1%")]
        if cv:
            row.append(_fmt(r.get("cv_error"), "+.1%"))
        w.add_row(*row, "yes" if r["feasible"] else "[red]no[/red]")
    out.print(w)
    for r in report["runs"]:
        if r.get("problem") or not r["feasible"]:
            why = r.get("problem") or "; ".join(x["message"] for x in r.get("infeasible_reasons", []))
            out.print(f"  [yellow]{r['name']}[/yellow]: {why}", highlight=False)
    for cluster, factors in report["factors_at_bound"].items():
        for k, f in factors.items():
            why = f["reason"] or "[red]no reason stated in the profile: an effect the model misses?[/red]"
            out.print(f"  {cluster} {k} = {f['value']:g} at its {f['bound']} bound: {why}", highlight=False)


def _layouts_table(layouts: list[dict], title: str, narrow: bool = False) -> Table:
    """The layouts as a table. ``narrow`` (a terminal too narrow for the wide table, e.g. 80 columns): layout,
    best variant and variant count in one column that wraps between words, numbers never wrapped, short
    headers; no column is narrower than its longest word, so no config string is broken mid-word."""
    def numbers(lay: dict) -> list[str]:
        ev, mark = lay["evaluation"], margin_mark(lay)
        return [f"{ev['tokens_per_s_per_device']:,.1f}", f"{ev['mfu']:.3f}", f"{ev['step_time_s']:.2f}",
                f"{ev['memory']['peak_gib']:.1f}", f"{ev['memory']['headroom_gib']:.1f}",
                f"[red]{mark}[/red]" if mark == "SHORT" else mark]

    t = Table(title=title, title_justify="left", show_edge=not narrow, pad_edge=not narrow)
    if not narrow:
        for col, just in (("rank", "right"), ("layout", "left"), ("best variant", "left"), ("variants", "right"),
                          ("tokens/s/dev", "right"), ("MFU", "right"), ("step s", "right"), ("peak GiB", "right"),
                          ("headroom GiB", "right"), ("margin", "left")):
            t.add_column(col, justify=just, overflow="fold")
        for lay in layouts:
            t.add_row(str(lay["best_rank"]), layout_brief(lay["config"]), variant_brief(lay["config"]),
                      f"{lay['variants']:,}", *numbers(lay))
        return t
    texts = [f"{layout_brief(lay['config'])}\n{wrappable(variant_brief(lay['config']))} "
             f"({lay['variants']:,} variants)" for lay in layouts]
    # The number columns get exactly their widest cell (headers wrap between words), the text column the rest.
    t.add_column("rank", justify="right", width=longest_word(["rank"] + [str(lay["best_rank"]) for lay in layouts]))
    t.add_column("layout / best variant", min_width=longest_word(texts))
    cells = [[c.removeprefix("[red]").removesuffix("[/red]") for c in numbers(lay)] for lay in layouts]
    for i, col in enumerate(("tok/s per dev", "MFU", "step s", "peak GiB", "head- room GiB", "margin")):
        t.add_column(col, justify="left" if col == "margin" else "right",
                     width=longest_word([col] + [c[i] for c in cells]))
    for lay, text in zip(layouts, texts):
        t.add_row(str(lay["best_rank"]), text, *numbers(lay))
    return t


def _memory_parts_table(layouts: list[dict]) -> Table:
    """Each listed layout's memory at its peak stage, part by part (they add up to the peak)."""
    t = Table(title="memory at each layout's peak stage, GiB (the parts add up to peak)", title_justify="left")
    t.add_column("rank", justify="right")
    for k in ("peak_gib", *MEMORY_PARTS):
        t.add_column(k.removesuffix("_gib").replace("optimizer", "optim").replace("activations", "activ"),
                     justify="right")
    for lay in layouts:
        mem = lay["evaluation"]["memory"]
        # "#rank": these rows are told from the layouts table's, which start with the bare rank
        t.add_row(f"#{lay['best_rank']}", *(_fmt(mem.get(k), ".1f") for k in ("peak_gib", *MEMORY_PARTS)))
    return t


def _search_table(result: dict, margin_gib: float) -> None:
    """The top K distinct layouts, each with its best variant (``--json`` has every ranked config)."""
    scored, pruned = result.get("configs_scored"), result.get("configs_pruned") or 0
    dominated = result.get("configs_dominated") or 0
    counted = (f"{result['trials']:,} decided: {scored:,} scored, {pruned:,} bounded out, "
               f"{dominated:,} dominated · {result['feasible_trials']:,} of the scored feasible" if pruned else
               f"{result['trials']:,} scored · {result['feasible_trials']:,} feasible")
    out.print(f"engine [b]{result['engine']}[/b] · space {result['space_size']:,} configs · {counted} · "
              f"{result['search_time_s']:.1f} s · memory margin {margin_gib:g} GiB", soft_wrap=False)
    layouts = result["layouts"]
    scored_layouts = "scored layouts" if pruned else "layouts"
    title = (f"top {len(layouts)} layouts (of {result['feasible_layouts']:,} {scored_layouts} with a config that "
             "fits); rank: of the best variant among all ranked configs")
    table = _layouts_table(layouts, title)
    if out.measure(table, options=out.options.update_width(10_000)).maximum > out.width:
        # a terminal narrower than the wide table (e.g. 80 columns): layout and variant share one column
        table = _layouts_table(layouts, title, narrow=True)
    out.print(table, soft_wrap=False)
    if layouts:
        out.print(_memory_parts_table(layouts), soft_wrap=False)
    if any(lay.get("keeps_margin") is False for lay in layouts):
        out.print(f"SHORT: headroom below the {margin_gib:g} GiB memory margin (allocator fragmentation and "
                  "communication buffers are not in the model): ranked after every config that keeps the margin, "
                  "and may not fit in practice.", highlight=False, soft_wrap=False)
    _best_warnings(result)


def next_steps(framework: str) -> str:
    """The line under a search's tables that says what to do with the result: keep it as JSON, then the
    report (plots), the launch arguments of the ranked configs, and how two ranks differ and why."""
    return ("next: add --json > result.json to keep it, then `paraplan report result.json -o report.html` (plots), "
            f"`paraplan export result.json --format {framework}` (launch arguments) or "
            "`paraplan compare result.json#1 result.json#2` (what differs and why)")


def _best_warnings(result: dict) -> None:
    """The best config's warnings (calibration coverage, extrapolation) under the table, as evaluate prints them."""
    best = result.get("best")
    for w in (best or {}).get("evaluation", {}).get("warnings", []):
        out.print(f"  [yellow]warning[/yellow]: {w}", highlight=False, soft_wrap=False)  # wrapped to the terminal


@main.command()
@click.option("--model", required=True, help="Preset name, or a JSON/YAML model spec file.")
@click.option("--cluster", required=True, help="Profile name (hardware_profiles/), or a profile file.")
@click.option("--devices", required=True, type=int, help="Number of devices.")
@click.option("--global-batch-size", required=True, type=int, help="Sequences per step.")
@click.option("--trials", type=int, default=DEFAULT_TRIALS, show_default=True, help="Trials for the samplers.")
@click.option("--sampler", type=click.Choice(ENGINES), default="auto", show_default=True)
@click.option("--top", "top_k", type=int, default=DEFAULT_TOP_K, show_default=True, help="How many configs to rank.")
@click.option("--seed", type=int, default=None, help="Sampler seed (same seed, same result).")
@click.option("--fix", "fix", multiple=True, metavar="KEY=VALUE", help="Pin a config field (repeatable).")
@click.option("--precision", type=click.Choice(["bf16", "fp8"]), default="bf16", show_default=True)
@click.option("--moe-load-imbalance", type=float, default=None, help="max/mean routed tokens per EP rank (≥ 1).")
@click.option("--seq-length", type=int, default=None, help="Override the model's seq_length.")
@click.option("--allow-cross-domain-tp", is_flag=True, help="Let tp span more than one scale-up domain.")
@click.option("--storage", default=None, help="Optuna storage URL for sampler studies (default: in memory).")
@click.option("--study-name", default=None, help="Optuna study name (with --storage).")
@click.option("--timeout", "timeout_s", type=float, default=None, help="Stop sampling after this many seconds.")
@click.option("--memory-margin-gib", "memory_margin_gib", type=float, default=DEFAULT_MEMORY_MARGIN_GIB,
              show_default=True, help="Headroom (GiB) a recommendation keeps for allocator fragmentation and "
                                      "communication buffers; configs short of it rank last (docs/search.md).")
@click.option("--framework", type=click.Choice(FRAMEWORKS), default=None,
              help="Training framework planned for: only configs it can express are searched (default: mindspeed "
                   "for Ascend profiles, megatron otherwise; docs/search.md).")
@click.option("--json", "as_json", is_flag=True, help="Print the contract's JSON result.")
@jobs_option
@resilience_flags(with_objective=True)
def search(model, cluster, devices, global_batch_size, trials, sampler, top_k, seed, fix, precision,
           moe_load_imbalance, seq_length, allow_cross_domain_tp, storage, study_name, timeout_s, memory_margin_gib,
           framework, as_json, jobs, objective, **resilience) -> None:
    """Find the configs with the highest predicted throughput that fit in memory."""
    try:
        # app/formats/bounds.py: the same bounds as the API's and the files'
        for name, problem in flag_problems(devices=devices, global_batch_size=global_batch_size, trials=trials,
                                           top=top_k, seed=seed, seq_length=seq_length, timeout_s=timeout_s,
                                           moe_load_imbalance=moe_load_imbalance):
            raise InputError(name, problem)
        if (problem := margin_problem(memory_margin_gib)) is not None:
            raise InputError("memory_margin_gib", problem)
        if sampler == "exhaustive" and (exc := unused_option(SAMPLER_ONLY, EXHAUSTIVE_WHY)) is not None:
            raise exc
        if storage is None and (exc := unused_option(("study_name",), "without --storage (it names a stored "
                                                                       "study)")) is not None:
            raise exc
        if sampler in SAMPLERS and (exc := unused_option(("jobs",), JOBS_WHY)) is not None:
            raise exc
        check_jobs(jobs)
        spec = load_model(model, seq_length)
        profile = load_cluster(cluster)
        if (problem := margin_problem(memory_margin_gib, profile.fact("memory_gib"))) is not None:
            raise InputError("memory_margin_gib", problem)
        fixed = parse_fix(fix)
        check_config_data(fixed, "fix")
        fixed = validate_fixed(fixed, global_batch_size)
        req = SearchRequest(spec=spec, profile=profile, devices=devices, global_batch_size=global_batch_size,
                            sampler=sampler, n_trials=trials, top_k=top_k, seed=seed, fixed=fixed,
                            precision=precision, moe_load_imbalance=moe_load_imbalance,
                            allow_cross_domain_tp=allow_cross_domain_tp, storage=storage,
                            study_name=study_name, timeout_s=timeout_s, memory_margin_gib=memory_margin_gib,
                            framework=framework or default_framework(profile.name), objective=objective,
                            resilience=resilience_from_flags(resilience), jobs=jobs)
        result = _run_with_progress(req)
    except SpaceError as exc:
        fail(InputError(exc.field, str(exc).split(": ", 1)[1]))
    except InputError as exc:
        fail(exc)
    full = {"inputs": {"model": spec.model_dump(mode="json", exclude_none=True), "cluster": profile.name,
                       "devices": devices, "global_batch_size": global_batch_size, "precision": precision,
                       "moe_load_imbalance": moe_load_imbalance, "memory_margin_gib": memory_margin_gib,
                       "framework": req.framework}, **result}
    if result["engine"] != "exhaustive" and given("jobs"):
        err.print(f"note: --jobs not used: sampler auto chose {result['engine']} for the "
                  f"{result['space_size']:,} configs (a sampler scores one trial at a time)", highlight=False)
    if result["engine"] == "exhaustive" and (unused := [f"--{n.removesuffix('_s').replace('_', '-')}"
                                                        for n in SAMPLER_ONLY if given(n)]):
        err.print(f"note: {', '.join(unused)} not used: sampler auto scored the whole space "
                  f"({result['space_size']:,} configs, at most {AUTO_EXHAUSTIVE_MAX:,} are enumerated); pass "
                  "--sampler tpe to sample", highlight=False)
    if as_json:
        print_json(full)
    elif result["top"]:
        _search_table(result, memory_margin_gib)
        out.print(next_steps(req.framework), highlight=False, soft_wrap=False)
    best = result["best"]
    if best is not None and best.get("keeps_margin") is False:
        err.print(f"[yellow]warning:[/yellow] no config keeps the {memory_margin_gib:g} GiB memory margin; the best "
                  f"leaves {best['evaluation']['memory']['headroom_gib']:.1f} GiB of headroom", highlight=False)
    if result["best"] is None:
        smallest = result.get("smallest_peak_gib")
        where = (f": the smallest peak found is {smallest:.1f} GiB at {config_brief(result['smallest_peak_config'])}"
                 if smallest is not None else ": no structurally valid config was found")
        err.print(f"[red]no config fits in {profile.fact('memory_gib'):g} GiB[/red]{where}", highlight=False)
        sys.exit(EXIT_NO_FIT)


# The search options only a sampler reads: the exhaustive engine scores the whole space, once, in order.
SAMPLER_ONLY = ("trials", "seed", "timeout_s", "storage", "study_name")
EXHAUSTIVE_WHY = "with --sampler exhaustive (it scores the whole space; the samplers read it)"
JOBS_WHY = f"with --sampler {'/'.join(SAMPLERS)} (a sampler scores one trial at a time; --jobs is the exhaustive engine's)"


def _quiet_optuna(engine: str, size: int) -> None:
    """Optuna logs every study it creates at INFO on its own stderr handler ("A new study created in memory
    ..."): noise in a command whose stderr carries only progress, warnings and errors. Its warnings stay.
    Set once the engine is known (``run_search``'s ``on_engine``): an exhaustive search never imports Optuna."""
    if engine != "exhaustive":
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)


def _run_with_progress(req: SearchRequest) -> dict:
    """Run the search with a progress bar on stderr when it is a terminal."""
    if not err.is_terminal:
        return run_search(req, on_engine=_quiet_optuna)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeRemainingColumn(), console=err, transient=True) as bar:
        task = bar.add_task("searching", total=None)
        return run_search(req, progress=lambda done, total: bar.update(task, completed=done, total=total),
                          on_engine=_quiet_optuna)


from .commands import serve, submit, worker  # noqa: E402 - the service commands (app/cli/commands/)

main.add_command(serve)
main.add_command(worker)
main.add_command(submit)

from .commands.report import report  # noqa: E402 - the HTML job report

main.add_command(report)

from .commands.export import export  # noqa: E402 - training-script arguments (app/formats/launch.py)

main.add_command(export)

from .commands.calibrate import calibrate  # noqa: E402 - a profile refitted on the team's own runs

main.add_command(calibrate)

from .commands.rl import rl  # noqa: E402 - RL post-training plans (search/rl.py)

main.add_command(rl)

from .commands.plan import plan  # noqa: E402 - capacity planning over device counts (search/capacity.py)

main.add_command(plan)

from .commands.compare import compare_cmd  # noqa: E402 - two configs part by part, with causes
from .commands.from_launch import add_from_launch  # noqa: E402 - --from-launch on evaluate and search
from .commands.launch_import import import_launch  # noqa: E402 - a launch script read back (the inverse of export)

main.add_command(import_launch)
main.add_command(compare_cmd)
add_from_launch(evaluate, "evaluate")
add_from_launch(search, "search")


if __name__ == "__main__":
    main()

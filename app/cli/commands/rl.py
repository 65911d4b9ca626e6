"""``paraplan rl``: the best co-located and the best disaggregated plan of an RL post-training step."""

from __future__ import annotations

import sys

import click
from rich.table import Table

from search import SpaceError, validate_fixed
from search.rl import RLRequest

from app.formats.bounds import flag_problems
from app.formats.describe import count_text
from app.formats.inputs import InputError, check_devices, load_cluster, load_model
from app.formats.rl import DEFAULTS, rl_result, workload

from ..common import EXIT_NO_FIT, check_jobs, err, fail, jobs_option, out, parse_fix, print_json



@click.command()
@click.option("--model", required=True, help="Preset name, or a JSON/YAML model spec file (the policy).")
@click.option("--cluster", required=True, help="Profile name (hardware_profiles/), or a profile file.")
@click.option("--devices", required=True, type=int, help="Number of devices.")
@click.option("--algorithm", default=DEFAULTS["algorithm"], show_default=True,
              help="grpo (reference on, no critic) or ppo (reference and critic).")
@click.option("--prompts-per-step", type=int, default=DEFAULTS["prompts_per_step"], show_default=True)
@click.option("--responses-per-prompt", type=int, default=DEFAULTS["responses_per_prompt"], show_default=True)
@click.option("--prompt-length", type=int, default=DEFAULTS["prompt_length"], show_default=True, help="Tokens.")
@click.option("--response-length", type=int, default=DEFAULTS["response_length"], show_default=True,
              help="Tokens generated per response (the mean, priced as every response's length).")
@click.option("--max-response-length", type=int, default=None,
              help="Longest response (tokens; default: every response is --response-length). A synchronous step's "
                   "waves last this many decode steps.")
@click.option("--reference/--no-reference", default=None, help="Reference-model log-prob pass (default: the algorithm's).")
@click.option("--critic/--no-critic", default=None, help="Train a critic (default: the algorithm's).")
@click.option("--stale-sync", is_flag=True, help="Allow one step of staleness: the two pools of a disaggregated plan overlap.")
@click.option("--fix", "fix", multiple=True, metavar="KEY=VALUE",
              help="Pin a field of the training config (repeatable), as in `paraplan search`.")
@click.option("--seed", type=click.IntRange(0, 2**31 - 1), default=0, show_default=True,
              help="Seed of the training searches' sampler (spaces too big to enumerate).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@jobs_option
def rl(model, cluster, devices, algorithm, prompts_per_step, responses_per_prompt, prompt_length, response_length,
       max_response_length, reference, critic, stale_sync, fix, seed, as_json, jobs) -> None:
    """Plan RL post-training: rollout + training, co-located (RL Fusion) or on two pools."""
    try:
        for name, problem in flag_problems(devices=devices):
            raise InputError(name, problem)
        check_devices(devices)
        check_jobs(jobs)
        wl = workload(algorithm, prompts_per_step, responses_per_prompt, prompt_length, response_length,
                      reference, critic, stale_sync, max_response_length)
        spec = load_model(model)
        profile = load_cluster(cluster)
        fixed = validate_fixed(parse_fix(fix), wl.samples)
    except InputError as exc:
        fail(exc)
    except SpaceError as exc:
        fail(InputError(exc.field, str(exc).split(": ", 1)[1]))
    req = RLRequest(spec=spec, profile=profile, devices=devices, workload=wl, fixed=fixed, seed=seed, jobs=jobs)
    result = _run(req, model)
    if as_json:
        print_json(result)
    else:
        for mode in ("colocated", "disaggregated"):
            _plan_table(out, mode, result[mode])
    if result["best"] is None:
        err.print("[red]no RL plan fits[/red]", highlight=False)
        sys.exit(EXIT_NO_FIT)


def _run(req: RLRequest, model: str) -> dict:
    """The plan, with a progress bar of the training searches on stderr when it is a terminal, else a line
    saying what runs (a large model takes minutes, and a log should not look stalled)."""
    if not err.is_terminal:
        err.print(f"planning RL post-training of {model} on {req.devices:,} devices: the co-located plan and each "
                  "split of the devices into rollout and training pools (one training search each)", highlight=False)
        return rl_result(req, model)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("training searches"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as bar:
        task = bar.add_task("rl", total=None)
        return rl_result(req, model, progress=lambda done, total: bar.update(task, completed=done, total=total))


def _plan_table(out, mode: str, plan: dict | None) -> None:
    if plan is None:
        out.print(f"[b]{mode}[/b]: no plan fits", highlight=False)
        return
    r, c = plan["rollout"], plan["training"]["config"]
    out.print(f"[b]{mode}[/b]: step {plan['step_time_s']:.1f} s · {plan['samples_per_s']:.2f} samples/s · "
              f"{plan['generated_tokens_per_s']:,.0f} generated tokens/s · {plan['trained_tokens_per_s']:,.0f} "
              f"trained tokens/s · rollout {plan['rollout_devices']} devices (tp {r['tp']} ep {r['ep']} dp {r['dp']}, "
              f"batch {r['batch']} of {r['max_batch']}, {count_text(r['waves'], 'wave')}) · training {plan['train_devices']} devices "
              f"(tp {c['tp']} pp {c['pp']} cp {c['cp']} ep {c['ep']})", highlight=False)
    t = Table(title=f"{mode}: exposed time per step (adds up to the step)", title_justify="left")
    t.add_column("phase")
    t.add_column("seconds", justify="right")
    t.add_column("share", justify="right")
    for k, v in plan["time"].items():
        t.add_row(k.removesuffix("_s"), f"{v:.2f}", f"{v / plan['step_time_s']:.1%}")
    out.print(t)
    m = plan["memory"]
    out.print(f"peak memory per phase, GiB of {m['capacity_gib']:.0f}: rollout {m['rollout_peak_gib']:.1f} "
              f"(KV {m['rollout_kv_cache_gib']:.1f}), log-prob {m['logprob_peak_gib']:.1f}, train {m['train_peak_gib']:.1f}",
              highlight=False)

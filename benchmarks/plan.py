"""The capacity plan's speed: Pangu Ultra MoE 718B on ascend-910b, 1,024–16,384 NPUs in steps of 512, 19T
tokens (docs/guides/capacity.md), on one thread; then the planner's best against the full exhaustive
search's at a few counts (the gap the planning pins cost). Run from the repository root:

    .venv/bin/python benchmarks/plan.py [--compare 1024,6144,16384]

Prints per-count plan time (median, max), the total, and per compared count both bests in tokens/s/NPU.
The full searches take 20–80 s each; ``--compare ''`` skips them.

``--jobs N`` instead times the same plan on one process and on N (``PlanRequest(jobs=N)``, the counts
searched side by side), measured in the same run, alternating: median wall seconds of ``--repeats`` runs
each, the speedup, and whether the N-process plan equals the one-process plan (exit 1 if not):

    .venv/bin/python benchmarks/plan.py --jobs 2 [--repeats 3]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import hardware_profiles  # noqa: E402
import model_presets  # noqa: E402
from search import SearchRequest, run_search  # noqa: E402
from search.capacity import PlanRequest, run_plan  # noqa: E402
from proc_usage import cpu_s  # noqa: E402 - benchmarks/proc_usage.py


def _without_times(plan: dict) -> dict:
    return {**{k: v for k, v in plan.items() if k != "plan_time_s"},
            "points": [{k: v for k, v in p.items() if k != "search_time_s"} for p in plan["points"]]}


def jobs_comparison(spec, profile, jobs: int, repeats: int) -> bool:
    """The Pangu plan on 1 and on ``jobs`` processes; prints a table; True where the plans are equal."""
    from costmodel.runtime import tune_allocator

    tune_allocator()  # as the paraplan entry point and each pool process do
    walls: dict[int, list[float]] = {1: [], jobs: []}
    cpus: dict[int, list[float]] = {1: [], jobs: []}
    plans = {}
    for _ in range(repeats):
        for n in (1, jobs):
            c0 = cpu_s()
            plans[n] = run_plan(PlanRequest(spec=spec, profile=profile, tokens=19e12, devices_min=1024,
                                            devices_max=16384, devices_step=512, deadline_days=90,
                                            framework="mindspeed", jobs=n))
            walls[n].append(plans[n]["plan_time_s"])
            cpus[n].append(cpu_s() - c0)
    same = _without_times(plans[1]) == _without_times(plans[jobs])
    one, many = statistics.median(walls[1]), statistics.median(walls[jobs])
    t = Table(title=f"capacity plan on 1 and {jobs} processes, Pangu Ultra MoE 718B × ascend-910b, 1,024–16,384 "
                    f"step 512 (median of {repeats}, alternating; {os.cpu_count()} cores)", title_justify="left")
    for col in ("counts", "1 process s", f"{jobs} processes s", "speedup", f"CPU s, 1 / {jobs}", "plan"):
        t.add_column(col, justify="right")
    t.add_row(str(len(plans[1]["points"])), f"{one:.1f}", f"{many:.1f}", f"{one / many:.2f}x",
              f"{statistics.median(cpus[1]):.1f} / {statistics.median(cpus[jobs]):.1f}", "equal" if same else "DIFFERENT")
    Console().print(t)
    return same


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compare", default="1024,6144,16384", help="counts to compare with the full search")
    ap.add_argument("--jobs", type=int, default=None, help="compare the plan on 1 and on N processes")
    ap.add_argument("--repeats", type=int, default=3, help="runs per process count (with --jobs)")
    args = ap.parse_args()
    spec, profile = model_presets.load("pangu-ultra-moe-718b"), hardware_profiles.load("ascend-910b")
    if args.jobs is not None:
        sys.exit(0 if jobs_comparison(spec, profile, args.jobs, args.repeats) else 1)
    plan = run_plan(PlanRequest(spec=spec, profile=profile, tokens=19e12, devices_min=1024, devices_max=16384,
                                devices_step=512, framework="mindspeed"))
    times = [p["search_time_s"] for p in plan["points"]]
    t = Table(title="capacity plan, Pangu Ultra MoE 718B × ascend-910b, 1,024–16,384 step 512 (one thread)",
              title_justify="left")
    for col in ("counts", "per-count median s", "per-count max s", "plan total s"):
        t.add_column(col, justify="right")
    t.add_row(str(len(times)), f"{statistics.median(times):.2f}", f"{max(times):.2f}", f"{plan['plan_time_s']:.1f}")
    console = Console()
    console.print(t)
    counts = [int(c) for c in args.compare.split(",") if c]
    if not counts:
        return
    c = Table(title="planner's best against the full exhaustive search (tokens/s per NPU)", title_justify="left")
    for col in ("devices", "planner", "full search", "gap", "full search s"):
        c.add_column(col, justify="right")
    by_count = {p["devices"]: p for p in plan["points"]}
    for n in counts:
        p = by_count[n]
        full = run_search(SearchRequest(spec=spec, profile=profile, devices=n, global_batch_size=p["global_batch_size"],
                                        sampler="exhaustive", top_k=1, framework="mindspeed"))
        mine, best = p["tokens_per_s"] / n, full["best"]["evaluation"]["tokens_per_s"] / n
        c.add_row(f"{n:,}", f"{mine:.1f}", f"{best:.1f}", f"{mine / best - 1:+.1%}", f"{full['search_time_s']:.0f}")
    console.print(c)


if __name__ == "__main__":
    main()

"""The capacity plan's speed: Pangu Ultra MoE 718B on ascend-910b, 1,024–16,384 NPUs in steps of 512, 19T
tokens (docs/guides/capacity.md), on one thread; then the planner's best against the full exhaustive
search's at a few counts (the gap the planning pins cost). Run from the repository root:

    .venv/bin/python benchmarks/plan.py [--compare 1024,6144,16384]

Prints per-count plan time (median, max), the total, and per compared count both bests in tokens/s/NPU.
The full searches take 20–80 s each; ``--compare ''`` skips them.

``--jobs N`` instead times the plan and RL commands below (``--targets``) on one process and on N (``--jobs N``:
the plan's counts, the RL plan's training searches side by side), each run a whole new process, measured in
the same run, alternating: median wall seconds of ``--repeats`` runs each, the speedup, and whether the
N-process result (``--json``, times left out) equals the one-process result (exit 1 if not); beside them, the
machine's ceiling: N copies of the one-process command started at once share the cores' cache and memory bus
and nothing else, so N × one run's time / their time is the most N processes can give here:

    .venv/bin/python benchmarks/plan.py --jobs 2 [--repeats 3] [--commands plan,rl]

``--targets`` instead times the README's plan command as a whole process (``paraplan plan`` for Pangu on
1,024–16,384 NPUs in steps of 512, imports included) against its target, 10 s on one core; ``--rl`` adds
the RL command (``paraplan rl`` for Pangu on one CloudMatrix 384) against 20 s. Each command runs
``--runs`` times, in turn; the table has the median wall and CPU seconds, the target, and the ratio:

    .venv/bin/python benchmarks/plan.py --rl [--runs 3]

``--exact`` checks the pruned plan against the same plan with every count's space scanned in full (the
exhaustive engine without its bounds): the same chosen count and, at every count, the same best config and
tokens/s (exit 1 if not), with both plans' times.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import hardware_profiles  # noqa: E402
import model_presets  # noqa: E402
from results import without_times  # noqa: E402 - benchmarks/results.py
from search import SearchRequest, run_search  # noqa: E402
from search.capacity import PlanRequest, run_plan  # noqa: E402


def run_json(args: list[str]) -> tuple[float, dict]:
    """Wall seconds of ``paraplan ARGS --json`` as a whole process (one BLAS thread per process), and its
    result without times."""
    started = time.perf_counter()
    out = subprocess.run(_command(args), cwd=ROOT, check=True, env=_ENV, capture_output=True, text=True).stdout
    return time.perf_counter() - started, without_times(json.loads(out))


def side_by_side(args: list[str], n: int) -> float:
    """Median wall seconds of ``n`` copies of ``paraplan ARGS --json`` started at once, each on one process: the
    same work as one run, ``n`` times over, with nothing shared. ``n`` × one run's time / this is what the
    machine allows ``n`` processes at most (cache, memory bus and the rest they share), pool or no pool."""
    started = time.perf_counter()
    procs = [subprocess.Popen(_command(args), cwd=ROOT, env=_ENV, stdout=subprocess.DEVNULL) for _ in range(n)]
    ends: dict[int, float] = {}
    try:
        while len(ends) < n:
            for i, p in enumerate(procs):
                if i not in ends and p.poll() is not None:
                    if p.returncode:
                        raise subprocess.CalledProcessError(p.returncode, p.args)
                    ends[i] = time.perf_counter() - started
            time.sleep(0.01)
    finally:  # a copy that failed stops the others
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return statistics.median(ends.values())


_ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1"}


def _command(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "app.cli", *args, "--json"]


def jobs_comparison(names: list[str], jobs: int, repeats: int) -> bool:
    """The plan and RL commands (``COMMANDS``) on 1 and on ``jobs`` processes (``--jobs``), each run a whole new
    process, so that both sides start with empty caches, as a user's command does (a pool's processes always
    do); prints a table of medians; True where every result on ``jobs`` processes equals the one-process one."""
    rows, all_same = [], True
    for name in names:
        walls: dict[int, list[float]] = {1: [], jobs: []}
        apart: list[float] = []  # jobs one-process runs at once
        results = {}
        for _ in range(repeats):
            for n in (1, jobs):
                wall, results[n] = run_json([*COMMANDS[name][0], "--jobs", str(n)])
                walls[n].append(wall)
            apart.append(side_by_side([*COMMANDS[name][0], "--jobs", "1"], jobs))
        same = results[1] == results[jobs]
        all_same &= same
        one, many, pair = statistics.median(walls[1]), statistics.median(walls[jobs]), statistics.median(apart)
        rows.append((f"paraplan {name}", f"{one:.1f}", f"{many:.1f}", f"{one / many:.2f}x", f"{pair:.1f}",
                     f"{jobs * one / pair:.2f}x", "equal" if same else "DIFFERENT"))
    t = Table(title=f"whole commands on 1 and {jobs} processes (--jobs; median of {repeats}, alternating, each run a "
                    f"new process; {os.cpu_count()} cores)", title_justify="left")
    for col in ("command", "1 process s", f"{jobs} processes s", "speedup", f"{jobs} 1-process runs at once, s each",
                "the machine's ceiling", "result"):
        t.add_column(col, justify="right")
    for row in rows:
        t.add_row(*row)
    Console().print(t)
    print(f"the machine's ceiling: {jobs} x one run's time / the time of each of {jobs} such runs started at once "
          "(nothing shared between them: the speedup the cores allow, pool or no pool)")
    for name in names:
        print(f"paraplan {' '.join(COMMANDS[name][0])} --jobs N")
    return all_same


# The commands the speed targets are set on (README, docs/guides/capacity.md and rl.md) and the targets, s.
COMMANDS = {
    "plan": (["plan", "--model", "pangu-ultra-moe-718b", "--cluster", "ascend-910b", "--tokens", "19T",
              "--devices-min", "1024", "--devices-max", "16384", "--devices-step", "512", "--deadline-days", "90"],
             10.0),
    "rl": (["rl", "--model", "pangu-ultra-moe-718b", "--cluster", "ascend-910c-cloudmatrix384", "--devices", "384"],
           20.0),
}


def time_command(args: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of ``paraplan ARGS`` as a whole process, on one thread."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def targets(names: list[str], runs: int) -> None:
    """Each command of ``names`` run ``runs`` times in turn; a table of medians against the targets."""
    walls: dict[str, list[float]] = {n: [] for n in names}
    cpus: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(runs):
        for n in names:
            wall, cpu = time_command(COMMANDS[n][0])
            walls[n].append(wall)
            cpus[n].append(cpu)
    t = Table(title=f"whole-process time, one thread, median of {runs} (in turn)", title_justify="left")
    for col in ("command", "wall s", "wall min–max", "CPU s", "target s", "wall / target"):
        t.add_column(col, justify="right")
    for n in names:
        wall, target = statistics.median(walls[n]), COMMANDS[n][1]
        t.add_row(f"paraplan {COMMANDS[n][0][0]}", f"{wall:.1f}", f"{min(walls[n]):.1f}–{max(walls[n]):.1f}",
                  f"{statistics.median(cpus[n]):.1f}", f"{target:.0f}", f"{wall / target:.2f}")
    Console().print(t)
    for n in names:
        print(f"paraplan {' '.join(COMMANDS[n][0])}")


def exact_check(spec, profile) -> bool:
    """The plan with the engine's bounds and with plain full scans; prints a table; True where they agree."""
    import functools

    import search.engine

    request = PlanRequest(spec=spec, profile=profile, tokens=19e12, devices_min=1024, devices_max=16384,
                          devices_step=512, deadline_days=90, framework="mindspeed")
    pruned = run_plan(request)
    engine = search.engine.run_exhaustive
    search.engine.run_exhaustive = functools.partial(engine, prune=False)
    try:
        plain = run_plan(request)
    finally:
        search.engine.run_exhaustive = engine
    answer = lambda plan: (plan["chosen"], [(p["devices"], p["config"], p["tokens_per_s"])  # noqa: E731
                                            for p in plan["points"]])
    same = answer(pruned) == answer(plain)
    t = Table(title="the plan with bounds against plain full scans", title_justify="left")
    for col in ("counts", "chosen", "pruned plan s", "plain plan s", "every count's best"):
        t.add_column(col, justify="right")
    t.add_row(str(len(pruned["points"])), f"{pruned['chosen']:,}", f"{pruned['plan_time_s']:.1f}",
              f"{plain['plan_time_s']:.1f}", "equal" if same else "DIFFERENT")
    Console().print(t)
    return same


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compare", default="1024,6144,16384", help="counts to compare with the full search")
    ap.add_argument("--jobs", type=int, default=None, help="compare the plan on 1 and on N processes")
    ap.add_argument("--repeats", type=int, default=3, help="runs per process count (with --jobs)")
    ap.add_argument("--commands", default="plan,rl", help="with --jobs: which commands to compare (plan, rl)")
    ap.add_argument("--targets", action="store_true", help="time the plan command as a whole process")
    ap.add_argument("--rl", action="store_true", help="with --targets: time the RL command too (implies it)")
    ap.add_argument("--runs", type=int, default=3, help="runs of each command (--targets, --rl)")
    ap.add_argument("--exact", action="store_true", help="check the plan against plain full scans")
    args = ap.parse_args()
    if args.exact:
        sys.exit(0 if exact_check(model_presets.load("pangu-ultra-moe-718b"), hardware_profiles.load("ascend-910b"))
                 else 1)
    if args.targets or args.rl:
        targets(["plan", "rl"] if args.rl else ["plan"], args.runs)
        return
    if args.jobs is not None:
        sys.exit(0 if jobs_comparison(args.commands.split(","), args.jobs, args.repeats) else 1)
    spec, profile = model_presets.load("pangu-ultra-moe-718b"), hardware_profiles.load("ascend-910b")
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

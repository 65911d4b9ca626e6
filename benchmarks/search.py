"""Search engines on the issue's three cases: space size, exhaustive time, and samplers' trials to 99 %.

For Pangu Ultra MoE 718B on 6,144 ascend-910b (global batch 7680), DeepSeek-V3 671B on 2,048
nvidia-h100-80gb (15360) and Llama-3 405B on 16,384 nvidia-h100-80gb (2048): the exhaustive engine's
wall time and optimum, then for tpe, random and nsga2 the trials and wall time until the best feasible
config found reaches 99 % of that optimum (median over 5 seeds; ``>N`` when a seed never got there
within the budget). One thread. Run from the repository root:

    .venv/bin/python benchmarks/search.py [--seeds 5] [--budget 500] [--cases pangu,dsv3,llama]

``--exactness`` instead checks the exhaustive engine's pruning on the README's Pangu search (MindSpeed,
top 10, the search's 4 GiB memory margin unless ``--margin-gib``): the plain full scan
(``run_exhaustive(..., prune=False)``) and the pruned one on the same space,
their wall and CPU seconds, configs scored and pruned, and whether the top-10 configs, the top-10 layouts
and their ranks are equal (exit 1 if not):

    .venv/bin/python benchmarks/search.py --exactness

``--readme`` times the README's first command (``paraplan search --model pangu-ultra-moe-718b --cluster
ascend-910b --devices 6144 --global-batch-size 7680``) as a user runs it: a whole new process each time,
one thread (``OMP_NUM_THREADS=1`` and the BLAS equivalents), pinned to CPU 0 with ``taskset`` where there is
one, its tables written to /dev/null; one warm-up run, then the median of ``--runs`` (wall seconds, and CPU
seconds user + system from the kernel's accounting of the finished child) against the 5 s target (exit 1
when the median wall time misses it; on a machine busy with other work the wall time counts waiting for a
CPU, and the CPU seconds are the figure to compare).
``--against DIR`` runs the same command on another checkout (its directory first on PYTHONPATH), in turn
with this one, and adds its figures and the ratios run by run (this / other), so that a comparison holds
on a shared machine whose speed drifts:

    .venv/bin/python benchmarks/search.py --readme [--runs 5] [--against ../main]

``--jobs N`` compares the exhaustive engine on one process and on N (``run_exhaustive(..., jobs=N)``) on the
same Pangu space, measured in the same run, alternating: the pruned scan (README command 1) and the plain
full scan (``prune=False``, where scoring is nearly all the work); each run is a new process that builds the
space untimed, so that both sides start with empty caches (a pool's processes always do); median wall
seconds of ``--repeats`` runs each, the speedup, and whether the N-process result equals the one-process
result in full (exit 1 if not):

    .venv/bin/python benchmarks/search.py --jobs 2 [--repeats 3] [--scans pruned,plain]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import optuna  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

import hardware_profiles  # noqa: E402
import model_presets  # noqa: E402
from search import SearchRequest, run_search  # noqa: E402
from search.margin import DEFAULT_MEMORY_MARGIN_GIB  # noqa: E402
from proc_usage import cpu_s, pool_peak_gib  # noqa: E402 - benchmarks/proc_usage.py
from results import without_times  # noqa: E402 - benchmarks/results.py

CASES = {
    "pangu": ("pangu-ultra-moe-718b", "ascend-910b", 6144, 7680),
    "dsv3": ("deepseek-v3-671b", "nvidia-h100-80gb", 2048, 15360),
    "llama": ("llama3-405b", "nvidia-h100-80gb", 16384, 2048),
}
SAMPLERS = ("tpe", "random", "nsga2")


def trials_to_target(history: list[dict], target: float) -> int | None:
    best = 0.0
    for i, h in enumerate(history, start=1):
        if h["feasible"] and h["tokens_per_s"] is not None:
            best = max(best, h["tokens_per_s"])
        if best >= target:
            return i
    return None


def run_case(name: str, seeds: int, budget: int) -> list[list[str]]:
    model, cluster, devices, gbs = CASES[name]
    base = dict(spec=model_presets.load(model), profile=hardware_profiles.load(cluster), devices=devices,
                global_batch_size=gbs)
    exact = run_search(SearchRequest(**base, sampler="exhaustive", top_k=1))
    optimum = exact["best"]["evaluation"]["tokens_per_s"]
    rows = [[name, f"{exact['space_size']:,}", "exhaustive", f"{exact['space_size']:,} configs",
             f"{exact['search_time_s']:.1f} s", f"{optimum:,.0f}", "—"]]
    for sampler in SAMPLERS:
        needed, seconds, reached = [], [], []
        for seed in range(seeds):
            marks: list[tuple[int, float]] = []
            t0 = time.perf_counter()
            res = run_search(SearchRequest(**base, sampler=sampler, n_trials=budget, top_k=1, seed=seed),
                             progress=lambda done, total: marks.append((done, time.perf_counter() - t0)))
            n = trials_to_target(res["history"], 0.99 * optimum)
            best = res["best"]["evaluation"]["tokens_per_s"] if res["best"] else 0.0
            reached.append(best / optimum)
            if n is None:
                needed.append(budget + 1)
                seconds.append(float("inf"))
            else:
                needed.append(n)
                seconds.append(next(t for done, t in marks if done >= n))
        med_n, med_t = statistics.median(needed), statistics.median(seconds)
        rows.append([name, "", sampler, f">{budget}" if med_n > budget else f"{med_n:.0f} trials",
                     "—" if med_t == float("inf") else f"{med_t:.1f} s", "",
                     f"{min(reached):.4f} / {statistics.median(reached):.4f}"])
    return rows


def exactness(top_k: int = 10, margin_gib: float = DEFAULT_MEMORY_MARGIN_GIB) -> bool:
    """The pruned exhaustive scan against the plain full scan on the Pangu space, with the README command's
    memory margin unless told; prints a table."""
    from search.exhaustive import run_exhaustive
    from search.space import build_space

    model, cluster, devices, gbs = CASES["pangu"]
    t0, c0 = time.perf_counter(), time.process_time()
    space = build_space(model_presets.load(model), hardware_profiles.load(cluster), devices, gbs, framework="mindspeed")
    build = (time.perf_counter() - t0, time.process_time() - c0)
    runs = {}
    for prune in (False, True):
        t0, c0 = time.perf_counter(), time.process_time()
        ranked = run_exhaustive(space, top_k, prune=prune, margin_gib=margin_gib)
        runs[prune] = (ranked, time.perf_counter() - t0, time.process_time() - c0)
    key = lambda r: (r.configs, [(lay["layout"], lay["best_rank"], lay["config"]) for lay in r.layouts])  # noqa: E731
    same = key(runs[True][0]) == key(runs[False][0])
    table = Table(title=f"exhaustive engine on pangu ({space.size:,} configs, top {top_k}, memory margin "
                        f"{margin_gib:g} GiB; space built in "
                        f"{build[0]:.1f} s wall, {build[1]:.1f} s CPU)")
    for col in ("scan", "wall s", "CPU s", "configs scored", "configs pruned", "top-10 configs, layouts, ranks"):
        table.add_column(col, justify="left" if col == "scan" else "right")
    for prune, (ranked, wall, cpu) in runs.items():
        table.add_row("pruned (default)" if prune else "plain full scan", f"{wall:.1f}", f"{cpu:.1f}",
                      f"{ranked.extra['configs_scored']:,}", f"{ranked.extra['configs_pruned']:,}",
                      ("equal to the plain scan's" if same else "DIFFERENT") if prune else "reference")
    Console(width=200).print(table)
    return same


README_ARGS = ["search", "--model", "pangu-ultra-moe-718b", "--cluster", "ascend-910b", "--devices", "6144",
               "--global-batch-size", "7680"]
README_TARGET_S = 5.0
ROOT = Path(__file__).resolve().parents[1]


def _readme_command() -> list[str]:
    """The README's command 1 on one CPU: the ``paraplan`` script beside this interpreter (what a user
    runs), else ``python -m app.cli``."""
    script = Path(sys.executable).with_name("paraplan")
    cli = [str(script)] if script.exists() else [sys.executable, "-m", "app.cli"]
    pin = ["taskset", "-c", "0"] if shutil.which("taskset") else []
    return pin + cli + README_ARGS


def time_process(command: list[str], checkout: Path) -> tuple[float, float]:
    """(wall s, CPU s user + system) of one run of ``command`` importing ``checkout``'s code, one thread."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(checkout), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = "1"
    t0 = time.perf_counter()
    proc = subprocess.Popen(command, env=env, cwd=checkout, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    stderr = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} in {checkout} exited {proc.returncode}: {stderr.decode()[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime


def readme(runs: int, against: Path | None) -> bool:
    """Time README command 1 (and the same on ``against``, in turn); prints a table; True when this
    checkout's median wall time meets the target."""
    command = _readme_command()
    checkouts = {"this checkout": ROOT} | ({f"{against}": against} if against is not None else {})
    for path in checkouts.values():  # warm-up: byte-compiled modules and the page cache, not counted
        time_process(command, path)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in checkouts}
    for _ in range(runs):
        for name, path in checkouts.items():
            times[name].append(time_process(command, path))
    table = Table(title=f"README command 1, whole process, one thread{' on CPU 0' if command[0] == 'taskset' else ''}: "
                        f"median of {runs} runs (min-max); load average {os.getloadavg()[0]:.1f} on "
                        f"{os.cpu_count()} CPUs at the end")
    for col in ("checkout", "wall s", "CPU s (user + sys)", f"wall / {README_TARGET_S:g} s target", "meets target"):
        table.add_column(col, justify="left" if col == "checkout" else "right")
    med = lambda xs: statistics.median(xs)  # noqa: E731
    span = lambda xs: f"{med(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"  # noqa: E731
    for name, rows in times.items():
        walls, cpus = [w for w, _ in rows], [c for _, c in rows]
        table.add_row(name, span(walls), span(cpus), f"{med(walls) / README_TARGET_S:.2f}",
                      "yes" if med(walls) <= README_TARGET_S else "no")
    if against is not None:
        mine, other = times["this checkout"], times[f"{against}"]
        table.add_row("ratio, run by run (this / other)", span([a[0] / b[0] for a, b in zip(mine, other)]),
                      span([a[1] / b[1] for a, b in zip(mine, other)]), "", "")
    Console(width=200).print(f"command: {' '.join(command)}")
    Console(width=200).print(table)
    return med([w for w, _ in times["this checkout"]]) <= README_TARGET_S
def _one_jobs_run(scan: str, jobs: int, out: Path) -> None:
    """One timed exhaustive run in this (fresh) process: the pool started and the Pangu space built untimed (as
    ``run_search`` starts the pool before it builds the space), then ``run_exhaustive`` on ``jobs`` processes;
    its wall and CPU seconds (pool processes counted), the pool's peak memory and the result, pickled to
    ``out``."""
    import dataclasses
    import pickle
    from contextlib import nullcontext

    from costmodel.runtime import tune_allocator
    from search.exhaustive import run_exhaustive
    from search.pool import pool
    from search.space import build_space

    tune_allocator()  # as the paraplan entry point and each pool process do
    model, cluster, devices, gbs = CASES["pangu"]
    peak_gib = 0.0
    with (pool(jobs) if jobs > 1 else nullcontext()) as procs:
        if procs is not None:
            procs.warm()  # as run_search does: the processes start while the space is built
        space = build_space(model_presets.load(model), hardware_profiles.load(cluster), devices, gbs,
                            framework="mindspeed")
        t0, c0 = time.perf_counter(), cpu_s()
        result = run_exhaustive(space, 10, prune=scan == "pruned", procs=procs)
        wall, cpu = time.perf_counter() - t0, cpu_s() - c0
        if procs is not None:
            peak_gib = pool_peak_gib()
    out.write_bytes(pickle.dumps(dict(wall=wall, cpu=cpu, peak_gib=peak_gib, size=space.size,
                                      result=dataclasses.asdict(result))))


# A run's process loads this file under another name: run as a script, its pool processes would load it again
# as their main module (optuna included) before their first task, which paraplan's processes do not.
ONE_RUN = """import importlib.util, pathlib, sys
sys.path.append(str(pathlib.Path({path!r}).parent))  # proc_usage, results; after the repository (its search is the package)
spec = importlib.util.spec_from_file_location("benchmark_search", {path!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
module._one_jobs_run({scan!r}, {n}, pathlib.Path({out!r}))"""


SCAN_NAMES = {"pruned": "pruned (README command 1's search)", "plain": "plain full scan (prune=False)",
              "readme": "README command 1, whole process"}


def _readme_run(jobs: int) -> tuple[float, dict]:
    """README command 1 with ``--jobs`` as a whole process (imports, the space's build and the pool's start
    included; one BLAS thread per process, not pinned): wall s and its ``--json`` result without times (not
    its CPU: the pool's processes are the forkserver's children, which it does not reap, so the command's
    accounting misses them)."""
    script = Path(sys.executable).with_name("paraplan")
    cli = [str(script)] if script.exists() else [sys.executable, "-m", "app.cli"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    out = subprocess.run([*cli, *README_ARGS, "--jobs", str(jobs), "--json"], env=env, cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    return time.perf_counter() - t0, without_times(json.loads(out))


def jobs_comparison(jobs: int, repeats: int, scans: list[str]) -> bool:
    """The exhaustive engine on 1 and on ``jobs`` processes, on the Pangu space, each run a new process (so that
    neither side starts with caches the other filled: a pool's processes always start empty); prints a
    table of medians and the speedup; True where every result on ``jobs`` processes equals the one-process
    result."""
    import pickle
    import tempfile

    rows, all_same, peak_gib, size = [], True, 0.0, 0
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.pkl"
        for scan in scans:
            walls: dict[int, list[float]] = {1: [], jobs: []}
            cpus: dict[int, list[float]] = {1: [], jobs: []}
            results = {}
            for _ in range(repeats):
                for n in (1, jobs):
                    if scan == "readme":
                        wall, results[n] = _readme_run(n)
                        walls[n].append(wall)
                        continue
                    subprocess.run([sys.executable, "-c", ONE_RUN.format(path=__file__, scan=scan, n=n, out=str(out))],
                                   check=True)
                    run = pickle.loads(out.read_bytes())
                    walls[n].append(run["wall"])
                    cpus[n].append(run["cpu"])
                    results[n], size, peak_gib = run["result"], run["size"], max(peak_gib, run["peak_gib"])
            same = results[1] == results[jobs]
            all_same &= same
            one, many = statistics.median(walls[1]), statistics.median(walls[jobs])
            scored = results[1]["extra"]["configs_scored"] if scan != "readme" else results[1]["configs_scored"]
            rows.append((SCAN_NAMES[scan], f"{scored:,}", f"{one:.2f}", f"{many:.2f}", f"{one / many:.2f}x",
                         "—" if scan == "readme" else  # see _readme_run
                         f"{statistics.median(cpus[1]):.1f} / {statistics.median(cpus[jobs]):.1f}",
                         "equal" if same else "DIFFERENT"))
    table = Table(title=f"exhaustive engine on 1 and {jobs} processes, pangu ({size:,} configs, top 10; median of "
                        f"{repeats}, alternating, each run a new process; {os.cpu_count()} cores)")
    for col in ("scan", "configs scored", "1 process s", f"{jobs} processes s", "speedup", f"CPU s, 1 / {jobs}",
                "result"):
        table.add_column(col, justify="left" if col == "scan" else "right")
    for row in rows:
        table.add_row(*row)
    console = Console(width=200)
    console.print(table)
    console.print(f"peak resident memory of the largest pool process: {peak_gib:.2f} GiB (its parts of the rows and "
                  "their scoring)")
    return all_same


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exactness", action="store_true", help="check the pruned exhaustive scan on the Pangu space")
    ap.add_argument("--margin-gib", type=float, default=DEFAULT_MEMORY_MARGIN_GIB,
                    help="--exactness: the memory margin both scans rank by (default: the search's, 4 GiB)")
    ap.add_argument("--readme", action="store_true", help="time README command 1 as a whole process (5 s target)")
    ap.add_argument("--runs", type=int, default=5, help="--readme: counted runs (after one warm-up)")
    ap.add_argument("--against", type=Path, help="--readme: another checkout to time in turn with this one")
    ap.add_argument("--jobs", type=int, default=None, help="compare the exhaustive engine on 1 and on N processes")
    ap.add_argument("--repeats", type=int, default=3, help="runs per process count (with --jobs)")
    ap.add_argument("--scans", default="readme,pruned,plain",
                    help="which scans to compare (with --jobs): readme (the whole command), pruned, plain")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--budget", type=int, default=500, help="trials per sampler run")
    ap.add_argument("--cases", default="pangu,dsv3,llama")
    args = ap.parse_args()
    if args.exactness:
        sys.exit(0 if exactness(margin_gib=args.margin_gib) else 1)
    if args.readme:
        sys.exit(0 if readme(args.runs, args.against.resolve() if args.against else None) else 1)
    if args.jobs is not None:
        sys.exit(0 if jobs_comparison(args.jobs, args.repeats, args.scans.split(",")) else 1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    table = Table(title=f"search engines (median of {args.seeds} seeds, budget {args.budget} trials, one thread)")
    for col in ("case", "space size", "engine", "to reach 99 % of optimum", "wall time", "optimum tokens/s",
                "best/optimum at budget (min / median)"):
        table.add_column(col, justify="left" if col in ("case", "engine") else "right")
    for name in args.cases.split(","):
        for row in run_case(name, args.seeds, args.budget):
            table.add_row(*row)
    Console(width=200).print(table)


if __name__ == "__main__":
    main()

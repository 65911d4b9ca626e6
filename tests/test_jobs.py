"""``--jobs N`` and the worker's ``PARAPLAN_WORKER_JOBS``: the exhaustive engine, the capacity planner and the
RL planner on two processes give exactly what they give on one (every ranked config, layout, rank and
count; the plan's points; the RL plans and split rows), progress still counts up to the total, a check that
raises stops the pool and leaves no process behind, ``--jobs 0`` is an input error naming ``--jobs``, and
a worker with ``worker_jobs = 2`` runs its jobs on a pool of two with the results of one process."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

warnings.filterwarnings("ignore", message=".*httpx2.*")

from fastapi.testclient import TestClient  # noqa: E402

import hardware_profiles  # noqa: E402
import model_presets  # noqa: E402
import search.exhaustive  # noqa: E402
import search.pool  # noqa: E402
from app.service.core.config import Settings  # noqa: E402
from app.service.main import create_app  # noqa: E402
from app.service.worker import Worker  # noqa: E402
from costmodel import rl  # noqa: E402
from search.capacity import PlanRequest, run_plan  # noqa: E402
from search.exhaustive import run_exhaustive  # noqa: E402
from search.rl import RLRequest, run_rl_search  # noqa: E402
from search.space import build_space  # noqa: E402
from service_util import TINY_JOB  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TIMES = ("search_time_s", "plan_time_s")


def _without_times(x):
    """A result with its wall-clock fields left out (they differ between any two runs)."""
    if isinstance(x, dict):
        return {k: _without_times(v) for k, v in x.items() if k not in TIMES}
    if isinstance(x, list):
        return [_without_times(v) for v in x]
    return x


@pytest.fixture
def pools(monkeypatch):
    """The sizes of the process pools created while the test runs."""
    sizes: list[int] = []
    real = search.pool.Pool.__init__

    def spy(self, jobs):
        sizes.append(jobs)
        real(self, jobs)

    monkeypatch.setattr(search.pool.Pool, "__init__", spy)
    return sizes


@pytest.fixture
def submitted(monkeypatch):
    """The names of the functions sent to a pool's processes while the test runs."""
    names: list[str] = []
    real = search.pool.Pool.submit

    def spy(self, fn, *args):  # an item of Pool.map_shared by the function that scores it
        names.append(args[1].__name__ if fn is search.pool._claimed else fn.__name__)
        return real(self, fn, *args)

    monkeypatch.setattr(search.pool.Pool, "submit", spy)
    return names


# (model, cluster, devices, global batch, framework, top K, memory margin GiB, objective): a MoE space without
# a framework, MLA on Ascend, a dense model with a margin ranked by goodput; 74,000-514,000 configs
CASES = [
    ("tiny-moe", "nvidia-h100-80gb", 16, 64, None, 10, 0.0, "throughput"),
    ("tiny-mla-moe", "ascend-910b", 32, 128, "mindspeed", 5, 0.0, "throughput"),
    ("gpt-1.3b", "nvidia-a100-80gb", 64, 512, "megatron", 10, 2.0, "goodput"),
]


@pytest.mark.parametrize("model,cluster,devices,gbs,framework,k,margin,objective", CASES)
def test_exhaustive_on_two_processes_equals_one(model, cluster, devices, gbs, framework, k, margin, objective, pools,
                                                monkeypatch):
    # every group split between the processes, however small (a real search keeps groups of fewer than
    # POOL_MIN_PAIRS pairs in its own process: test_small_groups_stay_in_the_calling_process)
    monkeypatch.setattr(search.exhaustive, "POOL_MIN_PAIRS", 0)
    space = build_space(model_presets.load(model), hardware_profiles.load(cluster), devices, gbs, framework=framework)
    space.objective = objective
    for prune in (True, False):
        # groups of 20,000 pairs: several groups, each split between the processes, the cut known after the first
        progress: dict[int, list] = {1: [], 2: []}
        one, two = (run_exhaustive(space, k, batch_size=20_000, margin_gib=margin, prune=prune, jobs=jobs,
                                   progress=lambda done, total, jobs=jobs: progress[jobs].append((done, total)))
                    for jobs in (1, 2))
        assert one.configs, "the case must have feasible configs to rank"
        assert dataclasses.asdict(two) == dataclasses.asdict(one)  # configs, layouts, ranks, every count
        assert progress[2][-1] == progress[1][-1] == (space.size, space.size)
        assert [d for d, _ in progress[2]] == sorted(d for d, _ in progress[2])
    assert pools == [2, 2]


@pytest.mark.parametrize("prune,sent", [(True, "_score_part"), (False, "_score_packed")])
def test_small_groups_stay_in_the_calling_process(monkeypatch, submitted, prune, sent):
    """With a pool, a group of fewer than ``POOL_MIN_PAIRS`` pairs is scored where the search runs (sharing it
    costs more than it saves); with bounds, a larger group is split among the processes (``_score_part``), and
    without them (the plain scan) the groups are shared whole (``_score_packed``); the result is the same."""
    space = build_space(model_presets.load("tiny-moe"), hardware_profiles.load("nvidia-h100-80gb"), 16, 64)
    one = run_exhaustive(space, 10, batch_size=20_000, prune=prune)
    for min_pairs, shared in ((10**9, False), (1, True)):  # groups of about 20,000 pairs
        monkeypatch.setattr(search.exhaustive, "POOL_MIN_PAIRS", min_pairs)
        submitted.clear()
        two = run_exhaustive(space, 10, batch_size=20_000, prune=prune, jobs=2)
        assert dataclasses.asdict(two) == dataclasses.asdict(one)
        assert (sent in submitted) == shared
        assert {"_score_part", "_score_packed"} & set(submitted) <= {sent}


def test_a_plain_scan_of_few_groups_splits_them_rather_than_sharing_them(monkeypatch, submitted):
    """Without bounds, whole groups are shared only where each process gets several
    (``SHARED_GROUPS_PER_JOB``): a pass of one group is split between the processes as with bounds (shared
    whole, one process would score it while the other waited), and groups smaller than one scorer chunk
    stay in the calling process."""
    space = build_space(model_presets.load("tiny-moe"), hardware_profiles.load("nvidia-h100-80gb"), 16, 64)
    one = run_exhaustive(space, 10, batch_size=10**7, prune=False)
    monkeypatch.setattr(search.exhaustive, "POOL_MIN_PAIRS", 1)
    two = run_exhaustive(space, 10, batch_size=10**7, prune=False, jobs=2)  # one group of every pair
    assert dataclasses.asdict(two) == dataclasses.asdict(one)
    assert "_score_part" in submitted and "_score_packed" not in submitted
    monkeypatch.undo()
    submitted.clear()
    run_exhaustive(space, 10, batch_size=20_000, prune=False, jobs=2)  # groups below POOL_MIN_PAIRS
    assert not {"_score_part", "_score_packed"} & set(submitted)


def test_progress_never_goes_back_while_the_smallest_peak_is_settled(monkeypatch):
    """Nothing fits: the rows ruled out by their memory bound were counted (as pruned) in the progress; scoring
    them to settle the smallest peak moves them to scored and must not make the progress fall back."""
    monkeypatch.setattr(search.exhaustive, "POOL_MIN_PAIRS", 1)
    space = build_space(model_presets.load("llama3-70b"), hardware_profiles.load("nvidia-a100-80gb"), 8, 32)
    seen: dict[int, list] = {1: [], 2: []}
    one, two = (run_exhaustive(space, 5, batch_size=100, prune=True, jobs=jobs,
                               progress=lambda done, total, jobs=jobs: seen[jobs].append(done)) for jobs in (1, 2))
    assert not one.configs and one.smallest_peak_gib is not None, "the case must be one where nothing fits"
    assert dataclasses.asdict(two) == dataclasses.asdict(one)
    assert seen[1] == sorted(seen[1]) and seen[2] == sorted(seen[2])
    assert seen[1][-1] == seen[2][-1] == space.size


def test_a_raise_stops_the_items_a_process_has_queued_but_not_started():
    """When the caller's check raises in ``Pool.map_shared``, a process runs no item it has not started (the
    call queue holds one more than the processes, and a task there can no longer be cancelled): the pool
    closes after the item running, not after every queued one."""
    started = time.perf_counter()
    raised = {}

    def check():
        if time.perf_counter() - started > 0.3:
            raised.setdefault("at", time.perf_counter())
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        with search.pool.pool(2) as p:  # the caller and one process
            p.result(p.submit(_slept, 0.0), None)  # the process is up
            started = time.perf_counter()
            # the process's items take 1 s, the caller's 0.5 s: the caller raises at 0.5 s, while the process
            # runs its first item and two more wait in the call queue (they took 1 s more to close)
            p.map_shared(_slept, lambda seconds: time.sleep(seconds / 2), [1.0] * 8, check=check,
                         pack=lambda seconds: seconds)
    closed = time.perf_counter() - raised["at"]
    assert closed < 0.9, f"{closed:.2f} s from the raise to the pool's close: a queued item ran"


def _slept(seconds: float) -> str:
    time.sleep(seconds)
    return "process"


def test_the_caller_shares_the_work_from_the_last_item_back():
    """``Pool.map_shared``: the pool's process takes the items from the first on, the caller from the last back
    while the process has not started them; every result in the order of the items."""
    taken: list[int] = []
    items = [(i, 0.05) for i in range(40)]

    def take(item):  # as long as the process takes for an item: a caller that took none would finish first
        time.sleep(item[1])
        taken.append(item[0])

    with search.pool.pool(2) as p:  # the caller and one process
        p.result(p.submit(_slept, 0.0), None)  # the process is up (a cold one starts after the caller is done)
        out = p.map_shared(time.sleep, take, items, pack=lambda item: item[1])
    assert out == [None] * len(items)
    assert 0 < len(taken) < len(items), "both the caller and the process must have taken items"
    assert taken == list(range(len(items) - 1, len(items) - 1 - len(taken), -1))


def test_the_caller_takes_an_item_a_process_has_queued_but_not_started():
    """``ProcessPoolExecutor`` moves a submitted task into its call queue (one more than its processes) as soon
    as there is room, and a task there can no longer be cancelled though no process has started it: with one
    process and two items, both are queued at once. The caller must still take the second item (a process
    skips an item the caller has taken) rather than wait while the one process runs both in turn."""
    with search.pool.pool(2) as p:  # the caller and one process
        p.warm()
        p.result(p.submit(_slept, 0.0), None)  # the process is up: it starts the first item at once
        started = time.perf_counter()
        # check(): what the service's check costs (a database read), time for the queue to take both items
        out = p.map_shared(_slept, lambda seconds: "caller", [1.0, 1.0], check=lambda: time.sleep(0.05),
                           pack=lambda seconds: seconds)
        elapsed = time.perf_counter() - started
    assert out == ["process", "caller"]
    assert elapsed < 1.6, f"{elapsed:.2f} s: the two items ran one after the other"


def test_plan_on_two_processes_equals_one(pools):
    req = dict(spec=model_presets.load("gpt-1.3b"), profile=hardware_profiles.load("nvidia-a100-80gb"), tokens=26e9,
               devices_min=8, devices_max=48, devices_step=8, deadline_days=1.5, framework="megatron")
    progress: dict[int, list] = {1: [], 2: []}
    one, two = (run_plan(PlanRequest(**req, jobs=jobs), progress=lambda d, t, jobs=jobs: progress[jobs].append((d, t)))
                for jobs in (1, 2))
    assert [p["devices"] for p in two["points"]] == [8, 16, 24, 32, 40, 48]
    assert _without_times(two) == _without_times(one)
    assert progress[2] == progress[1] == [(i, 6) for i in range(1, 7)]  # one report per count, as counts finish
    assert pools == [2]


def test_rl_on_two_processes_equals_one(round_profile, pools):
    # 32 devices: the co-located search and three splits, the sweep stopping on its bound
    def req(jobs):
        return RLRequest(spec=model_presets.load("tiny-moe"), profile=round_profile, devices=32,
                         workload=rl.Workload(16, 8, 256, 768), training_top_k=2, jobs=jobs)

    progress: dict[int, list] = {1: [], 2: []}
    one, two = (run_rl_search(req(jobs), progress=lambda d, t, jobs=jobs: progress[jobs].append((d, t)))
                for jobs in (1, 2))
    assert one["best"] is not None and one["disaggregated"] is not None
    assert json.dumps(_without_times(two), default=str) == json.dumps(_without_times(one), default=str)
    assert progress[2][-1] == progress[1][-1]
    assert pools == [2]


def test_rl_of_the_colocated_mode_alone_runs_in_the_calling_process(round_profile, submitted):
    """With no splits to search, the co-located search is the caller's: nothing is sent to the pool, and the
    plan is the one of one process."""
    def req(jobs):
        return RLRequest(spec=model_presets.load("tiny-moe"), profile=round_profile, devices=32,
                         workload=rl.Workload(16, 8, 256, 768), training_top_k=2, modes=("colocated",), jobs=jobs)

    one = run_rl_search(req(1))
    submitted.clear()
    two = run_rl_search(req(2))
    assert one["colocated"] is not None
    assert json.dumps(_without_times(two), default=str) == json.dumps(_without_times(one), default=str)
    assert "_pooled_colocated" not in submitted


class Stop(Exception):
    pass


def test_a_check_or_progress_that_raises_stops_the_pool_and_leaves_no_process():
    space = build_space(model_presets.load("tiny-moe"), hardware_profiles.load("nvidia-h100-80gb"), 16, 64)

    def stop(*_):
        raise Stop

    with pytest.raises(Stop):
        run_exhaustive(space, 5, batch_size=20_000, jobs=2, check=stop)
    with pytest.raises(Stop):
        run_exhaustive(space, 5, batch_size=20_000, jobs=2, progress=stop)
    calls = []

    def after_two_counts():
        calls.append(1)
        if len(calls) > 2:
            raise Stop

    plan = PlanRequest(spec=model_presets.load("gpt-1.3b"), profile=hardware_profiles.load("nvidia-a100-80gb"),
                       tokens=26e9, devices_min=8, devices_max=256, devices_step=8, framework="megatron", jobs=2)
    with pytest.raises(Stop):
        run_plan(plan, check=after_two_counts)
    assert multiprocessing.active_children() == []  # every pool process joined, none left running


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)


SEARCH = ("search", "--model", "gpt-1.3b", "--cluster", "nvidia-a100-80gb", "--devices", "64",
          "--global-batch-size", "512", "--json")


@pytest.mark.parametrize("args,bad", [
    (SEARCH, "0"),
    (("plan", "--model", "gpt-1.3b", "--cluster", "nvidia-a100-80gb", "--tokens", "26B"), "-3"),
    (("rl", "--model", "tiny-moe", "--cluster", "nvidia-h100-80gb", "--devices", "16"), "two"),
])
def test_bad_jobs_exit_2_naming_jobs(args, bad):
    r = _cli(*args, "--jobs", bad)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    if bad == "two":  # click's own check of an integer option
        assert "Invalid value for '--jobs': 'two' is not a valid integer" in r.stderr, r.stderr
    else:
        assert f"error: --jobs: must be an integer of at least 1 (got {bad})" in r.stderr, r.stderr


def test_cli_search_with_two_jobs_prints_the_one_process_result():
    one, two = _cli(*SEARCH), _cli(*SEARCH, "--jobs", "2")
    assert one.returncode == two.returncode == 0, two.stderr
    assert _without_times(json.loads(two.stdout)) == _without_times(json.loads(one.stdout))


def test_jobs_with_a_sampler_is_refused_as_an_option_without_effect():
    r = _cli(*SEARCH, "--sampler", "tpe", "--jobs", "2")
    assert r.returncode == 2 and "--jobs" in r.stderr and "sampler" in r.stderr


PLAN_JOB = {"kind": "plan", "model": "gpt-1.3b", "cluster": "nvidia-a100-80gb", "tokens": 26e9, "devices_min": 8,
            "devices_max": 24, "devices_step": 8, "search": {"framework": "megatron"}}
RL_JOB = {"kind": "rl", "model": "tiny-moe", "cluster": "nvidia-h100-80gb", "devices": 16, "prompts_per_step": 16,
          "responses_per_prompt": 4, "prompt_length": 256, "response_length": 256}


def _worker_results(tmp_path, worker_jobs: int) -> list[dict]:
    """An exhaustive search, a plan and an RL job run by an in-process worker with ``worker_jobs``."""
    settings = Settings(database_url=f"sqlite:///{tmp_path / f'jobs{worker_jobs}.db'}", worker_jobs=worker_jobs)
    with TestClient(create_app(settings, run_worker=False)) as client:
        ids = [client.post("/v1/jobs", json=body).json()["id"] for body in (TINY_JOB, PLAN_JOB, RL_JOB)]
        assert Worker(settings).run_until_idle() == 3
        jobs = [client.get(f"/v1/jobs/{i}").json() for i in ids]
        assert [j["status"] for j in jobs] == ["succeeded"] * 3, jobs
        configs = client.get(f"/v1/jobs/{ids[0]}/configs").json()["items"]
    return [_without_times({"configs": configs, "summary": jobs[0]["summary"], "progress": jobs[0]["progress"]}),
            _without_times(jobs[1]["plan"]), _without_times(jobs[2]["rl"])]


def test_the_worker_runs_its_jobs_on_worker_jobs_processes(tmp_path, pools):
    one = _worker_results(tmp_path, 1)
    assert pools == []  # one process: no pool
    two = _worker_results(tmp_path, 2)
    assert pools == [2, 2, 2]  # the search, the plan and the RL job each on a pool of two
    assert json.dumps(two, default=str) == json.dumps(one, default=str)


@pytest.mark.parametrize("value", ["0", "many"])
def test_a_bad_worker_jobs_variable_stops_the_worker_naming_it(tmp_path, value):
    r = subprocess.run([sys.executable, "-m", "app.cli", "worker"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL,
                       env={**os.environ, "PARAPLAN_WORKER_JOBS": value,
                            "DATABASE_URL": f"sqlite:///{tmp_path / 'w.db'}"})
    assert r.returncode == 2
    assert "PARAPLAN_WORKER_JOBS" in r.stderr and "Traceback" not in r.stderr

"""Job throughput and recovery on SQLite, through real processes, with the service's default settings.

1. A 1,500-trial random-sampler job (Pangu Ultra MoE 718B on 6,144 Ascend 910B) on ``paraplan serve``
   with its embedded worker: seconds from POST to ``succeeded`` (target: within 150 s on 2 cores).
2. The same job, with ``paraplan serve`` killed with SIGKILL after 300 finished trials and started
   again on the same database: seconds from the restart until the job's progress moves again, and
   until it has succeeded with exactly 1,500 finished trials (target: resumed within 30 s).
3. ``paraplan serve --no-worker`` and two ``paraplan worker`` processes; the worker running the job is
   killed with SIGKILL after 300 trials: seconds until the surviving worker moves the job on (its lease
   has to run out first: ``PARAPLAN_LEASE_S``, 15 s).

Loopback only; each phase is bounded (300 s). Run from the repository root:

    .venv/bin/python benchmarks/jobs.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from service_util import Server, WorkerProcess, wait_for  # noqa: E402

TRIALS, KILL_AT, PHASE_S = 1500, 300, 300.0
JOB = {"model": "pangu-ultra-moe-718b", "cluster": "ascend-910b", "devices": 6144, "global_batch_size": 7680,
       "search": {"sampler": "random", "n_trials": TRIALS, "seed": 11}}


def _wait(url: str, job_id: str, until, timeout: float = PHASE_S) -> tuple[dict, float]:
    """``wait_for`` (tests/service_util.py) on the server at ``url``, with the seconds it took; a job that
    fails or does not get there ends the benchmark."""
    started = time.monotonic()
    with httpx.Client(base_url=url, timeout=30) as c:
        try:
            job = wait_for(c, job_id, until, timeout)
        except AssertionError as exc:
            raise SystemExit(f"job {job_id}: {exc}") from None
    return job, time.monotonic() - started


def _done(job: dict) -> int:
    return job["progress"]["trials_done"]


def one_job(tmp: Path) -> list[tuple[str, str]]:
    server = Server(tmp / "one.db", tmp / "one.log").start()
    try:
        job = httpx.post(f"{server.url}/v1/jobs", json=JOB, timeout=30).json()
        job, took = _wait(server.url, job["id"], lambda j: j["status"] == "succeeded")
    finally:
        server.stop()
    return [(f"{TRIALS}-trial random job, POST to succeeded (s)", f"{took:.1f}"),
            ("  finished trials in the job", str(job["summary"]["trials"])),
            ("  trials per second", f"{TRIALS / took:.1f}")]


def serve_killed(tmp: Path) -> list[tuple[str, str]]:
    server = Server(tmp / "kill.db", tmp / "kill.log").start()
    job = httpx.post(f"{server.url}/v1/jobs", json=JOB, timeout=30).json()
    try:
        at_kill, _ = _wait(server.url, job["id"], lambda j: _done(j) >= KILL_AT)
    finally:
        server.proc.kill()
        server.proc.wait()
    restarted = time.monotonic()
    server.start()
    try:
        _wait(server.url, job["id"], lambda j: _done(j) > _done(at_kill))
        resumed = time.monotonic() - restarted
        final, _ = _wait(server.url, job["id"], lambda j: j["status"] == "succeeded")
        ended = time.monotonic() - restarted
    finally:
        server.stop()
    return [("serve SIGKILLed at 300 trials: restart to progress again (s)", f"{resumed:.1f}"),
            ("  of which the server's start (s)", f"{server.ready_after_s:.1f}"),
            ("  restart to succeeded (s)", f"{ended:.1f}"),
            ("  finished trials in the job", str(final["summary"]["trials"]))]


def worker_killed(tmp: Path) -> list[tuple[str, str]]:
    server = Server(tmp / "workers.db", tmp / "workers.log", "--no-worker").start()
    url = server.env["DATABASE_URL"]
    workers = [WorkerProcess(url, tmp / f"w{i}.log").wait_started() for i in range(2)]
    try:
        job = httpx.post(f"{server.url}/v1/jobs", json=JOB, timeout=30).json()
        at_kill, _ = _wait(server.url, job["id"], lambda j: _done(j) >= KILL_AT)
        running = next(w for w in workers if "running random" in w.log())
        running.kill()
        _, resumed = _wait(server.url, job["id"], lambda j: _done(j) > _done(at_kill) + 10)
        final, _ = _wait(server.url, job["id"], lambda j: j["status"] == "succeeded")
    finally:
        for w in workers:
            w.stop()
        server.stop()
    return [("worker SIGKILLed at 300 trials: kill to the survivor's progress (s)", f"{resumed:.1f}"),
            ("  finished trials in the job", str(final["summary"]["trials"]))]


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="paraplan-jobs-"))
    rows = one_job(tmp) + serve_killed(tmp) + worker_killed(tmp)
    width = max(len(k) for k, _ in rows)
    print(f"\njobs on SQLite ({JOB['model']}, {JOB['devices']} devices, random sampler)")
    print(f"{'measure':<{width}}  value")
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

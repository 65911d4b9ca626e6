"""Load test of the service on PostgreSQL: many small jobs from many clients, two workers.

Starts a PostgreSQL server on loopback (``scripts/postgres_server.py``, PostgreSQL's durable defaults),
``paraplan serve --no-worker`` on it and two ``paraplan worker`` processes, then ``--clients`` (50)
concurrent clients submit ``--jobs`` (1,000) small jobs between them (``tiny-dense`` on 8 H100s, a
20-trial TPE search each) and poll until every job has finished. The per-key queued-jobs cap
(``PARAPLAN_MAX_QUEUED_JOBS``) is raised above the job count so that every job is accepted.

It checks that every job was accepted (202), that every one succeeded, that none ran twice (each was
claimed once, and its study holds exactly its 20 finished trials and no other) and prints a table:
submission latency and rate, jobs and trials finished per second, the wall time. Bounded in time:
``--timeout`` (1,800 s) after the first submission it stops, reports what finished, and exits 1.
With ``--faults`` it runs the fault and hostile-client cases instead (``benchmarks/faults.py``: the
biggest evaluates at once, a same-key burst, a 20 s PostgreSQL restart mid-job, a frozen database, DELETE
of a running job, a second key beside a big job, 200 concurrent reads, a 50 s freeze, the hostile bodies,
DELETE among 1,500 studies, the 10,000-layer body), one row each; ``--case NAME`` (repeatable) picks some. Loopback only. Run from the repository root:

    .venv/bin/python benchmarks/load.py [--jobs 1000] [--clients 50] [--workers 2]
    .venv/bin/python benchmarks/load.py --faults
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))

from postgres_server import PostgresServer  # noqa: E402
from service_util import Server, WorkerProcess  # noqa: E402

TRIALS = 20
JOB = {"model": "tiny-dense", "cluster": "nvidia-h100-80gb", "devices": 8, "global_batch_size": 64,
       "search": {"sampler": "tpe", "n_trials": TRIALS, "top_k": 5}}


async def submit_all(url: str, n_jobs: int, n_clients: int) -> tuple[list[str], list[float], list[int]]:
    """Each client submits its share of the jobs one after another; returns ids, latencies, statuses."""
    ids, latencies, statuses = [], [], []

    async def client(share: int, offset: int) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            for i in range(share):
                body = {**JOB, "search": {**JOB["search"], "seed": offset + i}}
                started = time.perf_counter()
                r = await c.post("/v1/jobs", json=body, headers={"Idempotency-Key": f"load-{offset + i}"})
                latencies.append(time.perf_counter() - started)
                statuses.append(r.status_code)
                if r.status_code == 202:
                    ids.append(r.json()["id"])

    shares = [n_jobs // n_clients + (1 if k < n_jobs % n_clients else 0) for k in range(n_clients)]
    offsets = [sum(shares[:k]) for k in range(n_clients)]
    await asyncio.gather(*(client(s, o) for s, o in zip(shares, offsets)))
    return ids, latencies, statuses


def wait_finished(url: str, n_jobs: int, deadline: float) -> dict[str, int]:
    """Poll the job counts until ``n_jobs`` have finished or the deadline passes."""
    with httpx.Client(base_url=url, timeout=60) as c:
        while True:
            counts = {s: c.get("/v1/jobs", params={"status": s, "limit": 1}).json()["total"]
                      for s in ("queued", "running", "succeeded", "failed", "cancelled")}
            finished = counts["succeeded"] + counts["failed"] + counts["cancelled"]
            print(f"\r  finished {finished}/{n_jobs}  running {counts['running']}  queued {counts['queued']}",
                  end="", file=sys.stderr, flush=True)
            if finished >= n_jobs or time.monotonic() > deadline:
                print(file=sys.stderr)
                return counts
            time.sleep(1.0)


def check_runs(database_url: str, ids: list[str]) -> dict[str, int]:
    """Claims per job and trials per study, read from the database."""
    import optuna
    from sqlalchemy import create_engine, text

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    engine = create_engine(database_url)
    with engine.connect() as conn:
        attempts = dict(conn.execute(text("SELECT id, attempts FROM jobs")).all())
        trials = dict(conn.execute(text(
            "SELECT s.study_name, count(*) FROM trials t JOIN studies s ON s.study_id = t.study_id "
            "GROUP BY s.study_name")).all())
        complete = dict(conn.execute(text(
            "SELECT s.study_name, count(*) FROM trials t JOIN studies s ON s.study_id = t.study_id "
            "WHERE t.state = 'COMPLETE' GROUP BY s.study_name")).all())
    engine.dispose()
    names = [f"paraplan-job-{i}" for i in ids]
    return {"claimed more than once": sum(attempts.get(i, 0) != 1 for i in ids),
            "studies with other than 20 trials": sum(trials.get(n, 0) != TRIALS for n in names),
            "studies with other than 20 finished trials": sum(complete.get(n, 0) != TRIALS for n in names)}


def main() -> int:
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up the servers on SIGTERM too
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=1800.0, help="Seconds after the first submission.")
    ap.add_argument("--faults", action="store_true", help="Instead, the database-fault and hostile-client "
                                                          "cases (benchmarks/faults.py), one row each.")
    ap.add_argument("--case", action="append", help="With --faults: only these cases (repeatable).")
    args = ap.parse_args()
    if args.faults:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        import faults

        return faults.run(args.case or list(faults.CASES))
    tmp = Path(tempfile.mkdtemp(prefix="paraplan-load-"))
    env = {"PARAPLAN_MAX_QUEUED_JOBS": str(args.jobs + 1), "PARAPLAN_POLL_S": "0.2"}
    with PostgresServer(durable=True) as pg:
        url = pg.url
        server = Server(url, tmp / "serve.log", "--no-worker", env=env).start()
        workers = [WorkerProcess(url, tmp / f"worker{i}.log", env=env).wait_started() for i in range(args.workers)]
        try:
            started = time.monotonic()
            ids, latencies, statuses = asyncio.run(submit_all(server.url, args.jobs, args.clients))
            submitted_s = time.monotonic() - started
            counts = wait_finished(server.url, args.jobs, started + args.timeout)
            total_s = time.monotonic() - started
        finally:
            for w in workers:
                w.stop()
            server.stop()
        runs = check_runs(url, ids)
    accepted = statuses.count(202)
    q = statistics.quantiles(latencies, n=100)
    rows = [
        ("jobs submitted / accepted (202)", f"{len(statuses)} / {accepted}"),
        ("clients / workers", f"{args.clients} / {args.workers}"),
        ("submit latency median / p99 (ms)", f"{statistics.median(latencies) * 1e3:.1f} / {q[98] * 1e3:.1f}"),
        ("submissions per second", f"{len(statuses) / submitted_s:.1f}"),
        ("succeeded / failed / cancelled", f"{counts['succeeded']} / {counts['failed']} / {counts['cancelled']}"),
        ("wall time, first submit to last finish (s)", f"{total_s:.1f}"),
        ("jobs finished per second", f"{counts['succeeded'] / total_s:.2f}"),
        ("trials finished per second", f"{counts['succeeded'] * TRIALS / total_s:.1f}"),
        *((k, str(v)) for k, v in runs.items()),
    ]
    width = max(len(k) for k, _ in rows)
    print(f"\nload test: {args.jobs} jobs ({JOB['model']}, {TRIALS}-trial TPE) on PostgreSQL, {os.cpu_count()} cores")
    print(f"{'measure':<{width}}  value")
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    ok = accepted == args.jobs and counts["succeeded"] == args.jobs and not any(runs.values())
    print("OK: every job accepted, finished once" if ok else "FAILED: see the table", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

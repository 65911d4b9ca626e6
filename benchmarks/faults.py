"""The service under load, database faults and hostile clients, one case after another on PostgreSQL.

Every case starts its own ``paraplan serve`` (and workers) on a new database of one PostgreSQL server
on loopback (``scripts/postgres_server.py``, durable defaults), does what the issue found breaking the
service, and prints one row: what was measured and whether it held.

1. **Biggest evaluates**: 40 concurrent ``POST /v1/evaluate`` of a model at every bound on 1,000,000
   devices (a 10,000-stage pipeline; 100 stages of 50 uneven chunks), while ``/healthz`` and a small
   evaluate are probed: answers, the server's peak resident memory (bound: 512 MiB), slowest probe.
2. **Same-key burst**: 200 concurrent ``POST /v1/jobs`` with one Idempotency-Key, probes of other keys
   meanwhile: jobs made (1), 5xx (0), slowest probe (< 1 s).
3. **20 s PostgreSQL restart**: a 300-trial TPE job on 3 workers; PostgreSQL stopped for 20 s after 40
   trials: the job's end (``succeeded``) and its finished trials (exactly 300).
4. **Frozen database**: PostgreSQL SIGSTOPped for 8 s: ``/healthz`` (200 within 1 s), ``/readyz`` (503),
   ``/v1/evaluate`` (200).
5. **DELETE of a running job** on 2 workers: its answer (204) and whether its Optuna study is left (no).
6. **Second key**: key A's ``parallel_workers: 64`` job on 2 workers, then key B's small job: seconds
   until B's job succeeded (< 60) while A's kept running.
7. **Read burst**: 200 concurrent ``GET /v1/jobs/{id}``: answers (200, or 503 with Retry-After), client
   timeouts (0), the slowest, and the first read after the burst (< 1 s: the pool was not left drained).
8. **50 s freeze**: PostgreSQL SIGSTOPped for 50 s while a client reads a job and submits one every
   second: every answer 503 with Retry-After within the request bound (``PARAPLAN_DB_REQUEST_TIMEOUT_S``,
   10 s) plus a second, ``/healthz`` 200 throughout, and 200 again within seconds of the thaw.
9. **Hostile bodies**: each body of ``tests/test_hostile.py`` (lone surrogates, NUL, 500 nested objects,
   a 5,000-digit layout repeat, a 300-character cluster name, ...) on one keep-alive connection: 422s
   naming the field (all), connections dropped (0), 5xx (0).
10. **DELETE among 1,500 studies**: a finished job's DELETE with 1,500 other studies of 10 trials each in
   the database: 204 in under 2 s.
11. **Widest body**: the 10,000-layer job of the hostile test: accepted within its bound (30 s) and the
   API's peak resident memory (< 512 MiB).

Loopback only. Run from the repository root (``benchmarks/load.py --faults`` runs the same):

    .venv/bin/python benchmarks/faults.py [--case NAME ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))

from postgres_server import PostgresServer  # noqa: E402
from service_util import (BIGGEST_EVALUATES, MEMORY_BOUND_MIB, PANGU_JOB, TINY_JOB, Server,  # noqa: E402
                          WorkerProcess, peak_rss_mib, raw_request, wait_for)

SMALL_EVALUATE = {"model": "tiny-dense", "cluster": "nvidia-h100-80gb", "devices": 8,
                  "config": {"tp": 2, "pp": 1, "micro_batch_size": 1, "global_batch_size": 8}}
KEYS = {"PARAPLAN_API_KEYS": "key-a-0123456789,key-b-0123456789"}
AUTH_A, AUTH_B = ({"Authorization": f"Bearer key-{k}-0123456789"} for k in "ab")


def new_database(pg: PostgresServer) -> str:
    """A new empty database on ``pg``; its URL."""
    from sqlalchemy import create_engine, text

    name = f"faults_{uuid.uuid4().hex[:10]}"
    engine = create_engine(pg.url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return pg.url.rsplit("/", 1)[0] + f"/{name}"


async def _probe_while(port: int, tasks: list, probes: list, requests: list) -> None:
    """Send ``requests`` (method, path, body, headers) one after another until ``tasks`` are done."""
    while not all(t.done() for t in tasks) or not probes:
        for method, path, body, headers in requests:
            started = time.monotonic()
            status, _, _ = await raw_request(port, method, path, body, headers)
            probes.append((path, status, time.monotonic() - started))
        await asyncio.sleep(0.1)


def biggest_evaluates(pg: PostgresServer, tmp: Path) -> tuple[str, bool]:
    server = Server(new_database(pg), tmp / "heavy.log", "--no-worker").start()
    try:
        async def run():
            heavy = [asyncio.create_task(raw_request(server.port, "POST", "/v1/evaluate", BIGGEST_EVALUATES[i % 2]))
                     for i in range(40)]
            probes: list = []
            await _probe_while(server.port, heavy, probes, [("GET", "/healthz", None, None),
                                                             ("POST", "/v1/evaluate", SMALL_EVALUATE, None)])
            return await asyncio.gather(*heavy), probes

        started = time.monotonic()
        answers, probes = asyncio.run(run())
        took = time.monotonic() - started
        alive = server.proc.poll() is None
        peak = peak_rss_mib(server.proc.pid) if alive else float("nan")
    finally:
        server.stop()
    ok = sum(a[0] == 200 for a in answers)
    busy = sum(a[0] == 503 and json.loads(a[2])["detail"][0]["type"] == "busy" for a in answers)
    slowest = max(p[2] for p in probes)
    held = alive and ok + busy == 40 and peak < MEMORY_BOUND_MIB and slowest < 1 and all(p[1] == 200 for p in probes)
    return (f"40 at once: {ok} x 200, {busy} x 503 busy, in {took:.1f} s; peak RSS {peak:.0f} MiB (bound "
            f"{MEMORY_BOUND_MIB}); slowest probe {slowest:.3f} s"), held


def same_key_burst(pg: PostgresServer, tmp: Path) -> tuple[str, bool]:
    server = Server(new_database(pg), tmp / "burst.log", "--no-worker").start()
    try:
        async def run():
            burst = [asyncio.create_task(raw_request(server.port, "POST", "/v1/jobs", TINY_JOB,
                                                     {"Idempotency-Key": "one-key"})) for _ in range(200)]
            probes: list = []
            await _probe_while(server.port, burst, probes, [
                ("GET", "/healthz", None, None),
                ("POST", "/v1/jobs", TINY_JOB, {"Idempotency-Key": f"other-{uuid.uuid4().hex}"})])
            return await asyncio.gather(*burst), probes

        answers, probes = asyncio.run(run())
    finally:
        server.stop()
    jobs = {json.loads(a[2])["id"] for a in answers if a[0] == 202}
    five = sum(a[0] >= 500 for a in answers) + sum(p[1] >= 500 for p in probes)
    slowest = max(p[2] for p in probes)
    counts = {s: sum(a[0] == s for a in answers) for s in sorted({a[0] for a in answers})}
    return (f"200 POSTs, one key: {len(jobs)} job, answers {counts}, 5xx {five}; slowest other request "
            f"{slowest:.3f} s"), len(jobs) == 1 and five == 0 and slowest < 1


def postgres_restart(pg: PostgresServer, tmp: Path) -> tuple[str, bool]:
    import optuna

    url = new_database(pg)
    n = 300
    body = {**PANGU_JOB, "search": {"sampler": "tpe", "n_trials": n, "seed": 5, "parallel_workers": 3}}
    server = Server(url, tmp / "restart.log").start()
    workers = [WorkerProcess(url, tmp / f"restart-worker{i}.log").wait_started() for i in range(2)]
    try:
        with server.client() as c:
            job = c.post("/v1/jobs", json=body).raise_for_status().json()
            wait_for(c, job["id"], until=lambda j: j["progress"]["trials_done"] >= 40, timeout=300)
            pg.restart(20)
            done = wait_for(c, job["id"], timeout=None, stall=120)
    finally:
        for w in workers:
            w.stop()
        server.stop()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=f"paraplan-job-{job['id']}", storage=url)
    complete = sum(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    return (f"3 workers, PostgreSQL down 20 s after 40 trials: {done['status']}, {complete} finished trials "
            f"of {n}"), done["status"] == "succeeded" and complete == n


def frozen_database(pg: PostgresServer, tmp: Path) -> tuple[str, bool]:
    server = Server(new_database(pg), tmp / "frozen.log", "--no-worker").start()
    seen: dict[str, list] = {"/healthz": [], "/readyz": [], "/v1/evaluate": []}
    try:
        with server.client() as c:
            pg.freeze()
            try:
                until = time.monotonic() + 8
                while time.monotonic() < until:
                    for path in seen:
                        started = time.monotonic()
                        r = c.post(path, json=SMALL_EVALUATE) if path == "/v1/evaluate" else c.get(path)
                        seen[path].append((r.status_code, time.monotonic() - started))
            finally:
                pg.thaw()
    finally:
        server.stop()
    health, ready, evaluate = (seen[p] for p in ("/healthz", "/readyz", "/v1/evaluate"))
    held = (all(s == 200 and t < 1 for s, t in health) and all(s == 503 for s, _ in ready)
            and all(s == 200 for s, _ in evaluate))
    return (f"frozen 8 s: /healthz {sorted({s for s, _ in health})} slowest {max(t for _, t in health):.3f} s; "
            f"/readyz {sorted({s for s, _ in ready})} slowest {max(t for _, t in ready):.1f} s; /v1/evaluate "
            f"{sorted({s for s, _ in evaluate})}"), held


def delete_running(pg: PostgresServer, tmp: Path) -> tuple[str, bool]:
    import optuna

    url = new_database(pg)
    body = {**PANGU_JOB, "search": {"sampler": "tpe", "n_trials": 3000, "seed": 9, "parallel_workers": 2}}
    server = Server(url, tmp / "delete.log").start()
    worker = WorkerProcess(url, tmp / "delete-worker.log").wait_started()
    try:
        with server.client() as c:
            job = c.post("/v1/jobs", json=body).raise_for_status().json()
            wait_for(c, job["id"], until=lambda j: j["progress"]["trials_done"] >= 20, timeout=300)
            started = time.monotonic()
            status = c.delete(f"/v1/jobs/{job['id']}").status_code
            took = time.monotonic() - started
    finally:
        worker.stop()
        server.stop()
    names = {s.study_name for s in optuna.study.get_all_study_summaries(url, include_best_trial=False)}
    left = f"paraplan-job-{job['id']}" in names
    return (f"DELETE of a 2-worker job mid-run: {status} in {took:.1f} s; study left: {'yes' if left else 'no'}",
            status == 204 and not left)


def second_key(pg: PostgresServer, tmp: Path) -> tuple[str, bool]:
    url = new_database(pg)
    env = {**KEYS, "PARAPLAN_FAIR_YIELD_S": "1"}
    server = Server(url, tmp / "fair.log", env=env).start()
    worker = WorkerProcess(url, tmp / "fair-worker.log", env=env).wait_started()
    try:
        with server.client(headers=AUTH_A) as a, server.client(headers=AUTH_B) as b:
            big = a.post("/v1/jobs", json={**PANGU_JOB, "search": {
                "sampler": "tpe", "n_trials": 5000, "seed": 11, "parallel_workers": 64}}).raise_for_status().json()
            wait_for(a, big["id"], until=lambda j: j["progress"]["trials_done"] >= 20, timeout=300)
            small = b.post("/v1/jobs", json=TINY_JOB).raise_for_status().json()
            started = time.monotonic()
            done = wait_for(b, small["id"], timeout=300)
            took = time.monotonic() - started
            a_status = a.get(f"/v1/jobs/{big['id']}").json()["status"]
            a.post(f"/v1/jobs/{big['id']}/cancel")
    finally:
        worker.stop()
        server.stop()
    return (f"key B's job beside key A's parallel_workers-64 job on 2 workers: {done['status']} {took:.1f} s "
            f"after submission; A's job meanwhile {a_status}"),\
        done["status"] == "succeeded" and took < 60 and a_status == "running"


def read_burst(pg: PostgresServer, tmp: Path) -> tuple[str, bool]:
    server = Server(new_database(pg), tmp / "reads.log", "--no-worker").start()
    try:
        with server.client() as c:
            job = c.post("/v1/jobs", json=TINY_JOB).raise_for_status().json()

        async def run():
            async def one():
                started = time.monotonic()
                status, headers, _ = await asyncio.wait_for(
                    raw_request(server.port, "GET", f"/v1/jobs/{job['id']}"), 30)
                return status, headers, time.monotonic() - started
            return await asyncio.gather(*(one() for _ in range(200)), return_exceptions=True)

        answers = asyncio.run(run())
        with server.client() as c:
            started = time.monotonic()
            after_status = c.get(f"/v1/jobs/{job['id']}").status_code
            after_s = time.monotonic() - started
    finally:
        server.stop()
    timeouts = sum(isinstance(a, BaseException) for a in answers)
    done = [a for a in answers if not isinstance(a, BaseException)]
    ok, busy = sum(a[0] == 200 for a in done), sum(a[0] == 503 and "retry-after" in a[1] for a in done)
    slowest = max((a[2] for a in done), default=float("nan"))
    return (f"200 concurrent GETs: {ok} x 200, {busy} x 503 Retry-After, {timeouts} timeouts, slowest "
            f"{slowest:.2f} s; next read {after_status} in {after_s:.3f} s"), \
        timeouts == 0 and ok + busy == 200 and after_status == 200 and after_s < 1


def long_freeze(pg: PostgresServer, tmp: Path, freeze_s: float = 50.0) -> tuple[str, bool]:
    from app.service.core.config import Settings

    bound = Settings().db_request_timeout_s
    server = Server(new_database(pg), tmp / "freeze50.log", "--no-worker").start()
    seen: list[tuple[str, int, bool, float]] = []
    try:
        with server.client() as c:  # its 30 s timeout is past the bound: a held request shows as slow
            job = c.post("/v1/jobs", json=TINY_JOB).raise_for_status().json()
            pg.freeze()
            try:
                until = time.monotonic() + freeze_s
                while time.monotonic() < until:
                    for method, path, body in (("GET", f"/v1/jobs/{job['id']}", None), ("POST", "/v1/jobs", TINY_JOB),
                                               ("GET", "/healthz", None)):
                        started = time.monotonic()
                        r = c.request(method, path, json=body)
                        seen.append((path, r.status_code, "retry-after" in r.headers, time.monotonic() - started))
                    time.sleep(1.0)
            finally:
                pg.thaw()
            thawed = time.monotonic()
            while c.get(f"/v1/jobs/{job['id']}").status_code != 200 and time.monotonic() - thawed < 30:
                time.sleep(0.2)
            back_s = time.monotonic() - thawed
    finally:
        server.stop()
    db = [x for x in seen if x[0] != "/healthz"]
    health = [x for x in seen if x[0] == "/healthz"]
    slowest = max(x[3] for x in db)
    answered = all(x[1] == 503 and x[2] for x in db)
    held = answered and slowest < bound + 1 and all(x[1] == 200 and x[3] < 1 for x in health) and back_s < 15
    return (f"frozen {freeze_s:.0f} s: {len(db)} reads and POSTs, all 503 Retry-After: {'yes' if answered else 'no'}, "
            f"slowest {slowest:.1f} s (bound {bound:g} s); /healthz slowest {max(x[3] for x in health):.3f} s; "
            f"200 again {back_s:.1f} s after the thaw"), held


def hostile_bodies(pg: PostgresServer, tmp: Path) -> tuple[str, bool]:
    import http.client

    from test_hostile import HOSTILE

    server = Server(new_database(pg), tmp / "hostile.log", "--no-worker").start()
    named = dropped = five = 0
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        conn.connect()
        for _, method, path, body, loc in HOSTILE:
            sock = conn.sock
            conn.request(method, path, body=json.dumps(body), headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            data = json.loads(r.read() or b"{}")
            five += r.status >= 500
            named += r.status == 422 and data["detail"][0]["loc"][:len(loc)] == loc
            if r.will_close or conn.sock is not sock:
                dropped += 1
                conn.close()
                conn.connect()
        conn.close()
    finally:
        server.stop()
    return (f"{len(HOSTILE)} hostile bodies: {named} x 422 naming the field, {five} x 5xx, {dropped} connections "
            f"dropped"), named == len(HOSTILE) and five == 0 and dropped == 0


def delete_among_studies(pg: PostgresServer, tmp: Path) -> tuple[str, bool]:
    from test_hostile import delete_among_studies

    url = new_database(pg)
    server = Server(url, tmp / "delete1500.log").start()
    try:
        with server.client() as c:
            _, r, took = delete_among_studies(c, url)
            status = r.status_code
    finally:
        server.stop()
    return f"DELETE with 1,500 studies x 10 trials: {status} in {took:.2f} s", status == 204 and took < 2


def widest_body(pg: PostgresServer, tmp: Path) -> tuple[str, bool]:
    from test_hostile import MEMORY_BOUND_MIB as BOUND_MIB, TEN_THOUSAND_LAYERS, WIDEST_JOB_BOUND_S

    server = Server(new_database(pg), tmp / "widest.log", "--no-worker").start()
    try:
        with httpx.Client(base_url=server.url, timeout=WIDEST_JOB_BOUND_S * 4) as c:
            started = time.monotonic()
            status = c.post("/v1/jobs", json=TEN_THOUSAND_LAYERS).status_code
            took = time.monotonic() - started
        peak = peak_rss_mib(server.proc.pid)
    finally:
        server.stop()
    return (f"10,000-layer job: {status} in {took:.1f} s (bound {WIDEST_JOB_BOUND_S:g} s); peak RSS {peak:.0f} MiB "
            f"(bound {BOUND_MIB})"), status == 202 and took < WIDEST_JOB_BOUND_S and peak < BOUND_MIB


CASES = {"biggest-evaluates": biggest_evaluates, "same-key-burst": same_key_burst,
         "postgres-restart": postgres_restart, "frozen-database": frozen_database,
         "delete-running": delete_running, "second-key": second_key, "read-burst": read_burst,
         "frozen-50s": long_freeze, "hostile-bodies": hostile_bodies, "delete-1500-studies": delete_among_studies,
         "widest-body": widest_body}


def run(cases: list[str]) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="paraplan-faults-"))
    rows = []
    with PostgresServer(durable=True) as pg:
        for name in cases:
            print(f"  {name} ...", file=sys.stderr, flush=True)
            started = time.monotonic()
            try:
                measured, held = CASES[name](pg, tmp)
            except (AssertionError, httpx.HTTPError, RuntimeError) as exc:
                measured, held = f"error: {str(exc).splitlines()[0][:200]}", False
            rows.append((name, measured, held, time.monotonic() - started))
    width = max(len(r[0]) for r in rows)
    print(f"\nfaults on PostgreSQL, logs in {tmp}")
    print(f"{'case':<{width}}  held  {'s':>5}  measured")
    for name, measured, held, seconds in rows:
        print(f"{name:<{width}}  {'yes' if held else 'NO':<4}  {seconds:5.0f}  {measured}")
    return 0 if all(r[2] for r in rows) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", action="append", choices=list(CASES), help="Run only these cases (repeatable).")
    return run(ap.parse_args().case or list(CASES))


if __name__ == "__main__":
    sys.exit(main())

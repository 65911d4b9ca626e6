"""The service under load and database faults, over real HTTP (`paraplan serve` on loopback): a burst
of one Idempotency-Key, database errors as 503, liveness apart from readiness, DELETE of a running job,
degenerate profiles, the biggest evaluates at once under a memory bound.

The bursts are sent with raw asyncio streams (a few microseconds of client CPU per request), so that what
is measured is the server, not an HTTP client sharing the two cores with it."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from service_util import (BIGGEST_EVALUATES, MEMORY_BOUND_MIB, TINY_JOB, Server, peak_rss_mib, raw_request,
                          set_connections, wait_for)

BURST = 200


@pytest.mark.serial
@pytest.mark.parametrize("database_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
                         indirect=True)
def test_burst_of_one_idempotency_key_makes_one_job_and_others_are_answered(database_url, tmp_path):
    """200 concurrent POSTs with one Idempotency-Key: one job, every answer a 202 (the job, or its replay)
    or a 409 `idempotency_in_progress` with Retry-After, no 5xx; meanwhile other requests (liveness, a
    read, a POST with another key), sent one after the other, are each answered within 1 s."""
    server = Server(database_url, tmp_path / "server.log", "--no-worker").start()
    try:
        asyncio.run(_burst(server, tmp_path))
    finally:
        server.stop()


async def _burst(server: Server, tmp_path) -> None:
    port = server.port
    done = asyncio.Event()
    probes: list[tuple[str, int, float]] = []

    async def probe() -> None:
        i = 0
        while not done.is_set() or i < 3:
            for method, path, body, headers in (
                    ("GET", "/healthz", None, None), ("GET", "/v1/jobs?limit=1", None, None),
                    ("POST", "/v1/jobs", TINY_JOB, {"Idempotency-Key": f"other-{i}"})):
                started = time.monotonic()
                status, _, _ = await raw_request(port, method, path, body, headers)
                probes.append((f"{method} {path}", status, time.monotonic() - started))
            i += 1

    async def same_key():
        return await raw_request(port, "POST", "/v1/jobs", TINY_JOB, {"Idempotency-Key": "one-key"})

    # Warm: the first job of a process imports the search and builds its first space (cold, ~1 s).
    status, _, _ = await raw_request(port, "POST", "/v1/jobs", TINY_JOB, {"Idempotency-Key": "warm-up"})
    assert status == 202
    prober = asyncio.create_task(probe())
    await asyncio.sleep(0.05)
    answers = await asyncio.gather(*(same_key() for _ in range(BURST)))
    done.set()
    await prober

    statuses = [status for status, _, _ in answers]
    assert set(statuses) <= {202, 409}, sorted(set(statuses))
    ids = {json.loads(content)["id"] for status, _, content in answers if status == 202}
    assert len(ids) == 1, ids
    for status, fields, content in answers:
        if status == 409:
            detail = json.loads(content)["detail"][0]
            assert detail["type"] == "idempotency_in_progress" and fields["retry-after"] == "1", detail
    # After the burst the key replays its job.
    status, fields, content = await raw_request(port, "POST", "/v1/jobs", TINY_JOB, {"Idempotency-Key": "one-key"})
    assert status == 202 and fields["idempotent-replayed"] == "true" and json.loads(content)["id"] in ids
    status, _, content = await raw_request(port, "GET", "/v1/jobs?limit=200")
    jobs = json.loads(content)["items"]
    others = sum(1 for _, s, _ in probes if s == 202)
    assert len(jobs) == 2 + others, (len(jobs), others)  # the warm-up, the burst's, the probes'
    assert all(s in (200, 202) for _, s, _ in probes), probes
    slow = [p for p in probes if p[2] > 1.0]
    assert not slow, f"answered after more than 1 s during the burst: {slow} of {len(probes)}"
    report = {"statuses": {s: statuses.count(s) for s in set(statuses)},
              "probe_max_s": {name: round(max(d for n, _, d in probes if n == name), 3)
                              for name in {n for n, _, _ in probes}}}
    (tmp_path / "burst.json").write_text(json.dumps(report))
    print("burst:", report)
    assert "QueuePool limit" not in server.log() and "Traceback" not in server.log()


# ------------------------------------------------------------------------------------------------
# database errors: 503 with Retry-After on a kept connection; liveness apart from readiness


def keep_alive_pair(port: int, first: str, second: str) -> list[tuple[int, dict, dict]]:
    """Two GETs on one keep-alive connection; each (status, headers, JSON body). A server that closed the
    connection after the first answer fails the second with a ConnectionError or an empty read."""
    import socket

    answers = []
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        stream = sock.makefile("rb")
        for path in (first, second):
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
            status_line = stream.readline()
            assert status_line, f"the server closed the connection before answering {path}"
            fields = {}
            while (line := stream.readline()) not in (b"\r\n", b""):
                k, _, v = line.decode("latin-1").partition(":")
                fields[k.strip().lower()] = v.strip()
            body = stream.read(int(fields["content-length"]))
            answers.append((int(status_line.split()[1]), fields, json.loads(body)))
    return answers


EVALUATE = {"model": "tiny-moe", "cluster": "nvidia-h100-80gb", "devices": 8,
            "config": {"tp": 2, "pp": 1, "ep": 2, "micro_batch_size": 1, "global_batch_size": 64}}


@pytest.mark.serial
@pytest.mark.postgres
def test_database_outage_is_503_with_retry_after_on_a_kept_connection(postgres_url, tmp_path):
    """PostgreSQL refuses the service's database: job routes answer 503 with Retry-After and a JSON body
    on the same keep-alive connection; /healthz stays 200, /readyz is 503 not ready, /v1/evaluate works
    (it never touches the database). Connections let in again: ready, and the routes answer 200."""
    import os

    import httpx
    from sqlalchemy.engine import make_url

    server = Server(postgres_url, tmp_path / "server.log", "--no-worker",
                    env={"PARAPLAN_DB_CONNECT_TIMEOUT_S": "2", "PARAPLAN_READY_TIMEOUT_S": "2"}).start()
    admin, database = os.environ["PARAPLAN_TEST_POSTGRES_URL"], make_url(postgres_url).database
    try:
        with server.client() as c:
            job = c.post("/v1/jobs", json=TINY_JOB).raise_for_status().json()
            assert c.get("/readyz").json()["status"] == "ready"
        set_connections(admin, database, allow=False)
        try:
            started = time.monotonic()
            answers = keep_alive_pair(server.port, f"/v1/jobs/{job['id']}", "/v1/jobs")
            for status, fields, body in answers:
                assert status == 503 and fields["retry-after"] == "5", (status, body)
                assert body["detail"][0]["type"] == "database_unavailable"
                assert fields.get("connection", "").lower() != "close"
            with server.client() as c:
                live = c.get("/healthz")
                assert live.status_code == 200 and live.json()["status"] == "ok"
                ready = c.get("/readyz")
                assert ready.status_code == 503 and ready.json()["status"] == "not ready", ready.text
                assert ready.headers["retry-after"]
                assert c.post("/v1/evaluate", json=EVALUATE).status_code == 200
                assert c.delete(f"/v1/jobs/{job['id']}").status_code == 503
            outage_s = time.monotonic() - started
        finally:
            set_connections(admin, database, allow=True)
        with httpx.Client(base_url=server.url, timeout=30) as c:
            assert c.get("/readyz").status_code == 200
            assert c.get(f"/v1/jobs/{job['id']}").json()["id"] == job["id"]
        assert outage_s < 20, outage_s
        log = server.log()
        assert "Exception in ASGI application" not in log and "database unavailable" in log
    finally:
        server.stop()


@pytest.mark.serial
@pytest.mark.postgres
def test_a_locked_table_times_out_as_503_while_liveness_and_evaluate_answer(postgres_url, tmp_path):
    """A database that does not answer (here: the jobs table locked by another session): a job read is a
    503 after the statement timeout, not a hang, and /healthz and /v1/evaluate answer meanwhile."""
    import concurrent.futures

    import httpx
    from sqlalchemy import create_engine, text

    server = Server(postgres_url, tmp_path / "server.log", "--no-worker",
                    env={"PARAPLAN_DB_STATEMENT_TIMEOUT_S": "2"}).start()
    locker = create_engine(postgres_url)
    try:
        with server.client() as c:
            c.post("/v1/jobs", json=TINY_JOB).raise_for_status()
        with locker.connect() as conn:
            conn.execute(text("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE"))
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                started = time.monotonic()
                reads = [pool.submit(httpx.get, f"{server.url}/v1/jobs", timeout=30) for _ in range(4)]
                time.sleep(0.3)
                quick = []
                for path, call in (("/healthz", lambda: httpx.get(f"{server.url}/healthz", timeout=5)),
                                   ("/v1/evaluate", lambda: httpx.post(f"{server.url}/v1/evaluate", json=EVALUATE,
                                                                       timeout=5))):
                    t = time.monotonic()
                    assert call().status_code == 200, path
                    quick.append(time.monotonic() - t)
                statuses = [f.result().status_code for f in reads]
                waited = time.monotonic() - started
            conn.rollback()
        assert statuses == [503] * 4, statuses
        assert 1.5 < waited < 10, waited
        assert max(quick) < 1.0, quick
    finally:
        locker.dispose()
        server.stop()


def test_database_errors_are_503_not_500(tmp_path, monkeypatch):
    """In-process: an OperationalError, a pool timeout or Optuna's storage error under a route is a 503
    with Retry-After and the JSON error shape; a constraint error (a bug) stays a JSON 500."""
    import optuna
    from fastapi.testclient import TestClient
    from sqlalchemy.exc import IntegrityError, OperationalError
    from sqlalchemy.exc import TimeoutError as PoolTimeout

    from app.service.core.config import Settings
    from app.service.main import create_app
    from app.service.services import jobs as service

    errors = [OperationalError("SELECT 1", {}, Exception("database or disk is full")),
              PoolTimeout("QueuePool limit of size 21 overflow 0 reached"),
              optuna.exceptions.StorageInternalError("lost")]
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'api.db'}"))
    with TestClient(app, raise_server_exceptions=False) as c:
        for exc in errors:
            def fail(*_a, exc=exc, **_k):
                raise exc
            monkeypatch.setattr(service, "list_jobs", fail)
            r = c.get("/v1/jobs")
            assert r.status_code == 503 and r.headers["retry-after"] == "5", r.text
            assert r.json()["detail"][0]["type"] == "database_unavailable"

        def bug(*_a, **_k):
            raise IntegrityError("INSERT", {}, Exception("UNIQUE constraint failed"))
        monkeypatch.setattr(service, "list_jobs", bug)
        r = c.get("/v1/jobs")
        assert r.status_code == 500 and r.json()["detail"][0]["type"] == "internal"
        assert c.get("/readyz").json() == {"status": "ready", "database": "ok", "version": r.headers.get(
            "x-paraplan-version", c.get("/healthz").json()["version"])}


# ------------------------------------------------------------------------------------------------
# DELETE of a running job


@pytest.mark.serial
def test_delete_of_a_running_job_stops_its_workers_and_leaves_no_study(database_url, tmp_path):
    """A sampler job running on two workers (the server's and a separate one) is deleted: 204 once its
    workers have stopped, and its Optuna study is gone from the storage (no study, no trials), the job
    404; both workers go on serving (a later job succeeds)."""
    import optuna
    from sqlalchemy import create_engine, text

    from service_util import WorkerProcess, wait_for

    job_body = {"model": "pangu-ultra-moe-718b", "cluster": "ascend-910b", "devices": 6144,
                "global_batch_size": 7680, "search": {"sampler": "tpe", "n_trials": 5000, "seed": 3,
                                                      "parallel_workers": 2}}
    server = Server(database_url, tmp_path / "server.log").start()
    worker = WorkerProcess(database_url, tmp_path / "worker.log").wait_started()
    try:
        with server.client() as c:
            job = c.post("/v1/jobs", json=job_body).raise_for_status().json()
            wait_for(c, job["id"], until=lambda j: j["status"] == "running" and j["progress"]["trials_done"] >= 20,
                     timeout=120)
            name = f"paraplan-job-{job['id']}"
            storage = optuna.storages.RDBStorage(database_url)
            assert name in optuna.get_all_study_names(storage)
            started = time.monotonic()
            r = c.delete(f"/v1/jobs/{job['id']}")
            took = time.monotonic() - started
            assert r.status_code == 204, r.text
            assert c.get(f"/v1/jobs/{job['id']}").status_code == 404
            assert name not in optuna.get_all_study_names(optuna.storages.RDBStorage(database_url))
            engine = create_engine(database_url)
            with engine.connect() as conn:
                assert conn.execute(text("SELECT count(*) FROM studies WHERE study_name = :n"), {"n": name}).scalar() == 0
                assert conn.execute(text("SELECT count(*) FROM trials WHERE study_id NOT IN "
                                         "(SELECT study_id FROM studies)")).scalar() == 0
                assert conn.execute(text("SELECT count(*) FROM job_leases")).scalar() == 0
            engine.dispose()
            time.sleep(1.5)  # the workers' next beats, trials and Optuna heartbeats: nothing recreates it
            assert name not in optuna.get_all_study_names(optuna.storages.RDBStorage(database_url))
            after = c.post("/v1/jobs", json=TINY_JOB).raise_for_status().json()
            assert wait_for(c, after["id"], timeout=60)["status"] == "succeeded"
        assert took < 15, took
        print(f"delete of a running job: 204 after {took:.2f} s")
        for log in (server.log(), worker.log()):
            assert "Traceback" not in log, log[-3000:]
    finally:
        worker.stop()
        server.stop()


# ------------------------------------------------------------------------------------------------
# degenerate profiles: a 422 naming the field, never a "feasible" result with null times

DEGENERATE = {"base": "nvidia-h100-80gb", "facts": {"peak_bf16_tflops": {"value": 1e-308, "source": "test"}}}


def test_degenerate_profile_is_a_422_naming_the_fact(tmp_path):
    """A peak of 1e-308 TFLOP/s in an inline profile: /v1/evaluate and /v1/jobs answer 422 naming
    cluster.facts.peak_bf16_tflops (it used to be a 200 "feasible" with null step time and rates); the
    shipped profile still evaluates, and check_finite says which result fields came out null."""
    from fastapi.testclient import TestClient

    import hardware_profiles
    import model_presets
    from app.formats.errors import InputError
    from app.formats.results import check_finite, evaluate, non_finite_fields
    from app.service.core.config import Settings
    from app.service.main import create_app
    from costmodel.spec import TrainingConfig

    profile = hardware_profiles.load(DEGENERATE)
    cfg = TrainingConfig(**EVALUATE["config"])
    with np_quiet():
        result = evaluate(model_presets.load("tiny-moe"), profile, 8, cfg)
    assert result["feasible"] and "step_time_s" in non_finite_fields(result)
    with pytest.raises(InputError) as err:
        check_finite(result, profile)
    assert err.value.field == "cluster.facts.peak_bf16_tflops" and "step_time_s" in err.value.reason
    shipped = hardware_profiles.load("nvidia-h100-80gb")
    assert check_finite(evaluate(model_presets.load("tiny-moe"), shipped, 8, cfg), shipped)["feasible"]

    with TestClient(create_app(Settings(database_url=f"sqlite:///{tmp_path / 'api.db'}"))) as c:
        assert c.post("/v1/evaluate", json=EVALUATE).status_code == 200
        for path, body in (("/v1/evaluate", {**EVALUATE, "cluster": DEGENERATE}),
                           ("/v1/jobs", {**TINY_JOB, "cluster": DEGENERATE})):
            r = c.post(path, json=body)
            assert r.status_code == 422, (path, r.status_code, r.text[:300])
            detail = r.json()["detail"][0]
            assert detail["loc"] == ["body", "cluster", "facts", "peak_bf16_tflops"], (path, detail)
            assert "1e-308" in detail["msg"], detail

    from service_util import run_cli

    (tmp_path / "degenerate.json").write_text(json.dumps(DEGENERATE))
    cli = run_cli("evaluate", "--model", "tiny-moe", "--cluster", str(tmp_path / "degenerate.json"), "--devices", "8",
                  "--config", json.dumps(EVALUATE["config"]), "--json")
    assert cli.returncode == 2 and cli.stdout == "", (cli.returncode, cli.stdout[:200])
    assert "error: cluster.facts.peak_bf16_tflops: " in cli.stderr, cli.stderr[-500:]


def np_quiet():
    import numpy as np

    return np.errstate(all="ignore")


# ------------------------------------------------------------------------------------------------
# a database outage mid-job is not a worker crash

OUTAGE_S = 20


@pytest.mark.serial
@pytest.mark.postgres
def test_a_20_s_database_outage_mid_job_on_3_workers_ends_succeeded_with_its_trials(postgres_url, tmp_path):
    """PostgreSQL drops and refuses the service database's connections for 20 s while a TPE job runs on 3
    workers (the server's and two more): the job ends `succeeded` with exactly its n_trials finished trials
    in its study, not "workers stopped 3 times ... giving up"."""
    import os

    import optuna
    from sqlalchemy.engine import make_url

    from service_util import WorkerProcess, wait_for

    n_trials = 300
    body = {"model": "pangu-ultra-moe-718b", "cluster": "ascend-910b", "devices": 6144, "global_batch_size": 7680,
            "search": {"sampler": "tpe", "n_trials": n_trials, "seed": 5, "parallel_workers": 3}}
    admin, database = os.environ["PARAPLAN_TEST_POSTGRES_URL"], make_url(postgres_url).database
    server = Server(postgres_url, tmp_path / "server.log").start()
    workers = [WorkerProcess(postgres_url, tmp_path / f"worker{i}.log").wait_started() for i in range(2)]
    try:
        with server.client() as c:
            job = c.post("/v1/jobs", json=body).raise_for_status().json()
            wait_for(c, job["id"], until=lambda j: j["progress"]["trials_done"] >= 40, timeout=180)
            set_connections(admin, database, allow=False)
            time.sleep(OUTAGE_S)
            set_connections(admin, database, allow=True)
            done = wait_for(c, job["id"], timeout=300)
        assert done["status"] == "succeeded", done["error"]
        assert done["progress"] == {"trials_done": n_trials, "trials_total": n_trials}
        study = optuna.load_study(study_name=f"paraplan-job-{job['id']}", storage=postgres_url)
        complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        assert len(complete) == n_trials, len(complete)
    finally:
        for w in workers:
            w.stop()
        server.stop()


@pytest.mark.serial
def test_forty_biggest_evaluates_at_once_leave_the_server_alive_and_bounded(tmp_path):
    """40 concurrent evaluates of the biggest inputs the bounds allow (one used to cost ~600 MB and 40 of
    them 21 GB, until the kernel killed the server): each is answered 200 with its result, or 503 with
    Retry-After when it found no turn in time; liveness and a small evaluate answer meanwhile; the
    server's peak resident memory stays under the documented bound."""
    server = Server(tmp_path / "heavy.db", tmp_path / "heavy.log", "--no-worker").start()
    try:
        light = {"model": "tiny-dense", "cluster": "nvidia-h100-80gb", "devices": 8,
                 "config": {"tp": 2, "pp": 1, "micro_batch_size": 1, "global_batch_size": 8}}

        async def burst():
            heavy = [asyncio.create_task(raw_request(server.port, "POST", "/v1/evaluate", BIGGEST_EVALUATES[i % 2]))
                     for i in range(40)]
            await asyncio.sleep(0.5)
            probes = []
            while not all(t.done() for t in heavy):
                for path, body in (("/healthz", None), ("/v1/evaluate", light)):
                    started = time.monotonic()
                    status, _, _ = await raw_request(server.port, "GET" if body is None else "POST", path, body)
                    probes.append((path, status, time.monotonic() - started))
                await asyncio.sleep(0.2)
            return await asyncio.gather(*heavy), probes

        answers, probes = asyncio.run(burst())
        assert server.proc.poll() is None, server.log()[-3000:]
        for status, headers, content in answers:
            assert status in (200, 503), content[:500]
            if status == 200:
                body = json.loads(content)
                assert body["feasible"] is False and body["infeasible_reasons"][0]["code"] == "oom"
                assert body["step_time_s"] > 0
            else:
                assert "retry-after" in headers and json.loads(content)["detail"][0]["type"] == "busy"
        assert sum(a[0] == 200 for a in answers) >= 20, [a[0] for a in answers]
        assert probes, "the burst ended before a probe was sent"
        for path, status, seconds in probes:
            assert status == 200 and seconds < 1.0, (path, status, seconds)
        peak = peak_rss_mib(server.proc.pid)
        print(f"peak RSS {peak:.0f} MiB; {sum(a[0] == 200 for a in answers)} of 40 answered 200; "
              f"slowest probe {max(p[2] for p in probes):.3f} s")
        assert peak < MEMORY_BOUND_MIB
    finally:
        server.stop()


@pytest.mark.serial
def test_a_heavy_evaluate_that_finds_no_turn_is_503_busy_with_retry_after(tmp_path):
    """One turn and a 10 ms wait: of 6 deep evaluates sent at once, the ones that find the turn taken
    answer 503 ``busy`` with Retry-After, the others their result; none is a 500."""
    server = Server(tmp_path / "turns.db", tmp_path / "turns.log", "--no-worker",
                    env={"PARAPLAN_MAX_HEAVY_EVALUATES": "1", "PARAPLAN_HEAVY_WAIT_S": "0.01"}).start()
    try:
        async def burst():
            return await asyncio.gather(*(raw_request(server.port, "POST", "/v1/evaluate", BIGGEST_EVALUATES[1])
                                          for _ in range(6)))

        answers = asyncio.run(burst())
        statuses = sorted(a[0] for a in answers)
        assert statuses[0] == 200 and statuses[-1] == 503, statuses
        assert set(statuses) == {200, 503}
        for status, headers, content in answers:
            if status == 503:
                detail = json.loads(content)["detail"][0]
                assert headers["retry-after"] == "5" and detail["type"] == "busy"
                assert detail["loc"] == ["body", "config"] and "virtual stages" in detail["msg"]
    finally:
        server.stop()


def _damage(path, how: str) -> None:
    """Overwrite pages of a SQLite file: its header (``header``), the pages after the first (``pages``), or
    those of the file's second half (``data``)."""
    import sqlite3

    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # every page in the main file
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.close()
    with open(path, "r+b") as f:
        if how == "header":
            f.write(b"this is no longer a SQLite file")
        else:  # the schema's pages (from page 2), or the tables' and indexes' (the second half)
            for page in range(2, max(3, pages // 2)) if how == "pages" else range(pages // 2, pages - 1):
                f.seek(page * page_size + 8)
                f.write(bytes(range(256)) * 4)


@pytest.mark.parametrize("how", ["pages", "data", "header"])
def test_a_damaged_sqlite_file_is_refused_at_start(tmp_path, how):
    """A file with overwritten pages used to be served as healthy: `serve` and `worker` now run SQLite's
    quick check first and exit 1 naming the file and what was found, without a traceback."""
    import sqlite3
    import subprocess
    import sys

    db = tmp_path / "jobs.db"
    server = Server(db, tmp_path / "first.log").start()
    try:
        with server.client() as c:
            job = c.post("/v1/jobs", json=TINY_JOB).json()
            assert wait_for(c, job["id"])["status"] == "succeeded"
    finally:
        server.stop()
    _damage(db, how)
    try:
        found = sqlite3.connect(db).execute("PRAGMA quick_check").fetchone()[0]
    except sqlite3.DatabaseError as exc:
        found = str(exc)
    assert found != "ok"  # damaged indeed
    before = db.read_bytes()
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{db}"}
    for command in (["serve", "--port", "0"], ["worker"]):
        run = subprocess.run([sys.executable, "-m", "app.cli", *command], env=env, capture_output=True, text=True,
                             timeout=60, cwd=Path(__file__).resolve().parents[1])
        assert run.returncode == 1, (command, run.stdout[-2000:], run.stderr[-2000:])
        assert f"the database file {db} is damaged" in run.stderr and "restore it from a backup" in run.stderr
        assert "Traceback" not in run.stderr + run.stdout
    assert db.read_bytes() == before  # looked at, never written


@pytest.mark.serial
@pytest.mark.parametrize("database_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
                         indirect=True)
def test_a_second_keys_job_starts_while_the_first_keys_big_job_runs(database_url, tmp_path):
    """Key A's `parallel_workers: 64` job takes both workers (the server's and a `paraplan worker`);
    key B's small job, submitted then, succeeds within seconds while A's job keeps running (a worker
    leaves A's shared job for it), and A's job goes on to more trials afterwards."""
    from service_util import PANGU_JOB, WorkerProcess

    keys = {"PARAPLAN_API_KEYS": "key-a-0123456789,key-b-0123456789", "PARAPLAN_FAIR_YIELD_S": "1"}
    a, b = ({"Authorization": f"Bearer key-{k}-0123456789"} for k in "ab")
    server = Server(database_url, tmp_path / "server.log", env=keys).start()
    worker = WorkerProcess(database_url, tmp_path / "worker.log", env=keys).wait_started()
    try:
        with server.client() as c:
            big = c.post("/v1/jobs", headers=a, json={**PANGU_JOB, "search": {
                "sampler": "tpe", "n_trials": 5000, "seed": 11, "parallel_workers": 64}}).json()["id"]
            with server.client(headers=a) as ca:
                wait_for(ca, big, until=lambda j: j["progress"]["trials_done"] >= 20, timeout=120)
            with server.client(headers=b) as cb:
                small = cb.post("/v1/jobs", json=TINY_JOB).json()["id"]
                submitted = time.monotonic()
                assert wait_for(cb, small, timeout=90)["status"] == "succeeded"
                took = time.monotonic() - submitted
            job = c.get(f"/v1/jobs/{big}", headers=a).json()
            assert job["status"] == "running", job
            at_b_done = job["progress"]["trials_done"]
            with server.client(headers=a) as ca:
                wait_for(ca, big, until=lambda j: j["progress"]["trials_done"] > at_b_done + 10, timeout=120)
                ca.post(f"/v1/jobs/{big}/cancel")
        assert took < 60, took
        assert "left to its other workers for another key's waiting job" in server.log() + worker.log()
    finally:
        worker.stop()
        server.stop()

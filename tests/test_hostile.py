"""A hostile client over real HTTP (`paraplan serve` on loopback, on a SQLite file and on the real
PostgreSQL server): bounded work for the biggest body the schema accepts, a burst of reads that cannot
drain the pool, no server file read on a request's say-so, 422s (never 500s) for bodies JSON allows but
no route can keep, a frozen database answered within the request bound, DELETE that does not grow with
the database, and open routes that show no internals.

Bursts go out on raw asyncio streams, so what is measured is the server, not an HTTP client."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from service_util import TINY_JOB, Server, peak_rss_mib, raw_request, wait_for

SQLITE_AND_POSTGRES = pytest.mark.parametrize(
    "database_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)

# The 10,000-layer body of the hostile test: one request took a core and gigabytes for minutes.
TEN_THOUSAND_LAYERS = {"model": {"name": "x", "num_layers": 10_000, "hidden_size": 256, "num_attention_heads": 8,
                                 "ffn_hidden_size": 1024, "vocab_size": 1024, "seq_length": 512},
                       "cluster": "nvidia-h100-80gb", "devices": 8, "global_batch_size": 64}
WIDEST_JOB_BOUND_S = 30.0  # docs/service.md, "Bounds": the answer to the widest body, measured about 4 s
MEMORY_BOUND_MIB = 512
SMALL_EVALUATE = {"model": "tiny-dense", "cluster": "nvidia-h100-80gb", "devices": 8,
                  "config": {"tp": 2, "pp": 1, "micro_batch_size": 1, "global_batch_size": 8}}


def _server(database_url: str, tmp_path: Path, *extra: str, env: dict | None = None) -> Server:
    return Server(database_url, tmp_path / f"serve-{uuid.uuid4().hex[:6]}.log", *extra, env=env).start()


# --- 1. bounded work per request --------------------------------------------------------------------

def test_the_ten_thousand_layer_body_is_answered_within_its_bound_and_memory(tmp_path):
    """The schema's most layers: the job is accepted within the documented bound, the API's peak resident
    memory stays under 512 MiB, and liveness answers meanwhile."""
    server = _server(f"sqlite:///{tmp_path / 'p.db'}", tmp_path, "--no-worker")
    try:
        async def run():
            post = asyncio.create_task(raw_request(server.port, "POST", "/v1/jobs", TEN_THOUSAND_LAYERS))
            started = time.monotonic()
            while not post.done() and time.monotonic() - started < WIDEST_JOB_BOUND_S:
                await asyncio.sleep(0.2)
            return await asyncio.wait_for(post, 1.0), time.monotonic() - started

        (status, _, body), took = asyncio.run(run())
        assert status == 202, body[:300]
        assert took < WIDEST_JOB_BOUND_S
        assert peak_rss_mib(server.proc.pid) < MEMORY_BOUND_MIB
    finally:
        server.stop()


# --- 2. a burst of reads ------------------------------------------------------------------------------

@SQLITE_AND_POSTGRES
def test_two_hundred_concurrent_reads_all_answer_and_the_api_is_whole_at_once(database_url, tmp_path):
    """200 concurrent GETs of one job: every one answers, 200 or 503 with Retry-After, none held past the
    request bound; right after, reads and a POST answer at once (the pool was not left drained)."""
    server = _server(database_url, tmp_path, "--no-worker")
    try:
        with server.client() as c:
            job = c.post("/v1/jobs", json=TINY_JOB).raise_for_status().json()

        async def burst():
            return await asyncio.gather(*(asyncio.wait_for(raw_request(server.port, "GET", f"/v1/jobs/{job['id']}"),
                                                           15) for _ in range(200)), return_exceptions=True)

        started = time.monotonic()
        answers = asyncio.run(burst())
        took = time.monotonic() - started
        timeouts = [a for a in answers if isinstance(a, BaseException)]
        assert not timeouts, f"{len(timeouts)} of 200 got no answer: {timeouts[:3]}"
        statuses = {a[0] for a in answers}
        assert statuses <= {200, 503}, statuses
        assert all("retry-after" in a[1] for a in answers if a[0] == 503)
        assert sum(a[0] == 200 for a in answers) >= 150, statuses
        with server.client() as c:
            after = time.monotonic()
            assert c.get(f"/v1/jobs/{job['id']}").status_code == 200
            assert c.get("/v1/jobs").status_code == 200
            assert c.post("/v1/jobs", json=TINY_JOB).status_code == 202
            assert time.monotonic() - after < 2.0
        assert took < 15
    finally:
        server.stop()


# --- 3. no file read on a request's say-so -------------------------------------------------------------

def test_calibrate_from_names_shipped_profiles_only_and_tells_nothing_of_files(tmp_path):
    """A planted factors file, reached by an absolute path and by ../, is never read: each is the same 422
    naming `cluster.calibrate_from` as a path that does not exist, and the step time is the shipped one."""
    planted = tmp_path / "planted.json"
    planted.write_text(json.dumps({"factors": {"gemm_eff_max": 0.01, "hbm_eff": 0.01}}))
    server = _server(f"sqlite:///{tmp_path / 'p.db'}", tmp_path, "--no-worker")
    try:
        with server.client() as c:
            shipped = c.post("/v1/evaluate", json={**SMALL_EVALUATE, "cluster": {"base": "nvidia-h100-80gb"}})
            assert shipped.status_code == 200
            relative = os.path.relpath(planted.with_suffix(""), Path(__file__).resolve().parents[1] / "hardware_profiles"
                                       / "calibration")
            messages = set()
            for value in (str(planted.with_suffix("")), relative, str(tmp_path / "nothing-here"),
                          "/etc/passwd", str(tmp_path), "nvidia-h100-80gb/../../x"):
                r = c.post("/v1/evaluate", json={**SMALL_EVALUATE, "cluster": {"base": "nvidia-h100-80gb",
                                                                               "calibrate_from": value}})
                assert r.status_code == 422, (value, r.text)
                detail = r.json()["detail"][0]
                assert detail["loc"] == ["body", "cluster", "calibrate_from"]
                assert value not in detail["msg"] and "tmp" not in detail["msg"]
                messages.add(detail["msg"])
            assert len(messages) == 1  # the same answer whether the file exists, is JSON or not: no oracle
            ok = c.post("/v1/evaluate", json={**SMALL_EVALUATE, "cluster": {"base": "nvidia-h100-80gb",
                                                                            "calibrate_from": "nvidia-h100-80gb"}})
            assert ok.status_code == 200
            assert ok.json()["step_time_s"] == shipped.json()["step_time_s"]
    finally:
        server.stop()


# --- 4. hostile bodies ----------------------------------------------------------------------------------

SURROGATE, NUL = "\ud800", "\u0000"


def _nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def _job(**changes) -> dict:
    body = json.loads(json.dumps(TINY_JOB))
    body["model"] = {"name": "m", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
                     "ffn_hidden_size": 1024, "vocab_size": 1024, "seq_length": 512}
    for path, value in changes.items():
        target = body
        *parents, last = path.split(".")
        for p in parents:
            target = target[p]
        target[last] = value
    return body


LONG_LAYOUT = "(t|)*" + "9" * 5000
HOSTILE = [
    ("kind-surrogate", "POST", "/v1/jobs", _job(kind=SURROGATE), ["body", "kind"]),
    ("model-name-surrogate", "POST", "/v1/jobs", _job(**{"model.name": SURROGATE}), ["body", "model", "name"]),
    ("model-name-nul", "POST", "/v1/jobs", _job(**{"model.name": "a" + NUL}), ["body", "model", "name"]),
    ("nested-500", "POST", "/v1/jobs", _job(**{"model.extra": _nested(500)}), ["body"]),
    ("layout-digits-evaluate", "POST", "/v1/evaluate",
     {**SMALL_EVALUATE, "config": {**SMALL_EVALUATE["config"], "pipeline_layout": LONG_LAYOUT}},
     ["body", "config", "pipeline_layout"]),
    ("layout-digits-fixed", "POST", "/v1/jobs", _job(**{"search.fixed": {"pipeline_layout": LONG_LAYOUT}}),
     ["body", "search", "fixed", "pipeline_layout"]),
    ("cluster-name-300", "POST", "/v1/jobs", _job(cluster={"base": "nvidia-h100-80gb", "name": "c" * 300}),
     ["body", "cluster", "name"]),
    ("cluster-name-nul", "POST", "/v1/jobs", _job(cluster={"base": "nvidia-h100-80gb", "name": "c" + NUL}),
     ["body", "cluster", "name"]),
    ("measurement-notes-surrogate", "POST", "/v1/clusters/nvidia-h100-80gb/measurements",
     {"name": "run", "devices": 8, "model": "tiny-dense", "config": {"tp": 1, "pp": 1, "global_batch_size": 8},
      "reported": {"tokens_per_s_per_device": 1000.0}, "notes": SURROGATE}, ["body", "notes"]),
]


@SQLITE_AND_POSTGRES
def test_every_hostile_body_is_a_422_naming_the_field_on_a_kept_connection(database_url, tmp_path):
    """Each body of the hostile test on one keep-alive connection: a 422 whose first detail names the field
    (a prefix of it for the nesting), the connection kept, nothing stored (the measurements list stays
    empty and readable), and the server still answers."""
    server = _server(database_url, tmp_path, "--no-worker")
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        conn.connect()
        sock = conn.sock
        for name, method, path, body, loc in HOSTILE:
            # json.dumps escapes the surrogate and the NUL as \ud800 and \u0000: what a client sends
            conn.request(method, path, body=json.dumps(body), headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            data = json.loads(r.read())
            assert r.status == 422, (name, data)
            assert data["detail"][0]["loc"][:len(loc)] == loc, (name, data)
            assert not r.will_close and conn.sock is sock, f"{name}: the connection was dropped"
        conn.request("GET", "/v1/clusters/nvidia-h100-80gb/measurements")
        r = conn.getresponse()
        assert r.status == 200 and json.loads(r.read())["total"] == 0
        conn.close()
    finally:
        server.stop()


def test_a_stored_measurement_with_a_lone_surrogate_is_read_back_not_a_500(tmp_path):
    """A row written before bodies were checked (here: put in the file directly) is answered, its bad
    character shown as U+FFFD, on every route that returns it."""
    import sqlalchemy as sa

    db = tmp_path / "p.db"
    server = _server(f"sqlite:///{db}", tmp_path, "--no-worker")
    try:
        with server.client() as c:
            m = c.post("/v1/clusters/nvidia-h100-80gb/measurements", json={
                "name": "run", "devices": 8, "model": "tiny-dense", "config": {"tp": 1, "pp": 1, "global_batch_size": 8},
                "reported": {"tokens_per_s_per_device": 1000.0}, "notes": "fine"}).raise_for_status().json()
            engine = sa.create_engine(f"sqlite:///{db}")
            with engine.begin() as conn:
                conn.execute(sa.text("UPDATE measurements SET run = json_set(run, '$.notes', json('\"\\ud800x\"'))"))
            engine.dispose()
            listed = c.get("/v1/clusters/nvidia-h100-80gb/measurements")
            one = c.get(f"/v1/clusters/nvidia-h100-80gb/measurements/{m['id']}")
            assert listed.status_code == 200 and one.status_code == 200, (listed.text, one.text)
            assert one.json()["run"]["notes"].endswith("x") and "\ufffd" in one.json()["run"]["notes"]
    finally:
        server.stop()


# --- 5. a frozen PostgreSQL -----------------------------------------------------------------------------

def _postgres_pids(admin_url: str) -> list[int]:
    """The postmaster of the test server and its children (found from a backend's parent)."""
    import sqlalchemy as sa

    def ppid(pid) -> int | None:
        try:
            return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return None

    engine = sa.create_engine(admin_url)
    with engine.connect() as conn:  # the backend's parent read while it lives: it exits with the connection
        postmaster = ppid(conn.scalar(sa.text("SELECT pg_backend_pid()")))
    engine.dispose()
    assert postmaster is not None, "the test server's postmaster was not found"
    children = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and ppid(p.name) == postmaster]
    return [postmaster, *children]


@contextlib.contextmanager
def frozen(pids: list[int]):
    """SIGSTOP every process of the server; SIGCONT them again, whatever happens."""
    try:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


@pytest.mark.postgres
def test_a_frozen_postgresql_is_503_with_retry_after_within_the_request_bound(postgres_url, tmp_path):
    """PostgreSQL SIGSTOPped (connections open, nothing answers): reads and POSTs answer 503 with
    Retry-After within the request bound (3 s here) plus a second, liveness answers at once; resumed, the
    API answers 200 again within seconds."""
    bound_s = 3.0
    server = _server(postgres_url, tmp_path, "--no-worker", env={"PARAPLAN_DB_REQUEST_TIMEOUT_S": str(bound_s)})
    try:
        with server.client() as c:
            job = c.post("/v1/jobs", json=TINY_JOB).raise_for_status().json()
            assert c.get(f"/v1/jobs/{job['id']}").status_code == 200
        pids = _postgres_pids(os.environ["PARAPLAN_TEST_POSTGRES_URL"])
        with frozen(pids):
            async def during():
                reads = [raw_request(server.port, "GET", f"/v1/jobs/{job['id']}") for _ in range(20)]
                posts = [raw_request(server.port, "POST", "/v1/jobs", TINY_JOB) for _ in range(5)]
                tasks = [asyncio.create_task(asyncio.wait_for(t, bound_s + 5)) for t in reads + posts]
                started = time.monotonic()
                health = await raw_request(server.port, "GET", "/healthz")
                health_s = time.monotonic() - started
                answers = await asyncio.gather(*tasks, return_exceptions=True)
                return answers, time.monotonic() - started, health, health_s

            answers, took, health, health_s = asyncio.run(during())
        assert health[0] == 200 and health_s < 1.0
        held = [a for a in answers if isinstance(a, BaseException)]
        assert not held, f"{len(held)} requests held past the bound"
        assert {a[0] for a in answers} == {503}
        assert all(a[1].get("retry-after") for a in answers)
        assert took < bound_s + 2.0
        with server.client() as c:
            deadline = time.monotonic() + 15
            while c.get(f"/v1/jobs/{job['id']}").status_code != 200:
                assert time.monotonic() < deadline, "the API did not come back after the database resumed"
                time.sleep(0.2)
    finally:
        server.stop()


# --- 6. DELETE does not grow with the database --------------------------------------------------------

def delete_among_studies(client, url: str, studies: int = 1500, trials_each: int = 10):
    """A finished 5-trial job, then ``studies`` other studies beside its own, then its DELETE timed:
    (the job, the DELETE's response, its seconds). The test and ``benchmarks/faults.py`` run the same."""
    job = client.post("/v1/jobs", json={**TINY_JOB, "search": {"sampler": "random", "n_trials": 5, "seed": 1,
                                                                "top_k": 3}}).raise_for_status().json()
    wait_for(client, job["id"], timeout=120)
    _many_studies(url, studies, trials_each)
    started = time.monotonic()
    r = client.delete(f"/v1/jobs/{job['id']}")
    return job, r, time.monotonic() - started


def _many_studies(url: str, studies: int, trials_each: int) -> None:
    """``studies`` Optuna studies with ``trials_each`` finished trials each, written in bulk."""
    import optuna
    import sqlalchemy as sa

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.create_study(study_name="seed-schema", storage=url)  # Optuna's tables
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO studies (study_name) VALUES (:n)"),
                     [{"n": f"bulk-{i}"} for i in range(studies)])
        ids = [r[0] for r in conn.execute(sa.text("SELECT study_id FROM studies WHERE study_name LIKE 'bulk-%'"))]
        conn.execute(sa.text("INSERT INTO study_directions (direction, study_id, objective) "
                             "VALUES ('MAXIMIZE', :s, 0)"), [{"s": s} for s in ids])
        conn.execute(sa.text("INSERT INTO trials (number, study_id, state, datetime_start, datetime_complete) "
                             "VALUES (:k, :s, 'COMPLETE', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"),
                     [{"k": k, "s": s} for s in ids for k in range(trials_each)])
    engine.dispose()


@SQLITE_AND_POSTGRES
def test_delete_takes_under_two_seconds_with_1500_studies_in_the_database(database_url, tmp_path):
    """1,500 other studies with 10 trials each (15,000 trials): a finished job's DELETE answers 204 in
    under 2 s (it checks its own study, not every study's summary)."""
    server = _server(database_url, tmp_path)
    try:
        with server.client() as c:
            job, r, took = delete_among_studies(c, database_url)
            assert r.status_code == 204, r.text
            assert took < 2.0, f"DELETE took {took:.1f} s"
            assert c.get(f"/v1/jobs/{job['id']}").status_code == 404
        import optuna

        with pytest.raises(KeyError):
            optuna.load_study(study_name=f"paraplan-job-{job['id']}", storage=database_url)
    finally:
        server.stop()


# --- 8. what open routes show ----------------------------------------------------------------------------

@pytest.mark.postgres
def test_readyz_shows_no_host_port_or_driver_text_when_the_database_is_away(postgres_url, tmp_path):
    """The database refuses connections: /readyz (open) is 503 `unavailable`, with nothing of the URL (host,
    port, user, database name) or the driver's message in it."""
    from sqlalchemy.engine import make_url

    from service_util import set_connections

    admin = os.environ["PARAPLAN_TEST_POSTGRES_URL"]
    u = make_url(postgres_url)
    server = _server(postgres_url, tmp_path, "--no-worker")
    try:
        set_connections(admin, u.database, allow=False)
        try:
            with server.client() as c:
                deadline = time.monotonic() + 10
                while (r := c.get("/readyz")).status_code == 200:
                    assert time.monotonic() < deadline
                    time.sleep(0.2)
        finally:
            set_connections(admin, u.database, allow=True)
        assert r.status_code == 503 and r.headers.get("retry-after")
        body = r.json()
        assert body["database"] in ("unavailable", f"no answer within 2 s")
        for secret in (u.host, str(u.port), u.username, u.database, "connection", "psycopg"):
            assert secret not in r.text, secret
    finally:
        server.stop()


def test_metrics_show_a_key_its_own_jobs_only(tmp_path):
    """Key A has three jobs, key B none: B's /metrics counts 0 queued jobs, A's 3; unauthenticated is 401."""
    keys = {"PARAPLAN_API_KEYS": "key-a-0123456789,key-b-0123456789"}
    server = _server(f"sqlite:///{tmp_path / 'p.db'}", tmp_path, "--no-worker", env=keys)
    try:
        a = server.client(headers={"Authorization": "Bearer key-a-0123456789"})
        b = server.client(headers={"Authorization": "Bearer key-b-0123456789"})
        for seed in range(3):
            a.post("/v1/jobs", json={**TINY_JOB, "search": {**TINY_JOB["search"], "seed": seed}}).raise_for_status()

        def queued(client) -> float:
            text = client.get("/metrics").raise_for_status().text
            line = next(x for x in text.splitlines() if x.startswith('paraplan_jobs{status="queued"}'))
            return float(line.split()[-1])

        assert queued(a) == 3
        assert queued(b) == 0
        assert server.client().get("/metrics").status_code == 401
        a.close()
        b.close()
    finally:
        server.stop()


# --- 7. a SQLite file that cannot be written ------------------------------------------------------------

def _chattr(flag: str, *paths: Path) -> bool:
    import subprocess

    return subprocess.run(["chattr", flag, *map(str, paths)], capture_output=True).returncode == 0


def test_an_immutable_sqlite_file_is_503_not_sigbus_and_the_service_recovers_by_itself(tmp_path):
    """The database file, -wal and -shm made immutable under a running server with its embedded worker:
    the process stays alive (no SIGBUS from SQLite's shared-memory index), database routes answer 503
    with Retry-After, liveness 200; made writable again, reads, a new job and the DELETE of a job with an
    Optuna study work without a restart."""
    db = tmp_path / "p.db"
    files = [db, Path(f"{db}-wal"), Path(f"{db}-shm")]
    server = _server(f"sqlite:///{db}", tmp_path)
    try:
        with server.client() as c:
            job = c.post("/v1/jobs", json={**TINY_JOB, "search": {"sampler": "random", "n_trials": 5, "seed": 2,
                                                                   "top_k": 3}}).raise_for_status().json()
            wait_for(c, job["id"], timeout=120)
            assert all(f.exists() for f in files)
            if not _chattr("+i", *files):
                pytest.skip("chattr +i is not available here (needs ext4 or alike and CAP_LINUX_IMMUTABLE)")
            try:
                time.sleep(1.0)  # the worker polls meanwhile: it must not touch the map either
                read = c.get(f"/v1/jobs/{job['id']}")
                post = c.post("/v1/jobs", json=TINY_JOB)
                health = c.get("/healthz")
                time.sleep(1.0)
                assert server.proc.poll() is None, f"the server died ({server.proc.returncode}):\n{server.log()[-2000:]}"
            finally:
                _chattr("-i", *files)
            assert read.status_code == 503 and read.headers.get("retry-after"), read.text
            assert post.status_code == 503 and post.headers.get("retry-after"), post.text
            assert health.status_code == 200
            deadline = time.monotonic() + 10
            while c.get(f"/v1/jobs/{job['id']}").status_code != 200:
                assert time.monotonic() < deadline, "reads did not come back"
                time.sleep(0.2)
            again = c.post("/v1/jobs", json=TINY_JOB)
            assert again.status_code == 202, again.text
            assert c.delete(f"/v1/jobs/{job['id']}").status_code == 204
            assert server.proc.poll() is None
    finally:
        _chattr("-i", *files)
        server.stop()

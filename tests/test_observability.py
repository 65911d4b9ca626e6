"""Logs and metrics: a real `paraplan serve` with API keys writes one JSON object per line, a request id on
every request line (the client's X-Request-ID echoed, or a new one), the key's scope prefix but never a
key, and says at start whether authentication is on; `/metrics` is Prometheus text with the latency
histogram by route template, the jobs gauge from the database and the trials rate from Optuna's table."""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import logging
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text, update

from app.service.core.logging import JsonFormatter, RequestIdFilter, RequestInfo, configure_logging, current_request, \
    request_id_from
from app.service.db.models import Job
from service_util import TINY_JOB, Server
from test_service_api import make_client, submit

warnings.filterwarnings("ignore", message=".*httpx2.*")

KEY_A = "pk-live-3f9a1c77e2b4"
KEY_B = "pk-live-90d4e6a1c35f"
WRONG = KEY_A[:-1] + "5"  # differs in the last character only


def scope_prefix(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:8]


def json_lines(log: str) -> list[dict]:
    lines = [line for line in log.splitlines() if line.strip()]
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            pytest.fail(f"not a JSON log line: {line!r}")
    return records


def test_server_logs_json_with_request_ids_and_never_the_keys(tmp_path):
    srv = Server(tmp_path / "p.db", tmp_path / "serve.log", env={"PARAPLAN_API_KEYS": f"{KEY_A},{KEY_B}"})
    srv.start()  # --log-format json is the default
    try:
        with srv.client() as c:
            calls = {  # request id -> (method, path, key, status)
                "list-a.1": ("GET", "/v1/jobs", KEY_A, 200),
                "submit_b-1": ("POST", "/v1/jobs", KEY_B, 202),
                "anon-1": ("GET", "/v1/jobs", None, 401),
                "wrong-1": ("GET", "/v1/models", WRONG, 401),
                "metrics-1": ("GET", "/metrics", KEY_A, 200),
            }
            job_id = None
            for rid, (method, path, key, status) in calls.items():
                headers = {"X-Request-ID": rid, **({"Authorization": f"Bearer {key}"} if key else {})}
                r = c.request(method, path, headers=headers, json=TINY_JOB if method == "POST" else None)
                assert r.status_code == status, r.text
                assert r.headers["x-request-id"] == rid
                job_id = r.json()["id"] if method == "POST" else job_id
            generated = []
            for bad in ("has spaces", "x" * 129, "semi;colon", "ünïcode".encode()):
                r = c.get("/healthz", headers={"X-Request-ID": bad})
                assert re.fullmatch(r"[0-9a-f]{32}", r.headers["x-request-id"]), bad
                generated.append(r.headers["x-request-id"])
            assert len(set(generated)) == len(generated)
            r = c.get("/healthz", headers={"X-Request-ID": "x" * 128})
            assert r.headers["x-request-id"] == "x" * 128
    finally:
        srv.stop()
    log = srv.log()
    for secret in (KEY_A, KEY_B, WRONG, "Bearer", "Authorization"):
        assert secret not in log, secret
    records = json_lines(log)
    for rec in records:
        assert {"ts", "level", "logger", "msg"} <= set(rec), rec
    start = [r for r in records if r["msg"].startswith("authentication is")]
    assert [(r["level"], r["msg"]) for r in start] == [("INFO", "authentication is ON: 2 API keys")]
    requests = [r for r in records if r["logger"] == "paraplan.http"]
    for rec in requests:
        assert {"request_id", "method", "path", "status", "duration_ms", "key"} <= set(rec), rec
        assert rec["duration_ms"] >= 0
    by_id = {}
    for rec in requests:
        by_id.setdefault(rec["request_id"], []).append(rec)
    for rid, (method, path, key, status) in calls.items():
        [rec] = by_id[rid]  # one line per request
        assert (rec["method"], rec["path"], rec["status"]) == (method, path, status)
        expected_key = scope_prefix(key) if status != 401 else "open"
        assert rec["key"] == expected_key and f"key={expected_key}" in rec["msg"]
    for rid in generated:
        assert by_id[rid][0]["key"] == "open" and by_id[rid][0]["path"] == "/healthz"
    # a line written inside the route (in the thread pool) carries the request's id
    queued = [r for r in records if r.get("job_id") == job_id and r["logger"] == "paraplan.jobs"]
    assert queued and queued[0]["request_id"] == "submit_b-1"


def test_text_logs_and_the_off_warning_without_keys(tmp_path):
    srv = Server(tmp_path / "p.db", tmp_path / "serve.log", "--log-format", "text",
                 env={"PARAPLAN_API_KEYS": ""})
    srv.start()
    try:
        with srv.client() as c:
            assert c.get("/v1/jobs", headers={"X-Request-ID": "plain-7"}).status_code == 200
    finally:
        srv.stop()
    log = srv.log()
    assert re.search(r" WARNING paraplan\.api: authentication is OFF: PARAPLAN_API_KEYS is not set; the API is open "
                     r"to anyone who can reach it", log), log
    assert re.search(r" INFO paraplan\.http: GET /v1/jobs 200 [0-9.]+ms key=open request_id=plain-7$", log, re.M), log


def test_start_message_in_process(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="paraplan")
    with make_client(tmp_path / "off"):
        pass
    with make_client(tmp_path / "on", api_keys=f"{KEY_A},{KEY_B}"):
        pass
    starts = [(r.levelname, r.getMessage()) for r in caplog.records if r.getMessage().startswith("authentication")]
    assert starts == [("WARNING", "authentication is OFF: PARAPLAN_API_KEYS is not set; the API is open to anyone "
                                  "who can reach it"), ("INFO", "authentication is ON: 2 API keys")]
    assert KEY_A not in caplog.text and KEY_B not in caplog.text


@pytest.fixture
def json_log():
    """Log records of the root logger as JSON lines in a buffer (as ``configure_logging`` formats them,
    without replacing pytest's own handlers)."""
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield lambda: json_lines(buf.getvalue())
    root.removeHandler(handler)
    root.setLevel(old_level)


def test_json_formatter_fields_extras_and_the_request_id(json_log):
    log = logging.getLogger("paraplan.test")
    log.info("plain %d", 1)
    token = current_request.set(RequestInfo("rid-1"))
    try:
        log.warning("in a request", extra={"job_id": "j-1", "status": 201})
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("failed")
    finally:
        current_request.reset(token)
    plain, inside, failed = json_log()
    assert plain["msg"] == "plain 1" and plain["level"] == "INFO" and plain["logger"] == "paraplan.test"
    assert "request_id" not in plain and plain["ts"].endswith("Z")
    dt.datetime.fromisoformat(plain["ts"].replace("Z", "+00:00"))
    assert inside["request_id"] == "rid-1" and inside["job_id"] == "j-1" and inside["status"] == 201
    assert failed["request_id"] == "rid-1" and "ValueError: boom" in failed["exc"]


def test_request_ids_kept_only_when_sane():
    for good in ("a", "A-b_c.9", "x" * 128, "0b5c8c52-3c2e-4a53-9f43-3f3f7f2a8f10"):
        assert request_id_from(good) == good
    for bad in (None, "", "x" * 129, "a b", "a\nb", "a/b", "é", "a;b", '"quoted"'):
        rid = request_id_from(bad)
        assert rid != bad and re.fullmatch(r"[0-9a-f]{32}", rid)
    with pytest.raises(ValueError):
        configure_logging("info", "xml")


def test_an_unhandled_error_is_logged_with_the_request_id(tmp_path, json_log):
    from fastapi.testclient import TestClient

    app = make_client(tmp_path).app

    @app.get("/boom")
    def boom():
        raise RuntimeError("kaboom")

    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.get("/boom", headers={"X-Request-ID": "err-1"})
    assert r.status_code == 500 and r.headers["x-request-id"] == "err-1"
    records = [rec for rec in json_log() if rec.get("request_id") == "err-1"]
    request_line = [rec for rec in records if rec["logger"] == "paraplan.http"]
    assert request_line and request_line[0]["status"] == 500
    error = [rec for rec in records if rec["logger"] == "paraplan.api"]
    assert error and "kaboom" in error[0]["exc"]


def metric_samples(body: str) -> dict:
    """{(name, frozenset(labels)): value} of a Prometheus text page; and the families' types."""
    out, types = {}, {}
    for family in text_string_to_metric_families(body):
        types[family.name] = family.type
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out, types


def scrape(c, **headers) -> tuple[dict, dict]:
    r = c.get("/metrics", headers=headers)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return metric_samples(r.text)


def complete_optuna_trials(url: str, n: int) -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name="metrics-test", storage=optuna.storages.RDBStorage(url))
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=n)


def test_metrics_histogram_jobs_gauge_and_trials_rate(tmp_path):
    url = f"sqlite:///{tmp_path / 'api.db'}"
    with make_client(tmp_path) as c:
        ids = [submit(c).json()["id"] for _ in range(3)]
        assert c.get(f"/v1/jobs/{ids[0]}").status_code == 200
        assert c.get("/no/such/path").status_code == 404
        c.post(f"/v1/jobs/{ids[2]}/cancel")
        with c.app.state.sessions() as db:
            db.execute(update(Job).where(Job.id == ids[1]).values(status="running", trials_done=7))
            db.commit()
        samples, types = scrape(c)
        assert types["paraplan_http_request_duration_seconds"] == "histogram"
        assert types["paraplan_jobs"] == "gauge" and types["paraplan_http_requests"] == "counter"
        count = "paraplan_http_request_duration_seconds_count"
        assert samples[(count, frozenset({("method", "GET"), ("route", "/v1/jobs/{job_id}")}))] == 1
        assert samples[(count, frozenset({("method", "POST"), ("route", "/v1/jobs")}))] == 3
        assert samples[(count, frozenset({("method", "GET"), ("route", "other")}))] == 1
        assert not any(ids[0] in dict(labels).get("route", "") for _, labels in samples)  # templates only
        assert samples[("paraplan_http_requests_total", frozenset({("method", "GET"), ("status", "404")}))] == 1
        jobs = {dict(labels)["status"]: v for (name, labels), v in samples.items() if name == "paraplan_jobs"}
        assert jobs == {"queued": 1, "running": 1, "succeeded": 0, "failed": 0, "cancelled": 1}
        assert samples[("paraplan_trials_done", frozenset())] == 7
        assert samples[("paraplan_trials_per_second", frozenset())] == 0  # no Optuna table yet

        complete_optuna_trials(url, 6)
        samples, _ = scrape(c)
        assert samples[("paraplan_trials_per_second", frozenset())] == pytest.approx(6 / 60)
        with c.app.state.sessions() as db:  # a trial finished two minutes ago is out of the window
            old = dt.datetime.now() - dt.timedelta(seconds=120)
            db.execute(text("UPDATE trials SET datetime_complete = :t WHERE number = 0"), {"t": old.isoformat(" ")})
            db.commit()
        samples, _ = scrape(c)
        assert samples[("paraplan_trials_per_second", frozenset())] == pytest.approx(5 / 60)
        assert samples[count, frozenset({("method", "GET"), ("route", "/metrics")})] == 2


def test_each_app_counts_its_own_requests(tmp_path):
    with make_client(tmp_path / "a") as a, make_client(tmp_path / "b") as b:
        for _ in range(3):
            a.get("/v1/models")
        b.get("/v1/models")
        key = ("paraplan_http_requests_total", frozenset({("method", "GET"), ("status", "200")}))
        assert scrape(a)[0][key] == 3 and scrape(b)[0][key] == 1


def test_metrics_route_is_documented_and_guarded(tmp_path):
    with make_client(tmp_path, api_keys=KEY_A) as c:
        op = c.get("/openapi.json").json()["paths"]["/metrics"]["get"]
        assert "text/plain" in op["responses"]["200"]["content"] and "401" in op["responses"]
        assert c.get("/metrics").status_code == 401
        samples, _ = scrape(c, Authorization=f"Bearer {KEY_A}")
        assert ("paraplan_trials_per_second", frozenset()) in samples


def test_library_lines_are_json_too(tmp_path):
    """Optuna's own handler and Python warnings would break the one-object-per-line log."""
    code = ("import warnings; from app.service.core.logging import configure_logging; configure_logging('info', 'json'); "
            "import optuna; optuna.create_study(storage='sqlite:///" + str(tmp_path / "o.db") + "'); "
            "warnings.warn('careful')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr
    records = json_lines(out.stderr)
    assert any(r["logger"].startswith("optuna") and "A new study created" in r["msg"] for r in records), out.stderr
    assert any(r["logger"] == "py.warnings" and "careful" in r["msg"] for r in records), out.stderr

"""schemathesis against the OpenAPI document of a live `paraplan serve`.

A real server (subprocess, SQLite file, no worker: submitted jobs just queue) is seeded with jobs in every
state a route cares about (two succeeded jobs with ranked configs, queued ones, a cancelled one), then
schemathesis loads `/openapi.json` from it and runs every operation with positive and negative data, in its
explicit-examples, coverage and fuzzing phases, with a fixed seed and bounded examples (reproducible in CI).
Path parameters are drawn half of the time from the seeded ids, ranks and preset names (schemathesis
dictionaries), and job bodies from real presets and device counts, so the routes are exercised past their
404s and 422s. Every response must be documented: no 5xx, a status code, content type and headers the
document declares for that operation, a body that matches the declared schema, and negative data rejected.

The suite runs twice: on a server without API keys, and on one with `PARAPLAN_API_KEYS`, where every case
is sent with the valid key and again with a wrong one (the 401 must be declared and well-formed too).
A few requests schemathesis does not make (oversized bodies, bytes that are not UTF-8, numbers past the
database's integers) are sent by hand and checked the same way.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.config import SchemathesisConfig
from schemathesis.specs.openapi.checks import (content_type_conformance, negative_data_rejection,
                                               response_headers_conformance, response_schema_conformance,
                                               status_code_conformance)

import calibration_util
from service_util import TINY_JOB, Server, wait_for

KEY = "schemathesis-key-1"
CALIBRATION_OPERATIONS = [f"{m} /v1/clusters/{{name}}{p}" for m, p in (
    ("POST", "/measurements"), ("GET", "/measurements"), ("GET", "/measurements/{measurement_id}"),
    ("DELETE", "/measurements/{measurement_id}"), ("POST", "/versions"), ("GET", "/versions"),
    ("GET", "/versions/{number}"), ("GET", "/versions/{number}/report"))]
MAX_EXAMPLES = 50  # per operation, for the fuzzing phase; the examples and coverage phases add their own cases
SEED = 20250101
HALF = 0.5  # how often a path parameter or a body field is drawn from the seeded values
DOCUMENTED = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
              response_schema_conformance]
CHECKS = [*DOCUMENTED, negative_data_rejection]
STATUSES: dict[str, Counter] = defaultdict(Counter)  # server kind -> (operation, status) -> count


@schemathesis.deserializer("text/html")
def _html(ctx, response):  # the job report, checked against its declared schema (a string)
    return response.content.decode("utf-8")


class Live:
    def __init__(self, kind: str, server: Server, ids: dict[str, list[str]]):
        self.kind, self.server, self.ids = kind, server, ids
        self.keyed = kind == "api-keys"
        self.headers = {"Authorization": f"Bearer {KEY}"} if self.keyed else {}


def _submit(client: httpx.Client, body: dict) -> str:
    r = client.post("/v1/jobs", json=body)
    assert r.status_code == 202, r.text
    return r.json()["id"]


def _measure(client: httpx.Client, run: dict) -> str:
    r = client.post(f"/v1/clusters/{run['cluster']}/measurements", json=run)
    assert r.status_code == 201, r.text
    return r.json()["id"]


@pytest.fixture(scope="module", params=["no-keys", "api-keys"])
def live(request, tmp_path_factory):
    kind = request.param
    tmp = tmp_path_factory.mktemp(f"schemathesis-{kind}")
    # A refit scores every measurement per candidate factor set: the fuzzer posts many measurements and many
    # refits, so its server caps a refit at 100 run scorings (a fraction of a second) to reach every route.
    env = {"PARAPLAN_MAX_CALIBRATION_RUN_EVALS": "100", "PARAPLAN_MAX_QUEUED_JOBS": "1000000", "PARAPLAN_API_KEYS": KEY if kind == "api-keys" else ""}
    headers = {"Authorization": f"Bearer {KEY}"} if kind == "api-keys" else {}
    db, log = tmp / "st.db", tmp / "server.log"
    # Two jobs run to the end on a server with its worker, so that configs, launch and report have data.
    seeding = Server(db, log, env=env).start()
    try:
        with seeding.client(headers=headers) as c:
            done = [_submit(c, TINY_JOB), _submit(c, {**TINY_JOB, "global_batch_size": 128})]
            for job_id in done:
                assert wait_for(c, job_id)["status"] == "succeeded", seeding.log()
    finally:
        seeding.stop()
    # The server under test has no worker: what schemathesis submits only queues.
    server = Server(db, log, "--no-worker", env={**env, "PARAPLAN_EMBEDDED_WORKER": "false"}).start()
    try:
        with server.client(headers=headers) as c:
            queued = [_submit(c, TINY_JOB) for _ in range(2)]
            cancelled = _submit(c, TINY_JOB)
            assert c.post(f"/v1/jobs/{cancelled}/cancel").json()["status"] == "cancelled"
            doomed = [_submit(c, TINY_JOB) for _ in range(6)]  # drawn by DELETE only: the others stay
            measured = [_measure(c, run) for run in calibration_util.measured_runs()[:2]]
            doomed_measured = [_measure(c, run) for run in calibration_util.measured_runs()[:1] * 6]
            assert c.post(f"/v1/clusters/{calibration_util.CLUSTER}/versions").status_code == 201
        yield Live(kind, server, {"jobs": done + queued + [cancelled], "succeeded": done, "doomed": doomed,
                                  "measurements": measured, "doomed_measurements": doomed_measured})
    finally:
        server.stop()


@pytest.fixture(scope="module")
def api_schema(live):
    with live.server.client(headers=live.headers) as c:
        models = sorted(m["name"] for m in c.get("/v1/models").raise_for_status().json())
        clusters = sorted(p["name"] for p in c.get("/v1/clusters").raise_for_status().json())
    config = SchemathesisConfig.from_dict({
        "seed": SEED,
        "generation": {"mode": "all", "max-examples": MAX_EXAMPLES, "deterministic": True,
                       "with-security-parameters": False},  # the key (or a wrong one) is sent by the test
        "phases": {"examples": {"enabled": True}, "coverage": {"enabled": True}, "fuzzing": {"enabled": True},
                   "stateful": {"enabled": False}},
        "dictionaries": {
            "jobs": {"values": live.ids["jobs"]},
            "doomed": {"values": live.ids["doomed"]},
            "ranks": {"values": [1, 2, 3, 4, 5]},
            "models": {"values": models},
            "clusters": {"values": clusters},
            "devices": {"values": [8, 16, 64, 512, 6144]},
            "batches": {"values": [64, 128, 1024, 7680]},
            "calibrated": {"values": [calibration_util.CLUSTER]},
            "measurements": {"values": live.ids["measurements"]},
            "doomed_measurements": {"values": live.ids["doomed_measurements"]},
            "versions": {"values": [1]},
        },
        "parameters": {
            "path.job_id": {"dictionary": "jobs", "probability": HALF},
            "path.rank": {"dictionary": "ranks", "probability": HALF},
            "body.model": {"dictionary": "models", "probability": HALF},
            "body.cluster": {"dictionary": "clusters", "probability": HALF},
            "body.devices": {"dictionary": "devices", "probability": HALF},
            "body.global_batch_size": {"dictionary": "batches", "probability": HALF},
        },
        "operations": [
            {"include-name": "DELETE /v1/jobs/{job_id}",
             "parameters": {"path.job_id": {"dictionary": "doomed", "probability": HALF}}},
            {"include-name": "GET /v1/models/{name}",
             "parameters": {"path.name": {"dictionary": "models", "probability": HALF}}},
            {"include-name": "GET /v1/clusters/{name}",
             "parameters": {"path.name": {"dictionary": "clusters", "probability": HALF}}},
            # the calibration routes: the cluster the seeded measurements and version 1 are of
            *({"include-name": name, "parameters": {
                "path.name": {"dictionary": "calibrated", "probability": HALF},
                "path.measurement_id": {"dictionary": "doomed_measurements" if name.startswith("DELETE")
                                        else "measurements", "probability": HALF},
                "path.number": {"dictionary": "versions", "probability": HALF}}}
              for name in CALIBRATION_OPERATIONS),
        ],
    })
    return schemathesis.openapi.from_url(f"{live.server.url}/openapi.json", config=config)


schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.fixture(autouse=True)
def _node_id_for_schemathesis(request):
    """schemathesis (4.32) names each operation's subtest through ``node._nodeid``, which pytest 9.2 no
    longer has; give the node one (its subtests are then reported under the test's own id)."""
    if not hasattr(request.node, "_nodeid"):
        request.node._nodeid = request.node.nodeid


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
def test_every_answer_is_documented(case, live):
    response = case.call_and_validate(headers=live.headers, checks=CHECKS, timeout=60)
    STATUSES[live.kind][(case.operation.label, response.status_code)] += 1
    if live.keyed:  # the same request with a wrong key: a declared, well-formed 401 (or an input error)
        response = case.call_and_validate(headers={"Authorization": "Bearer not-a-key"}, checks=CHECKS, timeout=60)
        STATUSES[live.kind][(case.operation.label, response.status_code)] += 1


def test_the_run_reached_real_objects(live):
    """Not only 404s and 422s: every operation answered with success at least once in the run above."""
    seen = STATUSES[live.kind]
    if not seen:
        pytest.skip("the schemathesis run did not take place in this session")
    labels = {label for label, _ in seen}
    succeeded = {label for label, status in seen if 200 <= status < 300}
    assert labels - succeeded == set(), sorted(labels - succeeded)
    if live.keyed:
        # the probes answer without a key (an orchestrator holds none): liveness and readiness
        open_probes = {"GET /healthz", "GET /readyz"}
        assert all((label, 401) in seen for label in labels if label not in open_probes), sorted(seen)
    with live.server.client(headers=live.headers) as c:  # and the seeded results are still there
        for job_id in live.ids["succeeded"]:
            assert c.get(f"/v1/jobs/{job_id}").json()["status"] == "succeeded"


def _request(live: Live, method: str, path: str, **kw) -> httpx.Response:
    headers = {**live.headers, **kw.pop("headers", {})}
    return httpx.request(method, f"{live.server.url}{path}", headers=headers, timeout=60, **kw)


def _check(api_schema, method: str, template: str, response: httpx.Response, **case) -> None:
    api_schema[template][method].Case(**case).validate_response(response, checks=DOCUMENTED)


BIG = b"{" + b" " * (2 * 1024 * 1024) + b"}"  # over PARAPLAN_MAX_BODY_BYTES (1 MiB)


def test_oversized_bodies_are_declared_413s(live, api_schema):
    job_id = live.ids["jobs"][0]
    for method, template, path in (("POST", "/v1/jobs", "/v1/jobs"), ("POST", "/v1/evaluate", "/v1/evaluate"),
                                   ("POST", "/v1/jobs/{job_id}/cancel", f"/v1/jobs/{job_id}/cancel")):
        r = _request(live, method, path, content=BIG, headers={"Content-Type": "application/json"})
        assert r.status_code == 413, (path, r.status_code, r.text)
        _check(api_schema, method, template, r, path_parameters={"job_id": job_id} if "{" in template else None)


def test_numbers_past_the_database_integers_are_422s(live, api_schema):
    job_id = live.ids["succeeded"][0]
    huge = 2**63
    for template, path, case in (
            ("/v1/jobs", f"/v1/jobs?offset={huge}", {"query": {"offset": huge}}),
            ("/v1/jobs/{job_id}/configs", f"/v1/jobs/{job_id}/configs?offset={huge}",
             {"path_parameters": {"job_id": job_id}, "query": {"offset": huge}}),
            ("/v1/jobs/{job_id}/configs/{rank}/launch", f"/v1/jobs/{job_id}/configs/{huge}/launch",
             {"path_parameters": {"job_id": job_id, "rank": huge}})):
        r = _request(live, "GET", path)
        assert r.status_code == 422, (path, r.status_code, r.text)
        _check(api_schema, "GET", template, r, **case)


# Pending a fix in app/service/main.py (exception handlers; see the report of this test's change). FastAPI answers a
# JSON body that is not UTF-8 with an undeclared 400 `{"detail": "There was an error parsing the body"}` (not
# the error shape); and its 422 handler cannot encode the echoed input when it is such bytes (sent as another
# content type) or NaN / Infinity (which Python's JSON parser accepts), so those answer 500.
UNENCODABLE = {
    "not-utf8-json": (b"\xff\xfe{", "application/json"),
    "not-utf8-text": (b"\xff\xfe{", "text/plain"),
    "not-utf8-no-type": (b"\xff\xfe{", None),
    "nan": (b'{"model": "tiny-moe", "cluster": "ascend-910b", "devices": NaN, "global_batch_size": 64, '
            b'"config": {}}', "application/json"),
    "infinity": (b'{"model": "tiny-moe", "cluster": "ascend-910b", "devices": 8, "global_batch_size": 64, '
                 b'"moe_load_imbalance": Infinity, "search": {"timeout_s": -Infinity}, "config": {}}',
                 "application/json"),
}


@pytest.mark.parametrize("body", UNENCODABLE.values(), ids=UNENCODABLE.keys())
@pytest.mark.parametrize("template", ["/v1/jobs", "/v1/evaluate"])
def test_bodies_json_cannot_carry_are_422s(live, api_schema, template, body):
    content, content_type = body
    r = _request(live, "POST", template, content=content,
                 headers={"Content-Type": content_type} if content_type else {})
    assert r.status_code == 422, (r.status_code, r.text)
    assert r.json()["detail"][0]["loc"][0] == "body"
    _check(api_schema, "POST", template, r)


def test_request_numbers_are_bounded_in_the_document(live):
    doc = httpx.get(f"{live.server.url}/openapi.json").json()
    components = doc["components"]["schemas"]
    unbounded = [f"{name}.{field}" for name in ("JobCreate", "SearchOptions", "EvaluateRequest")
                 for field, prop in _properties(components, name).items()
                 if _is_number(prop) and "maximum" not in json.dumps(prop)]
    assert not unbounded, unbounded
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            for p in op.get("parameters", []):
                if _is_number(p["schema"]):
                    assert "maximum" in json.dumps(p["schema"]), (method, path, p["name"])


def _properties(components: dict, name: str) -> dict:
    for key in (name, f"{name}-Input"):
        if key in components:
            return components[key]["properties"]
    raise KeyError(name)


def _is_number(schema: dict) -> bool:
    text = json.dumps(schema)
    return '"integer"' in text or '"number"' in text

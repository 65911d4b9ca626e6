"""API keys and hostile input, in-process: every /v1 route of the OpenAPI document (and /metrics) refuses
a missing, wrong or almost-right key; a key sees only its own jobs (another key's job is a 404 like an
unknown id); the queued-jobs cap is per key; the caps on devices, trials, top_k, timeout and body size
are 422/413 naming the field, while the documented floor (100,000 devices, 10,000 trials) is accepted."""

from __future__ import annotations

import hashlib
import uuid

import pytest

from app.service.api.deps import key_matches
from app.service.core.config import Settings
from service_util import TINY_JOB
from test_service_api import make_client, submit

KEY_A = "pk-alpha-7c1e9b0d42f3"
KEY_B = "pk-bravo-58a2e6d1c07b"
EVAL_BODY = {"model": "tiny-moe", "cluster": "nvidia-h100-80gb", "devices": 8,
             "config": {"tp": 2, "global_batch_size": 64}}
LAUNCH_TEXT = ("torchrun --nnodes 1 --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 2 "
               "--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 512 --max-position-embeddings 512 "
               "--vocab-size 1024 --micro-batch-size 1 --global-batch-size 64 --bf16")
COMPARE_BODY = {"cluster": "nvidia-h100-80gb",
                "a": {"model": "tiny-moe", "devices": 8, "config": {"tp": 2, "global_batch_size": 64}},
                "b": {"model": "tiny-moe", "devices": 8, "config": {"tp": 1, "global_batch_size": 64}}}
BODIES = {"/v1/jobs": TINY_JOB, "/v1/evaluate": EVAL_BODY, "/v1/launch/import": {"text": LAUNCH_TEXT},
          "/v1/compare": COMPARE_BODY}
# The calibration routes' bodies: one measured run, and a refit kept short.
CALIBRATION_BODIES = {
    "/v1/clusters/{name}/measurements": {"name": "team-run", "devices": 8, "model": "tiny-moe",
                                         "config": {"tp": 2, "global_batch_size": 64},
                                         "reported": {"tokens_per_s_per_device": 1000.0}},
    "/v1/clusters/{name}/versions": {"max_evals": 10}}
# Path parameters of the calibration routes: the cluster, a measurement id and a version number.
CALIBRATION_PARAMS = {"name": "nvidia-h100-80gb", "measurement_id": str(uuid.uuid4()), "number": "1"}
CATALOG_NAMES = {"/v1/models/{name}": "tiny-moe", "/v1/clusters/{name}": "nvidia-h100-80gb"}
# The routes the document must have (the loop below covers whatever else it declares as well).
KNOWN = {("/v1/jobs", "post"), ("/v1/jobs", "get"), ("/v1/jobs/{job_id}", "get"), ("/v1/jobs/{job_id}", "delete"),
         ("/v1/jobs/{job_id}/configs", "get"), ("/v1/jobs/{job_id}/cancel", "post"),
         ("/v1/jobs/{job_id}/report", "get"), ("/v1/jobs/{job_id}/configs/{rank}/launch", "get"),
         ("/v1/evaluate", "post"), ("/v1/models", "get"), ("/v1/models/{name}", "get"), ("/v1/clusters", "get"),
         ("/v1/clusters/{name}", "get")}


def bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def last_char_changed(key: str) -> str:
    return key[:-1] + ("x" if key[-1] != "x" else "y")


def operations(doc: dict, prefix: str = "/v1") -> list[tuple[str, str, dict]]:
    methods = {"get", "post", "put", "patch", "delete"}
    return [(path, method, op) for path, item in doc["paths"].items() if path.startswith(prefix)
            for method, op in item.items() if method in methods]


def fill(path: str, op: dict, job_id: str) -> str:
    """The path with its parameters filled: a real job id, rank 1, a shipped preset or profile name."""
    for p in op.get("parameters", []):
        if p["in"] != "path":
            continue
        value = ({"job_id": job_id, "rank": "1"}.get(p["name"]) or CATALOG_NAMES.get(path)
                 or CALIBRATION_PARAMS.get(p["name"]))
        assert value, f"no test value for path parameter {p['name']} of {path}: add one"
        path = path.replace("{" + p["name"] + "}", value)
    return path


def call(client, path: str, method: str, op: dict, job_id: str, headers: dict):
    body = None
    if "requestBody" in op:
        bodies = {**BODIES, **CALIBRATION_BODIES}
        assert path in bodies, f"no test body for {method.upper()} {path}: add one"
        body = bodies[path]
    return client.request(method.upper(), fill(path, op, job_id), json=body, headers=headers)


@pytest.fixture
def keyed(tmp_path):
    with make_client(tmp_path, api_keys=f"{KEY_A}, {KEY_B}") as c:
        yield c


def test_every_v1_route_and_metrics_need_a_valid_key(keyed):
    doc = keyed.get("/openapi.json").json()
    ops = operations(doc)
    assert KNOWN <= {(path, method) for path, method, _ in ops}
    ops += [(path, method, op) for path, method, op in operations(doc, "/metrics")]
    refused = {"none": {}, "wrong": bearer("wrong"), "last char": bearer(last_char_changed(KEY_A)),
               "prefix": bearer(KEY_A[:-1]), "longer": bearer(KEY_A + "0"), "empty": {"Authorization": "Bearer "},
               "other scheme": {"Authorization": f"Basic {KEY_A}"}, "bare": {"Authorization": KEY_A}}
    for path, method, op in ops:
        job_id = submit(keyed, None, **bearer(KEY_A)).json()["id"]  # a fresh job: DELETE must not eat others'
        for name, headers in refused.items():
            r = call(keyed, path, method, op, job_id, headers)
            assert r.status_code == 401, (method, path, name, r.status_code, r.text)
            assert r.json()["detail"][0]["loc"] == ["header", "Authorization"]
            assert r.headers["www-authenticate"] == "Bearer"
        # refused calls changed nothing
        assert keyed.get(f"/v1/jobs/{job_id}", headers=bearer(KEY_A)).json()["status"] == "queued"
        for key in (KEY_A, KEY_B):
            r = call(keyed, path, method, op, job_id if key == KEY_A else str(uuid.uuid4()), bearer(key))
            assert r.status_code != 401, (method, path, r.text)


def test_open_routes_stay_open_with_keys(keyed):
    for path in ("/healthz", "/docs", "/openapi.json"):
        assert keyed.get(path).status_code == 200, path


def test_key_check_compares_every_key_in_constant_time():
    keys = [KEY_A, KEY_B, "k" * 200]
    assert key_matches(KEY_A, keys) and key_matches(KEY_B, keys) and key_matches("k" * 200, keys)
    for given in ("", "wrong", last_char_changed(KEY_A), KEY_A[:-1], KEY_A + " ", KEY_A.upper(), "k" * 199):
        assert not key_matches(given, keys), given


def test_another_keys_job_is_404_on_every_job_route_and_not_listed(keyed):
    doc = keyed.get("/openapi.json").json()
    a = submit(keyed, None, **bearer(KEY_A)).json()["id"]
    b = submit(keyed, None, **bearer(KEY_B)).json()["id"]
    unknown = str(uuid.uuid4())
    job_ops = [(path, method, op) for path, method, op in operations(doc) if "{job_id}" in path]
    assert len(job_ops) >= 6
    for path, method, op in job_ops:
        theirs = call(keyed, path, method, op, a, bearer(KEY_B))
        nobody = call(keyed, path, method, op, unknown, bearer(KEY_B))
        assert theirs.status_code == nobody.status_code == 404, (method, path, theirs.text)
        t, n = theirs.json()["detail"][0], nobody.json()["detail"][0]
        assert (t["loc"], t["type"], t["msg"].replace(a, unknown)) == (n["loc"], n["type"], n["msg"])
    job = keyed.get(f"/v1/jobs/{a}", headers=bearer(KEY_A)).json()
    assert job["status"] == "queued"  # B's cancel and delete did nothing
    for key, own in ((KEY_A, a), (KEY_B, b)):
        page = keyed.get("/v1/jobs", headers=bearer(key)).json()
        assert [j["id"] for j in page["items"]] == [own] and page["total"] == 1
        assert keyed.get("/v1/jobs", params={"status": "queued"}, headers=bearer(key)).json()["total"] == 1
    r = keyed.post(f"/v1/jobs/{a}/cancel", headers=bearer(KEY_A))
    assert r.status_code == 200 and r.json()["status"] == "cancelled"


def test_jobs_are_stored_with_the_callers_scope(tmp_path):
    from app.service.db.models import Job

    with make_client(tmp_path, api_keys=KEY_A) as c:
        job_id = submit(c, None, **bearer(KEY_A)).json()["id"]
        with c.app.state.sessions() as db:
            owner = db.get(Job, job_id).owner
    assert owner == hashlib.sha256(KEY_A.encode()).hexdigest()[:32]


def test_queued_cap_is_per_key(tmp_path):
    with make_client(tmp_path, api_keys=f"{KEY_A},{KEY_B}", max_queued_jobs=2) as c:
        first = [submit(c, None, **bearer(KEY_A)).json()["id"] for _ in range(2)]
        r = submit(c, None, **bearer(KEY_A))
        assert r.status_code == 429 and int(r.headers["retry-after"]) > 0
        assert r.json()["detail"][0]["loc"] == ["body"] and r.json()["detail"][0]["type"] == "too_many_jobs"
        assert [submit(c, None, **bearer(KEY_B)).status_code for _ in range(3)] == [202, 202, 429]
        c.post(f"/v1/jobs/{first[0]}/cancel", headers=bearer(KEY_A))  # only queued jobs count
        assert submit(c, None, **bearer(KEY_A)).status_code == 202


def test_documented_floor_of_devices_and_trials_is_accepted_by_default(tmp_path):
    fields = Settings.model_fields
    assert fields["max_devices"].default >= 100_000 and fields["max_trials"].default >= 10_000
    with make_client(tmp_path) as c:  # the other settings at their defaults too
        body = {**TINY_JOB, "devices": 100_000, "global_batch_size": 400_000,
                "search": {"sampler": "tpe", "n_trials": 10_000}}
        r = submit(c, body)
        assert r.status_code == 202, r.text
        assert r.json()["inputs"]["devices"] == 100_000 and r.json()["progress"]["trials_total"] == 10_000
        over = {**TINY_JOB, "search": {"sampler": "tpe", "n_trials": fields["max_trials"].default + 1}}
        r = submit(c, over)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "search", "n_trials"]
        r = submit(c, {**TINY_JOB, "devices": fields["max_devices"].default + 1})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "devices"]


@pytest.mark.parametrize("change,loc", [
    ({"devices": 65}, ["body", "devices"]),
    ({"search": {"n_trials": 51}}, ["body", "search", "n_trials"]),
    ({"search": {"top_k": 4}}, ["body", "search", "top_k"]),
    ({"search": {"timeout_s": 10.5}}, ["body", "search", "timeout_s"]),
])
def test_caps_are_422_naming_the_field(tmp_path, change, loc):
    caps = {"max_devices": 64, "max_trials": 50, "max_top_k": 3, "max_timeout_s": 10}
    with make_client(tmp_path, **caps) as c:
        body = {**TINY_JOB, "global_batch_size": 512, "search": {**TINY_JOB["search"], "top_k": 3, "n_trials": 50,
                                                                            "timeout_s": 10}}
        r = submit(c, {**body, "devices": 64})
        assert r.status_code == 202, r.text  # at the cap: fine
        body = {**body, **change, "search": {**body["search"], **change.get("search", {})}}
        r = submit(c, body)
        assert r.status_code == 422, r.text
        detail = r.json()["detail"][0]
        assert detail["loc"] == loc and "at most" in detail["msg"]
        if loc == ["body", "devices"]:
            r = c.post("/v1/evaluate", json={**EVAL_BODY, "devices": 65})
            assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "devices"]


def test_body_over_the_cap_is_413_on_every_route_with_a_body(tmp_path):
    with make_client(tmp_path, api_keys=KEY_A, max_body_bytes=2048) as c:
        padding = {"name": "x" * 4000}
        for path, body in BODIES.items():
            big = {**body, "model": {"base": "tiny-moe", **padding}}
            r = c.post(path, json=big, headers=bearer(KEY_A))
            assert r.status_code == 413, (path, r.text)
            assert r.json()["detail"][0] == {"loc": ["body"], "type": "body_too_large",
                                             "msg": "the request body is larger than 2048 bytes"}
            assert c.post(path, json=body, headers=bearer(KEY_A)).status_code in (200, 202)

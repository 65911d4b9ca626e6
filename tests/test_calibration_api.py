"""Measurements and profile versions over the API in-process (the service): bad runs are
422s naming the field, the shapes, paging and deletion, isolation per API key, `"cluster": "name@n"` in
evaluate and jobs, the version's report. The factor recovery and the restart run over real HTTP
(test_calibration_e2e.py)."""

from __future__ import annotations

import copy
import warnings

import pytest

warnings.filterwarnings("ignore", message=".*httpx2.*")

from fastapi.testclient import TestClient  # noqa: E402

import calibration_util  # noqa: E402
from app.formats.results import evaluate  # noqa: E402
from app.service.core.config import Settings  # noqa: E402
from app.service.main import create_app  # noqa: E402
from costmodel import ClusterProfile  # noqa: E402
from costmodel.spec import TrainingConfig  # noqa: E402
import model_presets  # noqa: E402

KEY_A, KEY_B = "key-a-" + "a" * 20, "key-b-" + "b" * 20
BASE = "/v1/clusters/ascend-910b"
QUICK_EVALS = 30  # enough to move the factors; the recovery itself is test_calibration_e2e's


def auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def runs():
    return calibration_util.measured_runs()


@pytest.fixture
def client(tmp_path):
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'api.db'}", api_keys=f"{KEY_A},{KEY_B}"))
    with TestClient(app) as c:
        yield c


def _without(run: dict, *path: str) -> dict:
    out = copy.deepcopy(run)
    node = out
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return out


def _with(run: dict, value, *path: str) -> dict:
    out = copy.deepcopy(run)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


@pytest.mark.parametrize("change,loc", [
    (lambda r: _without(r, "reported"), ["body", "reported"]),
    (lambda r: _without(r, "reported", "tokens_per_s_per_device"), ["body", "reported", "tokens_per_s_per_device"]),
    (lambda r: _with(r, -3.0, "reported", "tokens_per_s_per_device"), ["body", "reported", "tokens_per_s_per_device"]),
    (lambda r: _with(r, "fast", "reported", "tokens_per_s_per_device"), ["body", "reported", "tokens_per_s_per_device"]),
    (lambda r: _with(r, "nvidia-h100-80gb", "cluster"), ["body", "cluster"]),
    (lambda r: _with(r, "no-such-model", "model"), ["body", "model"]),
    (lambda r: _with(r, "/etc/passwd", "model"), ["body", "model"]),  # a string is a preset name, never a path
    (lambda r: _with(r, 0, "devices"), ["body", "devices"]),
    (lambda r: _without(r, "name"), ["body", "name"]),
    (lambda r: _with(r, 0, "config", "tp"), ["body", "config", "tp"]),
    (lambda r: _with(r, "sometimes", "config", "recompute"), ["body", "config", "recompute"]),
    (lambda r: _with(r, 3, "config", "tp"), ["body", "config"]),  # 3 does not divide the heads: not scorable
])
def test_a_bad_measurement_is_a_422_naming_the_field(client, runs, change, loc):
    r = client.post(f"{BASE}/measurements", json=change(runs[0]), headers=auth(KEY_A))
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == loc, r.json()
    assert client.get(f"{BASE}/measurements", headers=auth(KEY_A)).json()["total"] == 0


def test_measurements_are_stored_listed_read_and_deleted(client, runs):
    posted = []
    for run in runs[:3]:
        r = client.post(f"{BASE}/measurements", json={k: v for k, v in run.items() if k != "cluster"},
                        headers=auth(KEY_A))
        assert r.status_code == 201, r.text
        posted.append(r.json())
    first = posted[0]
    assert first["run"] == {**runs[0], "cluster": "ascend-910b"} and first["cluster"] == "ascend-910b"
    page = client.get(f"{BASE}/measurements", params={"limit": 2, "offset": 1}, headers=auth(KEY_A)).json()
    assert page["total"] == 3 and page["limit"] == 2 and page["offset"] == 1
    assert [m["id"] for m in page["items"]] == [m["id"] for m in posted[1:]]
    assert client.get(f"{BASE}/measurements/{first['id']}", headers=auth(KEY_A)).json() == first
    assert client.delete(f"{BASE}/measurements/{first['id']}", headers=auth(KEY_A)).status_code == 204
    r = client.get(f"{BASE}/measurements/{first['id']}", headers=auth(KEY_A))
    assert r.status_code == 404 and r.json()["detail"][0]["loc"] == ["path", "measurement_id"]
    assert client.get(f"{BASE}/measurements", headers=auth(KEY_A)).json()["total"] == 2


def test_an_unknown_cluster_is_a_404(client, runs):
    for method, path in (("post", "/measurements"), ("get", "/measurements"), ("post", "/versions"),
                         ("get", "/versions"), ("get", "/versions/0")):
        kw = {"json": runs[0]} if path == "/measurements" and method == "post" else {}
        r = getattr(client, method)(f"/v1/clusters/nope{path}", headers=auth(KEY_A), **kw)
        assert r.status_code == 404 and r.json()["detail"][0]["loc"] == ["path", "name"], (method, path, r.text)


def test_a_refit_without_measurements_is_a_422_naming_the_cluster(client):
    r = client.post(f"{BASE}/versions", headers=auth(KEY_A))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["path", "name"]
    assert "measurements" in r.json()["detail"][0]["msg"]
    r = client.post(f"{BASE}/versions", json={"max_evals": 1}, headers=auth(KEY_A))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "max_evals"]


def _refit(client, runs, key=KEY_A) -> dict:
    for run in runs:
        assert client.post(f"{BASE}/measurements", json=run, headers=auth(key)).status_code == 201
    r = client.post(f"{BASE}/versions", json={"max_evals": QUICK_EVALS}, headers=auth(key))
    assert r.status_code == 201, r.text
    return r.json()


def test_versions_are_numbered_and_carry_the_fit(client, runs):
    one = _refit(client, runs[:2])
    two = _refit(client, runs[2:3])  # fitted on all three measurements
    assert (one["number"], two["number"]) == (1, 2) and two["name"] == "ascend-910b@2"
    assert two["runs"] == 3 and len(two["run_errors"]) == 3 and two["mape_after"] < two["mape_before"]
    assert ClusterProfile.model_validate(two["profile"]).version() == two["profile_version"]
    assert two["published"] is None or two["published_worse"] == (
        two["published"]["mape_after"] > two["published"]["mape_before"] + 0.05)
    listed = client.get(f"{BASE}/versions", headers=auth(KEY_A)).json()
    assert [v["number"] for v in listed["items"]] == [0, 1, 2] and listed["total"] == 3
    shipped = listed["items"][0]
    assert shipped["profile_version"] == client.get(BASE, headers=auth(KEY_A)).json()["profile_version"]
    assert "profile" not in listed["items"][1]
    assert client.get(f"{BASE}/versions/2", headers=auth(KEY_A)).json() == two
    r = client.get(f"{BASE}/versions/3", headers=auth(KEY_A))
    assert r.status_code == 404 and r.json()["detail"][0]["loc"] == ["path", "number"]


def test_evaluate_and_jobs_on_a_version_use_its_profile(client, runs):
    version = _refit(client, runs[:2])
    model, devices, cfg = calibration_util.RUNS[2]
    body = {"model": model, "cluster": "ascend-910b@1", "devices": devices, "config": cfg}
    r = client.post("/v1/evaluate", json=body, headers=auth(KEY_A))
    assert r.status_code == 200, r.text
    fitted = ClusterProfile.model_validate(version["profile"])
    expected = evaluate(model_presets.load(model), fitted, devices, TrainingConfig.model_validate(cfg))
    assert r.json()["tokens_per_s_per_device"] == pytest.approx(expected["tokens_per_s_per_device"], rel=1e-9)
    assert r.json()["versions"]["profile"] == version["profile_version"]
    shipped = client.post("/v1/evaluate", json={**body, "cluster": "ascend-910b@0"}, headers=auth(KEY_A)).json()
    assert shipped == client.post("/v1/evaluate", json={**body, "cluster": "ascend-910b"}, headers=auth(KEY_A)).json()
    assert shipped["tokens_per_s_per_device"] != r.json()["tokens_per_s_per_device"]

    job = {"model": model, "cluster": "ascend-910b@1", "devices": devices, "global_batch_size": 32,
           "search": {"sampler": "exhaustive", "top_k": 3}}
    r = client.post("/v1/jobs", json=job, headers=auth(KEY_A))
    assert r.status_code == 202, r.text
    assert r.json()["inputs"]["cluster"] == "ascend-910b@1"
    assert r.json()["inputs"]["profile_version"] == version["profile_version"]


@pytest.mark.parametrize("cluster", ["ascend-910b@9", "nope@1", "ascend-910b@x", "ascend-910b@1@2", "@1"])
def test_an_unknown_version_is_a_422_naming_cluster(client, runs, cluster):
    _refit(client, runs[:1])
    model, devices, cfg = calibration_util.RUNS[0]
    for path, body in (("/v1/evaluate", {"model": model, "cluster": cluster, "devices": devices, "config": cfg}),
                       ("/v1/jobs", {"model": model, "cluster": cluster, "devices": devices,
                                     "global_batch_size": 64})):
        r = client.post(path, json=body, headers=auth(KEY_A))
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "cluster"], (path, r.text)


def test_another_key_sees_none_of_them(client, runs):
    version = _refit(client, runs[:1])
    measurement = client.get(f"{BASE}/measurements", headers=auth(KEY_A)).json()["items"][0]
    assert client.get(f"{BASE}/measurements", headers=auth(KEY_B)).json()["total"] == 0
    for method in ("get", "delete"):
        r = getattr(client, method)(f"{BASE}/measurements/{measurement['id']}", headers=auth(KEY_B))
        assert r.status_code == 404, r.text
    assert [v["number"] for v in client.get(f"{BASE}/versions", headers=auth(KEY_B)).json()["items"]] == [0]
    for path in ("/versions/1", "/versions/1/report"):
        assert client.get(f"{BASE}{path}", headers=auth(KEY_B)).status_code == 404
    r = client.post("/v1/evaluate", json={"model": "gpt-1.3b", "cluster": "ascend-910b@1", "devices": 8,
                                          "config": {"tp": 1, "global_batch_size": 64}}, headers=auth(KEY_B))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "cluster"]
    r = client.post(f"{BASE}/versions", headers=auth(KEY_B))  # B has no measurements: A's are not B's
    assert r.status_code == 422
    assert client.get(f"{BASE}/versions/1", headers=auth(KEY_A)).json()["profile_version"] == version["profile_version"]
    assert client.get(f"{BASE}/measurements", headers=auth(KEY_A)).json()["total"] == 1
    assert client.get(f"{BASE}/measurements").status_code == 401


def test_the_version_report_plots_its_runs(client, runs):
    version = _refit(client, runs[:3])
    r = client.get(f"{BASE}/versions/1/report", headers=auth(KEY_A))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    from test_calibration_report import scatter_of

    before, after, diagonal = scatter_of(r.text)["data"]
    assert len(before["x"]) == len(after["x"]) == 3 and diagonal["mode"] == "lines"
    assert after["y"] == pytest.approx([e["reported"] * (1 + e["after"]) for e in version["run_errors"]])
    r = client.get(f"{BASE}/versions/0/report", headers=auth(KEY_A))
    assert r.status_code == 409 and r.json()["detail"][0]["loc"] == ["path", "number"]


def test_the_openapi_document_declares_the_new_routes_errors(client):
    doc = client.get("/openapi.json").json()
    post = doc["paths"]["/v1/clusters/{name}/versions"]["post"]["responses"]
    assert {"201", "401", "404", "413", "422", "503"} <= set(post)
    assert {"201", "404", "413", "422"} <= set(doc["paths"]["/v1/clusters/{name}/measurements"]["post"]["responses"])
    assert {"204", "404"} <= set(doc["paths"]["/v1/clusters/{name}/measurements/{measurement_id}"]["delete"]["responses"])
    assert {"200", "404", "409"} <= set(doc["paths"]["/v1/clusters/{name}/versions/{number}/report"]["get"]["responses"])

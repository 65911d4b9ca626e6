"""Calibration through the service end to end: `paraplan serve` over real HTTP on a
real SQLite file, with API keys. Measurements synthesised from the changed 910B (``calibration_util``:
GEMMs 10 % faster, scale-out link 30 % slower) are posted, a version is refitted on them and recovers
both factors; a job on ``ascend-910b@1`` ranks configs as ``search.run_search`` does with the fitted
profile; after a restart the measurements and the version are still there; another key sees none."""

from __future__ import annotations

import httpx
import pytest

import calibration_util
import model_presets
from costmodel import ClusterProfile
from search import SearchRequest, run_search
from service_util import running_server, wait_for

KEY_A, KEY_B = "e2e-key-a-" + "1" * 20, "e2e-key-b-" + "2" * 20
BASE = "/v1/clusters/ascend-910b"
JOB = {"model": "mixtral-8x22b", "devices": 128, "global_batch_size": 128,
       "search": {"sampler": "exhaustive", "top_k": 5}}  # EP wider than a node is one of its choices
FIT_TIMEOUT_S = 300  # the fit of ten runs takes about 30 s on one free core


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory, "calserve", env={"PARAPLAN_API_KEYS": f"{KEY_A},{KEY_B}"}) as srv:
        yield srv


def client(server, key: str):
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=FIT_TIMEOUT_S)


@pytest.fixture(scope="module")
def fitted(server):
    """Key A's measurements and its version 1, refitted on them."""
    with client(server, KEY_A) as c:
        ids = []
        for run in calibration_util.measured_runs():
            r = c.post(f"{BASE}/measurements", json=run)
            assert r.status_code == 201, r.text
            ids.append(r.json()["id"])
        r = c.post(f"{BASE}/versions", json={"max_evals": calibration_util.FIT_EVALS})
        assert r.status_code == 201, r.text
        return ids, r.json()


def test_the_refit_recovers_the_changed_factors(fitted):
    ids, version = fitted
    assert version["number"] == 1 and version["measurement_ids"] == ids
    for key, value in calibration_util.truth().items():
        assert version["factors"][key]["after"] == pytest.approx(value, rel=0.02), key
        assert version["profile"]["efficiency"][key]["value"] == pytest.approx(value, rel=0.02), key
    assert version["mape_before"] > 0.03 and version["mape_after"] < 0.005
    assert ClusterProfile.model_validate(version["profile"]).version() == version["profile_version"]


def test_a_job_on_the_version_ranks_as_the_fitted_profile_does(server, fitted):
    _, version = fitted
    with client(server, KEY_A) as c:
        tops = {}
        for cluster in ("ascend-910b@1", "ascend-910b@0"):
            r = c.post("/v1/jobs", json={**JOB, "cluster": cluster})
            assert r.status_code == 202, r.text
            job = wait_for(c, r.json()["id"], timeout=FIT_TIMEOUT_S)
            assert job["status"] == "succeeded", job
            tops[cluster] = c.get(f"/v1/jobs/{job['id']}/configs").json()["items"]
            if cluster.endswith("@1"):
                assert job["inputs"]["profile_version"] == version["profile_version"]
    direct = run_search(SearchRequest(spec=model_presets.load(JOB["model"]),
                                      profile=ClusterProfile.model_validate(version["profile"]),
                                      devices=JOB["devices"], global_batch_size=JOB["global_batch_size"],
                                      sampler="exhaustive", top_k=5, framework="mindspeed"))
    ranked = tops["ascend-910b@1"]
    assert [e["config"] for e in ranked] == [e["config"] for e in direct["top"]]
    assert [e["evaluation"]["tokens_per_s_per_device"] for e in ranked] == pytest.approx(
        [e["evaluation"]["tokens_per_s_per_device"] for e in direct["top"]], rel=1e-9)
    assert all(e["evaluation"]["versions"]["profile"] == version["profile_version"] for e in ranked)
    # the shipped profile ranks otherwise: the version is not the shipped profile under another name
    shipped = [e["evaluation"]["tokens_per_s_per_device"] for e in tops["ascend-910b@0"]]
    assert shipped != pytest.approx([e["evaluation"]["tokens_per_s_per_device"] for e in ranked], rel=1e-3)


def test_measurements_and_versions_survive_a_restart_and_stay_the_keys(server, fitted):
    ids, version = fitted
    with client(server, KEY_A) as c:
        listed = c.get(f"{BASE}/measurements", params={"limit": 100}).json()
    server.stop()
    server.start()
    with client(server, KEY_A) as c:
        again = c.get(f"{BASE}/measurements", params={"limit": 100}).json()
        assert again == listed and [m["id"] for m in again["items"]] == ids
        assert c.get(f"{BASE}/versions/1").json() == version
        assert [v["number"] for v in c.get(f"{BASE}/versions").json()["items"]] == [0, 1]
    with client(server, KEY_B) as c:
        assert c.get(f"{BASE}/measurements").json()["total"] == 0
        assert c.get(f"{BASE}/measurements/{ids[0]}").status_code == 404
        assert c.delete(f"{BASE}/measurements/{ids[0]}").status_code == 404
        assert c.get(f"{BASE}/versions/1").status_code == 404
        assert [v["number"] for v in c.get(f"{BASE}/versions").json()["items"]] == [0]
        r = c.post("/v1/jobs", json={**JOB, "cluster": "ascend-910b@1"})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "cluster"]
    with client(server, KEY_A) as c:  # B's tries changed nothing of A's
        assert c.get(f"{BASE}/measurements/{ids[0]}").status_code == 200

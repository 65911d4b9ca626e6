"""A job is accepted at once over real HTTP: ``POST /v1/jobs`` checks what is cheap and stores the job; the
search space (seconds for Pangu Ultra MoE on 6,144 NPUs) is built by the worker that runs it, which then
records the engine ``auto`` chose and the space size. A space that turns out empty fails the job with its
reason. (The accept latency itself is measured by ``benchmarks/accept.py``.)"""

from __future__ import annotations

import pytest

from service_util import PANGU_JOB, TINY_JOB, Server, WorkerProcess, wait_for


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server without a worker: what a job looks like between its accept and its run."""
    d = tmp_path_factory.mktemp("accept")
    srv = Server(d / "srv.db", d / "serve.log", "--no-worker").start()
    yield srv
    srv.stop()


def test_a_pangu_job_is_accepted_before_its_space_is_built(server):
    with server.client() as c:
        r = c.post("/v1/jobs", json={**PANGU_JOB, "search": {"sampler": "auto", "n_trials": 200, "seed": 7}})
        assert r.status_code == 202, r.text
        job = r.json()
        search = job["inputs"]["search"]
        assert (search["engine"], search["space_size"]) == ("auto", None)  # not built in the request
        assert job["status"] == "queued" and job["progress"] == {"trials_done": 0, "trials_total": 0}
        sampler = c.post("/v1/jobs", json=PANGU_JOB).json()  # a named sampler: its trial count is the total
        assert sampler["inputs"]["search"]["engine"] == "tpe" and sampler["progress"]["trials_total"] == 200
        assert c.get(f"/v1/jobs/{job['id']}").json()["inputs"]["search"]["space_size"] is None


def test_cheap_checks_still_answer_422(server):
    with server.client() as c:
        for change, loc in (({"search": {"sampler": "exhaustive", "fixed": {"tp": 3}}}, ["body", "search", "fixed"]),
                            ({"search": {"sampler": "exhaustive", "parallel_workers": 2}},
                             ["body", "search", "parallel_workers"]),
                            ({"model": "nope"}, ["body", "model"])):
            r = c.post("/v1/jobs", json={**TINY_JOB, **change})
            assert r.status_code == 422, r.text
            assert r.json()["detail"][0]["loc"] == loc, r.json()
        assert "does not divide the 8 devices" in c.post(
            "/v1/jobs", json={**TINY_JOB, "search": {"fixed": {"tp": 3}}}).json()["detail"][0]["msg"]


def test_the_worker_resolves_the_engine_and_fails_an_empty_space_with_its_reason(server, tmp_path):
    with server.client() as c:
        auto = c.post("/v1/jobs", json={**TINY_JOB, "search": {"sampler": "auto", "top_k": 3}}).json()
        empty = c.post("/v1/jobs", json={**TINY_JOB, "search": {"fixed": {"tp": 8, "ep": 8, "etp": 8}}})
        assert empty.status_code == 202, empty.text  # the request does not build the space to find it empty
        empty = empty.json()
        for other in c.get("/v1/jobs").json()["items"]:  # the Pangu jobs of the first test: not for this worker
            if other["id"] not in (auto["id"], empty["id"]):
                c.post(f"/v1/jobs/{other['id']}/cancel")
        worker = WorkerProcess(server.env["DATABASE_URL"], tmp_path / "worker.log").wait_started()
        try:
            done = wait_for(c, auto["id"], timeout=120)
            failed = wait_for(c, empty["id"], until=("failed",), timeout=120)
        finally:
            worker.stop()
    search = done["inputs"]["search"]
    assert done["status"] == "succeeded" and search["engine"] == "exhaustive"
    assert search["space_size"] == done["summary"]["space_size"] > 0
    assert done["progress"]["trials_total"] == done["progress"]["trials_done"] == search["space_size"]
    assert failed["error"] == ("no valid config to search: fix: the pinned values (tp=8, ep=8, etp=8) leave no "
                               "structurally valid config"), failed["error"]

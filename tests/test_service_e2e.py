"""The service end to end over real HTTP: `paraplan serve` on a free port with a temporary SQLite file.

A Pangu Ultra MoE job (TPE, 200 trials, fixed seed) is posted and followed to success; its ranked
configs match what `paraplan search` prints for the same seed; the server is restarted and the same
configs are read back. `paraplan submit` is run against the server, and `paraplan worker` and SIGTERM
are checked to lose nothing.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import optuna
import pytest

from service_util import HEALTHY_WITHIN_S, PANGU_JOB, ROOT, TINY_JOB, Server, run_cli, running_server, wait_for

SIGTERM_EXIT_S = 10.0
PANGU_JOB_WITHIN_S = 30.0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory, "serve") as srv:
        yield srv


@pytest.mark.serial
def test_pangu_job_over_http_matches_paraplan_search_and_survives_a_restart(server, same_result):
    assert server.ready_after_s < HEALTHY_WITHIN_S, server.ready_after_s
    with server.client() as c:
        started = time.monotonic()
        r = c.post("/v1/jobs", json=PANGU_JOB)
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
        assert r.headers["location"] == f"/v1/jobs/{job_id}"
        seen: list = []
        job = wait_for(c, job_id, timeout=120, seen=seen)
        took = time.monotonic() - started
        assert job["status"] == "succeeded", job
        assert took < PANGU_JOB_WITHIN_S, f"the 200-trial Pangu job took {took:.1f} s"
        progress = [j["progress"] for _, j in seen]
        assert all(0 <= p["trials_done"] <= p["trials_total"] for p in progress)
        assert [p["trials_done"] for p in progress] == sorted(p["trials_done"] for p in progress)
        assert job["progress"] == {"trials_done": 200, "trials_total": 200}
        configs = c.get(f"/v1/jobs/{job_id}/configs", params={"limit": 500}).json()
        layouts = c.get(f"/v1/jobs/{job_id}/layouts").json()

    cli = run_cli("search", "--model", "pangu-ultra-moe-718b", "--cluster", "ascend-910b", "--devices", "6144",
                  "--global-batch-size", "7680", "--sampler", "tpe", "--trials", "200", "--seed", "7", "--json")
    assert cli.returncode == 0, cli.stderr
    expected = json.loads(cli.stdout)
    assert configs["total"] == len(expected["top"]) == 10
    # the items also say whether they keep the memory margin, as the CLI's entries do
    keys = ("rank", "config", "evaluation", "keeps_margin")
    same_result([{k: e[k] for k in keys} for e in expected["top"]], [{k: e[k] for k in keys} for e in configs["items"]])
    assert [e.get("margin_warning") for e in expected["top"]] == [e["margin_warning"] for e in configs["items"]]
    keys = ("layout", "best_rank", "config", "evaluation", "variants", "keeps_margin")
    same_result([{k: g[k] for k in keys} for g in expected["layouts"]], [{k: g[k] for k in keys} for g in layouts["items"]])
    assert job["best"] == configs["items"][0]
    assert job["inputs"]["profile_version"] == expected["best"]["evaluation"]["versions"]["profile"]
    assert job["summary"]["feasible_trials"] == expected["feasible_trials"]
    study = optuna.load_study(study_name=f"paraplan-job-{job_id}", storage=f"sqlite:///{server.db_path}")
    assert len(study.trials) == 200

    assert server.stop() < SIGTERM_EXIT_S
    server.start()
    assert server.ready_after_s < HEALTHY_WITHIN_S
    with server.client() as c:
        again = c.get(f"/v1/jobs/{job_id}/configs", params={"limit": 500}).json()
        assert again == configs
        assert c.get(f"/v1/jobs/{job_id}").json()["best"] == job["best"]


def submit(server, *args):
    return run_cli("submit", "--server", server.url, *args, timeout=180)


def test_submit_wait_exits_0_and_prints_the_best_config(server):
    proc = submit(server, "--model", "pangu-ultra-moe-718b", "--cluster", "ascend-910b", "--devices", "6144",
                  "--global-batch-size", "7680", "--sampler", "tpe", "--trials", "40", "--seed", "3", "--wait")
    assert proc.returncode == 0, proc.stderr
    assert "best config:" in proc.stdout and "tokens/s/dev" in proc.stdout
    best = json.loads(proc.stdout.split("best config:", 1)[1].strip().splitlines()[0])
    assert best["global_batch_size"] == 7680

    proc = submit(server, "--model", "tiny-moe", "--cluster", "nvidia-h100-80gb", "--devices", "8",
                  "--global-batch-size", "64", "--top", "3", "--wait", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "succeeded" and [c["rank"] for c in out["top"]] == [1, 2, 3]
    assert out["best"] == out["top"][0]


def test_submit_exit_codes(server):
    tiny = ("--model", "tiny-moe", "--cluster", "nvidia-h100-80gb", "--devices", "8", "--global-batch-size", "64")
    proc = submit(server, *tiny, "--wait", "--min-mfu", "0.99")
    assert proc.returncode == 5, proc.stderr
    assert "below --min-mfu" in proc.stderr
    assert submit(server, *tiny, "--min-mfu", "0.0001").returncode == 0  # --min-mfu implies --wait

    proc = submit(server, "--model", "nope", "--cluster", "nvidia-h100-80gb", "--devices", "8",
                  "--global-batch-size", "64", "--wait")
    assert proc.returncode == 2 and "model: unknown model preset 'nope'" in proc.stderr, proc.stderr

    proc = submit(server, "--model", "llama3-405b", "--cluster", "nvidia-a100-80gb", "--devices", "8",
                  "--global-batch-size", "64", "--wait")
    assert proc.returncode == 3 and "no config fits" in proc.stderr, proc.stderr

    proc = submit(server, *tiny)  # without --wait: the job id, exit 0
    assert proc.returncode == 0 and len(proc.stdout.strip()) == 36

    proc = run_cli("submit", "--server", "http://127.0.0.1:9", *tiny, "--wait", timeout=60)
    assert proc.returncode == 7 and "cannot reach" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_idempotent_submit_and_delete_over_http(server):
    with server.client() as c:
        a = c.post("/v1/jobs", json=TINY_JOB, headers={"Idempotency-Key": "ci-run-1"})
        b = c.post("/v1/jobs", json=TINY_JOB, headers={"Idempotency-Key": "ci-run-1"})
        assert a.json()["id"] == b.json()["id"]
        assert c.post("/v1/jobs", json={**TINY_JOB, "devices": 16},
                      headers={"Idempotency-Key": "ci-run-1"}).status_code == 409
        wait_for(c, a.json()["id"])
        assert c.delete(f"/v1/jobs/{a.json()['id']}").status_code == 204
        assert c.get(f"/v1/jobs/{a.json()['id']}").status_code == 404
        big = c.post("/v1/jobs", content=b"{" + b" " * 2_000_000 + b"}", headers={"content-type": "application/json"})
        assert big.status_code == 413


@pytest.mark.serial
def test_nothing_accepted_is_lost_across_sigterm_and_a_separate_worker(tmp_path):
    api = Server(tmp_path / "q.db", tmp_path / "api.log", "--no-worker").start()
    try:
        with api.client() as c:
            long_job = {**PANGU_JOB, "search": {"sampler": "tpe", "n_trials": 3000, "seed": 5}}
            job_id = c.post("/v1/jobs", json=long_job).json()["id"]
            assert api.stop() < SIGTERM_EXIT_S
        api.start()
        with api.client() as c:
            assert c.get(f"/v1/jobs/{job_id}").json()["status"] == "queued"  # survived the restart

            log = open(tmp_path / "worker.log", "w")
            worker = subprocess.Popen([sys.executable, "-m", "app.cli", "worker"], cwd=ROOT, stdout=log,
                                      stderr=subprocess.STDOUT, env=api.env, stdin=subprocess.DEVNULL)
            try:
                job = wait_for(c, job_id, timeout=60, until=("running",))
                while job["progress"]["trials_done"] == 0:
                    time.sleep(0.2)
                    job = c.get(f"/v1/jobs/{job_id}").json()
                started = time.monotonic()
                worker.send_signal(signal.SIGTERM)
                worker.wait(timeout=SIGTERM_EXIT_S)
                assert time.monotonic() - started < SIGTERM_EXIT_S
            finally:
                if worker.poll() is None:
                    worker.kill()
            job = c.get(f"/v1/jobs/{job_id}").json()
            # back in the queue, its study kept: the next worker continues from the finished trials
            assert job["status"] == "queued" and job["progress"]["trials_done"] > 0
            kept = job["progress"]["trials_done"]

            worker = subprocess.Popen([sys.executable, "-m", "app.cli", "worker"], cwd=ROOT, stdout=log,
                                      stderr=subprocess.STDOUT, env=api.env, stdin=subprocess.DEVNULL)
            try:
                job = wait_for(c, job_id, timeout=60, until=("running",))
                assert job["progress"]["trials_done"] >= kept  # progress does not start over
                started = time.monotonic()
                assert c.post(f"/v1/jobs/{job_id}/cancel").json()["status"] == "cancelled"
                text = ""
                while "no longer ours" not in text and time.monotonic() - started < 10:
                    time.sleep(0.05)
                    text = (tmp_path / "worker.log").read_text()
                assert time.monotonic() - started < 3.0, text[-2000:]
            finally:
                worker.send_signal(signal.SIGTERM)
                worker.wait(timeout=SIGTERM_EXIT_S)
    finally:
        api.stop()


def test_benchmark_script_runs_against_the_server(server):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import api as bench
    finally:
        sys.path.pop(0)
    with server.client() as c:
        job_id = c.post("/v1/jobs", json=TINY_JOB).json()["id"]
        wait_for(c, job_id)
    results = bench.main(["--server", server.url, "--job", job_id, "--rate", "50", "--duration", "1", "--json"])
    for r in results.values():
        assert r["errors"] == 0 and r["requests"] == 50 and r["p99_ms"] > 0
    with pytest.raises(SystemExit):
        bench.loopback_target("http://192.0.2.1:8000")

"""The worker in-process: claim under a lease, progress, cancel within a second or two, stop and requeue,
reclaiming lost leases, readable errors, the ranked configs written once, the Optuna study beside."""

from __future__ import annotations

import datetime as dt
import socket
import subprocess
import threading
import time
import warnings

import optuna
import pytest
from sqlalchemy import delete, select, update

warnings.filterwarnings("ignore", message=".*httpx2.*")

from fastapi.testclient import TestClient  # noqa: E402

import hardware_profiles  # noqa: E402
import model_presets  # noqa: E402
from app.service.core.config import Settings  # noqa: E402
from app.service.db.engine import get_sessionmaker  # noqa: E402
from app.service.db.models import Job, JobConfig, JobLease, utcnow  # noqa: E402
from app.service.main import create_app  # noqa: E402
from app.service.worker import Worker, host_id  # noqa: E402
from search import SearchRequest, run_search  # noqa: E402
from service_util import PANGU_JOB, TINY_JOB  # noqa: E402


@pytest.fixture
def env(tmp_path):
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'worker.db'}", lease_s=5)
    with TestClient(create_app(settings)) as client:
        yield settings, client, get_sessionmaker(settings.database_url)


def job_row(sessions, job_id) -> Job:
    with sessions() as db:
        return db.get(Job, job_id)


def test_a_job_runs_to_success_and_matches_run_search(env, same_result):
    settings, client, sessions = env
    job = client.post("/v1/jobs", json=TINY_JOB).json()
    assert Worker(settings).run_until_idle() == 1
    done = client.get(f"/v1/jobs/{job['id']}").json()
    assert done["status"] == "succeeded" and done["error"] is None
    assert done["progress"]["trials_done"] == done["progress"]["trials_total"] == done["inputs"]["search"]["space_size"]
    assert done["summary"]["engine"] == "exhaustive" and done["summary"]["trials"] == done["progress"]["trials_done"]
    configs = client.get(f"/v1/jobs/{job['id']}/configs").json()
    assert configs["total"] == 5  # the top K, not a row per scored config
    assert [c["rank"] for c in configs["items"]] == [1, 2, 3, 4, 5]
    assert done["best"] == configs["items"][0]
    direct = run_search(SearchRequest(spec=model_presets.load("tiny-moe"), profile=hardware_profiles.load(
        "nvidia-h100-80gb"), devices=8, global_batch_size=64, sampler="exhaustive", top_k=5,
        framework=done["inputs"]["search"]["framework"]))  # the space the job searched
    # the items also say whether they keep the job's memory margin, as run_search does
    keys = ("rank", "config", "evaluation", "keeps_margin")
    same_result([{k: e[k] for k in keys} for e in direct["top"]], [{k: e[k] for k in keys} for e in configs["items"]])
    assert all(e["keeps_margin"] is True and e["margin_warning"] is None for e in configs["items"])
    assert set(configs["items"][0]) == {"rank", "config", "evaluation", "keeps_margin", "margin_warning"}
    by_mfu = client.get(f"/v1/jobs/{job['id']}/configs", params={"sort": "peak_gib", "limit": 2}).json()
    peaks = [c["evaluation"]["memory"]["peak_gib"] for c in by_mfu["items"]]
    assert by_mfu["total"] == 5 and peaks == sorted(peaks)
    with sessions() as db:
        row = db.get(JobConfig, (job["id"], 1))
        assert row.mfu == pytest.approx(configs["items"][0]["evaluation"]["mfu"])
        assert row.tokens_per_s == pytest.approx(configs["items"][0]["evaluation"]["tokens_per_s"])


def test_sampler_job_keeps_its_optuna_study_in_the_same_database(env):
    settings, client, _ = env
    body = {**TINY_JOB, "search": {"sampler": "tpe", "n_trials": 24, "seed": 3}}
    job = client.post("/v1/jobs", json=body).json()
    Worker(settings).run_until_idle()
    done = client.get(f"/v1/jobs/{job['id']}").json()
    assert done["status"] == "succeeded" and done["progress"] == {"trials_done": 24, "trials_total": 24}
    name = done["summary"]["study_name"]
    assert name == f"paraplan-job-{job['id']}"
    study = optuna.load_study(study_name=name, storage=settings.database_url)
    assert len(study.trials) == 24
    assert client.delete(f"/v1/jobs/{job['id']}").status_code == 204
    assert name not in {s.study_name for s in optuna.get_all_study_summaries(settings.database_url)}


def _run_in_thread(worker: Worker) -> threading.Thread:
    t = threading.Thread(target=worker.run_forever, daemon=True)
    t.start()
    return t


def _wait(pred, timeout: float, step: float = 0.05):
    started = time.monotonic()
    while not pred():
        if time.monotonic() - started > timeout:
            raise AssertionError("timed out")
        time.sleep(step)
    return time.monotonic() - started


@pytest.mark.serial
def test_progress_is_written_while_running_and_cancel_stops_the_search_within_two_seconds(env):
    settings, client, sessions = env
    job = client.post("/v1/jobs", json={**PANGU_JOB, "search": {"sampler": "tpe", "n_trials": 3000, "seed": 1}}).json()
    worker = Worker(settings)
    thread = _run_in_thread(worker)
    try:
        _wait(lambda: job_row(sessions, job["id"]).trials_done > 0, timeout=30)
        seen = []
        for _ in range(6):  # progress moves at least every 2 s, never past the total
            time.sleep(0.5)
            p = client.get(f"/v1/jobs/{job['id']}").json()["progress"]
            assert 0 < p["trials_done"] <= p["trials_total"] == 3000
            seen.append(p["trials_done"])
        assert seen == sorted(seen) and seen[-1] > seen[0]
        r = client.post(f"/v1/jobs/{job['id']}/cancel")
        assert r.json()["status"] == "cancelled"
        stopped_after = _wait(lambda: worker.current is None, timeout=5, step=0.01)
        assert stopped_after < 2.0
        assert client.get(f"/v1/jobs/{job['id']}").json()["status"] == "cancelled"
        assert client.get(f"/v1/jobs/{job['id']}/configs").json()["total"] == 0
    finally:
        worker.stop()
        thread.join(10)
    assert not thread.is_alive()


@pytest.mark.serial
def test_a_stopping_worker_puts_its_job_back_in_the_queue(env):
    settings, client, sessions = env
    job = client.post("/v1/jobs", json={**PANGU_JOB, "search": {"sampler": "tpe", "n_trials": 3000, "seed": 2}}).json()
    worker = Worker(settings)
    thread = _run_in_thread(worker)
    _wait(lambda: job_row(sessions, job["id"]).trials_done > 0, timeout=30)
    started = time.monotonic()
    worker.stop()
    thread.join(10)
    assert not thread.is_alive() and time.monotonic() - started < 3
    row = job_row(sessions, job["id"])
    assert row.status == "queued" and row.attempts == 1 and leases(sessions, job["id"]) == []
    # the study is kept for the next worker: finished trials only, none left running
    study = optuna.load_study(study_name=f"paraplan-job-{job['id']}", storage=settings.database_url)
    states = [t.state for t in study.get_trials(deepcopy=False)]
    assert states.count(optuna.trial.TrialState.COMPLETE) >= row.trials_done > 0
    assert optuna.trial.TrialState.RUNNING not in states
    client.post(f"/v1/jobs/{job['id']}/cancel")


def leases(sessions, job_id) -> list[str]:
    with sessions() as db:
        return list(db.scalars(select(JobLease.worker).where(JobLease.job_id == job_id)))


def _force_running(sessions, job_id, owner, expires, attempts=1, leases_lost=0):
    """Make the job look run by ``owner`` (and no one else), its lease running out at ``expires``."""
    with sessions() as db:
        db.execute(delete(JobLease).where(JobLease.job_id == job_id))
        db.execute(update(Job).where(Job.id == job_id).values(status="running", attempts=attempts,
                                                                leases_lost=leases_lost))
        db.add(JobLease(job_id=job_id, worker=owner, claimed_at=utcnow(), expires_at=expires))
        db.commit()


def test_lost_leases_are_reclaimed(env):
    settings, client, sessions = env
    job_id = client.post("/v1/jobs", json=TINY_JOB).json()["id"]
    worker = Worker(settings)
    future = utcnow() + dt.timedelta(seconds=60)
    _force_running(sessions, job_id, "elsewhere:1:abc", future)
    assert worker.claim() is None  # a live lease held by another worker
    _force_running(sessions, job_id, "elsewhere:1:abc", utcnow() - dt.timedelta(seconds=1))
    assert worker.claim() == job_id  # expired
    dead = subprocess.Popen(["true"])
    dead.wait()
    _force_running(sessions, job_id, f"{host_id()}:{dead.pid}:abc", future)
    assert worker.claim() == job_id  # its worker process on this host is gone
    _force_running(sessions, job_id, f"{socket.gethostname()}/1:{dead.pid}:abc", future)
    assert worker.claim() is None  # same host name, another pid namespace (a container): its lease holds
    _force_running(sessions, job_id, f"{host_id()}:{dead.pid}:abc", future)
    assert worker.claim() == job_id  # its worker process on this host is gone
    assert leases(sessions, job_id) == [worker.owner]  # the dead one's lease is dropped
    assert worker.run_job(job_id) == "succeeded"
    row = job_row(sessions, job_id)
    assert row.attempts == 2 and row.leases_lost == 1  # forced to 1, then this claim; the dead lease counted
    assert leases(sessions, job_id) == []


def test_a_job_that_keeps_losing_its_worker_fails_in_words(env):
    settings, client, sessions = env
    job_id = client.post("/v1/jobs", json=TINY_JOB).json()["id"]
    _force_running(sessions, job_id, "elsewhere:1:abc", utcnow() - dt.timedelta(seconds=1),
                   leases_lost=settings.max_attempts - 1)
    assert Worker(settings).claim() is None
    job = client.get(f"/v1/jobs/{job_id}").json()
    assert job["status"] == "failed" and "stopped 3 times" in job["error"]


def test_a_failed_search_records_a_readable_error(env):
    settings, client, sessions = env
    job_id = client.post("/v1/jobs", json=TINY_JOB).json()["id"]
    with sessions() as db:  # inputs that no longer leave a valid config (e.g. a changed cost model)
        job = db.get(Job, job_id)
        job.search = {**job.search, "fixed": {"tp": 3}}
        db.commit()
    Worker(settings).run_until_idle()
    job = client.get(f"/v1/jobs/{job_id}").json()
    assert job["status"] == "failed"
    assert job["error"].startswith("no valid config to search: ") and "tp=3" in job["error"]
    assert "Traceback" not in job["error"]


def test_a_job_cancelled_at_the_last_moment_gets_no_configs(env):
    settings, client, sessions = env
    job_id = client.post("/v1/jobs", json=TINY_JOB).json()["id"]
    worker = Worker(settings)
    assert worker.claim() == job_id
    client.post(f"/v1/jobs/{job_id}/cancel")
    assert worker.run_job(job_id) == "cancelled"
    with sessions() as db:
        assert db.scalars(select(JobConfig).where(JobConfig.job_id == job_id)).all() == []
    assert client.get(f"/v1/jobs/{job_id}").json()["status"] == "cancelled"


def test_a_database_error_under_a_running_search_requeues_the_job_instead_of_failing_it(env, monkeypatch):
    settings, client, sessions = env
    job_id = client.post("/v1/jobs", json={**TINY_JOB, "search": {"sampler": "random", "n_trials": 5}}).json()["id"]
    worker = Worker(settings)
    assert worker.claim() == job_id

    def broken(*_a, **_k):
        raise optuna.exceptions.StorageInternalError("An exception is raised during the commit")

    monkeypatch.setattr("search.run_search", broken)
    assert worker.run_job(job_id) == "retry"
    row = job_row(sessions, job_id)
    assert row.status == "queued" and row.error is None and leases(sessions, job_id) == []
    monkeypatch.undo()
    assert worker.run_until_idle() == 1
    assert job_row(sessions, job_id).status == "succeeded"

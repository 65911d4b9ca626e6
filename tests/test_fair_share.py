"""Fair shares of the workers across API keys (``app/service/fair_share.py``): the claim order,
the per-key caps, and a worker that leaves a shared job for another key's waiting job. Real SQLite files,
real workers (in threads here; as processes over HTTP in tests/test_resilience.py)."""

from __future__ import annotations

import datetime as dt
import threading
import time
import warnings

import pytest
from sqlalchemy import select

warnings.filterwarnings("ignore", message=".*httpx2.*")

from fastapi.testclient import TestClient  # noqa: E402

from app.service.core.config import Settings  # noqa: E402
from app.service.db.engine import get_sessionmaker  # noqa: E402
from app.service.db.models import Job, JobLease  # noqa: E402
from app.service.fair_share import KeyLoad, Lease, leases_to_yield  # noqa: E402
from app.service.main import create_app  # noqa: E402
from app.service.worker import Worker  # noqa: E402
from service_util import PANGU_JOB, TINY_JOB  # noqa: E402

KEY_A, KEY_B = "key-a-0123456789abcdef", "key-b-0123456789abcdef"
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def service(tmp_path):
    """A factory: the app on a new SQLite file with two API keys and the given settings."""
    clients = []

    def make(**settings):
        s = Settings(database_url=f"sqlite:///{tmp_path / f'fair{len(clients)}.db'}",
                     api_keys=f"{KEY_A},{KEY_B}", lease_s=5, **settings)
        client = TestClient(create_app(s))
        client.__enter__()
        clients.append(client)
        return s, client, get_sessionmaker(s.database_url)

    yield make
    for c in clients:
        c.__exit__(None, None, None)


def submit(client, key: str, body: dict = TINY_JOB) -> str:
    r = client.post("/v1/jobs", json=body, headers=auth(key))
    assert r.status_code == 202, r.text
    return r.json()["id"]


def lease(job: str, worker: str, minute: int) -> Lease:
    return Lease(job, worker, T0 + dt.timedelta(minutes=minute))


# ---- the yield rule, as a pure function ---------------------------------------------------------------
def test_a_key_two_workers_ahead_gives_half_the_difference_newest_first_never_a_jobs_first_lease():
    mine = [lease("big", "w1", 0), lease("big", "w2", 1), lease("big", "w3", 2), lease("big", "w4", 3),
            lease("solo", "w5", 4)]
    loads = {"a": KeyLoad(5, 2), "b": KeyLoad(0, 0)}
    # b waits with 3 jobs: a gives (5 - 0) // 2 = 2, its newest spare leases; solo's only lease stays
    assert [x.worker for x in leases_to_yield(mine, 5, {"b": 3}, loads)] == ["w4", "w3"]
    # one waiting job takes one worker
    assert [x.worker for x in leases_to_yield(mine, 5, {"b": 1}, loads)] == ["w4"]
    # one worker ahead is fair enough: nothing moves (moving it would only swap the imbalance)
    assert leases_to_yield(mine[:1], 1, {"b": 1}, {"a": KeyLoad(1, 1)}) == []
    assert leases_to_yield(mine, 5, {"b": 1}, {"a": KeyLoad(5, 2), "b": KeyLoad(4, 1)}) == []
    # no job of its own is ever left without a worker: single-lease jobs give nothing
    singles = [lease(f"j{i}", f"w{i}", i) for i in range(4)]
    assert leases_to_yield(singles, 4, {"b": 2}, {"a": KeyLoad(4, 4)}) == []


# ---- claim order and caps ---------------------------------------------------------------------------------
def test_the_key_holding_the_fewest_workers_is_served_first(service):
    settings, client, _ = service()
    a_jobs = [submit(client, KEY_A) for _ in range(3)]
    b_job = submit(client, KEY_B)  # submitted last
    w1, w2, w3 = (Worker(settings, name=f"w{i}") for i in (1, 2, 3))
    assert w1.claim() == a_jobs[0]  # both keys hold none: the oldest waiting job
    assert w2.claim() == b_job  # a holds one, b none: b's job before a's older ones
    assert w3.claim() == a_jobs[1]  # each holds one: the oldest again


def test_a_key_at_its_running_jobs_cap_starts_no_other(service):
    settings, client, _ = service(max_running_jobs_per_key=1)
    a_jobs = [submit(client, KEY_A) for _ in range(2)]
    b_job = submit(client, KEY_B)
    w1, w2, w3 = (Worker(settings, name=f"w{i}") for i in (1, 2, 3))
    assert w1.claim() == a_jobs[0]
    assert w2.claim() == b_job
    assert w3.claim() is None  # a's second job waits for its first; b has nothing more


def test_a_key_at_its_workers_cap_gets_no_more_workers(service):
    settings, client, sessions = service(max_workers_per_key=2)
    big = submit(client, KEY_A, {**TINY_JOB, "search": {"sampler": "tpe", "n_trials": 50, "parallel_workers": 4}})
    b_job = submit(client, KEY_B)
    workers = [Worker(settings, name=f"w{i}") for i in range(4)]
    claimed = [w.claim() for w in workers]
    assert claimed == [big, b_job, big, None]  # a reaches 2 workers of the 4 its job wants
    with sessions() as db:
        assert len(db.scalars(select(JobLease).where(JobLease.job_id == big)).all()) == 2


# ---- a shared worker leaves for another key's waiting job ---------------------------------------------------
def _wait(pred, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


@pytest.mark.serial
def test_a_second_keys_job_runs_while_the_first_keys_big_job_goes_on(service):
    """Two workers share key A's 3,000-trial job (it wants 64); key B's small job, submitted then, is
    run by one of them within seconds while A's job keeps running, and A's job gets its worker back
    once B's has finished."""
    settings, client, sessions = service(fair_yield_s=1.0)
    big = submit(client, KEY_A, {**PANGU_JOB, "search": {"sampler": "tpe", "n_trials": 3000, "seed": 5,
                                                           "parallel_workers": 64}})
    workers = [Worker(settings, name=f"w{i}") for i in range(2)]
    threads = [threading.Thread(target=w.run_forever, daemon=True) for w in workers]
    for t in threads:
        t.start()

    def live_leases(job_id):
        with sessions() as db:
            return len(db.scalars(select(JobLease).where(JobLease.job_id == job_id)).all())

    try:
        def trials_done():
            with sessions() as db:
                return db.get(Job, big).trials_done

        _wait(lambda: live_leases(big) == 2 and trials_done() > 0, 60)
        done_before = trials_done()
        small = submit(client, KEY_B)
        submitted = time.monotonic()
        _wait(lambda: client.get(f"/v1/jobs/{small}", headers=auth(KEY_B)).json()["status"] == "succeeded", 60)
        took = time.monotonic() - submitted
        with sessions() as db:
            a = db.get(Job, big)
            assert a.status == "running" and a.trials_done > done_before  # it went on meanwhile
        print(f"key B's job succeeded {took:.1f} s after it was submitted")
        assert took < 30, took
        _wait(lambda: live_leases(big) == 2, 30)  # the worker went back to A's job
    finally:
        client.post(f"/v1/jobs/{big}/cancel", headers=auth(KEY_A))
        for w in workers:
            w.stop()
        for t in threads:
            t.join(15)
    assert not any(t.is_alive() for t in threads)

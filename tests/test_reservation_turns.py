"""Turns at a study's reservation lock (search.storages.ReservationTurns): a worker that keeps winning the
polled lock lets one that has waited since before its last round go first."""

import optuna
import pytest

from search.storages import ReservationTurns


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def study(tmp_path):
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'turns.db'}")
    return optuna.create_study(storage=storage, study_name="turns")


def _pair(study, clock):
    return ReservationTurns(study, "a", clock), ReservationTurns(study, "b", clock)


def test_a_worker_yields_to_one_waiting_since_before_its_last_round(study):
    clock = Clock()
    a, b = _pair(study, clock)
    b.waiting()  # b waits from t=100 ...
    clock.now = 101.0
    a.waiting()
    assert not a.must_yield()  # a has had no round yet: b has not waited through one of a's
    a.reserved()  # ... while a reserves a round at t=101
    clock.now = 102.0
    b.waiting()  # (refreshed while it polls)
    a.waiting()
    assert a.must_yield() and not b.must_yield()
    b.reserved()
    assert not a.must_yield()  # b's mark went with its round
    assert study._storage.get_study_system_attrs(study._study_id)["waiting:b"] is None  # noqa: SLF001


def test_a_mark_left_by_a_dead_worker_goes_stale(study):
    clock = Clock()
    a, b = _pair(study, clock)
    b.waiting()
    clock.now = 101.0
    a.reserved()
    a.waiting()
    assert a.must_yield()
    clock.now = 101.0 + ReservationTurns.STALE_S  # b stopped refreshing its mark: it died waiting
    assert not a.must_yield()


def test_a_worker_yields_for_a_bounded_time(study):
    clock = Clock()
    a, b = _pair(study, clock)
    b.waiting()
    clock.now = 101.0
    a.reserved()
    a.waiting()
    for _ in range(int(ReservationTurns.YIELD_MAX_S) + 1):  # b keeps its mark fresh but never gets a round
        clock.now += 1.0
        b.waiting()
        if not a.must_yield():
            break
    assert clock.now - 101.0 > ReservationTurns.YIELD_MAX_S and not a.must_yield()


def test_done_clears_the_mark(study):
    clock = Clock()
    a, b = _pair(study, clock)
    b.waiting()
    clock.now = 101.0
    a.reserved()
    b.done()
    assert not a.must_yield()

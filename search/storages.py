"""Sharing one Optuna study between processes: the trial reservation lock and the trials' heartbeats.

Several workers add trials to one study until it holds ``n_trials`` finished trials. A worker asks
its next trials only while it holds the study's reservation lock, after counting the trials that are
finished or still running (each running trial is a reserved slot), so that together the workers
never ask for more trials than the budget. The lock is

* PostgreSQL: a transaction-level advisory lock (``search.locks.advisory_lock``) on a connection of the
  storage's own engine, keyed by the study name; a worker that dies loses its connection and so the lock;
* SQLite: an ``flock`` on a file beside the database (``search.locks.file_lock``) (SQLite is shared by processes of one host
  only); the kernel drops it when the process dies;
* in memory: a thread lock (one process).

A running trial carries Optuna's heartbeat (``RDBStorage.record_heartbeat``); when its worker dies,
``optuna.storages.fail_stale_trials`` fails it after the storage's grace period and its
``heartbeat_stale_trial_callback`` (``RetryHeartbeatStaleTrialCallback``) queues the same parameters
again as a WAITING trial, which the next ``study.ask()`` takes.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import optuna
from optuna.storages import RDBStorage

from .locks import POLL_S, advisory_lock, file_lock  # the one lock implementation (search/locks.py)

_THREAD_LOCKS: dict[str, threading.Lock] = {}
_THREAD_LOCKS_GUARD = threading.Lock()


def open_rdb_storage(url: str, heartbeat_s: int | None = None, grace_s: int | None = None,
                     engine_kwargs: dict | None = None) -> RDBStorage:
    """Optuna's RDB storage with trial heartbeats (every ``heartbeat_s`` s) and the retry of a trial whose
    heartbeat stopped for ``grace_s`` s (its worker died): the trial is failed and run again."""
    import warnings

    with warnings.catch_warnings():  # heartbeat_interval is marked experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        callback = optuna.storages.RetryHeartbeatStaleTrialCallback() if heartbeat_s else None
        return RDBStorage(url, engine_kwargs=engine_kwargs or {}, heartbeat_interval=heartbeat_s,
                          grace_period=grace_s, heartbeat_stale_trial_callback=callback)


def _rdb(storage) -> RDBStorage | None:
    """The RDB storage behind ``storage`` (Optuna wraps an RDBStorage in a cache), or None."""
    if isinstance(storage, RDBStorage):
        return storage
    backend = getattr(storage, "_backend", None)
    return backend if isinstance(backend, RDBStorage) else None


def _key64(name: str) -> int:
    """A signed 64-bit advisory-lock key for a study name."""
    return int.from_bytes(hashlib.sha256(f"paraplan-study:{name}".encode()).digest()[:8], "big", signed=True)


LOCK_POLL_S = POLL_S
# A PostgreSQL lock holder whose host vanished keeps its session (and the lock) until TCP notices, hours
# later; its transaction is idle while it holds the lock, so the server ends it after this long instead.
PG_LOCK_IDLE_TIMEOUT = "60s"


@contextlib.contextmanager
def reservation_lock(storage, study_name: str, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold the study's reservation lock (see the module docstring) for the ``with`` block. While
    waiting for it, ``on_wait`` is called every few tens of milliseconds (it may raise to give up)."""
    rdb = _rdb(storage)
    dialect = rdb.engine.dialect.name if rdb is not None else None
    on_wait = on_wait or (lambda: None)
    if dialect == "postgresql":
        with advisory_lock(rdb.engine, _key64(study_name), on_wait, idle_timeout=PG_LOCK_IDLE_TIMEOUT):
            yield
        return
    if dialect == "sqlite" and rdb.engine.url.database not in (None, "", ":memory:"):
        with file_lock(Path(f"{rdb.engine.url.database}.trials-lock"), on_wait):
            yield
        return
    with _THREAD_LOCKS_GUARD:  # in memory (one process), or a backend without a shared lock here
        lock = _THREAD_LOCKS.setdefault(study_name, threading.Lock())
    while not lock.acquire(timeout=LOCK_POLL_S):
        on_wait()
    try:
        yield
    finally:
        lock.release()


class TrialHeartbeat:
    """Records Optuna heartbeats for the trials a worker is running, every ``interval_s`` seconds,
    from one thread (instead of Optuna's thread per trial: a round asks up to 64 trials at once)."""

    def __init__(self, storage):
        self.rdb = _rdb(storage)
        self.interval_s = self.rdb.get_heartbeat_interval() if self.rdb is not None else None
        self.trial_ids: list[int] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self.interval_s is not None

    def track(self, trial_ids: list[int]) -> None:
        """Beat for these trials from now on (the previous set is dropped); each had its ``first_beat``."""
        if not self.enabled:
            return
        with self._lock:
            self.trial_ids = list(trial_ids)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="optuna-heartbeat", daemon=True)
            self._thread.start()

    def first_beat(self, trial_id: int) -> None:
        """The first heartbeat of a trial, right after it was asked."""
        if self.enabled:
            self.rdb.record_heartbeat(trial_id)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            with self._lock:
                trial_ids = list(self.trial_ids)
            for trial_id in trial_ids:
                try:
                    self.rdb.record_heartbeat(trial_id)
                except Exception:  # noqa: BLE001 - a busy database: the next beat tries again
                    pass

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


class ReservationTurns:
    """Turns at the reservation lock for the workers of one study, so that none is starved.

    The lock is taken by polling (``search.locks``), which is not fair: two workers that reserve big
    rounds and release the lock to score can keep beating a third to it (seen beside CPU-bound processes
    on CI's 2 cores: one of 3 workers got no trial of a 300-trial job). So a worker waiting for a round
    marks the study (study system attribute ``waiting:<worker>``, the wall time it started waiting,
    refreshed every ``REFRESH_S`` s while it waits), and a worker holding the lock reserves nothing while
    another has waited since before its own last reservation: it lets the lock go and waits its turn.
    A mark not refreshed for ``STALE_S`` s (its worker died) is ignored, and a worker yields for at most
    ``YIELD_MAX_S`` s in a row (hosts whose clocks disagree could otherwise each wait for the other).
    """

    REFRESH_S = 1.0
    STALE_S = 5.0
    YIELD_MAX_S = 10.0
    PREFIX = "waiting:"

    def __init__(self, study: optuna.Study, worker: str, clock: Callable[[], float] | None = None):
        import time

        self.study, self.key = study, f"{self.PREFIX}{worker}"
        self.clock = clock or time.time  # wall time: compared across processes
        self.since: float | None = None  # when this worker started waiting for its next round
        self.refreshed = 0.0
        self.last_reserved = float("-inf")

    def _write(self, value) -> None:
        self.study._storage.set_study_system_attr(self.study._study_id, self.key, value)  # noqa: SLF001

    def waiting(self) -> None:
        """This worker wants a round: mark it (once, then every ``REFRESH_S`` s)."""
        now = self.clock()
        if self.since is None:
            self.since = now
        if now - self.refreshed >= self.REFRESH_S:
            self._write([self.since, now])
            self.refreshed = now

    def must_yield(self) -> bool:
        """Call holding the lock: whether another worker has waited since before this one's last round."""
        now = self.clock()
        if self.since is not None and now - self.since > self.YIELD_MAX_S:
            return False
        attrs = self.study._storage.get_study_system_attrs(self.study._study_id)  # noqa: SLF001
        return any(key.startswith(self.PREFIX) and key != self.key and mark is not None
                   and mark[0] < self.last_reserved and now - mark[1] < self.STALE_S
                   for key, mark in attrs.items())

    def reserved(self) -> None:
        """This worker got its round: its mark goes."""
        self.last_reserved = self.clock()
        self.done()

    def done(self) -> None:
        if self.since is not None:
            self._write(None)
        self.since, self.refreshed = None, 0.0


def fail_stale_trials(study: optuna.Study, storage) -> None:
    """Fail (and retry) the trials whose worker died. Call it holding the reservation lock.

    Optuna's own stale-trial handling covers trials whose heartbeat stopped. A worker killed between
    asking a trial and its first heartbeat leaves a running trial with no heartbeat at all, which
    Optuna never calls stale; since trials are asked and given their first heartbeat under the lock, a
    running trial without a heartbeat seen by the lock's holder was asked by a worker that died holding
    the lock: it is failed and retried the same way.
    """
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    rdb = _rdb(storage)
    if rdb is None or rdb.get_heartbeat_interval() is None or rdb.engine.dialect.name not in ("postgresql", "sqlite"):
        return  # the rule needs the lock shared by every process (see ``reservation_lock``)
    from sqlalchemy import text

    study_id = rdb.get_study_id_from_name(study.study_name)
    with rdb.engine.connect() as conn:  # Optuna's schema: trials, trial_heartbeats
        orphans = [r[0] for r in conn.execute(text(
            "SELECT t.trial_id FROM trials t WHERE t.study_id = :sid AND t.state = 'RUNNING' AND NOT EXISTS "
            "(SELECT 1 FROM trial_heartbeats h WHERE h.trial_id = t.trial_id)"), {"sid": study_id})]
    callback = rdb.get_heartbeat_stale_trial_callback()
    for trial_id in orphans:
        try:
            if rdb.set_trial_state_values(trial_id, state=optuna.trial.TrialState.FAIL) and callback is not None:
                callback(study, rdb.get_trial(trial_id))
        except optuna.exceptions.UpdateFinishedTrialError:
            pass

"""The service's Prometheus metrics (``GET /metrics``), one registry per app instance.

Counted as requests are answered (by the request middleware, ``app/service/main.py``):

* ``paraplan_http_requests_total{method,status}``: requests answered.
* ``paraplan_http_request_duration_seconds{method,route}``: latency histogram. ``route`` is the route's
  template (``/v1/jobs/{job_id}``), never the raw path, so that the number of series stays bounded
  whatever clients send; a path no route matches is ``other``, and so is an unusual method.

Read from the database at scrape time (``DatabaseCollector``), scoped to the caller's API key (a key sees
its own jobs' counts, never another key's; without keys every caller shares one scope):

* ``paraplan_jobs{status}``: the caller's jobs by status, every status (0 included).
* ``paraplan_trials_done``: finished trials of the caller's running jobs (the sum of their progress).
* ``paraplan_trials_per_second``: Optuna trials completed in the last 60 s, over all jobs, / 60, read from
  Optuna's own ``trials`` table (0 until a sampler job has made it): one service-wide figure, which names
  no key.

The HTTP counter and histogram are service-wide too (methods, statuses and route templates, no keys).
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from sqlalchemy.orm import Session, sessionmaker

from app.service.db.models import STATUSES, Job

__all__ = ["CONTENT_TYPE_LATEST", "Metrics", "jobs_by_status", "running_trials_done", "trials_per_second"]

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# Most answers take well under 10 ms (docs/guides/service.md, "Measured"), so the buckets start at 1 ms.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TRIALS_WINDOW_S = 60.0

# Optuna's table, named and typed just enough for the one query below (it is Optuna's, not in our models).
OPTUNA_TRIALS = sa.table("trials", sa.column("state", sa.String), sa.column("datetime_complete", sa.DateTime))


class Metrics:
    """One app's registry: the HTTP counter and histogram, and the database collector. A registry per app
    (not prometheus_client's global one) so that several apps in one process keep separate counts."""

    def __init__(self, sessions: sessionmaker[Session] | None = None):
        self.registry = CollectorRegistry()
        self.requests = Counter("paraplan_http_requests", "HTTP requests answered, by method and status.",
                                ["method", "status"], registry=self.registry)
        self.latency = Histogram("paraplan_http_request_duration_seconds",
                                 "Time to answer an HTTP request, by method and route template.",
                                 ["method", "route"], buckets=BUCKETS, registry=self.registry)

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        method = method if method in METHODS else "other"  # a client chooses the method: bound the labels
        self.requests.labels(method, str(status)).inc()
        self.latency.labels(method, route).observe(seconds)

    def exposition(self, db: Session, scope: str) -> bytes:
        """The Prometheus text format (``CONTENT_TYPE_LATEST``): the HTTP metrics and the database gauges of
        ``scope`` (the caller's key hash), read with ``db``."""
        scoped = CollectorRegistry()
        scoped.register(DatabaseCollector(db, scope))
        return generate_latest(self.registry) + generate_latest(scoped)


class DatabaseCollector:
    """The job and trial gauges of one API key's scope, read from the database when collected."""

    def __init__(self, db: Session, scope: str):
        self.db, self.scope = db, scope

    def describe(self):
        # Names only: without ``describe`` the registry would query the database when registering this.
        return [_jobs_family(), _trials_done_family(), _trials_rate_family()]

    def collect(self):
        db = self.db
        counts, done, rate = jobs_by_status(db, self.scope), running_trials_done(db, self.scope), trials_per_second(db)
        jobs = _jobs_family()
        for status in (*STATUSES, *sorted(set(counts) - set(STATUSES))):
            jobs.add_metric([status], counts.get(status, 0))
        yield jobs
        yield _trials_done_family(done)
        yield _trials_rate_family(rate)


def _jobs_family() -> GaugeMetricFamily:
    return GaugeMetricFamily("paraplan_jobs", "The caller's jobs by status.", labels=["status"])


def _trials_done_family(value: float | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily("paraplan_trials_done", "Finished trials of the caller's running jobs (their "
                                                     "progress, summed).", value=value)


def _trials_rate_family(value: float | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily("paraplan_trials_per_second", "Optuna trials completed over the last 60 s, all "
                                                           "jobs, per second.", value=value)


def jobs_by_status(db: Session, scope: str | None = None) -> dict[str, int]:
    """Jobs by status: of ``scope`` (an owner), or of every owner (None)."""
    q = sa.select(Job.status, sa.func.count()).group_by(Job.status)
    if scope is not None:
        q = q.where(Job.owner == scope)
    return {s: int(n) for s, n in db.execute(q).all()}


def running_trials_done(db: Session, scope: str | None = None) -> int:
    q = sa.select(sa.func.coalesce(sa.func.sum(Job.trials_done), 0)).where(Job.status == "running")
    if scope is not None:
        q = q.where(Job.owner == scope)
    return int(db.scalar(q) or 0)


def trials_per_second(db: Session, window_s: float = TRIALS_WINDOW_S) -> float:
    """Optuna trials completed in the last ``window_s`` seconds, per second; 0 before Optuna made its tables."""
    if not sa.inspect(db.connection()).has_table("trials"):
        return 0.0
    # Optuna stamps datetime_complete with the naive local time (datetime.now()), so compare with the same.
    cutoff = dt.datetime.now() - dt.timedelta(seconds=window_s)
    t = OPTUNA_TRIALS.c
    # state is an enum type on PostgreSQL: compared as text, so the bound string needs no enum cast.
    n = db.scalar(sa.select(sa.func.count()).select_from(OPTUNA_TRIALS)
                  .where(sa.cast(t.state, sa.String) == "COMPLETE", t.datetime_complete >= cutoff))
    return int(n or 0) / window_s

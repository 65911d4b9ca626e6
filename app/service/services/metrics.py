"""The service's Prometheus metrics (``GET /metrics``), one registry per app instance.

Counted as requests are answered (by the request middleware, ``app/service/main.py``):

* ``paraplan_http_requests_total{method,status}``: requests answered.
* ``paraplan_http_request_duration_seconds{method,route}``: latency histogram. ``route`` is the route's
  template (``/v1/jobs/{job_id}``), never the raw path, so that the number of series stays bounded
  whatever clients send; a path no route matches is ``other``, and so is an unusual method.

Read from the database at scrape time (``DatabaseCollector``):

* ``paraplan_jobs{status}``: jobs by status, every status (0 included).
* ``paraplan_trials_done``: finished trials of the running jobs (the sum of their progress).
* ``paraplan_trials_per_second``: Optuna trials completed in the last 60 s, over all jobs, / 60, read from
  Optuna's own ``trials`` table (0 until a sampler job has made it).
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

    def __init__(self, sessions: sessionmaker[Session]):
        self.registry = CollectorRegistry()
        self.requests = Counter("paraplan_http_requests", "HTTP requests answered, by method and status.",
                                ["method", "status"], registry=self.registry)
        self.latency = Histogram("paraplan_http_request_duration_seconds",
                                 "Time to answer an HTTP request, by method and route template.",
                                 ["method", "route"], buckets=BUCKETS, registry=self.registry)
        self.registry.register(DatabaseCollector(sessions))

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        method = method if method in METHODS else "other"  # a client chooses the method: bound the labels
        self.requests.labels(method, str(status)).inc()
        self.latency.labels(method, route).observe(seconds)

    def exposition(self) -> bytes:
        """The Prometheus text format (``CONTENT_TYPE_LATEST``); queries the database."""
        return generate_latest(self.registry)


class DatabaseCollector:
    """The job and trial gauges, read from the database each time the registry is collected."""

    def __init__(self, sessions: sessionmaker[Session]):
        self.sessions = sessions

    def describe(self):
        # Names only: without ``describe`` the registry would query the database when registering this.
        return [_jobs_family(), _trials_done_family(), _trials_rate_family()]

    def collect(self):
        with self.sessions() as db:
            counts, done, rate = jobs_by_status(db), running_trials_done(db), trials_per_second(db)
        jobs = _jobs_family()
        for status in (*STATUSES, *sorted(set(counts) - set(STATUSES))):
            jobs.add_metric([status], counts.get(status, 0))
        yield jobs
        yield _trials_done_family(done)
        yield _trials_rate_family(rate)


def _jobs_family() -> GaugeMetricFamily:
    return GaugeMetricFamily("paraplan_jobs", "Jobs in the database by status.", labels=["status"])


def _trials_done_family(value: float | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily("paraplan_trials_done", "Finished trials of the running jobs (their progress, "
                                                     "summed).", value=value)


def _trials_rate_family(value: float | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily("paraplan_trials_per_second", "Optuna trials completed over the last 60 s, all "
                                                           "jobs, per second.", value=value)


def jobs_by_status(db: Session) -> dict[str, int]:
    return {s: int(n) for s, n in db.execute(sa.select(Job.status, sa.func.count()).group_by(Job.status)).all()}


def running_trials_done(db: Session) -> int:
    return int(db.scalar(sa.select(sa.func.coalesce(sa.func.sum(Job.trials_done), 0))
                         .where(Job.status == "running")) or 0)


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

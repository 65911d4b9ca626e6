"""Fair shares of the workers across API keys (without them, one key's ``parallel_workers: 64`` job took
every worker and the other keys' jobs waited until it ended).

Three rules, all read from the jobs and leases tables, so that every worker of every process applies
them alike:

* **Claim order**: a worker looking for work serves the key that holds the fewest live leases first
  (its running jobs that want more workers, then its oldest queued job); keys at the same count go by
  their oldest waiting job.
* **Caps**: a key at ``PARAPLAN_MAX_WORKERS_PER_KEY`` live leases gets no more workers; a key at
  ``PARAPLAN_MAX_RUNNING_JOBS_PER_KEY`` running jobs starts no other (0: no cap).
* **Yield**: a worker of a job that other workers share leaves it (the job goes on with them) when a
  job of another key has waited ``PARAPLAN_FAIR_YIELD_S`` in the queue, that key may take a worker and
  holds at least two fewer than this worker's key. Per look, a key gives up half the difference (at
  most one worker per waiting job), its newest leases first and never a job's first: a job is never
  left without a worker, and the shares meet without workers passing one another.

The key of a job is its ``owner`` (the submitting API key's scope; one shared scope without keys).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.service.core.config import Settings
from app.service.db.models import Job, JobLease

ACTIVE = ("queued", "running")


@dataclass(frozen=True)
class KeyLoad:
    """One key's share now: live leases (workers) and running jobs."""

    workers: int = 0
    running_jobs: int = 0


def key_loads(db: Session, now: dt.datetime) -> dict[str, KeyLoad]:
    """Every key's live leases and running jobs (keys with neither are absent)."""
    workers = dict(db.execute(select(Job.owner, func.count()).select_from(JobLease)
                              .join(Job, Job.id == JobLease.job_id).where(JobLease.expires_at > now)
                              .group_by(Job.owner)).all())
    running = dict(db.execute(select(Job.owner, func.count()).where(Job.status == "running")
                              .group_by(Job.owner)).all())
    return {k: KeyLoad(int(workers.get(k, 0)), int(running.get(k, 0))) for k in set(workers) | set(running)}


def may_take_worker(load: KeyLoad, settings: Settings) -> bool:
    """Below the key's worker cap."""
    return not settings.max_workers_per_key or load.workers < settings.max_workers_per_key


def may_start_job(load: KeyLoad, settings: Settings) -> bool:
    """A worker for one more of the key's jobs: below both caps."""
    return may_take_worker(load, settings) and (
        not settings.max_running_jobs_per_key or load.running_jobs < settings.max_running_jobs_per_key)


def claim_order(db: Session, loads: dict[str, KeyLoad], limit: int) -> list[str]:
    """The keys with queued or running jobs, the fewest workers first, then the oldest waiting job;
    at most ``limit`` of them."""
    keys = db.execute(select(Job.owner, func.min(Job.created_at)).where(Job.status.in_(ACTIVE))
                      .group_by(Job.owner)).all()
    keys.sort(key=lambda k: (loads.get(k[0], KeyLoad()).workers, k[1], k[0]))
    return [k[0] for k in keys[:limit]]


@dataclass(frozen=True)
class Lease:
    job_id: str
    worker: str
    claimed_at: dt.datetime


def leases_to_yield(mine: list[Lease], held: int, waiting: dict[str, int], loads: dict[str, KeyLoad]) -> list[Lease]:
    """Which of a key's live leases (``mine``, ``held`` of them) leave their job now, newest first.

    ``waiting``: for each other key that may take a worker, its queued jobs that have waited long
    enough. A key that holds at least two more workers than the least served waiting key gives up half
    the difference, at most one per waiting job; never the first lease of a job (the job keeps going)."""
    behind = {k: n for k, n in waiting.items() if loads.get(k, KeyLoad()).workers <= held - 2}
    if not behind:
        return []
    fewest = min(loads.get(k, KeyLoad()).workers for k in behind)
    give = min(sum(behind.values()), (held - fewest) // 2)
    first_of_job: dict[str, Lease] = {}
    for lease in sorted(mine, key=lambda x: (x.claimed_at, x.worker)):
        first_of_job.setdefault(lease.job_id, lease)
    spare = [x for x in mine if first_of_job[x.job_id] is not x]
    spare.sort(key=lambda x: (x.claimed_at, x.worker), reverse=True)
    return spare[:give]


def should_yield(db: Session, job_id: str, worker: str, settings: Settings, now: dt.datetime) -> bool:
    """Whether ``worker`` should leave ``job_id`` for another key's waiting job (the yield rule)."""
    owner = db.scalar(select(Job.owner).where(Job.id == job_id))
    if owner is None:
        return False
    since = now - dt.timedelta(seconds=settings.fair_yield_s)
    queued = dict(db.execute(select(Job.owner, func.count()).where(
        Job.status == "queued", Job.owner != owner, Job.created_at <= since).group_by(Job.owner)).all())
    if not queued:
        return False
    loads = key_loads(db, now)
    waiting = {k: int(n) for k, n in queued.items() if may_start_job(loads.get(k, KeyLoad()), settings)}
    mine = [Lease(r.job_id, r.worker, r.claimed_at) for r in db.execute(
        select(JobLease.job_id, JobLease.worker, JobLease.claimed_at).join(Job, Job.id == JobLease.job_id)
        .where(Job.owner == owner, JobLease.expires_at > now))]
    return any(x.job_id == job_id and x.worker == worker
               for x in leases_to_yield(mine, len(mine), waiting, loads))

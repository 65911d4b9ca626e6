"""The job worker: claims a job under a lease, runs its search, writes the result.

* Claim: one transaction that locks candidate jobs with ``SELECT … FOR UPDATE SKIP LOCKED`` (on
  PostgreSQL; SQLite serialises writers anyway), picks, for the API key holding the fewest workers
  (``fair_share``: keys at their caps passed over), a job of it that is running with fewer live leases
  than its ``search.parallel_workers``, or else its oldest queued one, inserts this worker's row in ``job_leases``
  (expiring ``lease_s`` from now) and bumps ``jobs.attempts`` conditionally on the value it read, so
  that two claimers can never both win. Leases that ran out (their worker died), or whose worker is a
  dead process on this host, are dropped on the way and counted in ``jobs.leases_lost``; after
  ``max_attempts`` lost leases a job with no live worker fails.
* While the search runs, a thread renews the lease and writes the progress every half second; when the
  job is no longer ``running`` or the lease is gone (cancelled, deleted, finished by another worker),
  the search's progress callback (or its check while the space is built) raises :class:`Cancelled` at
  its next call and nothing is written.
* Sampler jobs run their Optuna study (``paraplan-job-<id>``, in the same database) through
  ``search.samplers.run_sampler``: every worker of the job adds trials to the same study until it holds
  ``n_trials`` finished trials, and a worker taking over a job after a crash continues the study (the
  dead worker's unfinished trials are failed by Optuna's heartbeat check and run again).
* At the end the status, the summary and the ranked configs are written in one transaction, only by a
  worker that still holds a lease on the still-running job: the first finisher writes, the others
  find the job finished.
* Every ``FAIR_LOOK_S`` a worker of a job that others share asks ``fair_share.should_yield``; when
  another key's job has waited and this key holds two workers more, it leaves the job to the others
  (its lease dropped, the trial it was running run again) and claims anew, the least served key first.
* A worker asked to stop (SIGTERM) stops at its next progress call and drops its lease; a job left
  with no worker goes back to ``queued`` (its study is kept): nothing accepted is ever lost.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import logging
import os
import socket
import threading
import time
import uuid

from sqlalchemy import case, delete, exists, select, update
from sqlalchemy.exc import SQLAlchemyError

from app.service import fair_share
from app.service.core.config import Settings, get_settings
from app.service.db.engine import get_sessionmaker, safe_url
from app.service.db.models import Job, JobConfig, JobLease, utcnow
from app.service.services.studies import optuna_storage, study_name
from costmodel import ClusterProfile, ModelSpec

log = logging.getLogger("paraplan.worker")
CLAIM_CANDIDATES = 50  # jobs looked at per key and status (locked and skipped by the others on PostgreSQL)
CLAIM_KEYS = 20  # keys looked at per claim, the least served first
FAIR_LOOK_S = 2.0  # how often a running job's worker asks whether another key waits for it (fair_share)
TRANSIENT_BACKOFF_S = 5.0  # pause after a database error took a running job away


class Cancelled(Exception):
    """The job was cancelled or deleted (or taken by another worker) while it ran."""


class Interrupted(Exception):
    """The worker is stopping; the job goes back to the queue."""


class Yielded(Exception):
    """The worker leaves a job that other workers share, for another key's waiting job (fair_share)."""


def _job_update(*where):
    """A conditional UPDATE of jobs (the in-session objects are not touched: callers compare rowcounts)."""
    return update(Job).execution_options(synchronize_session=False).where(*where)


def host_id() -> str:
    """This host as lease owners name it: the host name and the pid namespace, so that containers sharing
    a host name (host networking) never judge each other's workers by their process ids."""
    try:
        ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        ns = 0
    return f"{socket.gethostname()}/{ns}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def user_error(exc: BaseException) -> str:
    """A failed job's error, in words."""
    from search import SpaceError

    if isinstance(exc, SpaceError):
        return f"no valid config to search: {exc}"
    if isinstance(exc, MemoryError):
        return ("the search ran out of memory; pin some dimensions with search.fixed, or use a sampler "
                "instead of exhaustive")
    text = str(exc).splitlines()[0][:500] if str(exc) else ""
    return f"the search failed unexpectedly ({type(exc).__name__}{': ' + text if text else ''})"


class Worker:
    def __init__(self, settings: Settings | None = None, name: str | None = None):
        self.settings = settings or get_settings()
        self.url = self.settings.database_url
        self.host = host_id()
        self.owner = name or f"{self.host}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.stop_event = threading.Event()
        self.wake = threading.Event()
        self.current: str | None = None
        self._sessions = get_sessionmaker(self.url)

    # ---- the loop -------------------------------------------------------------------------------
    def run_forever(self) -> None:
        log.info("worker %s started on %s", self.owner, safe_url(self.url))
        while not self.stop_event.is_set():
            try:
                job_id = self.claim()
                if job_id is not None and self.run_job(job_id) != "retry":
                    continue
                if job_id is not None:  # the database failed under the job: give it a moment
                    self.wake.wait(TRANSIENT_BACKOFF_S)
            except SQLAlchemyError as exc:  # the database is busy or away: retry after a pause
                log.warning("worker: database error (%s); retrying", str(exc).splitlines()[0])
            except Exception:  # noqa: BLE001 - the worker loop outlives any one job's surprise
                log.exception("worker: unexpected error; going on")
            self.wake.wait(self.settings.poll_s)
            self.wake.clear()
        log.info("worker %s stopped", self.owner)

    def stop(self) -> None:
        self.stop_event.set()
        self.wake.set()

    def run_until_idle(self, max_jobs: int = 100) -> int:
        """Run queued jobs until none is left (tests and one-shot use); returns how many ran."""
        n = 0
        while n < max_jobs and not self.stop_event.is_set():
            job_id = self.claim()
            if job_id is None:
                break
            self.run_job(job_id)
            n += 1
        return n

    # ---- claiming -------------------------------------------------------------------------------
    def _expired(self, lease: JobLease, now: dt.datetime) -> bool:
        """Ran out, or held by a process of this host that no longer exists (a restarted server takes
        its job back at once instead of waiting for the lease to run out)."""
        if lease.expires_at < now:
            return True
        host, _, rest = lease.worker.partition(":")
        pid = rest.partition(":")[0]
        return host == self.host and pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid))

    def claim(self) -> str | None:
        """Claim a job, fairly across API keys (``app/service/fair_share.py``): the key holding the fewest
        live leases first, within a key its running jobs that want more workers, then its oldest queued
        job; keys at their caps are passed over. None when nothing is claimable."""
        now = utcnow()
        with self._sessions() as db:
            loads = fair_share.key_loads(db, now)
            for key in fair_share.claim_order(db, loads, CLAIM_KEYS):
                load = loads.get(key, fair_share.KeyLoad())
                if not fair_share.may_take_worker(load, self.settings):
                    continue
                job_id = self._claim_of_key(db, key, fair_share.may_start_job(load, self.settings), now)
                if job_id is not None:
                    db.commit()
                    return job_id
            db.commit()  # lost leases dropped and given-up jobs failed on the way; row locks released
        return None

    def _claim_of_key(self, db, key: str, may_start: bool, now: dt.datetime) -> str | None:
        """Claim one of ``key``'s jobs in the open transaction: a running one that wants more workers, or
        (``may_start``) its oldest queued one."""
        # Running jobs and queued ones are looked at apart: running jobs that are full must not hide
        # the queue from every claimer.
        rows = [row for status in ("running", "queued") for row in db.execute(
            select(Job.id, Job.status, Job.search, Job.attempts, Job.leases_lost)
            .where(Job.owner == key, Job.status == status).order_by(Job.created_at).limit(CLAIM_CANDIDATES)
            .with_for_update(skip_locked=True)).all()]
        running = [r.id for r in rows if r.status == "running"]
        leases: dict[str, list[JobLease]] = {}
        if running:
            for lease in db.scalars(select(JobLease).where(JobLease.job_id.in_(running))):
                leases.setdefault(lease.job_id, []).append(lease)
        for row in rows:
            if row.status == "queued" and not may_start:
                break
            if self._try_claim(db, row, leases.get(row.id, []), now):
                return row.id
        return None

    def _try_claim(self, db, row, leases: list[JobLease], now: dt.datetime) -> bool:
        """Claim ``row`` in the open transaction if it has room for this worker."""
        lost = [lease for lease in leases if self._expired(lease, now)]
        live = len(leases) - len(lost)
        dropped = sum(  # each lease as read: one renewed meanwhile, or dropped by another claimer, stays out
            db.execute(delete(JobLease).where(JobLease.job_id == row.id, JobLease.worker == lease.worker,
                                              JobLease.expires_at == lease.expires_at)).rowcount
            for lease in lost)
        if dropped:
            # Leases found run out in one look are one loss, however many went: a database outage
            # or a lost machine takes every worker of a job at once, and counting each lease made a 20 s
            # PostgreSQL restart fail a 3-worker job ("stopped 3 times") with its finished trials. A crash loop
            # (each new claim dies) still adds one loss per claim and fails after max_attempts.
            db.execute(_job_update(Job.id == row.id).values(leases_lost=Job.leases_lost + 1))
            log.warning("job %s: lease lost by %s", row.id, ", ".join(lease.worker for lease in lost))
            if live == 0 and row.leases_lost + 1 >= self.settings.max_attempts:
                db.execute(_job_update(Job.id == row.id, Job.status == "running", Job.attempts == row.attempts,
                                       ~exists().where(JobLease.job_id == row.id)).values(
                    status="failed", finished_at=now, updated_at=now,
                    error=f"the job's workers stopped {row.leases_lost + 1} times while running it "
                          "(lost leases); giving up"))
                return False
        if row.status == "running" and live >= _wanted_workers(row.search):
            return False
        res = db.execute(_job_update(Job.id == row.id, Job.status == row.status, Job.attempts == row.attempts).values(
            status="running", attempts=Job.attempts + 1, updated_at=now,
            **({"started_at": now} if row.status == "queued" else {})))
        if res.rowcount != 1:  # another worker claimed it between our read and our write
            return False
        db.add(JobLease(job_id=row.id, worker=self.owner, claimed_at=now,
                        expires_at=now + dt.timedelta(seconds=self.settings.lease_s)))
        if row.status == "running":
            log.info("job %s: joined (%d other worker%s)", row.id, live, "" if live == 1 else "s")
        return True

    # ---- running one job ------------------------------------------------------------------------
    def _should_yield(self, job_id: str) -> bool:
        with self._sessions() as db:
            leave = fair_share.should_yield(db, job_id, self.owner, self.settings, utcnow())
            db.commit()
        return leave

    def _holds_lease(self, job_id: str):
        return exists().where(JobLease.job_id == job_id, JobLease.worker == self.owner)

    def _renew(self, job_id: str, done: int, total: int) -> bool:
        """Renew this worker's lease and write the progress; False when the lease or the job is gone."""
        now = utcnow()
        with self._sessions() as db:
            lease = db.execute(update(JobLease).where(JobLease.job_id == job_id, JobLease.worker == self.owner)
                               .values(expires_at=now + dt.timedelta(seconds=self.settings.lease_s)))
            job = db.execute(_job_update(Job.id == job_id, Job.status == "running").values(
                trials_done=case((Job.trials_done > done, Job.trials_done), else_=done),  # never backwards
                trials_total=total, updated_at=now))
            db.commit()
        return lease.rowcount == 1 and job.rowcount == 1

    def run_job(self, job_id: str) -> str:
        """Run a claimed job to its end; returns the status it ended in (as this worker saw it)."""
        from search import run_search

        self.current = job_id
        with self._sessions() as db:
            job = db.get(Job, job_id)
        if job is None:  # deleted since the claim
            self.current = None
            return "cancelled"
        progress = {"done": 0, "total": int(job.trials_total or 0)}
        lost, leave = threading.Event(), threading.Event()
        beat_stop = threading.Event()

        def heartbeat() -> None:
            interval, renewed = min(0.5, self.settings.progress_s), time.monotonic()
            looked = time.monotonic()
            while not beat_stop.wait(interval):
                try:
                    if not self._renew(job_id, min(progress["done"], progress["total"]), progress["total"]):
                        lost.set()
                        return
                    renewed = time.monotonic()
                    if renewed - looked >= FAIR_LOOK_S:
                        looked = renewed
                        if self._should_yield(job_id):
                            leave.set()
                except Exception as exc:  # noqa: BLE001 - busy or unreachable database: try again at the next beat
                    log.warning("job %s: lease renewal failed (%s)", job_id, str(exc).splitlines()[0])
                    if time.monotonic() - renewed > self.settings.lease_s:  # others may have taken the job
                        lost.set()
                        return

        def check() -> None:
            if lost.is_set():
                raise Cancelled()
            if self.stop_event.is_set():
                raise Interrupted()
            if leave.is_set():
                raise Yielded()

        def on_progress(done: int, total: int) -> None:
            progress["done"], progress["total"] = int(done), int(total)
            check()

        beat = threading.Thread(target=heartbeat, name=f"heartbeat-{job_id[:8]}", daemon=True)
        beat.start()
        started = time.perf_counter()
        try:
            if job.search.get("kind") == "plan":
                log.info("job %s: planning %s device counts (%d processes)", job_id, progress["total"],
                         self.settings.worker_jobs)
                result = plan_job_result(job, progress=on_progress, check=check, jobs=self.settings.worker_jobs)
            elif job.search.get("kind") == "rl":
                log.info("job %s: planning an RL step (up to %s training searches, %d processes)", job_id,
                         progress["total"], self.settings.worker_jobs)
                result = rl_job_result(job, progress=on_progress, check=check, jobs=self.settings.worker_jobs)
            else:
                req = self._request(job)
                log.info("job %s: running %s (%s trials, claim %d, exhaustive on %d processes)", job_id,
                         job.search["engine"], progress["total"], job.attempts, self.settings.worker_jobs)

                def on_engine(engine: str, size: int) -> None:
                    progress["total"] = size if engine == "exhaustive" else req.n_trials
                    self._record_engine(job_id, engine, size, progress["total"])
                    check()

                result = run_search(req, progress=on_progress, check=check, on_engine=on_engine)
        except Cancelled:
            self._drop_lease(job_id)
            log.info("job %s: no longer ours (cancelled, deleted or finished by another worker); stopped after "
                     "%.1f s", job_id, time.perf_counter() - started)
            return "cancelled"
        except Interrupted:
            self._release(job_id)
            log.info("job %s: worker stopping; lease released", job_id)
            return "queued"
        except Yielded:
            self._release(job_id)
            log.info("job %s: left to its other workers for another key's waiting job (fair share)", job_id)
            return "yielded"
        except Exception as exc:  # noqa: BLE001 - a failed job records why
            if _transient(exc):  # the database, not the job: leave it to this or another worker, later
                log.warning("job %s: database error while running (%s); lease released, retrying later", job_id,
                            str(exc).splitlines()[0][:300])
                with contextlib.suppress(Exception):
                    self._release(job_id)
                return "retry"
            if lost.is_set():  # deleted under the search (its study too): nothing to record
                log.info("job %s: cancelled or deleted while running (%s)", job_id, type(exc).__name__)
                return "cancelled"
            from search import SpaceError

            if isinstance(exc, SpaceError):  # the inputs leave nothing to search: the job's answer, not a crash
                log.info("job %s: %s", job_id, user_error(exc))
            else:
                log.exception("job %s failed", job_id)
            return self._fail(job_id, user_error(exc))
        finally:
            beat_stop.set()
            beat.join(timeout=5)
            self.current = None
        return self._finish(job_id, result)

    def _record_engine(self, job_id: str, engine: str, size: int, total: int) -> None:
        """What the job learns once its space is built (the request did not wait for it): the engine ``auto``
        chose, the space size and the progress total. Other workers may then join a sampler job."""
        with self._sessions() as db:
            search = db.scalar(select(Job.search).where(Job.id == job_id))
            if search is None or (search.get("engine") == engine and search.get("space_size") == size):
                return
            search = {**search, "engine": engine, "space_size": int(size),
                      **({"parallel_workers": 1} if engine == "exhaustive" else {})}
            db.execute(_job_update(Job.id == job_id, Job.status == "running").values(
                search=search, trials_total=total, updated_at=utcnow()))
            db.commit()

    def _request(self, job: Job):
        """The job's search request; sampler jobs run on the job's study in the service database."""
        from search import SearchRequest
        from search.samplers import SAMPLERS

        s = job.search
        storage, name, seed = None, None, s["seed"]
        if s["engine"] in SAMPLERS or s["engine"] == "auto":  # auto: a sampler unless the space is small
            name = study_name(job.id)
            storage = optuna_storage(self.url, self.settings.trial_heartbeat_s, self.settings.trial_grace_s)
            seed = claim_seed(seed, job.attempts)
        return SearchRequest(
            spec=ModelSpec.model_validate(job.model_spec), profile=ClusterProfile.model_validate(job.cluster_profile),
            devices=job.devices, global_batch_size=job.global_batch_size, sampler=s["engine"],
            n_trials=s["n_trials"], top_k=s["top_k"], seed=seed, fixed=s.get("fixed") or None,
            precision=job.precision, moe_load_imbalance=job.moe_load_imbalance,
            allow_cross_domain_tp=s.get("allow_cross_domain_tp", False), storage=storage, study_name=name,
            timeout_s=s.get("timeout_s"), worker=self.owner, framework=s.get("framework"), **_margin_option(s),
            objective=s.get("objective", "throughput"), resilience=resilience_option(s), jobs=self.settings.worker_jobs)

    def _drop_lease(self, job_id: str) -> None:
        with contextlib.suppress(SQLAlchemyError), self._sessions() as db:
            db.execute(delete(JobLease).where(JobLease.job_id == job_id, JobLease.worker == self.owner))
            db.commit()

    def _release(self, job_id: str) -> None:
        """Drop this worker's lease; a job left with no live worker goes back to the queue."""
        now = utcnow()
        with self._sessions() as db:
            # Lock the job row first, as a claimer does: a worker joining meanwhile is then either seen (its
            # lease committed) or waits and finds the job queued.
            db.execute(select(Job.id).where(Job.id == job_id).with_for_update())
            db.execute(delete(JobLease).where(JobLease.job_id == job_id, JobLease.worker == self.owner))
            db.execute(_job_update(Job.id == job_id, Job.status == "running",
                                   ~exists().where(JobLease.job_id == job_id)).values(
                status="queued", started_at=None, updated_at=now))
            db.commit()

    def _fail(self, job_id: str, message: str) -> str:
        now = utcnow()
        with self._sessions() as db:
            res = db.execute(_job_update(Job.id == job_id, Job.status == "running", self._holds_lease(job_id)).values(
                status="failed", error=message, finished_at=now, updated_at=now))
            db.execute(delete(JobLease).where(JobLease.job_id == job_id))
            db.commit()
        return "failed" if res.rowcount else "cancelled"

    def _finish(self, job_id: str, result: dict) -> str:
        summary, result = stored_result(result)
        now = utcnow()
        with self._sessions() as db:
            res = db.execute(_job_update(Job.id == job_id, Job.status == "running", self._holds_lease(job_id)).values(
                status="succeeded", summary=summary, layouts=result.get("layouts"), trials_done=result["trials"],
                trials_total=max(result["trials"], db.scalar(select(Job.trials_total).where(Job.id == job_id)) or 0),
                finished_at=now, updated_at=now, error=None))
            if res.rowcount != 1:  # cancelled, deleted or finished by another worker: write nothing
                db.rollback()
                return "cancelled"
            db.execute(delete(JobLease).where(JobLease.job_id == job_id))
            db.execute(delete(JobConfig).where(JobConfig.job_id == job_id))
            db.add_all(_config_row(job_id, entry) for entry in result["top"])
            db.commit()
        log.info("job %s: succeeded (%d ranked configs)", job_id, len(result["top"]))
        return "succeeded"


def stored_result(result: dict) -> tuple[dict, dict]:
    """A job's result as stored: the summary, and what the ranked-config rows and the final progress come from
    (``trials``, ``top``, ``layouts``). A plan or an RL result is kept whole in the summary (the API shows it
    as the job's ``plan`` or ``rl``), with no ranked configs."""
    if "points" in result:  # a capacity plan
        summary = {"engine": "plan", "space_size": len(result["points"]), "trials": len(result["points"]),
                   "feasible_trials": sum(p["feasible"] for p in result["points"]),
                   "search_time_s": result["plan_time_s"], "plan": result}
        return summary, {"trials": len(result["points"]), "top": []}
    if "training_searches" in result:  # an RL plan: every split settled, searched or bounded out
        settled = 1 + len(result["splits"])
        summary = {"engine": "rl", "space_size": settled, "trials": result["training_searches"],
                   "feasible_trials": sum(result[m] is not None for m in ("colocated", "disaggregated")),
                   "search_time_s": result["search_time_s"], "rl": result}
        return summary, {"trials": settled, "top": []}
    return {k: v for k, v in result.items() if k not in ("best", "top", "history", "layouts")}, result


def rl_job_result(job: Job, progress=None, check=None, jobs: int = 1) -> dict:
    """An rl job's result, as ``paraplan rl --json`` prints it (progress counts training searches), its
    training searches on ``jobs`` processes (the worker's ``worker_jobs``)."""
    from app.formats.rl import rl_result
    from app.service.services.jobs import rl_request

    spec = ModelSpec.model_validate(job.model_spec)
    req = rl_request(job.search["rl"], job.devices, spec, ClusterProfile.model_validate(job.cluster_profile))
    req.jobs = jobs
    return rl_result(req, spec.name or "model", progress, check)


def plan_job_result(job: Job, progress=None, check=None, jobs: int = 1) -> dict:
    """A plan job's plan, as ``paraplan plan --json`` prints it (progress counts device counts), its counts
    searched on ``jobs`` processes (the worker's ``worker_jobs``)."""
    from app.formats.plan import plan_result
    from app.service.services.jobs import plan_request

    req = plan_request(job.search["plan"], ModelSpec.model_validate(job.model_spec),
                       ClusterProfile.model_validate(job.cluster_profile))
    req.jobs = jobs
    return plan_result(req, progress=progress, check=check)


def _transient(exc: BaseException) -> bool:
    """A database error (directly, or wrapped by Optuna's storage), not a property of the job."""
    import optuna

    return isinstance(exc, (SQLAlchemyError, optuna.exceptions.StorageInternalError))


def resilience_option(search: dict):
    """The job's checkpoint options (``costmodel.resilience``); the defaults for jobs stored before them."""
    from costmodel.resilience import ResilienceOptions

    return ResilienceOptions.model_validate(search.get("resilience") or {})


def _margin_option(search: dict) -> dict:
    """The job's memory margin as a search argument; a job stored before margins existed gets the
    default (it is run now, under the current ranking rules)."""
    margin = search.get("memory_margin_gib")
    return {} if margin is None else {"memory_margin_gib": float(margin)}


def _wanted_workers(search: dict) -> int:
    """How many workers a job takes at once: ``parallel_workers`` for sampler jobs, else one."""
    from search.samplers import SAMPLERS

    return max(1, int(search.get("parallel_workers") or 1)) if search.get("engine") in SAMPLERS else 1


def claim_seed(seed: int, attempt: int) -> int:
    """The sampler seed of a job's ``attempt``-th claim: the job's own seed for the first (so that a job
    run by one worker reproduces ``paraplan search --seed``), a distinct one derived from it for every
    other worker, so that workers sharing a study do not suggest the same trials."""
    if attempt <= 1:
        return seed
    return int.from_bytes(hashlib.sha256(f"{seed}:{attempt}".encode()).digest()[:4], "big") % 2**31


def _config_row(job_id: str, entry: dict) -> JobConfig:
    ev = entry["evaluation"]
    return JobConfig(job_id=job_id, rank=entry["rank"], config=entry["config"], evaluation=ev,
                     feasible=bool(ev["feasible"]), tokens_per_s=ev.get("tokens_per_s"),
                     tokens_per_s_per_device=ev.get("tokens_per_s_per_device"), mfu=ev.get("mfu"),
                     step_time_s=ev.get("step_time_s"), peak_gib=(ev.get("memory") or {}).get("peak_gib"))


def start_thread(worker: Worker) -> threading.Thread:
    t = threading.Thread(target=worker.run_forever, name="paraplan-worker", daemon=True)
    t.start()
    return t

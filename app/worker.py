"""The job worker: claims one queued job at a time under a lease, runs the search, writes the result.

* Claim: a conditional UPDATE (``queued`` -> ``running``) that only one worker can win, recording the
  worker as lease owner until ``now + lease_s``. A ``running`` job whose lease has expired (its worker
  died), or whose owner is a dead process on this host, is claimed again; after
  ``max_attempts`` claims it fails.
* While the search runs, a heartbeat thread writes the progress (trials done / total) and renews the
  lease every half second with a conditional UPDATE; when that finds the job no longer ``running``
  under this worker (cancelled or deleted through the API), the search's progress callback raises
  :class:`Cancelled` at its next call (within about a second) and nothing is written.
* At the end the status, the summary and the ranked configs are written in one transaction, again
  only if the job is still this worker's.
* A worker asked to stop (SIGTERM) interrupts the search at its next progress call and puts the job
  back to ``queued``: nothing accepted is ever lost.

Sampler jobs keep their Optuna study in the same database (``paraplan-job-<id>``).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import threading
import time
import uuid
from functools import lru_cache

from sqlalchemy import and_, delete, or_, select, update
from sqlalchemy.exc import OperationalError, SQLAlchemyError

from app.core.config import Settings, get_settings
from app.db.engine import engine_kwargs, get_sessionmaker, is_sqlite, tune_sqlite
from app.db.models import Job, JobConfig, utcnow
from costmodel import ClusterProfile, ModelSpec

log = logging.getLogger("paraplan.worker")


class Cancelled(Exception):
    """The job was cancelled or deleted (or taken by another worker) while it ran."""


class Interrupted(Exception):
    """The worker is stopping; the job goes back to the queue."""


@lru_cache(maxsize=4)
def optuna_storage(url: str):
    """Optuna's RDB storage on the service database (its own tables and its own ``alembic_version``)."""
    import optuna

    kwargs = engine_kwargs(url) if is_sqlite(url) else {"pool_pre_ping": True}
    storage = optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
    tune_sqlite(storage.engine)
    return storage


def _job_update(*where):
    """A conditional UPDATE of jobs (the in-session objects are not touched: callers compare rowcounts)."""
    return update(Job).execution_options(synchronize_session=False).where(*where)


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
    if isinstance(exc, SQLAlchemyError):
        first = str(exc).splitlines()[0][:300]
        return f"the database was unavailable while the search ran ({first}); submit the job again"
    text = str(exc).splitlines()[0][:500] if str(exc) else ""
    return f"the search failed unexpectedly ({type(exc).__name__}{': ' + text if text else ''})"


class Worker:
    def __init__(self, settings: Settings | None = None, name: str | None = None):
        self.settings = settings or get_settings()
        self.url = self.settings.database_url
        self.host = socket.gethostname()
        self.owner = name or f"{self.host}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.stop_event = threading.Event()
        self.wake = threading.Event()
        self.current: str | None = None
        self._sessions = get_sessionmaker(self.url)

    # ---- the loop -------------------------------------------------------------------------------
    def run_forever(self) -> None:
        log.info("worker %s started on %s", self.owner, self.url)
        while not self.stop_event.is_set():
            try:
                job_id = self.claim()
                if job_id is not None:
                    self.run_job(job_id)
                    continue
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
    def _reclaimable(self, job: Job, now: dt.datetime) -> bool:
        if job.status != "running":
            return job.status == "queued"
        if job.lease_expires_at is None or job.lease_expires_at < now:
            return True
        host, _, rest = (job.lease_owner or "").partition(":")
        pid = rest.partition(":")[0]
        return host == self.host and pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid))

    def claim(self) -> str | None:
        """Claim the oldest claimable job; None when there is none."""
        now = utcnow()
        with self._sessions() as db:
            candidates = db.scalars(
                select(Job).where(or_(Job.status == "queued", Job.status == "running"))
                .order_by(Job.status.desc(), Job.created_at).limit(50)).all()  # running (stale) first
            for job in candidates:
                if not self._reclaimable(job, now):
                    continue
                was, prev_owner = job.status, job.lease_owner
                same = (Job.status == "queued") if was == "queued" else and_(
                    Job.status == "running", Job.lease_owner == prev_owner,
                    Job.lease_expires_at == job.lease_expires_at)
                if was == "running" and job.attempts >= self.settings.max_attempts:
                    db.execute(_job_update(Job.id == job.id, same).values(
                        status="failed", finished_at=now, updated_at=now, lease_owner=None, lease_expires_at=None,
                        error=f"the job's worker stopped {job.attempts} times while running it (lost lease); "
                              "giving up"))
                    db.commit()
                    continue
                res = db.execute(_job_update(Job.id == job.id, same).values(
                    status="running", lease_owner=self.owner,
                    lease_expires_at=now + dt.timedelta(seconds=self.settings.lease_s),
                    started_at=now, updated_at=now, trials_done=0, attempts=Job.attempts + 1))
                db.commit()
                if res.rowcount == 1:
                    if was == "running":
                        log.warning("job %s: reclaimed from %s (lease lost)", job.id, prev_owner)
                    return job.id
        return None

    # ---- running one job ------------------------------------------------------------------------
    def _mine(self, job_id: str):
        return (Job.id == job_id, Job.status == "running", Job.lease_owner == self.owner)

    def run_job(self, job_id: str) -> str:
        """Run a claimed job to its end; returns the status it ended in (as this worker saw it)."""
        from search import SearchRequest, run_search
        from search.samplers import SAMPLERS

        self.current = job_id
        with self._sessions() as db:
            job = db.get(Job, job_id)
        if job is None:  # deleted since the claim
            self.current = None
            return "cancelled"
        s = job.search
        progress = {"done": 0, "total": int(job.trials_total or 0)}
        lost = threading.Event()
        beat_stop = threading.Event()

        def heartbeat() -> None:
            interval = min(0.5, self.settings.progress_s)
            while not beat_stop.wait(interval):
                try:
                    now = utcnow()
                    with self._sessions() as db:
                        res = db.execute(_job_update(*self._mine(job_id)).values(
                            trials_done=min(progress["done"], progress["total"]), trials_total=progress["total"],
                            updated_at=now, lease_expires_at=now + dt.timedelta(seconds=self.settings.lease_s)))
                        db.commit()
                    if res.rowcount == 0:
                        lost.set()
                        return
                except OperationalError as exc:  # busy database: try again at the next beat
                    log.warning("job %s: heartbeat failed (%s)", job_id, str(exc).splitlines()[0])

        def on_progress(done: int, total: int) -> None:
            progress["done"], progress["total"] = int(done), int(total)
            if lost.is_set():
                raise Cancelled()
            if self.stop_event.is_set():
                raise Interrupted()

        beat = threading.Thread(target=heartbeat, name=f"heartbeat-{job_id[:8]}", daemon=True)
        beat.start()
        started = time.perf_counter()
        try:
            storage, name = None, None
            if s["engine"] in SAMPLERS:
                from app.services.jobs import delete_study, study_name

                name = study_name(job_id)
                delete_study(self.url, name)  # a study left by an interrupted earlier attempt
                storage = optuna_storage(self.url)
            req = SearchRequest(
                spec=ModelSpec.model_validate(job.model_spec),
                profile=ClusterProfile.model_validate(job.cluster_profile),
                devices=job.devices, global_batch_size=job.global_batch_size, sampler=s["engine"],
                n_trials=s["n_trials"], top_k=s["top_k"], seed=s["seed"], fixed=s.get("fixed") or None,
                precision=job.precision, moe_load_imbalance=job.moe_load_imbalance,
                allow_cross_domain_tp=s.get("allow_cross_domain_tp", False), storage=storage, study_name=name,
                timeout_s=s.get("timeout_s"))
            log.info("job %s: running %s (%s trials)", job_id, s["engine"], progress["total"])
            result = run_search(req, progress=on_progress)
        except Cancelled:
            log.info("job %s: cancelled while running; stopped after %.1f s", job_id, time.perf_counter() - started)
            return "cancelled"
        except Interrupted:
            self._release(job_id)
            log.info("job %s: worker stopping; job put back in the queue", job_id)
            return "queued"
        except Exception as exc:  # noqa: BLE001 - a failed job records why
            if lost.is_set():  # deleted under the search (its study too): nothing to record
                log.info("job %s: cancelled or deleted while running (%s)", job_id, type(exc).__name__)
                return "cancelled"
            log.exception("job %s failed", job_id)
            return self._fail(job_id, user_error(exc))
        finally:
            beat_stop.set()
            beat.join(timeout=5)
            self.current = None
        return self._finish(job_id, result)

    def _release(self, job_id: str) -> None:
        now = utcnow()
        with self._sessions() as db:
            db.execute(_job_update(*self._mine(job_id)).values(
                status="queued", lease_owner=None, lease_expires_at=None, started_at=None, trials_done=0,
                updated_at=now, attempts=Job.attempts - 1))
            db.commit()

    def _fail(self, job_id: str, message: str) -> str:
        now = utcnow()
        with self._sessions() as db:
            res = db.execute(_job_update(*self._mine(job_id)).values(
                status="failed", error=message, finished_at=now, updated_at=now, lease_owner=None,
                lease_expires_at=None))
            db.commit()
        return "failed" if res.rowcount else "cancelled"

    def _finish(self, job_id: str, result: dict) -> str:
        summary = {k: v for k, v in result.items() if k not in ("best", "top", "history")}
        now = utcnow()
        with self._sessions() as db:
            res = db.execute(_job_update(*self._mine(job_id)).values(
                status="succeeded", summary=summary, trials_done=result["trials"],
                trials_total=max(result["trials"], db.scalar(select(Job.trials_total).where(Job.id == job_id)) or 0),
                finished_at=now, updated_at=now, lease_owner=None, lease_expires_at=None, error=None))
            if res.rowcount != 1:  # cancelled or deleted at the last moment: write nothing
                db.rollback()
                return "cancelled"
            db.execute(delete(JobConfig).where(JobConfig.job_id == job_id))
            db.add_all(_config_row(job_id, entry) for entry in result["top"])
            db.commit()
        log.info("job %s: succeeded (%d ranked configs)", job_id, len(result["top"]))
        return "succeeded"


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

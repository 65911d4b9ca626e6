"""A sampler job's Optuna study: its name and the storage it lives in (the service database).

The service layer owns both: ``services/jobs.py`` deletes a job's study, ``services/report.py`` reads
its history and the worker (``app/service/worker.py``) runs the search on it; each imports them from
here, so neither ``services`` nor the worker imports the other (an import cycle otherwise).
"""

from __future__ import annotations

from functools import lru_cache

from app.service.db.engine import connect_args, is_sqlite, tune_sqlite


def study_name(job_id: str) -> str:
    return f"paraplan-job-{job_id}"


@lru_cache(maxsize=8)
def optuna_storage(url: str, heartbeat_s: int | None = None, grace_s: int | None = None):
    """Optuna's RDB storage on the service database (its own tables and its own ``alembic_version``);
    with ``heartbeat_s`` the trials carry Optuna's heartbeat and a trial whose worker died is failed
    after ``grace_s`` s and run again (``search.storages.open_rdb_storage``)."""
    from search.storages import open_rdb_storage

    # The service's bounded waits (connect, statement and busy timeouts); Optuna keeps its own pool.
    kwargs = {"connect_args": connect_args(url), **({} if is_sqlite(url) else {"pool_pre_ping": True})}
    storage = open_rdb_storage(url, heartbeat_s, grace_s, engine_kwargs=kwargs)
    tune_sqlite(storage.engine)
    return storage

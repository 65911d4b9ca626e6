"""A finished job as the search result that ``app/formats/report.py`` renders (``GET /v1/jobs/{id}/report``).

The service stores a job's inputs, its summary (engine, space size, trial counts, search time, NSGA-II's
``pareto``) and its ranked configs with their full evaluations, but not the per-trial history. For a
sampler job the history is read back from the job's Optuna study (``paraplan-job-<id>``, in the same
database): one point per completed trial, its tokens/s (0 means no config of the trial fit) and whether
that config keeps the memory margin (the trial's ``keeps_margin`` attribute). When the
study is gone, the report says so in the history plot.
"""

from __future__ import annotations

import logging

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.service.db.models import Job, JobConfig

from .errors import http_error
from .jobs import ranked_entry
from .studies import optuna_storage, study_name

log = logging.getLogger("paraplan.report")


def not_finished(job: Job):
    return http_error(409, ["path", "job_id"], f"job {job.id} is {job.status}: a report needs a succeeded job",
                      "job_not_succeeded")


def study_history(storage_url: str, job_id: str) -> list[dict] | None:
    """The sampler study's trials as ``[{"trial", "tokens_per_s", "feasible"}]``; None without a study."""
    from sqlalchemy import inspect

    from app.service.db.engine import get_engine

    if "studies" not in inspect(get_engine(storage_url)).get_table_names():
        return None
    import optuna

    from search.samplers import KEEPS_MARGIN

    try:
        study = optuna.load_study(study_name=study_name(job_id), storage=optuna_storage(storage_url))
    except KeyError:
        return None
    history = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        tokens = float(t.values[0]) if t.values else 0.0
        entry = {"trial": t.number, "tokens_per_s": tokens if tokens > 0 else None, "feasible": tokens > 0}
        if tokens > 0 and isinstance(t.user_attrs.get(KEEPS_MARGIN), bool):  # a study from before has none
            entry["keeps_margin"] = t.user_attrs[KEEPS_MARGIN]
        history.append(entry)
    return history


def job_result(db: Session, job: Job, storage_url: str) -> dict:
    """The job as ``paraplan search --json`` would print it (history from the study when there is one)."""
    if job.status != "succeeded":
        raise not_finished(job)
    rows = db.execute(select(JobConfig.rank, JobConfig.config, JobConfig.evaluation)
                      .where(JobConfig.job_id == job.id).order_by(JobConfig.rank)).all()
    margin = (job.search or {}).get("memory_margin_gib")
    top = [ranked_entry(r.rank, r.config, r.evaluation, margin) for r in rows]
    summary = dict(job.summary or {})
    model = {k: v for k, v in (job.model_spec or {}).items() if v is not None}
    result = {"inputs": {"model": model, "cluster": job.cluster_name, "devices": job.devices,
                         "global_batch_size": job.global_batch_size, "precision": job.precision,
                         "moe_load_imbalance": job.moe_load_imbalance, "memory_margin_gib": margin},
              **summary, "best": top[0] if top else None, "top": top, "job_id": job.id,
              "seed": (job.search or {}).get("seed"), "paraplan_version": job.paraplan_version}
    if job.layouts is not None:
        result["layouts"] = job.layouts
    if summary.get("engine") != "exhaustive":
        try:
            history = study_history(storage_url, job.id)
        except Exception as exc:  # noqa: BLE001 - the report goes out without the history
            log.warning("job %s: cannot read its Optuna study (%s)", job.id, exc)
            history = None
        if history:
            result["history"] = history
        else:
            result["history_note"] = "the job's Optuna study is not in the database"
    return result

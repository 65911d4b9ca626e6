"""The service's tables (SQLAlchemy 2.x). Optuna's tables live in the same database and are Optuna's.

* ``jobs``: one search job, with the exact inputs it ran on (the model spec after loading, the full
  cluster profile and its version hash, devices, batch, precision, imbalance and the resolved search
  options, seed included) so that its result can be reproduced, its status, progress, error, lease and
  idempotency key.
* ``job_leases``: the workers running a job, one row each, with the time their lease runs out (a job
  asks for ``search.parallel_workers`` of them; a lease that is not renewed lets another worker in).
* ``job_configs``: the ranked configs of a finished job, rank 1 first, each with its full evaluation
  JSON and the columns users filter and sort on (tokens/s, MFU, peak memory). An exhaustive job
  stores its top K and the counts (in ``jobs.summary``), not a row per scored config. The best config
  of each of the top K distinct parallel layouts, with its evaluation, is ``jobs.layouts`` (JSON; most
  of them are also ranked configs, but a layout's best may rank beyond K).
* ``measurements``: one run a team measured on a shipped cluster (``POST /v1/clusters/{name}/measurements``),
  in the published-runs format, owned by the API key that posted it.
* ``profile_versions``: a cluster profile refitted on an owner's measurements of that cluster, numbered
  1, 2, ... per owner and cluster (0 is the shipped profile, never stored), with the full fitted profile,
  its hash and the fit's figures (``app/formats/calibration.refit``'s report).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (JSON, Boolean, DateTime, Float, ForeignKey, Index, Integer, MetaData, String, Text,
                        TypeDecorator, UniqueConstraint)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")
FINISHED = ("succeeded", "failed", "cancelled")


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class UTCDateTime(TypeDecorator):
    """Aware UTC datetimes in, aware UTC datetimes out, on every backend (stored naive, in UTC)."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is not None and value.tzinfo is not None:
            value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
        return value

    def process_result_value(self, value, dialect):
        return value.replace(tzinfo=dt.timezone.utc) if value is not None else None


NAMING = {"ix": "ix_%(column_0_label)s", "uq": "uq_%(table_name)s_%(column_0_name)s",
          "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s", "pk": "pk_%(table_name)s",
          "ck": "ck_%(table_name)s_%(constraint_name)s"}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    status: Mapped[str] = mapped_column(String(16), default="queued")
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)

    # the exact inputs
    request: Mapped[dict[str, Any]] = mapped_column(JSON)  # the body as submitted
    model_spec: Mapped[dict[str, Any]] = mapped_column(JSON)  # after loading (preset + overrides)
    cluster_name: Mapped[str] = mapped_column(String(200))
    cluster_profile: Mapped[dict[str, Any]] = mapped_column(JSON)  # the full profile used
    profile_version: Mapped[str] = mapped_column(String(64))
    devices: Mapped[int] = mapped_column(Integer)
    global_batch_size: Mapped[int] = mapped_column(Integer)
    precision: Mapped[str] = mapped_column(String(8))
    moe_load_imbalance: Mapped[float | None] = mapped_column(Float)
    search: Mapped[dict[str, Any]] = mapped_column(JSON)  # resolved options: seed, engine, ...
    paraplan_version: Mapped[str] = mapped_column(String(32))

    # progress and outcome
    trials_done: Mapped[int] = mapped_column(Integer, default=0)
    trials_total: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text)
    summary: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # engine, space_size, trials, counts, ...
    layouts: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)  # top K layouts (search output ``layouts``)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)

    # the workers' claims (the leases themselves are rows of ``job_leases``)
    attempts: Mapped[int] = mapped_column(Integer, default=0)  # claims so far; claim n > 1 reseeds its sampler
    leases_lost: Mapped[int] = mapped_column(Integer, default=0, server_default="0")  # leases that ran out (their worker died)

    # the API key that created it (a hash; "" when the server runs without keys): only it sees the job
    owner: Mapped[str] = mapped_column(String(64), default="", server_default="")

    # Idempotency-Key, scoped to the API key (a hash of it; "" without keys)
    idempotency_scope: Mapped[str | None] = mapped_column(String(64))
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    request_hash: Mapped[str | None] = mapped_column(String(64))

    __table_args__ = (
        Index("ix_jobs_status_created_at", "status", "created_at"),
        Index("ix_jobs_created_at", "created_at"),
        Index("ix_jobs_owner_status", "owner", "status"),
        UniqueConstraint("idempotency_scope", "idempotency_key", name="uq_jobs_idempotency"),
    )


class JobLease(Base):
    """One worker's claim on a running job, renewed while the worker lives."""

    __tablename__ = "job_leases"

    job_id: Mapped[str] = mapped_column(String(36), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    worker: Mapped[str] = mapped_column(String(200), primary_key=True)  # host:pid:random
    claimed_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)


class JobConfig(Base):
    __tablename__ = "job_configs"

    job_id: Mapped[str] = mapped_column(String(36), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    evaluation: Mapped[dict[str, Any]] = mapped_column(JSON)
    feasible: Mapped[bool] = mapped_column(Boolean)
    tokens_per_s: Mapped[float | None] = mapped_column(Float)
    tokens_per_s_per_device: Mapped[float | None] = mapped_column(Float)
    mfu: Mapped[float | None] = mapped_column(Float)
    step_time_s: Mapped[float | None] = mapped_column(Float)
    peak_gib: Mapped[float | None] = mapped_column(Float)

    __table_args__ = (
        Index("ix_job_configs_job_id_tokens_per_s", "job_id", "tokens_per_s"),
        Index("ix_job_configs_job_id_mfu", "job_id", "mfu"),
        Index("ix_job_configs_job_id_peak_gib", "job_id", "peak_gib"),
    )


class Measurement(Base):
    """One measured run (the published-runs format, ``cluster`` filled in), owned by an API key's hash."""

    __tablename__ = "measurements"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    owner: Mapped[str] = mapped_column(String(64), default="", server_default="")
    cluster_name: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    run: Mapped[dict[str, Any]] = mapped_column(JSON)

    __table_args__ = (Index("ix_measurements_owner_cluster_name_created_at", "owner", "cluster_name", "created_at"),)


class ProfileVersion(Base):
    """Version ``number`` of ``owner``'s profile of ``cluster_name``: the shipped profile refitted on the
    measurements ``measurement_ids`` (the runs themselves are in ``fit.run_errors``, so that a deleted
    measurement does not change what a version says it was fitted on)."""

    __tablename__ = "profile_versions"

    owner: Mapped[str] = mapped_column(String(64), primary_key=True)
    cluster_name: Mapped[str] = mapped_column(String(200), primary_key=True)
    number: Mapped[int] = mapped_column(Integer, primary_key=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    profile: Mapped[dict[str, Any]] = mapped_column(JSON)  # the full fitted profile
    profile_version: Mapped[str] = mapped_column(String(64))  # its hash, ClusterProfile.version()
    measurement_ids: Mapped[list[str]] = mapped_column(JSON)
    mape_before: Mapped[float] = mapped_column(Float)
    mape_after: Mapped[float] = mapped_column(Float)
    published_mape_before: Mapped[float | None] = mapped_column(Float)
    published_mape_after: Mapped[float | None] = mapped_column(Float)
    published_worse: Mapped[bool] = mapped_column(Boolean)
    fit: Mapped[dict[str, Any]] = mapped_column(JSON)  # factors, run errors, published figures, max_evals

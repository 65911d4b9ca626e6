"""Alembic migrations: an empty (or older) database upgrades to head, the schema then matches the models
(no autogenerate diff over the project's own tables), and Optuna's studies live beside them with their
own schema and their own `alembic_version` table."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import optuna
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from app.service.db.migrate import VERSION_TABLE, alembic_config, current_revision, head_revision, include_object, upgrade
from app.service.db.models import Base

ROOT = Path(__file__).resolve().parents[1]
OPTUNA_TABLES = {"studies", "trials", "trial_params", "trial_values", "alembic_version"}


def _diff(url: str) -> list:
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE, "include_object": include_object,
                                                     "compare_type": True})
        diff = compare_metadata(ctx, Base.metadata)
    engine.dispose()
    return diff


def _tables(url: str) -> set[str]:
    engine = sa.create_engine(url)
    names = set(sa.inspect(engine).get_table_names())
    engine.dispose()
    return names


def _optuna_study(url: str, name: str) -> optuna.Study:
    study = optuna.create_study(storage=url, study_name=name, load_if_exists=True)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    return study


def _version_rows(url: str, table: str) -> list[str]:
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        rows = [r[0] for r in conn.execute(sa.text(f"SELECT version_num FROM {table}"))]
    engine.dispose()
    return rows


def test_empty_database_upgrades_to_head_and_matches_the_models_with_optuna_beside(database_url):
    url = database_url
    assert current_revision(url) is None
    assert upgrade(url) == head_revision(url)
    assert _diff(url) == []
    _optuna_study(url, "beside")
    tables = _tables(url)
    assert {"jobs", "job_configs", "job_leases", VERSION_TABLE} <= tables and OPTUNA_TABLES <= tables
    assert _version_rows(url, VERSION_TABLE) == [head_revision(url)]
    assert _version_rows(url, "alembic_version") != [head_revision(url)]  # Optuna's own revision
    assert _diff(url) == []  # Optuna's tables are not ours to compare
    assert upgrade(url) == head_revision(url)  # a no-op
    assert len(optuna.load_study(study_name="beside", storage=url).trials) == 3


def test_a_database_holding_optuna_first_and_an_older_revision_upgrade(database_url):
    url = database_url
    _optuna_study(url, "first")  # Optuna's schema and alembic_version before ours
    upgrade(url)
    command.downgrade(alembic_config(url), "base")  # an older database: at base, our tables gone
    assert current_revision(url) is None and "jobs" not in _tables(url)
    assert upgrade(url) == head_revision(url) and _diff(url) == []
    assert len(optuna.load_study(study_name="first", storage=url).trials) == 3


def test_alembic_upgrade_head_by_hand(database_url):
    env = {**os.environ, "DATABASE_URL": database_url}
    alembic = [sys.executable, "-m", "alembic"]
    up = subprocess.run([*alembic, "upgrade", "head"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert up.returncode == 0, up.stderr
    cur = subprocess.run([*alembic, "current"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert "(head)" in cur.stdout, cur.stdout + cur.stderr
    check = subprocess.run([*alembic, "check"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert check.returncode == 0 and "No new upgrade operations detected" in check.stdout + check.stderr


def test_revision_0002_keeps_running_jobs_leases_and_ranked_configs(database_url):
    url = database_url
    command.upgrade(alembic_config(url), "0001")
    engine = sa.create_engine(url)
    jobs = sa.Table("jobs", sa.MetaData(), autoload_with=engine)
    now = dt.datetime(2026, 12, 1, 12, 0, 0)
    row = {c.name: None for c in jobs.columns}
    row.update(id="0b5c8c52-3c2e-4a53-9f43-3f3f7f2a8f10", status="running", created_at=now, updated_at=now,
               request={}, model_spec={}, cluster_name="c", cluster_profile={}, profile_version="v", devices=8,
               global_batch_size=64, precision="bf16", search={}, paraplan_version="0.1.0", trials_done=5,
               trials_total=10, cancel_requested=False, attempts=1, lease_owner="host:1:abc",
               lease_expires_at=now + dt.timedelta(seconds=30))
    configs = sa.Table("job_configs", sa.MetaData(), autoload_with=engine)
    with engine.begin() as conn:
        conn.execute(jobs.insert().values(**row))
        conn.execute(configs.insert().values(job_id=row["id"], rank=1, config={"tp": 8}, evaluation={},
                                             feasible=True))
    engine.dispose()
    assert upgrade(url) == head_revision(url) and _diff(url) == []
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        leases = conn.execute(sa.text("SELECT job_id, worker, expires_at FROM job_leases")).all()
        job = conn.execute(sa.text("SELECT owner, leases_lost, trials_done FROM jobs")).one()
        ranked = conn.execute(sa.text("SELECT job_id, rank FROM job_configs")).all()
    engine.dispose()
    assert [(j, w) for j, w, _ in leases] == [(row["id"], "host:1:abc")]
    assert tuple(job) == ("", 0, 5)
    assert [tuple(r) for r in ranked] == [(row["id"], 1)]  # rebuilding jobs (SQLite batch mode) keeps them

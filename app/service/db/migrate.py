"""Bring a database to the newest schema (what ``alembic upgrade head`` does), on service start.

Works on an empty database, on one at an older revision, and on one that already holds Optuna's
tables, on SQLite and PostgreSQL. Migrations run under a lock (advisory on PostgreSQL, a file beside a
SQLite database), so a server and workers started together do not both create the tables.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from app.service.db.engine import get_engine, sqlite_path
from app.service.db.models import Base
from search.locks import advisory_lock, file_lock

ROOT = Path(__file__).resolve().parents[3]
# The project's own Alembic version table: Optuna keeps its ``alembic_version`` in the same database.
VERSION_TABLE = "paraplan_alembic_version"


def include_object(obj, name, type_, reflected, compare_to) -> bool:
    """Only the project's own tables (and their indexes and constraints) are compared and migrated;
    Optuna's tables are Optuna's."""
    if type_ == "table":
        return name in Base.metadata.tables
    table = getattr(obj, "table", None)
    if table is not None:
        return table.name in Base.metadata.tables
    return True


def alembic_config(url: str) -> Config:
    cfg = Config(str(ROOT / "alembic.ini")) if (ROOT / "alembic.ini").is_file() else Config()
    cfg.set_main_option("script_location", str(ROOT / "migrations"))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


MIGRATION_LOCK_KEY = 7_310_512_404  # pg_advisory_lock key of "the schema is being migrated"


@contextmanager
def _lock(url: str):
    """Serialise migrations of one database across processes: an advisory lock on PostgreSQL, a file lock
    beside a SQLite file (an API and its workers starting together must not both create the tables). The
    locks are ``search.locks``', shared with the search's trial reservation (why there: its docstring);
    the PostgreSQL one without an idle timeout, since its session is idle while the migration runs."""
    if get_engine(url).dialect.name == "postgresql":
        with advisory_lock(get_engine(url), MIGRATION_LOCK_KEY):
            yield
        return
    path = sqlite_path(url)
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(f"{path}.migrate-lock"):
        yield


def current_revision(url: str) -> str | None:
    with get_engine(url).connect() as conn:
        return MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()


def head_revision(url: str) -> str | None:
    return ScriptDirectory.from_config(alembic_config(url)).get_current_head()


def upgrade(url: str) -> str | None:
    """Upgrade to head (a no-op when already there); returns the revision now in force."""
    with _lock(url):
        if current_revision(url) != head_revision(url):
            command.upgrade(alembic_config(url), "head")
        _create_optuna_schema(url)
    return current_revision(url)


def _create_optuna_schema(url: str) -> None:
    """Optuna's tables, created here under the lock: workers that open Optuna's storage on a new database
    at the same moment would otherwise race to create them (and one would fail its job)."""
    from sqlalchemy import inspect

    if "studies" in inspect(get_engine(url)).get_table_names():
        return
    import optuna

    optuna.storages.RDBStorage(url, skip_compatibility_check=True).engine.dispose()

"""Bring a database to the newest schema (what ``alembic upgrade head`` does), on service start.

Works on an empty database, on one at an older revision, and on one that already holds Optuna's
tables. A SQLite database is migrated under a file lock, so a server and a worker started together do
not both create the tables.
"""

from __future__ import annotations

import fcntl
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from app.db.engine import get_engine, sqlite_path
from app.db.models import Base

ROOT = Path(__file__).resolve().parents[2]
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


@contextmanager
def _lock(url: str):
    path = sqlite_path(url)
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.migrate-lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


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
    return current_revision(url)

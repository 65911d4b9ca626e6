"""One SQLAlchemy engine and session factory per database URL (the API's session dependency is
``app.service.api.deps.get_db``).

SQLite (the default) runs in WAL mode with ``synchronous=NORMAL``: readers never wait for the worker's
writes, and a commit does not wait for a disk flush (a crash loses at most the last commits, never the
file). The worker, the API threads and Optuna's storage share one file.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from app.service.core.config import get_settings

SQLITE_BUSY_TIMEOUT_S = 30


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def safe_url(url: str) -> str:
    """A database URL as it may be logged (the service's and the worker's start lines): its password
    masked."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - an unparsable URL fails at connect anyway; log nothing of it
        return "(unparsable DATABASE_URL)"


def sqlite_path(url: str) -> Path | None:
    """The database file of a SQLite URL (None for in-memory or another backend)."""
    u = make_url(url)
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return None
    return Path(u.database)


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def tune_sqlite(engine: Engine) -> Engine:
    """WAL and friends on every new connection of ``engine`` (also used on Optuna's engine)."""
    if engine.dialect.name == "sqlite" and not event.contains(engine, "connect", _sqlite_pragmas):
        event.listen(engine, "connect", _sqlite_pragmas)
        engine.dispose()  # connections opened before the listener get it when reopened
    return engine


def engine_kwargs(url: str) -> dict:
    if is_sqlite(url):
        return {"connect_args": {"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S}}
    return {"pool_pre_ping": True}


@lru_cache(maxsize=8)
def get_engine(url: str | None = None) -> Engine:
    url = url or get_settings().database_url
    path = sqlite_path(url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    return tune_sqlite(create_engine(url, **engine_kwargs(url)))


@lru_cache(maxsize=8)
def get_sessionmaker(url: str | None = None) -> sessionmaker[Session]:
    return sessionmaker(bind=get_engine(url), expire_on_commit=False)


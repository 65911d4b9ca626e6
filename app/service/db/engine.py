"""One SQLAlchemy engine and session factory per database URL (the API's session dependency is
``app.service.api.deps.get_db``).

SQLite (the default) runs in WAL mode with ``synchronous=NORMAL``: readers never wait for the worker's
writes, and a commit does not wait for a disk flush (a crash loses at most the last commits, never the
file). The worker, the API threads and Optuna's storage share one file.

Every engine has bounded waits, from the settings (``app/service/core/config.py``): a
connect timeout and a statement timeout on PostgreSQL (libpq's ``connect_timeout``, the server's
``statement_timeout``, TCP keepalives so a vanished server is noticed), SQLite's busy timeout, and a
pool as large as the threads that use it (``Settings.pool_size``) with a bounded wait for a connection.
A database that is away turns into a SQLAlchemy error within those bounds, which the API answers with
503 (``app/service/main.py``). A frozen server (its kernel still acknowledging, nothing answering) holds a
statement until it resumes: the API bounds each request's whole database wait on its side
(``PARAPLAN_DB_REQUEST_TIMEOUT_S``, ``app/service/api/deps.py``) and answers 503 with Retry-After then.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from app.service.core.config import Settings, get_settings

LIBPQ_DRIVERS = ("psycopg", "psycopg2")


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


# Linux file attributes as statx(2) reports them (linux/stat.h): an immutable or append-only file cannot
# take a write, not even through a shared memory map that is already open.
STATX_ATTR_IMMUTABLE, STATX_ATTR_APPEND = 0x10, 0x20
AT_FDCWD = -100
FROZEN_CHECK_S = 0.25  # how long one look at the files' attributes is trusted


@lru_cache(maxsize=1)
def _statx():
    """libc's statx, or None (not Linux, or a libc before glibc 2.28)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.statx
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
    return fn


def _file_frozen(path: str) -> bool:
    """Whether ``path`` exists and is immutable or append-only (False where that cannot be told). Read with
    statx, never by opening the file: closing any descriptor of a SQLite file drops every POSIX lock the
    process holds on it, SQLite's own included."""
    import ctypes

    statx = _statx()
    if statx is None:
        return False
    buf = ctypes.create_string_buffer(256)  # struct statx; stx_attributes is the u64 at offset 8
    if statx(AT_FDCWD, path.encode(), 0, 0, buf) != 0:
        return False
    attributes = int.from_bytes(buf.raw[8:16], "little")
    return bool(attributes & (STATX_ATTR_IMMUTABLE | STATX_ATTR_APPEND))


class FrozenFileGuard:
    """Refuses SQLite work on a database whose file, ``-wal`` or ``-shm`` became immutable.

    SQLite in WAL mode keeps its index in ``-shm`` as a shared memory map, and every read and write
    (read marks included) writes to it. Once the file is immutable (``chattr +i``) the kernel answers the
    next write to that map with SIGBUS, which ends the whole process: API, embedded worker and all. So
    before each statement, commit and new connection the attributes are looked at (statx) (at most every
    ``FROZEN_CHECK_S``) and, while frozen, the work is refused with a DBAPI error (503 with Retry-After
    through the API; the worker waits as for an outage); it goes on by itself once the file is writable.
    A file made read-only by its permissions needs no guard: a connection already open keeps writing
    through its map, and a new one opens read-only (``_drop_read_only``)."""

    def __init__(self, path: str):
        self.paths = [path, f"{path}-wal", f"{path}-shm"]
        self.checked_at, self.frozen = -1e9, False

    def check(self, *_args, **_kw) -> None:
        import sqlite3
        import time

        now = time.monotonic()
        if now - self.checked_at > FROZEN_CHECK_S:
            self.frozen, self.checked_at = any(_file_frozen(p) for p in self.paths), now
        if self.frozen:  # a SQLAlchemy error, so that every caller handles it as a database error
            raise OperationalError("(refused)", None, sqlite3.OperationalError(
                "the database file is immutable; refused before SQLite touches it"))


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def _drop_read_only(context) -> None:
    """A SQLite connection opened while its file could not be written stays read-only for life ("attempt to
    write a readonly database" ever after, though the file is writable again): treat the error as a lost
    connection, so that the pool drops it and the next use opens a new one. The request still answers 503
    (the API's handler for database errors), and writes work again as soon as the file does, without a
    restart."""
    if "readonly database" in str(context.original_exception):
        context.is_disconnect = True


def tune_sqlite(engine: Engine) -> Engine:
    """WAL and friends on every new connection of ``engine`` (also used on Optuna's engine), and read-only
    connections dropped (``_drop_read_only``)."""
    if engine.dialect.name == "sqlite" and not event.contains(engine, "connect", _sqlite_pragmas):
        database = engine.url.database
        if database and database != ":memory:" and not database.startswith("file:"):
            guard = FrozenFileGuard(str(Path(database).resolve()))
            event.listen(engine, "connect", guard.check)  # before the pragmas: listeners run in order
            event.listen(engine, "before_cursor_execute", guard.check)
            event.listen(engine, "commit", guard.check)
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "handle_error", _drop_read_only)
        engine.dispose()  # connections opened before the listener get it when reopened
    return engine


def connect_args(url: str, settings: Settings | None = None) -> dict:
    """The driver's connect arguments that bound every wait: SQLite's busy timeout; on PostgreSQL
    (libpq drivers) the connect timeout, the statement timeout and TCP keepalives."""
    s = settings or get_settings()
    if is_sqlite(url):
        return {"check_same_thread": False, "timeout": s.db_busy_timeout_s}
    if make_url(url).get_driver_name() in LIBPQ_DRIVERS:
        # tcp_user_timeout: a write the server's host does not acknowledge fails after this long (a vanished
        # host); a frozen server's kernel still acknowledges, which the request bound covers
        # (PARAPLAN_DB_REQUEST_TIMEOUT_S, app/service/api/deps.py).
        return {"connect_timeout": s.db_connect_timeout_s,
                "options": f"-c statement_timeout={int(s.db_statement_timeout_s * 1000)}",
                "keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3,
                "tcp_user_timeout": int(s.db_statement_timeout_s * 1000)}
    return {}


def engine_kwargs(url: str, settings: Settings | None = None) -> dict:
    """``create_engine`` arguments: bounded connect/statement/busy waits and the pool (``pool_size``
    connections, no overflow beyond them, a bounded wait for one)."""
    s = settings or get_settings()
    kwargs = {"connect_args": connect_args(url, s), "pool_size": s.pool_size, "max_overflow": 0,
              "pool_timeout": s.db_pool_timeout_s}
    if make_url(url).database in (None, "", ":memory:") and is_sqlite(url):
        return {"connect_args": kwargs["connect_args"]}  # in-memory SQLite: a singleton pool, no sizes
    if not is_sqlite(url):
        kwargs["pool_pre_ping"] = True
    return kwargs


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


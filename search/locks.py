"""Cross-process locks on a shared database, one implementation for all of ParaPlan: a PostgreSQL
advisory lock, and an ``flock`` on a file beside a SQLite database.

Two users: a study's trial reservation (``search/storages.py``) and the service's schema migration
(``app/service/db/migrate.py``). The lock lives here, in ``search``, because the layering runs
costmodel <- search <- app: ``search`` may not import ``app`` and ``app`` may import ``search``, so the
one implementation sits at the lowest level that needs it. It is a module of its own, importing only the
standard library and SQLAlchemy, so that the migration does not pull in Optuna with ``search/storages.py``.
"""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections.abc import Callable, Iterator
from pathlib import Path

POLL_S = 0.05  # how often a waiter tries again


def _nothing() -> None:
    pass


@contextlib.contextmanager
def advisory_lock(engine, key: int, on_wait: Callable[[], None] | None = None,
                  idle_timeout: str | None = None) -> Iterator[None]:
    """Hold PostgreSQL's transaction-level advisory lock ``key`` (a signed 64-bit integer) for the
    ``with`` block, on a connection of ``engine`` of its own. It is taken by polling
    ``pg_try_advisory_xact_lock`` (``on_wait`` is called between tries; it may raise to give up) and goes
    with the transaction's end: the block's end, or the holder's session ending (a dead process).
    ``idle_timeout`` (e.g. ``"60s"``) makes the server end a holder's session that stays idle that long
    (a holder whose host vanished would otherwise keep it until TCP notices, hours later)."""
    from sqlalchemy import text

    on_wait = on_wait or _nothing
    with engine.connect() as conn:
        try:
            if idle_timeout is not None:
                conn.execute(text(f"SET LOCAL idle_in_transaction_session_timeout = '{idle_timeout}'"))
            while not conn.execute(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": key}).scalar():
                on_wait()
                time.sleep(POLL_S)
            yield
        finally:
            conn.rollback()  # ends the transaction: the lock goes with it


@contextlib.contextmanager
def file_lock(path: str | Path, on_wait: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the ``with`` block; the kernel
    drops it when the process dies. ``on_wait`` as for ``advisory_lock``."""
    on_wait = on_wait or _nothing
    with open(path, "a") as fh:
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                on_wait()
                time.sleep(POLL_S)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)

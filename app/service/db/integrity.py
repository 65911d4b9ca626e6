"""The SQLite file checked before it is served (unchecked, a file with overwritten pages was served as
healthy, and every request that touched a broken page failed).

``paraplan serve`` and ``paraplan worker`` run SQLite's ``PRAGMA quick_check`` (every page and index
entry is well formed: O(file size), not the cross-checks of ``integrity_check``) on the file before
anything else opens it, and refuse to start on a damaged one. PostgreSQL checks its own pages.
"""

from __future__ import annotations

import sqlite3

from app.service.db.engine import sqlite_path

SHOWN_PROBLEMS = 3


class DatabaseDamaged(RuntimeError):
    """The database file is damaged; the message says which file and what SQLite found."""


def check_sqlite_file(url: str) -> None:
    """Raise :class:`DatabaseDamaged` when ``url`` is a SQLite file that exists and fails
    ``PRAGMA quick_check`` (or is not a SQLite database at all). A file that does not exist yet is fine:
    the migrations create it."""
    path = sqlite_path(url)
    if path is None or not path.exists() or path.stat().st_size == 0:
        return
    try:
        # Read-only: a damaged file is not to be written (no WAL replay into it, no journal created).
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            rows = [r[0] for r in conn.execute("PRAGMA quick_check")]
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise DatabaseDamaged(f"the database file {path} is damaged: {exc}; restore it from a backup, or "
                              "move it aside to start on a new one") from None
    if rows != ["ok"]:
        shown = "; ".join(rows[:SHOWN_PROBLEMS]) + (f"; … {len(rows) - SHOWN_PROBLEMS} more"
                                                     if len(rows) > SHOWN_PROBLEMS else "")
        raise DatabaseDamaged(f"the database file {path} is damaged (PRAGMA quick_check: {shown}); restore it "
                              "from a backup, or move it aside to start on a new one")

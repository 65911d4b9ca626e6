"""The service's logs: one JSON object per line (or plain text), each carrying the id of the HTTP request
being served when it was written.

``configure_logging(level, fmt)`` installs one handler on the root logger (stderr) for ``paraplan serve``
and ``paraplan worker``; uvicorn's and Optuna's lines and Python's warnings go through it too. A JSON line
has ``ts`` (UTC, ISO 8601), ``level``, ``logger``, ``msg``, and whatever the call passed in ``extra``
(``method``, ``path``, ``status``, ``duration_ms``, ``job_id``, ...), plus ``request_id`` when it was
written while serving a request.

The request id lives in a context variable set by the request middleware (``app/service/main.py``): asyncio
tasks and the thread pool that runs the sync routes copy the context, so every line written on behalf of
a request carries its id, and nothing else (the worker thread starts with an empty context).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import sys
import uuid
from contextvars import ContextVar
from dataclasses import dataclass

FORMATS = ("json", "text")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# A client's X-Request-ID is kept only if it is a plain token: it is echoed in a header and logged.
REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")

# The attributes every LogRecord has; anything else on a record came from ``extra=`` (or a filter).
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}
# Extras that only repeat the message for a terminal (uvicorn's coloured copy of it).
_DROPPED = {"color_message"}


@dataclass
class RequestInfo:
    """What the logs know about the request being served: its id and who made it (``key`` is the first 8
    characters of the caller's scope hash once ``api_scope`` accepted a key, else ``open``; never the key)."""

    request_id: str
    key: str = "open"


current_request: ContextVar[RequestInfo | None] = ContextVar("paraplan_request", default=None)


def request_id_from(header: str | None) -> str:
    """The client's ``X-Request-ID`` if it is a sane token (<= 128 of ``[A-Za-z0-9._-]``), else a new uuid4 hex."""
    if header and REQUEST_ID.fullmatch(header):
        return header
    return uuid.uuid4().hex


class RequestIdFilter(logging.Filter):
    """Adds ``request_id`` to a record written while serving a request (unless the call gave one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        info = current_request.get()
        if info is not None and not hasattr(record, "request_id"):
            record.request_id = info.request_id
        return True


def extras(record: logging.LogRecord) -> dict:
    """The fields a call added to the record (``extra=``, ``request_id``), in the order they were set."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and k not in _DROPPED}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``msg``, the extras, and ``exc`` (the
    traceback) when there is one. Values JSON cannot hold are written as their ``str``."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"ts": dt.datetime.fromtimestamp(record.created, dt.timezone.utc).isoformat(timespec="milliseconds")
               .replace("+00:00", "Z"),
               "level": record.levelname, "logger": record.name, "msg": record.getMessage()}
        for k, v in extras(record).items():
            out.setdefault(k, v)  # an extra never overwrites the four fields above
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``TEXT_FORMAT`` followed by `` request_id=... job_id=...`` when the record has them (the other extras
    of a request line are already in its message)."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        line = super().formatMessage(record)
        tags = [f"{k}={getattr(record, k)}" for k in ("request_id", "job_id") if getattr(record, k, None)]
        return " ".join([line, *tags])


def configure_logging(level: str = "info", fmt: str = "json") -> None:
    """Log to stderr at ``level`` (a name such as ``info``), as ``json`` lines or ``text``. Replaces the
    root logger's handlers (calling it twice is safe); Python warnings become log lines too, so that a
    JSON log stays one object per line."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.captureWarnings(True)
    _route_optuna_logs()
    # Alembic announces its autogenerate plugins at every start; the migration lines themselves stay.
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)


def _route_optuna_logs() -> None:
    """Optuna writes its lines ("A new study created ...") through a handler of its own, in its own format:
    send them through ours instead."""
    try:
        import optuna
    except ImportError:  # pragma: no cover - a dependency; nothing to route without it
        return
    optuna.logging.disable_default_handler()
    optuna.logging.enable_propagation()

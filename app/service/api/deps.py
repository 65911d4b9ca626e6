"""Dependencies of the routes: settings, database work per request (``in_db``, ``db_route``), and the API
key check.

Database work runs in the app's database threads (``PARAPLAN_API_THREADS`` of them, one pooled connection
each) inside a session that is closed in the same thread before the route's answer is validated and sent:
a request never holds a connection beyond its queries. Under FastAPI a plain ``def`` route validates its
answer in a second thread-pool hop while the request's session (a ``yield`` dependency) still holds its
connection, so a burst of reads could fill every thread with requests waiting for connections held by
requests waiting for a thread, until the pool's timeout. Every wait is bounded too: a request whose database
work has not finished within ``PARAPLAN_DB_REQUEST_TIMEOUT_S`` (queueing for a thread included) answers 503
with ``Retry-After`` (``DatabaseTimeout``), whatever the database does (away, frozen, out of connections);
work that had not started is dropped, and a thread held by a frozen database is freed when it answers.

The key check compares the given key with every configured key, always all of them and in constant
time, so that the answer's timing says nothing about how close a guess was or which key matched. Keys
are never logged: the request log shows the first 8 characters of the scope hash at most.
"""

from __future__ import annotations

import hashlib
import hmac
import asyncio
import contextvars
import functools
import inspect
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from app.service.core.config import Settings
from app.service.core.logging import current_request
from app.service.services.errors import http_error

bearer = HTTPBearer(auto_error=False, description="An API key from PARAPLAN_API_KEYS (only when the server "
                                                  "sets keys): `Authorization: Bearer KEY`.")


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_db(request: Request) -> AsyncIterator[Session]:
    """One session per request, closed afterwards. (The dependencies are ``async`` so that FastAPI calls
    them on the event loop instead of a thread each; the session is synchronous and used by the route.)"""
    session = request.app.state.sessions()
    try:
        yield session
    finally:
        session.close()


class DatabaseTimeout(RuntimeError):
    """A request's database work did not finish within its bound (503 with Retry-After)."""


def db_executor(app) -> ThreadPoolExecutor:
    """The app's database threads (created on first use, ``api_threads`` of them)."""
    ex = getattr(app.state, "db_executor", None)
    if ex is None:
        ex = app.state.db_executor = ThreadPoolExecutor(app.state.settings.api_threads,
                                                        thread_name_prefix="paraplan-db")
    return ex


async def in_db(request: Request, fn: Callable, *args, timeout_s: float | None = -1.0):
    """``fn(db, *args)`` in a database thread with a session of its own, closed there when ``fn`` returns
    (build the answer inside ``fn``: plain data, not rows). ``timeout_s`` (default the setting
    ``db_request_timeout_s``; None: no bound) bounds the whole wait; past it, ``DatabaseTimeout``."""
    app = request.app
    bound = app.state.settings.db_request_timeout_s if timeout_s == -1.0 else timeout_s
    sessions = app.state.sessions

    def run():
        with sessions() as db:
            return fn(db, *args)

    ctx = contextvars.copy_context()  # the request id reaches the thread's log lines
    future = asyncio.wrap_future(db_executor(app).submit(ctx.run, run))
    try:
        return await asyncio.wait_for(future, bound)  # on timeout the work is cancelled if not started
    except (TimeoutError, asyncio.TimeoutError):
        raise DatabaseTimeout(f"no answer from the database within {bound:g} s") from None


def db_route(timeout_s: float | None | Callable = -1.0):
    """Make a route ``f(..., db: Session, ...)`` (written as a plain function) an ``async`` route that runs
    ``f`` through ``in_db``: its parameters stay what FastAPI sees, less ``db`` (plus the request).
    ``timeout_s``: as ``in_db``'s, or a function of the settings giving it."""
    def wrap(f):
        sig = inspect.signature(f, eval_str=True)  # resolved in f's module, not this one
        params = [p for name, p in sig.parameters.items() if name != "db"]
        own_request = "request" in sig.parameters
        if not own_request:
            params.append(inspect.Parameter("_request", inspect.Parameter.KEYWORD_ONLY, annotation=Request))

        @functools.wraps(f)
        async def route(**kw):
            request = kw["request"] if own_request else kw.pop("_request")
            bound = timeout_s(request.app.state.settings) if callable(timeout_s) else timeout_s
            return await in_db(request, lambda db: f(db=db, **kw), timeout_s=bound)

        del route.__wrapped__  # FastAPI reads the signature below, not f's
        route.__signature__ = sig.replace(parameters=params)
        return route
    return wrap


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


@lru_cache(maxsize=8)
def _key_digests(keys: tuple[str, ...]) -> tuple[bytes, ...]:
    return tuple(_digest(k) for k in keys)


def key_matches(given: str, keys: list[str]) -> bool:
    """Whether ``given`` is one of ``keys``, in time independent of which key matches or how much of it: the
    SHA-256 digests (all one length, whatever the keys' lengths) are compared with ``compare_digest`` against
    every key, and the results OR-ed without stopping at the first match."""
    given_digest, found = _digest(given), False
    for digest in _key_digests(tuple(keys)):
        found |= hmac.compare_digest(given_digest, digest)
    return found


async def api_scope(credentials: HTTPAuthorizationCredentials | None = Security(bearer),
              settings: Settings = Depends(get_settings)) -> str:
    """The caller's scope (a hash of its key; "" when the server has no keys). 401 without a valid key.
    Jobs and Idempotency-Keys belong to a scope; the request log shows its first 8 characters."""
    keys = settings.api_key_list
    if not keys:
        return ""
    given = credentials.credentials if credentials is not None else ""
    if not key_matches(given, keys):
        raise http_error(401, ["header", "Authorization"],
                         "a valid API key is required (Authorization: Bearer KEY)" if given
                         else "missing API key (Authorization: Bearer KEY)", "unauthorized",
                         headers={"WWW-Authenticate": "Bearer"})
    scope = hashlib.sha256(given.encode()).hexdigest()[:32]
    info = current_request.get()
    if info is not None:
        info.key = scope[:8]
    return scope

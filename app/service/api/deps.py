"""Dependencies of the routes: settings, a DB session per request, and the API key check.

The key check compares the given key with every configured key, always all of them and in constant
time, so that the answer's timing says nothing about how close a guess was or which key matched. Keys
are never logged: the request log shows the first 8 characters of the scope hash at most.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import AsyncIterator
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

"""Dependencies of the routes: settings, a DB session per request, and the API key check."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import AsyncIterator

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from app.core.config import Settings
from app.services.errors import http_error

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


async def api_scope(credentials: HTTPAuthorizationCredentials | None = Security(bearer),
              settings: Settings = Depends(get_settings)) -> str:
    """The caller's scope (a hash of its key; "" when the server has no keys). 401 without a valid key."""
    keys = settings.api_key_list
    if not keys:
        return ""
    given = credentials.credentials if credentials is not None else ""
    if not any(hmac.compare_digest(given.encode(), k.encode()) for k in keys):
        raise http_error(401, ["header", "Authorization"],
                         "a valid API key is required (Authorization: Bearer KEY)" if given
                         else "missing API key (Authorization: Bearer KEY)", "unauthorized",
                         headers={"WWW-Authenticate": "Bearer"})
    return hashlib.sha256(given.encode()).hexdigest()[:32]

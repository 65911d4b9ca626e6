"""`/healthz` (liveness, open), `/readyz` (readiness: the database answers; open) and `/metrics`
(Prometheus text; needs a key when keys are set).

Liveness and readiness are apart: `/healthz` says the process serves requests and touches no
database, so an orchestrator does not restart a healthy server because its database is away; `/readyz`
runs `SELECT 1` on a thread of its own, bounded by ``PARAPLAN_READY_TIMEOUT_S``, and answers 503 "not
ready" when the database fails or does not answer in time (a frozen database holds that one thread, never
the event loop; checks arriving meanwhile share the pending one).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel
from sqlalchemy import text

from app.service.api.deps import api_scope, in_db
from app.service.schemas.common import AUTH_ERRORS
from app.service.services.metrics import CONTENT_TYPE_LATEST
from costmodel.result import PARAPLAN_VERSION

router = APIRouter(tags=["service"])
log = logging.getLogger("paraplan.api")


class Health(BaseModel):
    status: str
    database: str
    worker: str
    version: str


class Ready(BaseModel):
    status: str
    database: str
    version: str


def _worker_state(request: Request) -> str:
    worker = getattr(request.app.state, "worker", None)
    if worker is None:
        return "off"
    thread = getattr(request.app.state, "worker_thread", None)
    if thread is not None and not thread.is_alive() and not worker.stop_event.is_set():
        return "dead"
    return "busy" if worker.current else "idle"


@router.get("/healthz", response_model=Health, summary="Liveness",
            description="The process serves requests. No database access: a database that is away or frozen "
                        "leaves this 200 (`database` is `not checked`; see `/readyz`). 503 only when the "
                        "embedded worker thread has died.",
            responses={503: {"model": Health, "description": "The embedded worker thread has died."}})
async def healthz(request: Request):
    state = _worker_state(request)
    body = {"status": "ok", "database": "not checked (see /readyz)", "worker": state, "version": PARAPLAN_VERSION}
    if state == "dead":
        return JSONResponse(status_code=503, content={**body, "status": "unhealthy"})
    return body


_ready_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="readyz")
_ready_lock = threading.Lock()
_pending: dict[int, Future] = {}


def _check(sessions) -> None:
    with sessions() as db:
        db.execute(text("SELECT 1"))


def _ready_future(app) -> Future:
    """The database check under way for ``app``, or a new one: a frozen database holds one thread at most."""
    with _ready_lock:
        fut = _pending.get(id(app))
        if fut is None or fut.done():
            fut = _pending[id(app)] = _ready_pool.submit(_check, app.state.sessions)
        return fut


@router.get("/readyz", response_model=Ready, summary="Readiness: the database answers",
            description="`SELECT 1` on the service database within `PARAPLAN_READY_TIMEOUT_S` (2 s): 200 "
                        "`ready`, else 503 `not ready` (`database`: `unavailable` or `no answer within 2 s`, "
                        "never the driver's message) and a `Retry-After` header. Open: it reveals only whether "
                        "the database answers and the version. Route traffic by this; restart by `/healthz`.",
            responses={503: {"model": Ready, "description": "The database failed or did not answer in time.",
                             "headers": {"Retry-After": {"description": "Seconds to wait.",
                                                         "schema": {"type": "string"}}}}})
async def readyz(request: Request):
    timeout = request.app.state.settings.ready_timeout_s
    try:
        await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(_ready_future(request.app))), timeout)
    except Exception as exc:  # noqa: BLE001 - any failure (or the timeout) means not ready
        # An open route: the reason is one of two fixed phrases. The driver's text (host, port, user,
        # database name) goes to the server log only.
        timed_out = isinstance(exc, (TimeoutError, asyncio.TimeoutError))
        reason = f"no answer within {timeout:g} s" if timed_out else "unavailable"
        if not timed_out:
            log.warning("readiness check failed: %s: %s", type(exc).__name__,
                        str(exc).splitlines()[0][:300] if str(exc) else "")
        return JSONResponse(status_code=503, headers={"Retry-After": "5"},
                            content={"status": "not ready", "database": reason, "version": PARAPLAN_VERSION})
    return {"status": "ready", "database": "ok", "version": PARAPLAN_VERSION}


@router.get("/metrics", response_class=PlainTextResponse, summary="Prometheus metrics",
            description="Prometheus text format: the caller's `paraplan_jobs{status}` and `paraplan_trials_done` "
                        "(its own jobs only), the service-wide `paraplan_trials_per_second` (read from the "
                        "database now), "
                        "`paraplan_http_requests_total{method,status}` and the latency histogram "
                        "`paraplan_http_request_duration_seconds{method,route}` (`route` is the route's template).",
            responses=AUTH_ERRORS)
async def metrics(request: Request, scope: str = Depends(api_scope)) -> Response:
    # collecting queries the database: in a database thread, bounded as every request's database work
    body = await in_db(request, request.app.state.metrics.exposition, scope)
    return Response(body, media_type=CONTENT_TYPE_LATEST)

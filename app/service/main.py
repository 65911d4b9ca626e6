"""The ParaPlan HTTP service: ``create_app`` builds the FastAPI application.

On start it upgrades the database to the newest schema (Alembic), logs whether API keys are required
and, for ``paraplan serve``, starts an embedded worker thread; on shutdown it stops the worker (a running
job goes back to the queue). Swagger UI is served at ``/docs`` from assets shipped by the
``fastapi-offline`` package (no CDN). Every request gets an id (``X-Request-ID``), one log line and its
place in the Prometheus metrics (``ObserveRequests``).
"""

from __future__ import annotations

import json
import logging
import math
import time
from contextlib import asynccontextmanager
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.datastructures import MutableHeaders
from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.formats.errors import validation_message
from app.service.core.config import Settings, get_settings
from app.service.core.logging import RequestInfo, current_request, request_id_from
from app.service.db.engine import get_sessionmaker, safe_url
from app.service.hostile import SafeJSONResponse, body_problem
from app.service.services.metrics import Metrics
from costmodel.result import PARAPLAN_VERSION

log = logging.getLogger("paraplan.api")
http_log = logging.getLogger("paraplan.http")
SWAGGER_ASSETS = resources.files("fastapi_offline") / "static"
WORKER_JOIN_S = 8.0
DB_RETRY_AFTER_S = 5
# DBAPI errors that are bugs (a constraint or SQL the code got wrong), not the database being away: 500.
DB_BUG_ERRORS = ("IntegrityError", "ProgrammingError", "DataError", "NotSupportedError")

DESCRIPTION = """
Plan the parallel layout of a large-model training run before spending a card-hour.

* **Jobs** — `POST /v1/jobs` submits a search (model, cluster, devices, global batch size, search options)
  and answers `202` with the job; follow it with `GET /v1/jobs/{id}` (status and progress) and read the
  ranked configs with `GET /v1/jobs/{id}/configs`.
* **Evaluate** — `POST /v1/evaluate` scores one config at once.
* **Catalog** — the model presets and cluster profiles that `model` and `cluster` may name.
* **Calibration** — `POST /v1/clusters/{name}/measurements` takes your measured runs, `POST
  /v1/clusters/{name}/versions` refits the profile on them; `"cluster": "<name>@<version>"` uses it.

`model` and `cluster` take a preset name, a full spec, or a preset with overrides (`"base"`). Every
error is a JSON body `{"detail": [{"loc", "msg", "type"}]}` naming the field and the reason.
When the server sets `PARAPLAN_API_KEYS`, the `/v1` routes need `Authorization: Bearer KEY` (use
**Authorize**).
"""

TAGS = [
    {"name": "jobs", "description": "Search jobs: `queued → running → succeeded | failed | cancelled`."},
    {"name": "evaluate", "description": "Score one training config at once."},
    {"name": "catalog", "description": "Shipped model presets and cluster profiles."},
    {"name": "calibration", "description": "Your measured runs of a cluster, and the profile versions refitted on "
                                           "them (`\"cluster\": \"<name>@<version>\"` in jobs and evaluates)."},
    {"name": "service", "description": "Liveness (`/healthz`), readiness (`/readyz`) and metrics."},
]


async def replay_nothing():
    return {"type": "http.request", "body": b"", "more_body": False}


class BodyLimit:
    """413 for a request body over ``max_bytes``: by its Content-Length, or counted as it streams; 422 for
    a JSON body with text no route may keep or echo (``app/service/hostile.py``)."""

    def __init__(self, app, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def _reject(self, send) -> None:
        body = json.dumps({"detail": [{"loc": ["body"], "msg": f"the request body is larger than "
                                                               f"{self.max_bytes} bytes", "type": "body_too_large"}]})
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body.encode()})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            return await self.app(scope, receive, send)
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    too_big = int(value) > self.max_bytes
                except ValueError:
                    too_big = False
                if too_big:
                    return await self._reject(send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await self._reject(send)
            if not message.get("more_body", False):
                break
        body, sent = b"".join(chunks), False
        if body and (problem := body_problem(body)) is not None:  # text no route may keep or echo (hostile.py)
            await SafeJSONResponse(status_code=422, content={"detail": [problem]})(scope, replay_nothing, send)
            return

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


class ObserveRequests:
    """Per HTTP request: an id (the client's ``X-Request-ID`` if it is a sane token, else a new one), echoed
    in the ``X-Request-ID`` response header and set in ``current_request`` so that every log line written
    while serving it carries it; then one log line (method, path, status, duration, request id and the
    caller's scope prefix ``key=...`` or ``key=open``, never the key) and the request's HTTP metrics."""

    def __init__(self, app, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        info = RequestInfo(request_id_from(_header(scope, b"x-request-id")))
        token = current_request.set(info)
        started, status = time.perf_counter(), 500  # 500 unless the app answers: it raised

        async def send_with_id(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message)["X-Request-ID"] = info.request_id
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            self._record(scope, status, time.perf_counter() - started, info)
        # Reset only after a normal answer: when the app raised, the error handler outside this middleware
        # logs the traceback in this request's task, and that line should carry the request id too.
        current_request.reset(token)

    def _record(self, scope, status: int, seconds: float, info: RequestInfo) -> None:
        route = getattr(scope.get("route"), "path", None) or "other"  # the template; set once a route matched
        self.metrics.observe(scope["method"], route, status, seconds)
        ms = round(seconds * 1000, 2)
        http_log.info("%s %s %d %.1fms key=%s", scope["method"], printable(scope["path"]), status, ms, info.key,
                      extra={"method": scope["method"], "path": scope["path"], "status": status,
                             "duration_ms": ms, "key": info.key})


def _header(scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


def printable(path: str) -> str:
    """A path as it may go into a text log line: control characters escaped (a client could send ``%0a``
    to forge a line), quotes included."""
    return json.dumps(path, ensure_ascii=False)[1:-1]


def log_auth_state(settings: Settings) -> None:
    """Say at start whether the API needs a key (how many keys, never which)."""
    n = len(settings.api_key_list)
    if n:
        log.info("authentication is ON: %d API key%s", n, "" if n == 1 else "s")
    else:
        log.warning("authentication is OFF: PARAPLAN_API_KEYS is not set; the API is open to anyone who can "
                    "reach it")


def _optuna_storage_errors() -> tuple[type, ...]:
    """Optuna's wrapper of a database error (deleting a job's study), when Optuna is importable."""
    try:
        import optuna
    except ImportError:  # pragma: no cover - a dependency
        return ()
    return (optuna.exceptions.StorageInternalError,)


def create_app(settings: Settings | None = None, *, run_worker: bool = False, migrate: bool = True) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        log_auth_state(settings)
        if migrate:
            from app.service.db.migrate import upgrade

            rev = upgrade(settings.database_url)
            log.info("database %s at revision %s", safe_url(settings.database_url), rev)
        worker_thread = None
        if run_worker:
            from app.service.worker import Worker, start_thread

            worker = Worker(settings)
            app.state.worker = worker
            app.state.wake = worker.wake.set
            worker_thread = app.state.worker_thread = start_thread(worker)
        # The threads that run blocking work: as many as the pool has connections for (more threads than
        # connections would make requests wait for the pool, and time out).
        import anyio.to_thread

        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.api_threads
        yield
        if worker_thread is not None:
            app.state.worker.stop()
            worker_thread.join(WORKER_JOIN_S)
        executor = getattr(app.state, "db_executor", None)
        if executor is not None:  # work not started is dropped; a thread on a frozen database is not waited for
            executor.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="ParaPlan", version=PARAPLAN_VERSION, description=DESCRIPTION, openapi_tags=TAGS,
                  docs_url=None, redoc_url=None, lifespan=lifespan,
                  default_response_class=SafeJSONResponse)
    app.state.settings = settings
    app.state.sessions = get_sessionmaker(settings.database_url)
    app.state.worker = None
    app.state.worker_thread = None
    app.state.wake = None
    app.state.metrics = Metrics(app.state.sessions)

    from app.service.api.routes import catalog, evaluate, health, jobs, launch, launch_import, profiles

    for module in (jobs, launch, launch_import, evaluate, catalog, profiles, health):
        app.include_router(module.router)

    app.mount("/static/swagger", StaticFiles(directory=str(SWAGGER_ASSETS)), name="swagger-assets")

    @app.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=app.openapi_url, title="ParaPlan API",
                                   swagger_js_url="/static/swagger/swagger-ui-bundle.js",
                                   swagger_css_url="/static/swagger/swagger-ui.css",
                                   swagger_favicon_url="/static/swagger/favicon.png",
                                   swagger_ui_parameters={"displayRequestDuration": True,
                                                          "defaultModelsExpandDepth": 0})

    @app.exception_handler(RequestValidationError)
    async def invalid_input(request: Request, exc: RequestValidationError) -> JSONResponse:
        # The offending input is echoed back; bytes that are not UTF-8 and NaN/Infinity (which Python's JSON
        # parser accepts) must not turn the 422 into a 500 while it is encoded.
        errors = [{**e, "msg": validation_message(e)} for e in exc.errors()]  # NaN: "a finite number"
        detail = jsonable_encoder(errors, custom_encoder={
            bytes: lambda b: b.decode("utf-8", "replace"), float: lambda f: f if math.isfinite(f) else str(f)})
        return SafeJSONResponse(status_code=422, content={"detail": detail})

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 400 and exc.detail == "There was an error parsing the body":  # not UTF-8 text
            return SafeJSONResponse(status_code=422, content={"detail": [{
                "loc": ["body"], "msg": "the body is not JSON (not UTF-8 text)", "type": "json_invalid"}]})
        if exc.status_code in (204, 304):
            return await http_exception_handler(request, exc)
        return SafeJSONResponse(status_code=exc.status_code, content={"detail": exc.detail},
                                headers=getattr(exc, "headers", None))

    async def database_error(request: Request, exc: Exception) -> JSONResponse:
        """The database is away, frozen, full or out of connections: 503 with Retry-After and a JSON body,
        on a keep-alive connection (a handler for these classes answers without re-raising, unlike the
        catch-all below, after which uvicorn closes the connection)."""
        info = current_request.get()
        headers = {"X-Request-ID": info.request_id} if info is not None else {}
        first = str(getattr(exc, "orig", None) or exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        if type(exc).__name__ in DB_BUG_ERRORS:
            log.error("database error on %s %s", request.method, printable(request.url.path), exc_info=exc)
            return JSONResponse(status_code=500, headers=headers, content={"detail": [{
                "loc": [], "msg": "internal error; see the server log", "type": "internal"}]})
        log.warning("database unavailable on %s %s: %s: %s", request.method, printable(request.url.path),
                    type(exc).__name__, first)
        return JSONResponse(status_code=503, headers={**headers, "Retry-After": str(DB_RETRY_AFTER_S)},
                            content={"detail": [{"loc": [], "msg": "the database is unavailable "
                                                 f"({type(exc).__name__}); retry in {DB_RETRY_AFTER_S} s",
                                                 "type": "database_unavailable"}]})

    from app.service.api.deps import DatabaseTimeout
    from app.service.services.jobs import StudyNotDeleted

    for cls in (DBAPIError, PoolTimeout, DisconnectionError, StudyNotDeleted, DatabaseTimeout,
                *_optuna_storage_errors()):
        app.add_exception_handler(cls, database_error)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, printable(request.url.path))
        info = current_request.get()  # still set: see ObserveRequests
        return JSONResponse(status_code=500, content={"detail": [{"loc": [], "msg": "internal error; see the server "
                                                                                     "log", "type": "internal"}]},
                            headers={"X-Request-ID": info.request_id} if info is not None else None)

    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(ObserveRequests, metrics=app.state.metrics)  # added last: outermost, times all
    return app

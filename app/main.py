"""The ParaPlan HTTP service: ``create_app`` builds the FastAPI application.

On start it upgrades the database to the newest schema (Alembic) and, for ``paraplan serve``, starts
an embedded worker thread; on shutdown it stops the worker (a running job goes back to the queue).
Swagger UI is served at ``/docs`` from assets shipped by the ``fastapi-offline`` package (no CDN).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from contextlib import asynccontextmanager
from importlib import resources

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from app.core.config import Settings, get_settings
from app.db.engine import get_sessionmaker
from costmodel.result import PARAPLAN_VERSION

log = logging.getLogger("paraplan.api")
SWAGGER_ASSETS = resources.files("fastapi_offline") / "static"
WORKER_JOIN_S = 8.0

DESCRIPTION = """
Plan the parallel layout of a large-model training run before spending a card-hour.

* **Jobs** — `POST /v1/jobs` submits a search (model, cluster, devices, global batch size, search options)
  and answers `202` with the job; follow it with `GET /v1/jobs/{id}` (status and progress) and read the
  ranked configs with `GET /v1/jobs/{id}/configs`.
* **Evaluate** — `POST /v1/evaluate` scores one config at once.
* **Catalog** — the model presets and cluster profiles that `model` and `cluster` may name.

`model` and `cluster` take a preset name, a full spec, or a preset with overrides (`"base"`). Every
error is a JSON body `{"detail": [{"loc", "msg", "type"}]}` naming the field and the reason.
When the server sets `PARAPLAN_API_KEYS`, the `/v1` routes need `Authorization: Bearer KEY` (use
**Authorize**).
"""

TAGS = [
    {"name": "jobs", "description": "Search jobs: `queued → running → succeeded | failed | cancelled`."},
    {"name": "evaluate", "description": "Score one training config at once."},
    {"name": "catalog", "description": "Shipped model presets and cluster profiles."},
    {"name": "service", "description": "Health and metrics."},
]


class BodyLimit:
    """413 for a request body over ``max_bytes``: by its Content-Length, or counted as it streams."""

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

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


class CountRequests:
    def __init__(self, app, counts: Counter):
        self.app = app
        self.counts = counts

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def counting_send(message):
            if message["type"] == "http.response.start":
                self.counts[(scope["method"], message["status"])] += 1
            await send(message)

        return await self.app(scope, receive, counting_send)


def create_app(settings: Settings | None = None, *, run_worker: bool = False, migrate: bool = True) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if migrate:
            from app.db.migrate import upgrade

            rev = upgrade(settings.database_url)
            log.info("database %s at revision %s", settings.database_url, rev)
        worker_thread = None
        if run_worker:
            from app.worker import Worker, start_thread

            worker = Worker(settings)
            app.state.worker = worker
            app.state.wake = worker.wake.set
            worker_thread = start_thread(worker)
        yield
        if worker_thread is not None:
            app.state.worker.stop()
            worker_thread.join(WORKER_JOIN_S)

    app = FastAPI(title="ParaPlan", version=PARAPLAN_VERSION, description=DESCRIPTION, openapi_tags=TAGS,
                  docs_url=None, redoc_url=None, lifespan=lifespan)
    app.state.settings = settings
    app.state.sessions = get_sessionmaker(settings.database_url)
    app.state.worker = None
    app.state.wake = None
    app.state.request_counts = Counter()

    from app.api.routes import catalog, evaluate, health, jobs, launch

    for module in (jobs, launch, evaluate, catalog, health):
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

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse(status_code=500, content={"detail": [{"loc": [], "msg": "internal error; see the server "
                                                                                     "log", "type": "internal"}]})

    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(CountRequests, counts=app.state.request_counts)
    return app

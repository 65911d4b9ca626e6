"""`/healthz` (open) and `/metrics` (Prometheus text; needs a key when keys are set)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel
from sqlalchemy import text
from sqlalchemy.orm import Session

from app.service.api.deps import api_scope, get_db
from app.service.schemas.common import AUTH_ERRORS
from app.service.services.metrics import CONTENT_TYPE_LATEST
from costmodel.result import PARAPLAN_VERSION

router = APIRouter(tags=["service"])


class Health(BaseModel):
    status: str
    database: str
    worker: str
    version: str


@router.get("/healthz", response_model=Health, summary="Liveness and database check",
            responses={503: {"model": Health, "description": "The database cannot be reached."}})
async def healthz(request: Request, db: Session = Depends(get_db)):
    worker = getattr(request.app.state, "worker", None)
    state = "off" if worker is None else ("busy" if worker.current else "idle")
    try:
        db.execute(text("SELECT 1"))
    except Exception as exc:  # noqa: BLE001
        return JSONResponse(status_code=503, content={"status": "unhealthy", "database": str(exc).splitlines()[0],
                                                      "worker": state, "version": PARAPLAN_VERSION})
    return {"status": "ok", "database": "ok", "worker": state, "version": PARAPLAN_VERSION}


@router.get("/metrics", response_class=PlainTextResponse, summary="Prometheus metrics",
            description="Prometheus text format: `paraplan_jobs{status}`, `paraplan_trials_done`, "
                        "`paraplan_trials_per_second` (read from the database now), "
                        "`paraplan_http_requests_total{method,status}` and the latency histogram "
                        "`paraplan_http_request_duration_seconds{method,route}` (`route` is the route's template).",
            dependencies=[Depends(api_scope)], responses=AUTH_ERRORS)
def metrics(request: Request) -> Response:
    # a plain ``def``: collecting queries the database, so it runs in the thread pool
    return Response(request.app.state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

"""`/healthz` (open) and `/metrics` (Prometheus text; needs a key when keys are set)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from app.api.deps import api_scope, get_db
from app.db.models import STATUSES, Job
from app.schemas.common import AUTH_ERRORS
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
            dependencies=[Depends(api_scope)], responses=AUTH_ERRORS)
def metrics(request: Request, db: Session = Depends(get_db)) -> str:
    counts = dict(db.execute(select(Job.status, func.count()).group_by(Job.status)).all())
    lines = ["# HELP paraplan_jobs Jobs in the database by status.", "# TYPE paraplan_jobs gauge"]
    lines += [f'paraplan_jobs{{status="{s}"}} {counts.get(s, 0)}' for s in STATUSES]
    lines += ["# HELP paraplan_http_requests_total HTTP requests answered, by method and status.",
              "# TYPE paraplan_http_requests_total counter"]
    for (method, status), n in sorted(request.app.state.request_counts.items()):
        lines.append(f'paraplan_http_requests_total{{method="{method}",status="{status}"}} {n}')
    return "\n".join(lines) + "\n"

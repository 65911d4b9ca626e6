"""`/v1/jobs`: submit a search, follow it, read its ranked configs, cancel or delete it.

Every route's database work runs in the database threads with a session closed there before the answer
is sent (``db_route``, ``in_db`` in ``app/service/api/deps.py``): none does blocking database I/O on the
event loop or holds a connection beyond its queries, and each answers 503 with Retry-After when its
database work does not finish within ``PARAPLAN_DB_REQUEST_TIMEOUT_S`` (DELETE: that plus the lease it may
wait out), so a frozen or unreachable database never holds a request, while `/healthz`, `/readyz` and
`/v1/evaluate` keep answering. ``submit`` takes its Idempotency-Key slot on the event loop first.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Body, Depends, Header, Path, Query, Request, Response
from fastapi.responses import HTMLResponse
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from app.service.api.deps import api_scope, db_route, get_settings, in_db
from app.service.core.config import Settings
from app.service.schemas.common import (AUTH_ERRORS, BODY_ERRORS, MAX_OFFSET, MAX_PAGE_SIZE, NOT_FOUND, QUERY_ERRORS,
                                TOO_LARGE, error_doc, header_doc, text_route)
from app.service.schemas.jobs import ConfigPage, JobCreate, JobOut, JobPage, LayoutPage, Status
from app.service.services import jobs as service

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], dependencies=[Depends(api_scope)], responses=AUTH_ERRORS)

JobId = Annotated[str, Path(description="The job's UUID.", examples=["0b5c8c52-3c2e-4a53-9f43-3f3f7f2a8f10"])]

EXAMPLES = {
    "preset": {"summary": "Presets: Pangu Ultra MoE on 6,144 Ascend 910B (TPE, 200 trials)",
               "value": {"model": "pangu-ultra-moe-718b", "cluster": "ascend-910b", "devices": 6144,
                         "global_batch_size": 7680, "search": {"sampler": "tpe", "n_trials": 200, "seed": 7}}},
    "overrides": {"summary": "A preset with overrides (\"base\"), pinned recompute",
                  "value": {"model": {"base": "deepseek-v3-671b", "seq_length": 8192},
                            "cluster": "nvidia-h100-80gb", "devices": 2048, "global_batch_size": 15360,
                            "search": {"sampler": "tpe", "n_trials": 300, "seed": 1,
                                       "fixed": {"recompute": "selective"}}}},
    "spec": {"summary": "A full model spec, exhaustive search",
             "value": {"model": {"name": "my-moe", "num_layers": 6, "hidden_size": 256, "num_attention_heads": 8,
                                 "ffn_hidden_size": 1024, "vocab_size": 1024, "seq_length": 512,
                                 "num_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 256},
                       "cluster": "nvidia-h100-80gb", "devices": 8, "global_batch_size": 64,
                       "search": {"sampler": "exhaustive", "top_k": 5}}},
}


# Every route below takes the caller's scope (``api_scope``, resolved once per request with the router's
# check) and passes it to the service, which only ever shows a key its own jobs.


def _out(db: Session, job) -> dict:
    return service.to_out(job, service.best_of(db, [job]).get(job.id))


@router.post("", status_code=202, response_model=JobOut, summary="Submit a search job",
             description="Checks the inputs (422 naming the field on any problem), stores the job with its exact "
                         "inputs and returns it `queued`, with a `Location` header. The same `Idempotency-Key` "
                         "with the same body returns the same job; with another body it is a 409.",
             responses={202: {"description": "The job, `queued` (or the job this Idempotency-Key made).",
                              "headers": {"Location": header_doc("The job's URL.", "/v1/jobs/0b5c8c52-3c2e-4a53-"
                                                                                   "9f43-3f3f7f2a8f10"),
                                          "Idempotent-Replayed": header_doc("`true` when this Idempotency-Key "
                                                                            "and body made the job before.",
                                                                            "true", required=False)}},
                        **BODY_ERRORS,
                        409: error_doc("Idempotency-Key reused with another body (`idempotency_conflict`), or "
                                       "its first request is still being created (`idempotency_in_progress`, "
                                       "with `Retry-After`: retry to get the job).",
                                       ["header", "Idempotency-Key"],
                                       "this Idempotency-Key was used with another body", "idempotency_conflict"),
                        429: error_doc("Too many queued jobs (PARAPLAN_MAX_QUEUED_JOBS).", ["body"],
                                       "1000 jobs are already queued; retry later", "too_many_jobs",
                                       headers={"Retry-After": header_doc("Seconds to wait.", "30")})})
async def submit(request: Request, response: Response,
                 body: Annotated[JobCreate, Body(openapi_examples=EXAMPLES)],
                 idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", max_length=200,
                                                               description="Makes retries safe: same key and "
                                                                           "body, same job.")] = None,
                 scope: str = Depends(api_scope), settings: Settings = Depends(get_settings)) -> dict:
    # The Idempotency-Key slot is taken on the event loop (no database): a duplicate of a request still being
    # created is a 409 at once. Then the database checks and the insert run as bounded database work, and
    # the inputs are resolved between them in the thread pool: that is CPU work (the search space is built),
    # which the database bound must not cut short and which holds no connection.
    with service.idempotency_slot(scope, idempotency_key):
        replay, profile = await in_db(request, _admit, body, settings, scope, idempotency_key)
        if replay is None:
            fields = await run_in_threadpool(service.prepare, body, settings, profile)
            replay = await in_db(request, _store, body, fields, scope, idempotency_key)
        job_id, replayed, out = replay
    response.headers["Location"] = f"/v1/jobs/{job_id}"
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    else:
        wake = getattr(request.app.state, "wake", None)
        if wake is not None:
            wake()
    return out


def _admit(db: Session, body: JobCreate, settings: Settings, scope: str, idempotency_key: str | None):
    """(the replayed job's answer, None) for a replayed Idempotency-Key, else (None, the profile version the
    body names or None)."""
    existing, profile = service.admit(db, body, settings, scope, idempotency_key)
    if existing is not None:
        return (existing.id, True, _out(db, existing)), None
    return None, profile


def _store(db: Session, body: JobCreate, fields: dict, scope: str, idempotency_key: str | None):
    job, replayed = service.store(db, body, fields, scope, idempotency_key)
    return job.id, replayed, _out(db, job)


@router.get("", response_model=JobPage, summary="List jobs", description="Newest first.",
            responses=QUERY_ERRORS)
@db_route()
def list_jobs(status: Annotated[Status | None, Query(description="Only jobs in this status.")] = None,
              limit: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)] = 50,
              offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
              scope: str = Depends(api_scope), db: Session = None) -> dict:
    rows, total = service.list_jobs(db, status, limit, offset, owner=scope)
    best = service.best_of(db, rows)
    return {"items": [service.to_out(j, best.get(j.id)) for j in rows], "total": total, "limit": limit,
            "offset": offset}


@router.get("/{job_id}", response_model=JobOut, summary="One job: status, progress, best config, inputs",
            responses=NOT_FOUND)
@db_route()
def get_job(job_id: JobId, scope: str = Depends(api_scope), db: Session = None) -> dict:
    return _out(db, service.get(db, job_id, owner=scope))


@router.get("/{job_id}/configs", response_model=ConfigPage, summary="The job's ranked configs",
            description="Rank 1 first (or sorted by `sort`), each with its full evaluation. Empty until the job "
                        "has succeeded.", responses={**NOT_FOUND, **QUERY_ERRORS})
@db_route()
def get_configs(job_id: JobId,
                limit: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)] = 50,
                offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
                sort: Annotated[Literal["rank", "tokens_per_s", "mfu", "peak_gib"],
                                Query(description="`rank` (default), or best first by tokens/s, MFU, or the "
                                                  "smallest peak memory.")] = "rank",
                min_mfu: Annotated[float | None, Query(ge=0, le=1, description="Only configs with at least "
                                                                               "this MFU.")] = None,
                max_peak_gib: Annotated[float | None, Query(gt=0, le=1_048_576, description="Only configs whose "
                                                                                         "peak memory (GiB) is "
                                                                                         "at most this.")] = None,
                scope: str = Depends(api_scope), db: Session = None) -> dict:
    service.exists(db, job_id, owner=scope)
    items, total = service.configs(db, job_id, limit, offset, sort, min_mfu, max_peak_gib,
                                   service.margin_of(db, job_id))
    return {"items": items, "total": total, "limit": limit, "offset": offset}


@router.get("/{job_id}/layouts", response_model=LayoutPage, summary="The job's top distinct parallel layouts",
            description="The best config of each of the job's top `top_k` distinct layouts (tp, pp, cp, ep, etp), "
                        "best first, with its rank among all ranked configs (`best_rank`, which may lie beyond "
                        "`top_k`), its full evaluation, how many variants of the layout fit (`variants`) and whether "
                        "it keeps the memory margin. Empty until the job has succeeded, and for jobs from before "
                        "layouts were recorded.", responses={**NOT_FOUND, **QUERY_ERRORS})
@db_route()
def get_layouts(job_id: JobId,
                      limit: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)] = 50,
                      offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
                      scope: str = Depends(api_scope), db: Session = None) -> dict:
    service.exists(db, job_id, owner=scope)
    items, total = service.layouts(db, job_id, limit, offset)
    return {"items": items, "total": total, "limit": limit, "offset": offset}


@router.post("/{job_id}/cancel", response_model=JobOut, summary="Cancel a job",
             description="A queued or running job becomes `cancelled` at once (a running search stops within "
                         "about a second); a finished job is returned unchanged.",
             responses={**NOT_FOUND, **TOO_LARGE})
@db_route()
def cancel_job(job_id: JobId, scope: str = Depends(api_scope), db: Session = None) -> dict:
    return _out(db, service.cancel(db, service.get(db, job_id, owner=scope)))


@router.delete("/{job_id}", status_code=204, response_class=Response, summary="Delete a job",
               description="Cancels it if it runs and waits until its workers have stopped (at most the lease, "
                           "`PARAPLAN_LEASE_S`), then deletes its Optuna study (checked gone), its ranked configs "
                           "and it. 503 with `Retry-After` when the database fails meanwhile (the job stays "
                           "`cancelled`; retry the DELETE).",
               responses=NOT_FOUND)
@db_route(lambda s: s.db_request_timeout_s + s.lease_s)
def delete_job(job_id: JobId, scope: str = Depends(api_scope), db: Session = None,
               settings: Settings = Depends(get_settings)) -> Response:
    service.remove(db, service.get(db, job_id, owner=scope), settings.database_url,
                   stop_within_s=settings.lease_s)
    return Response(status_code=204)


@router.get("/{job_id}/report", response_class=HTMLResponse, summary="The job's HTML report",
            description="One self-contained HTML page (Plotly inlined, no network needed): the inputs, the top configs' "
                        "time breakdown and per-stage memory against capacity, throughput against peak memory with "
                        "the Pareto front, the optimisation history (sampler jobs: read from the job's Optuna study) "
                        "and a table of the top configs; as `paraplan report`. A `plan` job's page shows its plan, an "
                        "`rl` job's its two plans' step timelines and per-phase peak memory. 409 until the job has "
                        "succeeded.",
            responses={200: {"content": {"text/html": {}}, "description": "The report."},
                       **text_route({**AUTH_ERRORS, **NOT_FOUND,
                                     409: error_doc("The job has not succeeded (queued, running, failed or "
                                                    "cancelled).", ["path", "job_id"], "job 0b5c8c52-... is running: "
                                                    "a report needs a succeeded job", "job_not_succeeded")})})
@db_route()
def get_report(job_id: JobId, scope: str = Depends(api_scope), db: Session = None,
               settings: Settings = Depends(get_settings)) -> Response:
    from app.formats.report import render_report
    from app.service.services.report import job_result

    job = service.get(db, job_id, owner=scope)
    kind = (job.search or {}).get("kind")
    if kind in ("plan", "rl"):  # the plan's page (app/formats/plan_report.py), the RL plan's (rl_report.py)
        from app.formats.plan_report import render_plan_report
        from app.formats.rl_report import render_rl_report
        from app.service.services.report import not_finished

        if job.status != "succeeded":
            raise not_finished(job)
        render = render_plan_report if kind == "plan" else render_rl_report
        return HTMLResponse(render(job.summary[kind]))
    return HTMLResponse(render_report(job_result(db, job, settings.database_url)))

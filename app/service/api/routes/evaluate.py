"""`POST /v1/evaluate`: one config scored at once."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from fastapi import APIRouter, Depends, HTTPException, Request
from starlette.concurrency import run_in_threadpool


from app.service.api.deps import api_scope, get_settings, in_db
from app.service.core.config import Settings
from app.service.schemas.common import AUTH_ERRORS, BODY_ERRORS, error_doc, header_doc
from app.service.schemas.evaluate import EvaluateRequest
from app.service.schemas.evaluation import Evaluation
from app.service.services.errors import field_loc, http_error, invalid
from app.service.services.inputs import (check_config_for, check_stages, resolve_cluster, resolve_config,
                                         resolve_model)
from app.service.services.profiles import resolve_cluster_for
from app.formats.errors import InputError
from app.formats.results import check_finite
from app.formats.results import evaluate as evaluate_config

router = APIRouter(prefix="/v1", tags=["evaluate"], dependencies=[Depends(api_scope)], responses=AUTH_ERRORS)
log = logging.getLogger("paraplan.api")
INLINE_STAGES = 256
HEAVY_RETRY_AFTER_S = 5


def _gate(app, turns: int) -> asyncio.Semaphore:
    """The app's semaphore of heavy turns, one per event loop (a test client may run several loops)."""
    loop = asyncio.get_running_loop()
    held = getattr(app.state, "heavy_gate", None)
    if held is None or held[0] is not loop:
        held = app.state.heavy_gate = (loop, asyncio.Semaphore(turns))
    return held[1]


@contextlib.asynccontextmanager
async def heavy_turn(app, settings: Settings, loc: tuple = ("body", "config"),
                     what: str = f"evaluates of more than {INLINE_STAGES} virtual stages"):
    """Wait for one of the ``max_heavy_evaluates`` turns (no thread is held while waiting); a 503 with
    Retry-After, naming ``loc``, when none came within ``heavy_wait_s``. The turns are shared by every
    heavy request (deep-pipeline evaluates, profile refits): together they bound the API's CPU and memory."""
    gate = _gate(app, settings.max_heavy_evaluates)
    try:
        await asyncio.wait_for(gate.acquire(), settings.heavy_wait_s)
    except TimeoutError:
        raise http_error(503, list(loc), f"{settings.max_heavy_evaluates} {what} are running and none ended "
                                         f"within {settings.heavy_wait_s:g} s; retry later", "busy",
                         headers={"Retry-After": str(HEAVY_RETRY_AFTER_S)}) from None
    try:
        yield
    finally:
        gate.release()


@router.post("/evaluate", response_model=Evaluation, summary="Evaluate one training config",
             description="Step time, throughput, MFU/HFU, the time and memory breakdown. A config that is invalid "
                         "or does not fit is a result (`feasible: false` with the reasons), not an error.",
             responses={**BODY_ERRORS, 503: error_doc(
                 "A deep pipeline's evaluate found no free turn in time (`Retry-After` says when to retry).",
                 ["body", "config"], "2 evaluates of more than 256 virtual stages are running and none ended "
                                     "within 30 s; retry later", "busy",
                 headers={"Retry-After": header_doc("Seconds to wait before retrying.", "5")})})
async def evaluate(body: EvaluateRequest, request: Request, settings: Settings = Depends(get_settings),
                   scope: str = Depends(api_scope)) -> dict:
    if body.devices > settings.max_devices:
        raise invalid(["body", "devices"], f"at most {settings.max_devices:,} devices", "less_than_equal")
    spec = resolve_model(body.model, body.seq_length)
    # A profile version ("name@n") is read from the database, in the thread pool (no database I/O on the loop).
    profile = await in_db(request, resolve_cluster_for, scope, body.cluster) \
        if isinstance(body.cluster, str) and "@" in body.cluster else resolve_cluster(body.cluster)
    check_stages(spec, body.config.get("pp"), body.config.get("vpp"), ["body", "config"])
    cfg = resolve_config(body.config)
    check_config_for(spec, cfg)
    # One config takes a few milliseconds: scored on the event loop, which is faster under load than a
    # thread hop. A deep pipeline (many virtual stages) costs up to seconds and goes to the thread pool,
    # a few at a time (40 of them at once took 21 GB).
    stages = cfg.pp * cfg.vpp
    try:
        if stages <= INLINE_STAGES:
            result = evaluate_config(spec, profile, body.devices, cfg)
        else:
            async with heavy_turn(request.app, settings):
                result = await run_in_threadpool(evaluate_config, spec, profile, body.devices, cfg)
    except HTTPException:
        raise
    except Exception as exc:  # noqa: BLE001 - input the cost model cannot score is still the caller's input
        log.exception("evaluate failed")
        raise invalid(["body", "config"], f"cannot be evaluated ({type(exc).__name__}: {exc})") from None
    # A degenerate profile (a peak of 1e-308) gives null times on a "feasible" config: a 422 naming the fact
    # to blame, not a 200 with nulls.
    try:
        return check_finite(result, profile)
    except InputError as exc:
        raise invalid(field_loc(exc.field), exc.reason) from None

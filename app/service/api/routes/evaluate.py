"""`POST /v1/evaluate`: one config scored at once."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Depends
from starlette.concurrency import run_in_threadpool

from app.service.api.deps import api_scope, get_settings
from app.service.core.config import Settings
from app.service.schemas.common import AUTH_ERRORS, BODY_ERRORS
from app.service.schemas.evaluate import EvaluateRequest
from app.service.schemas.evaluation import Evaluation
from app.service.services.errors import field_loc, invalid
from app.service.services.inputs import (check_config_for, check_stages, resolve_cluster, resolve_config,
                                         resolve_model)
from app.formats.errors import InputError
from app.formats.results import check_finite
from app.formats.results import evaluate as evaluate_config

router = APIRouter(prefix="/v1", tags=["evaluate"], dependencies=[Depends(api_scope)], responses=AUTH_ERRORS)
log = logging.getLogger("paraplan.api")
INLINE_STAGES = 256


@router.post("/evaluate", response_model=Evaluation, summary="Evaluate one training config",
             description="Step time, throughput, MFU/HFU, the time and memory breakdown. A config that is invalid "
                         "or does not fit is a result (`feasible: false` with the reasons), not an error.",
             responses=BODY_ERRORS)
async def evaluate(body: EvaluateRequest, settings: Settings = Depends(get_settings)) -> dict:
    if body.devices > settings.max_devices:
        raise invalid(["body", "devices"], f"at most {settings.max_devices:,} devices", "less_than_equal")
    spec = resolve_model(body.model, body.seq_length)
    profile = resolve_cluster(body.cluster)
    check_stages(spec, body.config.get("pp"), body.config.get("vpp"), ["body", "config"])
    cfg = resolve_config(body.config)
    check_config_for(spec, cfg)
    # One config takes a few milliseconds: scored on the event loop, which is faster under load than a
    # thread hop. A deep pipeline (many virtual stages) costs more and goes to the thread pool.
    stages = cfg.pp * cfg.vpp
    try:
        if stages <= INLINE_STAGES:
            result = evaluate_config(spec, profile, body.devices, cfg)
        else:
            result = await run_in_threadpool(evaluate_config, spec, profile, body.devices, cfg)
    except Exception as exc:  # noqa: BLE001 - input the cost model cannot score is still the caller's input
        log.exception("evaluate failed")
        raise invalid(["body", "config"], f"cannot be evaluated ({type(exc).__name__}: {exc})") from None
    # A degenerate profile (a peak of 1e-308) gives null times on a "feasible" config: a 422 naming the fact
    # to blame (issue 19), not a 200 with nulls.
    try:
        return check_finite(result, profile)
    except InputError as exc:
        raise invalid(field_loc(exc.field), exc.reason) from None

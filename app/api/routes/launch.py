"""`GET /v1/jobs/{id}/configs/{rank}/launch`: a ranked config as training-script arguments (as `paraplan export`)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Query
from fastapi.responses import PlainTextResponse
from sqlalchemy.orm import Session

from app.api.deps import api_scope, get_db
from app.launch import format_args, launch_args
from app.schemas.common import AUTH_ERRORS, error_doc, text_route
from app.schemas.jobs import MAX_TOP_K
from app.services import jobs as service
from costmodel import ModelSpec

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], dependencies=[Depends(api_scope)], responses=AUTH_ERRORS)

LAUNCH_ERRORS = text_route({
    **AUTH_ERRORS,
    404: error_doc("No job with this id, or no config of this rank (yet).", ["path", "rank"],
                   "job 'd9b2d63d-a233-4123-847a-000000000000' has no config of rank 7", "not_found"),
    422: error_doc("Bad query or path parameter.", ["query", "format"],
                   "Input should be 'megatron' or 'mindspeed'", "literal_error"),
})  # errors are JSON; the 200 is text/plain


@router.get("/{job_id}/configs/{rank}/launch", response_class=PlainTextResponse,
            summary="A ranked config as Megatron-LM / MindSpeed-LLM arguments",
            description="The training script's arguments for config `rank` of the job (as `paraplan export`): "
                        "every parallel-size and batch flag, defaults included, then the model's flags; one flag "
                        "per line, lines joined with ` \\`. 404 for an unknown job or rank.",
            responses={200: {"content": {"text/plain": {"example": "--tensor-model-parallel-size 8 \\\n"
                                                                   "--pipeline-model-parallel-size 16 \\\n..."}}},
                       **LAUNCH_ERRORS})
def launch(job_id: Annotated[str, Path(description="The job's UUID.")],
           rank: Annotated[int, Path(ge=1, le=MAX_TOP_K, description="The config's rank (1 = best).")],
           format: Annotated[Literal["megatron", "mindspeed"],  # noqa: A002 - the query parameter's name
                             Query(description="Training framework.")] = "megatron",
           scope: str = Depends(api_scope), db: Session = Depends(get_db)) -> PlainTextResponse:
    job = service.get(db, job_id, owner=scope)  # another key's job is a 404 like an unknown one
    row = service.ranked_config(db, job, rank)
    spec = ModelSpec.model_validate(job.model_spec)
    return PlainTextResponse(format_args(launch_args(row.config, spec, format)))

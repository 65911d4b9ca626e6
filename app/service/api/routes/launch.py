"""`GET /v1/jobs/{id}/configs/{rank}/launch`: a ranked config as training-script arguments (as `paraplan export`)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Query
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse
from sqlalchemy.orm import Session

from app.service.api.deps import api_scope, db_route
from app.formats.launch import ENV_HEADER, InexpressibleError, format_args, launch_args, launch_env
from app.service.schemas.common import AUTH_ERRORS, error_doc, text_route
from app.service.schemas.jobs import MAX_TOP_K
from app.service.services import jobs as service
from costmodel import ModelSpec
from search.frameworks import LABELS

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], dependencies=[Depends(api_scope)], responses=AUTH_ERRORS)

LAUNCH_ERRORS = text_route({
    **AUTH_ERRORS,
    404: error_doc("No job with this id, or no config of this rank (yet).", ["path", "rank"],
                   "job 'd9b2d63d-a233-4123-847a-000000000000' has no config of rank 7", "not_found"),
    422: error_doc("Bad query or path parameter, or the config uses an option the format cannot express "
                   "(type `inexpressible_option`, one item per option, the message naming it).", ["query", "format"],
                   "MindSpeed-LLM cannot express recompute_modules=[layernorm,shared_experts]: MindSpeed-LLM has "
                   "no shared-expert recompute", "inexpressible_option"),
})  # errors are JSON; the 200 is text/plain


@router.get("/{job_id}/configs/{rank}/launch", response_class=PlainTextResponse,
            summary="A ranked config as Megatron-LM / MindSpeed-LLM arguments",
            description="The training script's arguments for config `rank` of the job (as `paraplan export`): "
                        "every parallel-size and batch flag, defaults included, then the model's flags; one flag "
                        "per line, lines joined with ` \\`. 404 for an unknown job or rank; 422 naming the option "
                        "when the config uses one the format cannot express (docs/search.md, \"Frameworks\"). Environment "
                        "variables the flags need (e.g. NVTE_CPU_OFFLOAD_V1=1 with activation offload) come in the "
                        "`X-Launch-Env` header as space-separated KEY=VALUE.",
            responses={200: {"content": {"text/plain": {"example": "--tensor-model-parallel-size 8 \\\n"
                                                                   "--pipeline-model-parallel-size 16 \\\n..."}}},
                       **LAUNCH_ERRORS})
@db_route()
def launch(job_id: Annotated[str, Path(description="The job's UUID.")],
           rank: Annotated[int, Path(ge=1, le=MAX_TOP_K, description="The config's rank (1 = best).")],
           format: Annotated[Literal["megatron", "mindspeed"],  # noqa: A002 - the query parameter's name
                             Query(description="Training framework.")] = "megatron",
           scope: str = Depends(api_scope), db: Session = None) -> PlainTextResponse:
    job = service.get(db, job_id, owner=scope)  # another key's job is a 404 like an unknown one
    row = service.ranked_config(db, job, rank)
    spec = ModelSpec.model_validate(job.model_spec)
    domain = (job.cluster_profile or {}).get("facts", {}).get("scale_up_domain", {}).get("value")
    try:
        tokens = launch_args(row.config, spec, format, int(domain) if domain else None)
    except InexpressibleError as exc:
        raise RequestValidationError([{"loc": ("query", "format"), "msg": f"{LABELS[format]} cannot express {r}",
                                       "type": "inexpressible_option", "option": r.field}
                                      for r in exc.refusals]) from None
    env = launch_env(tokens)
    headers = {ENV_HEADER: " ".join(f"{k}={v}" for k, v in env.items())} if env else None
    return PlainTextResponse(format_args(tokens), headers=headers)

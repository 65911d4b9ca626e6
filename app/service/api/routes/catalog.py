"""The shipped model presets and cluster profiles."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Path

import model_presets
from app.service.api.deps import api_scope
from app.service.schemas.catalog import ClusterDetail, ClusterSummary, ModelDetail, ModelSummary
from app.service.schemas.common import AUTH_ERRORS, error_doc
from app.service.services.errors import http_error
from app.service.services.inputs import cluster_names, model_names, named_cluster, preset_model
from costmodel import total_params

router = APIRouter(prefix="/v1", tags=["catalog"], dependencies=[Depends(api_scope)], responses=AUTH_ERRORS)
UNKNOWN = {404: error_doc("No preset or profile by this name.", ["path", "name"], "unknown model preset 'nope'",
                          "not_found")}


def _model_summary(name: str) -> dict:
    spec = preset_model(name, None)
    return {"name": name, "num_layers": spec.num_layers, "hidden_size": spec.hidden_size,
            "num_attention_heads": spec.num_attention_heads, "seq_length": spec.seq_length,
            "num_experts": spec.num_experts, "moe_router_topk": spec.moe_router_topk,
            "total_params": float(total_params(spec))}


@router.get("/models", response_model=list[ModelSummary], summary="Model presets")
def models() -> list[dict]:
    return [_model_summary(n) for n in sorted(model_names())]


@router.get("/models/{name}", response_model=ModelDetail, summary="One model preset, with its sources",
            responses=UNKNOWN)
def model(name: str = Path(examples=["pangu-ultra-moe-718b"])) -> dict:
    if name not in model_names():
        raise http_error(404, ["path", "name"], f"unknown model preset {name!r}; known: "
                                                f"{', '.join(sorted(model_names()))}", "not_found")
    return {"name": name, "spec": preset_model(name, None).model_dump(mode="json", exclude_none=True),
            "preset": model_presets.raw(name)}


def _cluster_summary(name: str) -> dict:
    p = named_cluster(name)
    fact = lambda k: p.fact(k) if k in p.facts else None  # noqa: E731
    return {"name": name, "description": p.description, "profile_version": p.version(),
            "peak_bf16_tflops": fact("peak_bf16_tflops"), "memory_gib": fact("memory_gib"),
            "devices_per_node": fact("devices_per_node"), "scale_up_domain": fact("scale_up_domain")}


@router.get("/clusters", response_model=list[ClusterSummary], summary="Cluster profiles")
def clusters() -> list[dict]:
    return [_cluster_summary(n) for n in sorted(cluster_names())]


@router.get("/clusters/{name}", response_model=ClusterDetail, summary="One cluster profile, calibrated factors "
                                                                      "merged", responses=UNKNOWN)
def cluster(name: str = Path(examples=["ascend-910b"])) -> dict:
    if name not in cluster_names():
        raise http_error(404, ["path", "name"], f"unknown cluster profile {name!r}; known: "
                                                f"{', '.join(sorted(cluster_names()))}", "not_found")
    p = named_cluster(name)
    return {"name": name, "profile_version": p.version(), "profile": p.model_dump(mode="json")}

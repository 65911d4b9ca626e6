"""The shipped model presets and cluster profiles."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class ModelSummary(BaseModel):
    name: str = Field(examples=["pangu-ultra-moe-718b"])
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    seq_length: int
    num_experts: int | None = None
    moe_router_topk: int | None = None
    total_params: float = Field(description="Parameters (all experts), in units.")


class ModelDetail(BaseModel):
    name: str
    spec: dict[str, Any] = Field(description="The spec as used (sources removed).")
    preset: dict[str, Any] = Field(description="The preset file as written, every field with its source.")


class ClusterSummary(BaseModel):
    name: str = Field(examples=["ascend-910b"])
    description: str
    profile_version: str
    peak_bf16_tflops: float | None
    memory_gib: float | None
    devices_per_node: float | None
    scale_up_domain: float | None


class ClusterDetail(BaseModel):
    name: str
    profile_version: str
    profile: dict[str, Any] = Field(description="The profile with its calibrated factors merged; every fact "
                                                "carries its source.")

"""`POST /v1/evaluate`: one config, scored at once."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .jobs import CLUSTER_FIELD, MAX_DEVICES, MAX_SEQ_LENGTH, MODEL_FIELD


class EvaluateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [{
        "model": "pangu-ultra-moe-718b", "cluster": "ascend-910b", "devices": 6144,
        "config": {"tp": 8, "pp": 16, "vpp": 2, "ep": 32, "micro_batch_size": 2, "global_batch_size": 7680,
                   "recompute": "selective", "recompute_modules": ["layernorm", "mla_up_proj", "moe"],
                   "account_for_embedding_in_pipeline_split": True, "account_for_loss_in_pipeline_split": True,
                   "moe_a2a_overlap": True, "tp_comm_overlap": True}}]})

    model: str | dict[str, Any] = MODEL_FIELD
    cluster: str | dict[str, Any] = CLUSTER_FIELD
    devices: int = Field(ge=1, le=MAX_DEVICES, description="Number of devices (at most PARAPLAN_MAX_DEVICES).",
                         examples=[6144])
    config: dict[str, Any] = Field(description="The training config (CONTRACT.md, \"Training config\").")
    seq_length: int | None = Field(None, ge=1, le=MAX_SEQ_LENGTH, description="Override the model's seq_length.")

"""`POST /v1/launch/import` and `POST /v1/compare`: a launch script read back, and two configs compared."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .jobs import CLUSTER_FIELD, MAX_DEVICES

MAX_LAUNCH_CHARS = 60_000  # a launch script of a few hundred lines is ~10 kB; two of them, JSON-escaped at up
# to 6 bytes a character, stay under the 1 MiB request body limit (a 413 otherwise)

LAUNCH_FIELD = Field(max_length=MAX_LAUNCH_CHARS, description=(
    "A Megatron-LM or MindSpeed-LLM launch script (bash: variables, argument blocks and arrays, line "
    "continuations, the torchrun / msrun / python launch of pretrain_gpt.py), or its plain argument list."),
    examples=["torchrun --nnodes 2 --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 8 ..."])


EXAMPLE_SCRIPT = """GPUS_PER_NODE=8
TP=4
GPT_ARGS="--tensor-model-parallel-size $TP --sequence-parallel --micro-batch-size 1 --global-batch-size 64 \\
    --num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 4096 --vocab-size 50304 \\
    --swiglu --normalization RMSNorm --position-embedding-type rope --disable-bias-linear --bf16 --lr 3e-4"
torchrun --nnodes 2 --nproc_per_node $GPUS_PER_NODE pretrain_gpt.py $GPT_ARGS --save /ckpt
"""


class ImportRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True,
                              json_schema_extra={"examples": [{"text": EXAMPLE_SCRIPT, "framework": None}]})

    text: str = LAUNCH_FIELD
    framework: Literal["megatron", "mindspeed"] | None = Field(
        None, description="The script's framework (default: guessed from its launcher and flags).")


class Imported(BaseModel):
    framework: Literal["megatron", "mindspeed"]
    devices: int | None = Field(description="nodes × processes per node, when the launcher states them.")
    model: dict[str, Any] = Field(description="The model spec (CONTRACT.md, \"Model spec\").")
    config: dict[str, Any] = Field(description="The training config, its non-default fields.")
    notes: list[str] = Field(description="Each flag ignored, and why; script blocks not read.")
    warnings: list[str] = Field(description="What the framework itself would refuse of this combination.")


class CompareSide(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    label: str | None = Field(None, max_length=200, description="A name for this side (default A / B).")
    launch: str | None = Field(None, max_length=MAX_LAUNCH_CHARS,
                               description="A launch script or argument list (instead of model and config).")
    framework: Literal["megatron", "mindspeed"] | None = None
    model: str | dict[str, Any] | None = Field(None, description="Preset name or spec (with config).")
    config: dict[str, Any] | None = Field(None, description="The training config (with model).")
    devices: int | None = Field(None, ge=1, le=MAX_DEVICES, description="Devices (default: the script's).")


class CompareRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [{
        "cluster": "ascend-910b",
        "a": {"label": "Huawei", "model": "pangu-ultra-moe-718b", "devices": 6144,
              "config": {"tp": 8, "pp": 16, "vpp": 2, "ep": 32, "micro_batch_size": 2, "global_batch_size": 7680}},
        "b": {"label": "tp 4", "model": "pangu-ultra-moe-718b", "devices": 6144,
              "config": {"tp": 4, "pp": 16, "vpp": 2, "ep": 32, "micro_batch_size": 2, "global_batch_size": 7680}}}]})

    cluster: str | dict[str, Any] = CLUSTER_FIELD
    a: CompareSide
    b: CompareSide

"""The contract's evaluation result and a ranked config."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")  # the cost model may add fields; they pass through


class InfeasibleReason(_Open):
    code: str = Field(examples=["oom"])
    message: str = Field(examples=["stage 0 needs 71.2 GiB of 64.0"])


class TimeBreakdown(_Open):
    """Exposed time per step (seconds); the parts add up to ``step_time_s``. Null when the config is
    structurally invalid."""

    compute_s: float | None
    tp_comm_s: float | None
    cp_comm_s: float | None
    ep_comm_s: float | None
    pp_bubble_s: float | None
    pp_p2p_s: float | None
    dp_comm_exposed_s: float | None
    optimizer_s: float | None
    straggler_s: float | None = Field(None, description="waiting for the slowest data-parallel replica "
                                                         "(docs/costmodel.md, Stragglers)")


class MemoryBreakdown(_Open):
    """Memory at the peak stage (GiB, 2^30 bytes) and the peak of every pipeline stage. params, grads,
    optimizer, activations, buffers and overhead add up to ``peak_gib``."""

    peak_gib: float | None
    capacity_gib: float | None
    headroom_gib: float | None = Field(None, description="capacity_gib − peak_gib: room left on the fullest "
                                                         "device (negative when the config does not fit).")
    params_gib: float | None
    grads_gib: float | None
    optimizer_gib: float | None
    activations_gib: float | None = Field(None, description="Activations stored for the backward pass: the "
                                                           "micro-batches in flight and the output logits.")
    buffers_gib: float | None = Field(None, description="Transient buffers alive at the peak: MoE dispatch/combine "
                                                       "buffers, the activations a recomputed layer rebuilds.")
    overhead_gib: float | None = Field(None, description="The profile's framework overhead (runtime context, "
                                                        "communicator buffers, allocator reserve).")
    per_stage_peak_gib: list[float | None] | None


class Versions(_Open):
    paraplan: str
    profile: str = Field(description="A hash of the cluster profile used (facts and factors).")


class Goodput(_Open):
    """What failures, checkpoints and restarts cost the config (docs/guides/goodput.md); fractions of wall-clock time."""

    checkpoint_mode: Literal["sync", "async", "in_memory"]
    checkpoint_gib_per_rank: float
    checkpoint_gib: float = Field(description="What all ranks write per checkpoint (GiB).")
    checkpoint_write_s: float
    checkpoint_stall_s: float = Field(description="Seconds a checkpoint stops training.")
    checkpoint_background_s: float = Field(description="Seconds until a checkpoint is safe after training resumes.")
    checkpoint_load_s: float
    checkpoint_interval_s: float = Field(description="Training seconds between checkpoints (whole steps).")
    checkpoint_interval_steps: int
    checkpoint_interval_rule: Literal["given", "young_daly", "background_write"]
    mtbf_h: float
    interruptions_per_day: float
    unexpected_per_day: float
    planned_per_day: float
    lost_work_per_failure_s: float
    downtime_per_failure_s: float
    checkpoint_overhead: float
    lost_fraction: float
    restart_fraction: float
    goodput_fraction: float = Field(description="Fraction of wall-clock time that advances training (ETTR).",
                                    examples=[0.95])
    effective_tokens_per_s: float
    hot_spare_nodes: int
    paid_devices: int = Field(description="The job's devices and its hot spares' devices.")
    effective_tokens_per_s_per_paid_device: float


class Evaluation(_Open):
    """One evaluation result (CONTRACT.md, "Evaluation result")."""

    feasible: bool
    infeasible_reasons: list[InfeasibleReason]
    warnings: list[str]
    step_time_s: float | None
    tokens_per_s: float | None
    tokens_per_s_per_device: float | None
    model_tflops_per_device: float | None
    mfu: float | None
    hfu: float | None
    time: TimeBreakdown
    memory: MemoryBreakdown
    versions: Versions
    goodput: Goodput | None = Field(None, description="Failures, checkpoints and restarts priced for the config "
                                                      "(docs/guides/goodput.md); null where it has no step time.")
    # A config with moe_expert_load / moe_expert_skew adds "moe_routing" (docs/costmodel.md); like every
    # field the cost model adds, it passes through (extra="allow") and is absent otherwise.


KEEPS_MARGIN = Field(None, description="Whether the config's memory headroom is at least the job's "
                                       "`search.memory_margin_gib`; false: ranked after every config that keeps "
                                       "it, and it may not fit in practice. Null for jobs from before margins.")
MARGIN_WARNING = Field(None, description="Set when `keeps_margin` is false: the headroom and the margin, in words.")


class RankedConfig(BaseModel):
    rank: int = Field(description="1 is the best (highest predicted tokens/s that keeps the memory margin, "
                                  "then those that only fit).", examples=[1])
    config: dict[str, Any] = Field(description="The training config (CONTRACT.md, \"Training config\").",
                                   examples=[{"tp": 8, "pp": 16, "vpp": 2, "cp": 1, "ep": 32, "etp": 1,
                                              "micro_batch_size": 2, "global_batch_size": 7680,
                                              "recompute": "selective"}])
    evaluation: Evaluation
    keeps_margin: bool | None = KEEPS_MARGIN
    margin_warning: str | None = MARGIN_WARNING


class Layout(BaseModel):
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int


class RankedLayout(BaseModel):
    """One distinct parallel layout and its best variant (vpp, micro-batch, recompute, split)."""

    layout: Layout = Field(description="The sizes that make configs the same layout.")
    best_rank: int = Field(description="The rank of `config` among all ranked configs (it may lie beyond the "
                                       "job's `top_k`).", examples=[3])
    config: dict[str, Any] = Field(description="The layout's best config.")
    evaluation: Evaluation
    variants: int = Field(description="Configs of this layout that fit, among those the search scored.",
                          examples=[175])
    keeps_margin: bool | None = KEEPS_MARGIN
    margin_warning: str | None = MARGIN_WARNING

"""A batch of training configs as columns of numpy arrays (one entry per config).

The vectorised cost model reads only this structure, so a search can hand it whole enumerated spaces
without building a Python object per config. ``ConfigBatch.from_configs`` builds it from pydantic
configs; the single-config path is a batch of one.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, fields

import numpy as np

from .spec import OFFLOAD_MODULES, RECOMPUTE_MODULES, TrainingConfig

RECOMPUTE_CODES = {"none": 0, "selective": 1, "full": 2}
PRECISION_CODES = {"bf16": 0, "fp8": 1}
MODULE_BITS = {m: 1 << i for i, m in enumerate(RECOMPUTE_MODULES)}
DEFAULT_RECOMPUTE_MODULES = ("core_attn",)
OFFLOAD_BITS = {m: 1 << i for i, m in enumerate(OFFLOAD_MODULES)}
# Documented default for moe_load_imbalance (max/mean routed tokens per EP rank) when a config does not
# set it: dropless training with an auxiliary balance loss keeps the busiest EP rank roughly 10-20 %
# above the mean (DeepSeek-V3 §2.1.2 reports well-balanced but not perfectly balanced expert load).
DEFAULT_MOE_LOAD_IMBALANCE = 1.15
NO_VALUE = -1  # integer columns use -1 for "not set"
CP_COMM_CODES = {"p2p": 0, "a2a": 1, "allgather": 2, "a2a+p2p": 3}
# moe_token_dispatcher_type: 0 = not stated (an all-to-all, flat or hierarchical by moe_a2a_algorithm, as
# before the field); flex is priced as the hierarchical all-to-all (moe_a2a_hierarchical set with it).
DISPATCHER_CODES = {None: 0, "allgather": 1, "alltoall": 2, "alltoall_seq": 3, "flex": 4}
DISPATCHER_ALLGATHER, DISPATCHER_ALLTOALL_SEQ = DISPATCHER_CODES["allgather"], DISPATCHER_CODES["alltoall_seq"]
ATTENTION_KERNEL_CODES = {"flash": 0, "unfused": 1}
SHARDING_CODES = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
# Pipeline schedules: Megatron-Core's 1F1B (vpp 1) and interleaved 1F1B (vpp > 1) share code 0, since
# vpp tells them apart; DeepSeek's DualPipe and the V-shaped DualPipeV place two chunks on each rank.
SCHEDULE_CODES = {"1f1b": 0, "interleaved": 0, "dualpipe": 1, "dualpipev": 2}
DUALPIPE, DUALPIPEV = SCHEDULE_CODES["dualpipe"], SCHEDULE_CODES["dualpipev"]
DTYPE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0}
# Megatron-Core --fp8-recipe; NO_VALUE: not stated, resolved per config from its recompute modules as the
# export does (TrainingConfig.fp8_recipe_in_force, ``fp8_recipe_codes``).
FP8_RECIPE_CODES = {"delayed": 0, "tensorwise": 1, "blockwise": 2, "mxfp8": 3}
EMA_CODES = {"none": 0, "device": 1, "host": 2}
# Columns added after the first release; a batch built without them (the search's own arrays) gets
# TrainingConfig's defaults for them (see ``__post_init__``), so a new field never changes what an
# older caller scores.
_LATER_COLUMNS = ("moe_a2a_hierarchical", "cp_comm", "main_grads_bytes", "main_params_bytes",
                  "exp_avg_bytes", "exp_avg_sq_bytes", "schedule", "offload_modules", "moe_expert_replicas",
                  "moe_dispatcher", "attention_kernel", "fp8_recipe", "delay_wgrad", "act_fp8_input_store",
                  "parameter_ema", "mla_fa_without_pad")


@functools.cache
def _default_row() -> "ConfigBatch":
    """A batch of one default TrainingConfig: built once, as searches build a batch per chunk."""
    return ConfigBatch.from_configs([TrainingConfig(global_batch_size=1)])


def modules_mask(modules, bits: dict[str, int] = MODULE_BITS) -> int:
    """Bit mask of the named modules: recompute modules by default, ``OFFLOAD_BITS`` for offload."""
    mask = 0
    for m in modules:
        mask |= bits[m]
    return mask


@dataclass
class ConfigBatch:
    """Columns of a batch of configs. Integer sizes are int64, flags bool, the imbalance float64."""

    tp: np.ndarray
    pp: np.ndarray
    vpp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    dp: np.ndarray  # NO_VALUE = derive from devices
    micro_batch_size: np.ndarray
    global_batch_size: np.ndarray
    sequence_parallel: np.ndarray
    tp_comm_overlap: np.ndarray
    recompute: np.ndarray  # RECOMPUTE_CODES
    recompute_modules: np.ndarray  # bit mask of MODULE_BITS
    recompute_num_layers: np.ndarray  # NO_VALUE = all layers of the stage
    distributed_optimizer: np.ndarray
    overlap_grad_reduce: np.ndarray
    overlap_param_gather: np.ndarray
    first_stage_layers: np.ndarray  # NO_VALUE = not set
    last_stage_layers: np.ndarray
    account_for_embedding: np.ndarray
    account_for_loss: np.ndarray
    layout_id: np.ndarray  # index into ``layouts``; NO_VALUE = no pipeline_layout
    precision: np.ndarray  # PRECISION_CODES
    moe_a2a_overlap: np.ndarray
    moe_load_imbalance: np.ndarray
    layouts: list[str] = field(default_factory=list)
    moe_a2a_hierarchical: np.ndarray | None = None
    cp_comm: np.ndarray | None = None  # CP_COMM_CODES
    main_grads_bytes: np.ndarray | None = None  # bytes per parameter of each model-state part
    main_params_bytes: np.ndarray | None = None
    exp_avg_bytes: np.ndarray | None = None
    exp_avg_sq_bytes: np.ndarray | None = None
    sharding: np.ndarray | None = None  # SHARDING_CODES; default from distributed_optimizer
    schedule: np.ndarray | None = None  # SCHEDULE_CODES
    offload_modules: np.ndarray | None = None  # bit mask of OFFLOAD_BITS (0: nothing offloaded)
    moe_expert_replicas: np.ndarray | None = None  # extra expert slots per EP rank (copies of hot experts)
    moe_dispatcher: np.ndarray | None = None  # DISPATCHER_CODES (0: not stated)
    attention_kernel: np.ndarray | None = None  # ATTENTION_KERNEL_CODES (0: FlashAttention)
    fp8_recipe: np.ndarray | None = None  # FP8_RECIPE_CODES, NO_VALUE = the export's rule (``fp8_recipe_codes``)
    delay_wgrad: np.ndarray | None = None  # 1 delayed, 0 not, NO_VALUE = with moe_a2a_overlap (``delays_wgrad``)
    act_fp8_input_store: np.ndarray | None = None  # the SwiGLU input stored in FP8 for the backward
    parameter_ema: np.ndarray | None = None  # EMA_CODES
    mla_fa_without_pad: np.ndarray | None = None  # MindSpeed's --mla-fa-without-pad (V not padded)

    def fp8_recipe_codes(self) -> np.ndarray:
        """The FP8 recipe in force per config (TrainingConfig.fp8_recipe_in_force): the stated one, else
        tensorwise where selective recompute drops layernorm or moe_act, else delayed."""
        needs_current = (self.recompute == RECOMPUTE_CODES["selective"]) & (
            (self.recompute_modules & (MODULE_BITS["layernorm"] | MODULE_BITS["moe_act"])) != 0)
        return np.where(self.fp8_recipe == NO_VALUE, np.where(needs_current, FP8_RECIPE_CODES["tensorwise"],
                                                              FP8_RECIPE_CODES["delayed"]), self.fp8_recipe)

    def delays_wgrad(self) -> np.ndarray:
        """Whether each config delays its weight-gradient GEMMs (TrainingConfig.delays_wgrad)."""
        return np.where(self.delay_wgrad == NO_VALUE, self.moe_a2a_overlap, self.delay_wgrad == 1)

    @property
    def chunks(self) -> np.ndarray:
        """Model chunks per pipeline rank: vpp, or the two of a DualPipe schedule."""
        return np.where(self.schedule > 0, 2, self.vpp)

    def __post_init__(self) -> None:
        missing = [name for name in _LATER_COLUMNS if getattr(self, name) is None]
        if missing:  # the defaults come from TrainingConfig itself, so the two cannot disagree
            default = _default_row()
            for name in missing:
                setattr(self, name, np.repeat(getattr(default, name), len(self.tp)))
        if self.sharding is None:
            self.sharding = np.where(self.distributed_optimizer, SHARDING_CODES["optim"],
                                     SHARDING_CODES["no_shard"]).astype(np.int64)

    def __len__(self) -> int:
        return len(self.tp)

    @classmethod
    def from_configs(cls, configs: list[TrainingConfig]) -> "ConfigBatch":
        unresolved = [c for c in configs if c.moe_load_imbalance is None
                      and (c.moe_expert_load is not None or c.moe_expert_skew is not None)]
        if unresolved:  # the imbalance follows from the routing and the model's experts
            raise ValueError("configs with moe_expert_load/moe_expert_skew need costmodel.routing.resolved "
                             "(the model's expert count) before batching")
        layouts: list[str] = []
        layout_ids = []
        for c in configs:
            if c.pipeline_layout is None:
                layout_ids.append(NO_VALUE)
            else:
                if c.pipeline_layout not in layouts:
                    layouts.append(c.pipeline_layout)
                layout_ids.append(layouts.index(c.pipeline_layout))

        def col(getter, dtype):
            return np.array([getter(c) for c in configs], dtype=dtype)

        def opt(v):
            return NO_VALUE if v is None else v

        return cls(
            tp=col(lambda c: c.tp, np.int64),
            pp=col(lambda c: c.pp, np.int64),
            vpp=col(lambda c: c.vpp, np.int64),
            cp=col(lambda c: c.cp, np.int64),
            ep=col(lambda c: c.ep, np.int64),
            etp=col(lambda c: c.etp, np.int64),
            dp=col(lambda c: opt(c.dp), np.int64),
            micro_batch_size=col(lambda c: c.micro_batch_size, np.int64),
            global_batch_size=col(lambda c: c.global_batch_size, np.int64),
            sequence_parallel=col(lambda c: c.sp, bool),
            tp_comm_overlap=col(lambda c: c.tp_comm_overlap, bool),
            recompute=col(lambda c: RECOMPUTE_CODES[c.recompute], np.int64),
            recompute_modules=col(
                lambda c: modules_mask(c.recompute_modules if c.recompute_modules is not None
                                       else DEFAULT_RECOMPUTE_MODULES), np.int64),
            recompute_num_layers=col(lambda c: opt(c.recompute_num_layers), np.int64),
            distributed_optimizer=col(lambda c: c.distributed_optimizer, bool),
            overlap_grad_reduce=col(lambda c: c.overlap_grad_reduce, bool),
            overlap_param_gather=col(lambda c: c.overlap_param_gather, bool),
            first_stage_layers=col(lambda c: opt(c.first_stage_layers), np.int64),
            last_stage_layers=col(lambda c: opt(c.last_stage_layers), np.int64),
            account_for_embedding=col(lambda c: c.account_for_embedding_in_pipeline_split, bool),
            account_for_loss=col(lambda c: c.account_for_loss_in_pipeline_split, bool),
            layout_id=np.array(layout_ids, dtype=np.int64),
            precision=col(lambda c: PRECISION_CODES[c.precision], np.int64),
            moe_a2a_overlap=col(lambda c: c.moe_a2a_overlap, bool),
            moe_load_imbalance=col(
                lambda c: DEFAULT_MOE_LOAD_IMBALANCE if c.moe_load_imbalance is None else c.moe_load_imbalance,
                np.float64),
            layouts=layouts,
            moe_a2a_hierarchical=col(lambda c: c.a2a_hierarchical, bool),
            cp_comm=col(lambda c: CP_COMM_CODES[c.cp_comm_type], np.int64),
            main_grads_bytes=col(lambda c: DTYPE_BYTES[c.main_grads_dtype], np.float64),
            main_params_bytes=col(lambda c: DTYPE_BYTES[c.main_params_dtype], np.float64),
            exp_avg_bytes=col(lambda c: DTYPE_BYTES[c.exp_avg_dtype], np.float64),
            exp_avg_sq_bytes=col(lambda c: DTYPE_BYTES[c.exp_avg_sq_dtype], np.float64),
            sharding=col(lambda c: SHARDING_CODES[c.sharding], np.int64),
            schedule=col(lambda c: SCHEDULE_CODES[c.schedule], np.int64),
            offload_modules=col(lambda c: modules_mask(c.offload_modules or (), OFFLOAD_BITS), np.int64),
            moe_expert_replicas=col(lambda c: c.moe_expert_replicas, np.int64),
            moe_dispatcher=col(lambda c: DISPATCHER_CODES[c.moe_token_dispatcher_type], np.int64),
            attention_kernel=col(lambda c: ATTENTION_KERNEL_CODES[c.attention_kernel], np.int64),
            fp8_recipe=col(lambda c: opt(c.fp8_recipe and FP8_RECIPE_CODES[c.fp8_recipe]), np.int64),
            delay_wgrad=col(lambda c: opt(c.delay_wgrad_compute if c.delay_wgrad_compute is None
                                          else int(c.delay_wgrad_compute)), np.int64),
            act_fp8_input_store=col(lambda c: c.activation_func_fp8_input_store, bool),
            parameter_ema=col(lambda c: EMA_CODES[c.parameter_ema], np.int64),
            mla_fa_without_pad=col(lambda c: c.mla_fa_without_pad, bool),
        )

    def take(self, idx: np.ndarray) -> "ConfigBatch":
        """The sub-batch at ``idx`` (index or boolean mask)."""
        kw = {f.name: getattr(self, f.name)[idx] for f in fields(self) if f.name != "layouts"}
        return ConfigBatch(**kw, layouts=self.layouts)

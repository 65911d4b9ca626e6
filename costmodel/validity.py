"""The contract's validity rules, vectorised: each rule is a code, a mask of broken configs and a message.

A broken rule makes a config structurally infeasible; it is reported, never raised.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .batch import ATTENTION_KERNEL_CODES, DUALPIPE, DUALPIPEV, NO_VALUE, OFFLOAD_BITS, RECOMPUTE_CODES, ConfigBatch
from .spec import ModelSpec


@dataclass
class Rule:
    code: str
    broken: np.ndarray  # (N,) bool
    message: Callable[[int], str]  # index of a broken config -> explanation


def check(spec: ModelSpec, b: ConfigBatch, devices: int, has_fp8: bool, has_host_link: bool = True) -> list[Rule]:
    """Every validity rule of the contract except the pipeline split (see :mod:`costmodel.pipeline`)."""
    heads, groups = spec.num_attention_heads, spec.query_groups
    model_par = b.tp * b.pp * b.cp
    # dp is defined only where the devices divide by tp·pp·cp: the rules that use it say nothing
    # elsewhere (a rounded-down dp would be quoted that no launch could have).
    whole, rest = np.divmod(devices, np.maximum(model_par, 1))  # one integer division for both
    dp = np.where((model_par > 0) & (rest == 0), whole, 0)
    dense_rank = b.tp * b.cp * dp
    seq = spec.seq_length
    sp, cp = b.sequence_parallel, b.cp
    seq_div = np.where(sp, b.tp, 1) * np.where(cp > 1, 2 * cp, 1)  # tp with SP, times 2·cp with CP
    experts = spec.num_experts or 0
    rules = [
        Rule("tp_divides_heads", (heads % b.tp != 0) | (groups % b.tp != 0),
             lambda i: f"tp={b.tp[i]} must divide num_attention_heads={heads} and num_query_groups={groups}"),
        Rule("devices_divisible", devices % model_par != 0,
             lambda i: f"devices={devices} is not divisible by tp*pp*cp={model_par[i]}"),
        Rule("dp_mismatch", (b.dp != NO_VALUE) & (b.dp != dp) & (devices % model_par == 0),
             lambda i: f"dp={b.dp[i]} does not match devices/(tp*pp*cp)={dp[i]}"),
        Rule("ep_etp_divides", (dp > 0) & (dense_rank % (b.ep * b.etp) != 0),
             lambda i: f"ep*etp={b.ep[i] * b.etp[i]} must divide tp*cp*dp={dense_rank[i]}"),
        Rule("dense_ep", ((b.ep > 1) | (b.etp > 1)) if not experts else np.zeros(len(b), bool),
             lambda i: f"a dense model needs ep=1 and etp=1 (got ep={b.ep[i]}, etp={b.etp[i]})"),
        Rule("ep_divides_experts", (experts % b.ep != 0) if experts else np.zeros(len(b), bool),
             lambda i: f"ep={b.ep[i]} must divide num_experts={experts}"),
        Rule("global_batch_divisible", (dp > 0) & (b.global_batch_size % np.maximum(b.micro_batch_size * dp, 1) != 0),
             lambda i: f"global_batch_size={b.global_batch_size[i]} is not divisible by "
                       f"micro_batch_size*dp={b.micro_batch_size[i] * dp[i]}"),
        Rule("seq_divisible", seq % seq_div != 0,
             lambda i: f"seq_length={seq} must be divisible by {seq_div[i]} "
                       f"(tp with sequence parallel, 2*cp with context parallel)"),
        Rule("vpp_needs_pp", (b.vpp > 1) & (b.pp == 1),
             lambda i: f"vpp={b.vpp[i]} needs pp > 1"),
        Rule("fp8_unsupported", (b.precision == 1) & (not has_fp8),
             lambda i: "precision fp8 needs a profile with an FP8 peak"),
        # Megatron-Core's unfused DotProductAttention asserts context_parallel_size == 1 ("Context
        # parallelism is only supported by TEDotProductAttention"); MindSpeed's CP algorithms all call
        # npu_fusion_attention: context parallelism needs the flash kernel.
        Rule("unfused_attention_cp", (b.attention_kernel == ATTENTION_KERNEL_CODES["unfused"]) & (cp > 1),
             lambda i: f"attention_kernel unfused with cp={cp[i]}: context parallelism runs only with the "
                       "flash kernel (Megatron-Core's unfused attention has no context parallelism)"),
        # Megatron-Core transformer_config.py: "Storing activation input in FP8 is supported only for SwiGLU."
        Rule("fp8_input_store_needs_swiglu", b.act_fp8_input_store & (not spec.swiglu),
             lambda i: "activation_func_fp8_input_store stores the SwiGLU input: the model has no SwiGLU"),
        *_schedule_rules(spec, b, dp),
        *_offload_rules(spec, b, has_host_link),
    ]
    return rules


def _offload_rules(spec: ModelSpec, b: ConfigBatch, has_host_link: bool) -> list[Rule]:
    """What activation offload (``offload_modules``) needs: a host link to offload over, layers that
    keep activations (a fully recomputed layer keeps only its input, which Megatron-Core's checkpoint
    holds itself), and experts for the expert modules (Megatron offloads expert_fc1 and moe_act inside
    its MoE experts only)."""
    offloads = b.offload_modules != 0
    expert_bits = OFFLOAD_BITS["expert_fc1"] | OFFLOAD_BITS["moe_act"]
    names = lambda i: [m for m, bit in OFFLOAD_BITS.items() if b.offload_modules[i] & bit]  # noqa: E731
    return [
        Rule("offload_needs_host_link", offloads & (not has_host_link),
             lambda i: f"offload_modules={names(i)} needs a profile with a host link (facts host_link_bandwidth_gbps, "
                       "host_link_devices, host_memory_gib)"),
        Rule("offload_full_recompute", offloads & (b.recompute == RECOMPUTE_CODES["full"]),
             lambda i: f"offload_modules={names(i)} with recompute full: a fully recomputed layer keeps only its "
                       "input, there is nothing to offload (use recompute selective or none)"),
        Rule("offload_needs_moe", ((b.offload_modules & expert_bits) != 0) if not spec.is_moe
             else np.zeros(len(b), bool),
             lambda i: f"offload_modules={names(i)}: expert_fc1 and moe_act offload expert activations, and this "
                       "model has no experts"),
    ]


_SCHEDULE_NAMES = {DUALPIPE: "dualpipe", DUALPIPEV: "dualpipev"}
SCHEDULE_RULES = ("dualpipe_needs_pp", "dualpipe_even_pp", "dualpipe_microbatches", "dualpipev_layers")


def _schedule_rules(spec: ModelSpec, b: ConfigBatch, dp: np.ndarray) -> list[Rule]:
    """What each pipeline schedule needs (see ``costmodel.pipeline``).

    DualPipe (deepseek-ai/DualPipe dualpipe.py ``step``: ``num_ranks % 2 == 0``, ``num_chunks % 2 == 0 and
    num_chunks >= num_ranks * 2``); DualPipeV as MindSpeed validates it (features_manager/pipeline_parallel/
    dualpipev_feature.py at 028de58c: pp > 1, num_layers ≥ 2·pp, micro-batches ≥ 2·pp − 1). Megatron-LM's
    all-to-all overlap with pp > 1 and vpp 1 is an export refusal, not a rule here: MindSpeed's
    --moe-alltoall-overlap-comm runs that layout (search/frameworks/megatron.py ``_a2a_overlap_pipeline``)."""
    name = lambda i: _SCHEDULE_NAMES[int(b.schedule[i])]  # noqa: E731
    dual, v = b.schedule > 0, b.schedule == DUALPIPEV
    if not dual.any():  # every rule holds for 1F1B: no micro-batch counts to derive
        return [Rule(code, np.zeros(len(b), bool), lambda i: "") for code in SCHEDULE_RULES]
    m = np.where(dp > 0, b.global_batch_size // np.maximum(b.micro_batch_size * dp, 1), 0)
    need_m = np.where(v, 2 * b.pp - 1, 2 * b.pp)
    return [
        Rule("dualpipe_needs_pp", dual & (b.pp < 2), lambda i: f"pipeline_schedule {name(i)} needs pp > 1"),
        Rule("dualpipe_even_pp", (b.schedule == DUALPIPE) & (b.pp % 2 == 1),
             lambda i: f"pipeline_schedule dualpipe runs its two directions over an even pp (got pp={b.pp[i]})"),
        Rule("dualpipe_microbatches", dual & (dp > 0) & ((m < need_m) | ((b.schedule == DUALPIPE) & (m % 2 == 1))),
             lambda i: f"pipeline_schedule {name(i)} needs at least {need_m[i]} micro-batches per step"
                       f"{' (an even number, half each way)' if b.schedule[i] == DUALPIPE else ''}; "
                       f"global_batch_size/(micro_batch_size*dp) is {m[i]}"),
        Rule("dualpipev_layers", v & (spec.num_layers < 2 * b.pp),
             lambda i: f"pipeline_schedule dualpipev splits the model into 2*pp={2 * b.pp[i]} chunks, more than "
                       f"its {spec.num_layers} layers"),
    ]

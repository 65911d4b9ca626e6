"""Time, FLOPs, activations and weights of one layer on one device, per micro-batch.

One function per block (attention, dense MLP, MoE, embedding, output head); each returns a
:class:`Cost` whose fields are arrays with one entry per config. Communication is returned raw
(before overlap), except context-parallel K/V exchange, which overlaps with the attention core that
it feeds (ring attention), so only what exceeds the core's time is returned.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from . import comm, memory
from .batch import MODULE_BITS
from .compute import (BF16_BYTES, attention_core_bwd_s, attention_core_s, fp8_quantise_s, gemm_s, grouped_gemm_s,
                      grouped_weight_grad_s, memory_bound_s)
from .flops import attention_params, mlp_params
from .hardware import Hardware
from .spec import ModelSpec

BACKWARD_FACTOR = 2.0  # weight and input gradients: two GEMMs of the forward's size (SC21 §5.1)
# Bytes moved per element by the memory-bound kernels, forward (read + write, bf16):
NORM_BYTES = 2 * BF16_BYTES  # RMSNorm/LayerNorm: read x, write y
RESIDUAL_BYTES = 3 * BF16_BYTES  # residual add: read two, write one
MEMORY_BOUND_BACKWARD_FACTOR = 2.0  # gradient kernels read the input and the incoming gradient
# Megatron-Core keeps router logits in fp32 and runs softmax/top-k over them: about three fp32 passes.
ROUTER_BYTES_PER_SCORE = 3 * 4
# Token permutation before and after the experts, dispatch and combine: read + write each.
PERMUTE_BYTES = 2 * 2 * BF16_BYTES
# Vocabulary-parallel cross-entropy: fp32 logits written, then read and rewritten by softmax and its
# gradient: about five fp32 passes over the logits.
CROSS_ENTROPY_BYTES_PER_LOGIT = 5 * 4


@dataclass
class Cost:
    fwd_s: np.ndarray  # forward compute (matmuls, attention core, memory-bound kernels, launch overhead)
    bwd_s: np.ndarray
    gemm_fwd_s: np.ndarray  # the part of fwd_s that TP communication can hide behind
    gemm_bwd_s: np.ndarray
    selective_s: np.ndarray  # forward compute repeated by selective recompute
    tp_fwd_s: np.ndarray
    tp_bwd_s: np.ndarray
    cp_fwd_s: np.ndarray  # exposed already (behind the attention core)
    cp_bwd_s: np.ndarray
    ep_fwd_s: np.ndarray
    ep_bwd_s: np.ndarray
    ep_nic_s: np.ndarray  # NIC time of one pass's dispatch and combine (shared with overlapped DP traffic)
    selective_cp_s: np.ndarray  # CP exchange repeated by selective recompute of core_attn
    selective_ep_s: np.ndarray  # dispatch/combine repeated by selective recompute of moe
    flops_fwd: np.ndarray  # hardware FLOPs of the forward pass on this device
    selective_flops: np.ndarray
    act_bytes: np.ndarray  # activations kept for the backward pass
    transient_bytes: np.ndarray  # buffers alive only while the layer runs
    offload_bytes: np.ndarray  # activations offloaded to host memory (offload_modules), moved each way once
    dense_params: np.ndarray  # weights reduced over the dp·cp group
    expert_params: np.ndarray  # weights reduced over the expert-data-parallel group
    # The attention block's weight-gradient GEMMs (part of bwd_s), which Megatron-Core's combined 1F1B
    # runs after the layer's overlapped region under --delay-wgrad-compute (evaluate: the EP window).
    delayed_wgrad_s: np.ndarray

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})


def _zero_cost(n: int) -> Cost:
    z = np.zeros(n)
    return Cost(**{f.name: z for f in fields(Cost)})


@dataclass
class Context:
    """Everything per config the block functions read."""

    spec: ModelSpec
    hw: Hardware
    shapes: memory.Shapes
    fp8: np.ndarray
    sp: np.ndarray
    imbalance: np.ndarray
    modules: np.ndarray  # selective recompute bit mask (0 unless recompute == selective)
    a2a_hierarchical: np.ndarray  # EP dispatch deduplicated per destination node
    cp_comm: np.ndarray  # batch.CP_COMM_CODES: 0 ring, 1 Ulysses all-to-all, 2 K/V all-gather, 3 both
    grad_accum_bytes: np.ndarray  # bytes per element of the main gradients (integer, main_grads_dtype)
    expert_replicas: np.ndarray  # extra expert slots per EP rank (copies of hot experts, routing.py)
    fp8_quant_bytes: np.ndarray  # bytes per element to quantise an FP8 GEMM operand (0 in BF16; compute.py)

    def drops(self, module: str) -> np.ndarray:
        return (self.modules & MODULE_BITS[module]) != 0


def _fp8_cast_s(ctx: Context, gemms) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward FP8 quantisation time of the GEMMs ``(m, k, n)`` (``compute.fp8_quantise_s``):
    the forward casts each input (m·k), the backward each output gradient (m·n); zero in BF16."""
    fwd = sum(fp8_quantise_s(m * k, ctx.fp8_quant_bytes, ctx.hw) for m, k, n in gemms)
    bwd = sum(fp8_quantise_s(m * n, ctx.fp8_quant_bytes, ctx.hw) for m, k, n in gemms)
    return fwd + 0.0 * ctx.fp8_quant_bytes, bwd + 0.0 * ctx.fp8_quant_bytes


def _tp_pair_s(ctx: Context, nbytes) -> np.ndarray:
    """An all-gather plus a reduce-scatter (sequence parallel) or one all-reduce (without): the same
    volume, 2(tp−1)/tp of the activation, around each tensor-parallel block (Korthikanti et al. §4.2.2)."""
    return comm.all_reduce_s(nbytes, 1, ctx.shapes.tp, ctx.hw)


def _residual_and_norm_bytes(ctx: Context) -> np.ndarray:
    return (NORM_BYTES + RESIDUAL_BYTES) * ctx.shapes.tokens_sp * ctx.spec.hidden_size


def attention_block(ctx: Context) -> Cost:
    """Input norm, QKV (or MLA) projections, causal FlashAttention, output projection, residual."""
    spec, hw, s, fp8 = ctx.spec, ctx.hw, ctx.shapes, ctx.fp8
    h, a, T, tp = spec.hidden_size, spec.num_attention_heads, s.tokens, s.tp
    if spec.multi_latent_attention:
        rope, q_lora, kv_lora = spec.qk_pos_emb_head_dim or 0, spec.q_lora_rank, spec.kv_lora_rank
        q_in = q_lora or h
        # Megatron-Core runs the (unsharded) down-projections on the sequence-parallel shard and
        # all-gathers the small latents instead of the hidden states.
        latent = kv_lora + rope + (q_lora or 0)
        down_shapes = [(s.tokens_sp, h, kv_lora + rope)] + ([(s.tokens_sp, h, q_lora)] if q_lora else [])
        up_shapes = [(T, q_in, a * (spec.qk_head_dim + rope) / tp), (T, kv_lora, a * (spec.qk_head_dim + spec.v_head_dim) / tp)]
        out_shapes = [(T, a * spec.v_head_dim / tp, h)]
        down = sum(gemm_s(m, k, n, hw, fp8) for m, k, n in down_shapes)
        up = sum(gemm_s(m, k, n, hw, fp8) for m, k, n in up_shapes)
        out = gemm_s(*out_shapes[0], hw, fp8)
        gemms = down + up + out
        cast_fwd, cast_bwd = _fp8_cast_s(ctx, down_shapes + up_shapes + out_shapes)
        up = up + _fp8_cast_s(ctx, up_shapes)[0]  # what recomputing the up-projections repeats
        latent_norm_bytes = NORM_BYTES * T * ((q_lora or 0) + kv_lora)
        kv_width = a * (2 * spec.qk_head_dim + 2 * rope + spec.v_head_dim) / tp  # K and V, expanded
        up_flops = 2.0 * T * (q_in * a * (spec.qk_head_dim + rope) + kv_lora * a * (spec.qk_head_dim + spec.v_head_dim)) / tp
    else:
        d, g = spec.head_dim, spec.query_groups
        latent = h  # the hidden states are what the QKV projection all-gathers
        shapes = [(T, h, (a + 2 * g) * d / tp), (T, a * d / tp, h)]
        gemms = sum(gemm_s(m, k, n, hw, fp8) for m, k, n in shapes)
        cast_fwd, cast_bwd = _fp8_cast_s(ctx, shapes)
        up = np.zeros_like(gemms)
        latent_norm_bytes = 0.0
        kv_width = 2 * g * d / tp
        up_flops = 0.0
    params = attention_params(spec)
    proj_flops = 2.0 * (T * params.sharded / tp + s.tokens_sp * params.replicated)
    core_flops = T * spec.seq_length * a / tp * (spec.qk_dim + spec.v_dim)
    # Causal: each token scores against half the sequence on average (core_flops counts it so too).
    scores = core_flops / (2.0 * (spec.qk_dim + spec.v_dim))
    ulysses, ring = _cp_degrees(ctx)
    core_fwd = attention_core_s(core_flops, scores, ring, hw)
    core_bwd = attention_core_bwd_s(core_flops, scores, ring, hw)
    norm_bytes = NORM_BYTES * s.tokens_sp * h + latent_norm_bytes
    mem_fwd = memory_bound_s(norm_bytes + RESIDUAL_BYTES * s.tokens_sp * h, hw)
    fwd = gemms + core_fwd + mem_fwd + cast_fwd
    bwd = BACKWARD_FACTOR * gemms + core_bwd + MEMORY_BOUND_BACKWARD_FACTOR * mem_fwd + cast_bwd
    qkv_width = a * (2 * spec.qk_dim + spec.v_dim) / tp if spec.multi_latent_attention else (a + 2 * spec.query_groups) * spec.head_dim / tp
    cp_fwd, cp_bwd = _context_parallel_s(ctx, core_fwd, core_bwd, kv_width, qkv_width, a * spec.v_dim / tp, ulysses, ring)
    selective = (ctx.drops("core_attn") * core_fwd
                 + ctx.drops("layernorm") * memory_bound_s(norm_bytes, hw)
                 + ctx.drops("mla_up_proj") * up)
    selective_flops = ctx.drops("core_attn") * core_flops + ctx.drops("mla_up_proj") * up_flops
    # Gather the block input (all-gather with SP; nothing without, the all-reduce below covers it)
    # and reduce the output projection (reduce-scatter with SP, all-reduce without).
    gather = np.where(ctx.sp, comm.all_gather_s(BF16_BYTES * T * latent, 1, tp, hw), 0.0)
    reduce = comm.all_gather_s(BF16_BYTES * T * h, 1, tp, hw) * np.where(ctx.sp, 1.0, 2.0)
    tp_comm = gather + reduce
    z = np.zeros_like(fwd)
    # Offloaded tensors stay on the device while they are copied out (and again from the prefetch of
    # their reload until the backward consumes them): the layer in flight holds them.
    offload = memory.attention_offload_bytes(spec, s)
    return Cost(
        fwd_s=fwd, bwd_s=bwd, gemm_fwd_s=gemms, gemm_bwd_s=BACKWARD_FACTOR * gemms,
        selective_s=selective, tp_fwd_s=tp_comm, tp_bwd_s=tp_comm, cp_fwd_s=cp_fwd, cp_bwd_s=cp_bwd,
        ep_fwd_s=z, ep_bwd_s=z, ep_nic_s=z, selective_cp_s=ctx.drops("core_attn") * cp_fwd, selective_ep_s=z,
        flops_fwd=proj_flops + core_flops, selective_flops=selective_flops,
        act_bytes=memory.attention_activation_bytes(spec, s), transient_bytes=offload + z,
        offload_bytes=offload + z,
        dense_params=params.sharded / tp + params.replicated + 2.0 * h + z, expert_params=z,
        # the weight-gradient half of the projections' backward (BACKWARD_FACTOR: dgrad + wgrad)
        delayed_wgrad_s=gemms + z)


def _cp_degrees(ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    """Ulysses (head all-to-all) and ring degrees of the context-parallel group: the ring alone (p2p),
    Ulysses alone (a2a), neither for the K/V all-gather, and for a2a+p2p Ulysses over the members
    inside one scale-up domain and the ring across domains (MindSpeed's hybrid_cp_algo)."""
    s = ctx.shapes
    inside = np.gcd(s.cp, np.maximum(ctx.hw.scale_up_domain // s.tp, 1))
    ulysses = np.select([ctx.cp_comm == 1, ctx.cp_comm == 3], [s.cp, inside], 1)
    ring = np.where(ctx.cp_comm == 2, 1, s.cp // ulysses)
    return ulysses, ring


def _context_parallel_s(ctx: Context, core_fwd, core_bwd, kv_width, qkv_width, out_width, ulysses, ring):
    """Exposed context-parallel communication of one layer, forward and backward.

    Ring (Megatron-Core's p2p ring attention, load-balanced: each rank holds chunks i and 2·cp−1−i of
    the sequence so that causal work is even): ring − 1 steps pass a K/V chunk on, each hidden behind
    one step of attention compute; the backward moves K/V and their gradients. Ulysses (DeepSpeed-
    Ulysses, MindSpeed's ulysses_cp_algo) re-partitions Q, K, V from sequence to heads and the output
    back: four all-to-alls on the critical path, the same again for the gradients. The K/V all-gather
    variant gathers the whole K/V before attention and reduce-scatters their gradients, exposed."""
    s, hw, T = ctx.shapes, ctx.hw, ctx.shapes.tokens
    kv_step = comm.p2p_s(BF16_BYTES * T * kv_width, s.tp * ulysses, hw)
    ring_fwd = np.maximum((ring - 1) * kv_step - core_fwd, 0.0)
    ring_bwd = np.maximum(2 * (ring - 1) * kv_step - core_bwd, 0.0)
    a2a = comm.all_to_all_s(BF16_BYTES * T * (qkv_width + out_width), s.tp, ulysses, hw)
    gather = np.where(ctx.cp_comm == 2, comm.all_gather_s(BF16_BYTES * T * kv_width * s.cp, s.tp, s.cp, hw), 0.0)
    return ring_fwd + a2a + gather, ring_bwd + a2a + gather


def _mlp_parts(ctx: Context, ffn: int, tokens, shard):
    """GEMM time, activation-function time, FLOPs and the FP8 casts (forward, backward) of an MLP of
    width ``ffn`` split ``shard`` ways."""
    hw, h = ctx.hw, ctx.spec.hidden_size
    fc1_width = (2 if ctx.spec.swiglu else 1) * ffn / shard
    shapes = [(tokens, h, fc1_width), (tokens, ffn / shard, h)]
    gemms = sum(gemm_s(m, k, n, hw, ctx.fp8) for m, k, n in shapes)
    act_bytes_moved = BF16_BYTES * tokens * (fc1_width + ffn / shard)  # read fc1 output, write fc2 input
    flops = 2.0 * tokens * mlp_params(h, ffn, ctx.spec.swiglu) / shard
    return gemms, memory_bound_s(act_bytes_moved, ctx.hw), flops, _fp8_cast_s(ctx, shapes)


def _expert_parts(ctx: Context, tokens, local_experts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Forward and backward GEMM time and activation-function time of a device's local experts.

    They run as one grouped GEMM per projection and pass (TEGroupedMLP, npu_gmm): the backward is the
    input-gradient grouped GEMM (it reads every expert's weights again) and the weight-gradient one
    (it rewrites every expert's main gradient: see ``grouped_weight_grad_s``)."""
    hw, h, f, etp, fp8 = ctx.hw, ctx.spec.hidden_size, ctx.spec.expert_ffn, ctx.shapes.etp, ctx.fp8
    fc1 = (2 if ctx.spec.swiglu else 1) * f / etp
    shapes = ((tokens, h, fc1), (tokens, f / etp, h))
    fwd = sum(grouped_gemm_s(m, k, n, local_experts, hw, fp8) for m, k, n in shapes)
    wgrad = sum(grouped_weight_grad_s(m, k, n, local_experts, hw, fp8, ctx.grad_accum_bytes) for m, k, n in shapes)
    act = memory_bound_s(BF16_BYTES * tokens * (fc1 + f / etp), hw)  # read fc1 output, write fc2 input
    cast_fwd, cast_bwd = _fp8_cast_s(ctx, shapes)  # one cast per grouped GEMM operand (all local experts)
    return fwd, fwd + wgrad, act, cast_fwd, cast_bwd


def dense_mlp_block(ctx: Context) -> Cost:
    """Pre-MLP norm, tensor-parallel MLP, residual."""
    spec, s = ctx.spec, ctx.shapes
    gemms, act, flops, (cast_fwd, cast_bwd) = _mlp_parts(ctx, spec.ffn_hidden_size, s.tokens, s.tp)
    mem = memory_bound_s(_residual_and_norm_bytes(ctx), ctx.hw)
    fwd = gemms + act + mem + cast_fwd
    tp_comm = _tp_pair_s(ctx, BF16_BYTES * s.tokens * spec.hidden_size)
    drop_mlp = ctx.drops("mlp")
    z = np.zeros_like(fwd)
    offload = memory.pre_mlp_offload_bytes(spec, s)
    return Cost(
        fwd_s=fwd, bwd_s=BACKWARD_FACTOR * gemms + MEMORY_BOUND_BACKWARD_FACTOR * (act + mem) + cast_bwd,
        gemm_fwd_s=gemms, gemm_bwd_s=BACKWARD_FACTOR * gemms,
        selective_s=drop_mlp * (gemms + act + cast_fwd) + ctx.drops("layernorm") * memory_bound_s(
            NORM_BYTES * s.tokens_sp * spec.hidden_size, ctx.hw),
        tp_fwd_s=tp_comm, tp_bwd_s=tp_comm, cp_fwd_s=z, cp_bwd_s=z, ep_fwd_s=z, ep_bwd_s=z, ep_nic_s=z,
        selective_cp_s=z, selective_ep_s=z, flops_fwd=flops, selective_flops=drop_mlp * flops,
        act_bytes=memory.pre_mlp_bytes(spec, s) + memory.mlp_activation_bytes(
            spec.ffn_hidden_size, spec, s.tokens, s.tp, drop_mlp, s.gemm_input_bytes, s.act_input_bytes),
        transient_bytes=offload + z, offload_bytes=offload + z,
        dense_params=mlp_params(spec.hidden_size, spec.ffn_hidden_size, spec.swiglu) / s.tp + 2.0 * spec.hidden_size + z,
        expert_params=z, delayed_wgrad_s=z)


def moe_block(ctx: Context) -> Cost:
    """Router, token dispatch (all-to-all over the EP group), routed experts, combine, shared experts.

    The busiest EP rank receives ``imbalance`` × the mean tokens: its expert GEMMs and its all-to-all
    set the pace of the layer (DeepSeek-V3 §3.2 on EP load balance)."""
    spec, hw, s = ctx.spec, ctx.hw, ctx.shapes
    h, f, E, k = spec.hidden_size, spec.expert_ffn, spec.num_experts, spec.moe_router_topk
    local_experts = E / s.ep + ctx.expert_replicas  # a copy is a full expert: weights, grads, its own GEMM
    tokens_per_device = s.routed * s.etp  # every ETP member processes its EP rank's tokens
    expert_fwd, expert_bwd, expert_act, cast_fwd, cast_bwd = _expert_parts(ctx, tokens_per_device, local_experts)
    expert_flops = 2.0 * s.routed * mlp_params(h, f, spec.swiglu)
    router = (gemm_s(s.tokens_moe, h, E, hw, False)
              + memory_bound_s(ROUTER_BYTES_PER_SCORE * s.tokens_moe * E, hw))
    permute = memory_bound_s(PERMUTE_BYTES * s.routed * h, hw)
    fs = spec.moe_shared_expert_intermediate_size
    if fs:
        sh_gemms, sh_act, sh_flops, (sh_cast_fwd, sh_cast_bwd) = _mlp_parts(ctx, fs, s.tokens, s.tp)
        sh_tp = _tp_pair_s(ctx, BF16_BYTES * s.tokens * h)
    else:
        sh_gemms = sh_act = sh_flops = sh_tp = sh_cast_fwd = sh_cast_bwd = np.zeros_like(permute)
    mem = memory_bound_s(_residual_and_norm_bytes(ctx), hw)
    gemms = expert_fwd + sh_gemms + router
    gemms_bwd = expert_bwd + BACKWARD_FACTOR * (sh_gemms + router)
    fwd = gemms + expert_act + sh_act + permute + mem + cast_fwd + sh_cast_fwd
    bwd = gemms_bwd + MEMORY_BOUND_BACKWARD_FACTOR * (expert_act + sh_act + permute + mem) + cast_bwd + sh_cast_bwd
    # Dispatch and combine: every device sends its tokens' top-k copies; the busiest rank's receive
    # side (imbalance × mean) sets the time. Expert-tensor parallelism adds an all-gather and a
    # reduce-scatter of the received tokens inside the ETP group.
    send_bytes = BF16_BYTES * s.tokens_moe * k * h * ctx.imbalance
    a2a = 2.0 * comm.expert_all_to_all_s(send_bytes, k, s.etp, s.ep, ctx.a2a_hierarchical, hw)
    a2a_nic = 2.0 * comm.expert_all_to_all_nic_s(send_bytes, k, s.etp, s.ep, ctx.a2a_hierarchical, hw)
    etp_comm = comm.all_reduce_s(BF16_BYTES * tokens_per_device * h, 1, s.etp, hw)
    drop_moe = ctx.drops("moe")
    selective = np.where(drop_moe, fwd, ctx.drops("moe_act") * expert_act
                         + ctx.drops("shared_experts") * (sh_gemms + sh_act + sh_cast_fwd)
                         + ctx.drops("layernorm") * memory_bound_s(NORM_BYTES * s.tokens_sp * h, hw))
    flops = expert_flops + sh_flops + 2.0 * s.tokens_moe * h * E
    selective_flops = np.where(drop_moe, flops, ctx.drops("shared_experts") * sh_flops)
    tp_comm = sh_tp + etp_comm
    z = np.zeros_like(fwd)
    router_and_shared = h * E + mlp_params(h, fs, spec.swiglu) / s.tp + 2.0 * h
    offload = memory.pre_mlp_offload_bytes(spec, s) + memory.moe_block_offload_bytes(spec, s)
    return Cost(
        fwd_s=fwd, bwd_s=bwd, gemm_fwd_s=gemms, gemm_bwd_s=gemms_bwd,
        selective_s=selective, tp_fwd_s=tp_comm, tp_bwd_s=tp_comm, cp_fwd_s=z, cp_bwd_s=z,
        ep_fwd_s=a2a, ep_bwd_s=a2a, ep_nic_s=a2a_nic, selective_cp_s=z, selective_ep_s=drop_moe * a2a,
        flops_fwd=flops, selective_flops=selective_flops,
        act_bytes=memory.pre_mlp_bytes(spec, s) + memory.moe_block_activation_bytes(spec, s),
        transient_bytes=memory.dispatch_buffer_bytes(spec, s) + offload, offload_bytes=offload + z,
        dense_params=router_and_shared + z,
        expert_params=local_experts * mlp_params(h, f, spec.swiglu) / s.etp + z, delayed_wgrad_s=z)


def _shared_attention_block(ctx: Context) -> Cost:
    """``attention_block(ctx)``, computed once per context: dense and MoE layers share it (never
    modified in place, as every Cost operation returns new arrays)."""
    cost = ctx.__dict__.get("_attention_block")
    if cost is None:
        cost = ctx.__dict__["_attention_block"] = attention_block(ctx)
    return cost


def dense_layer(ctx: Context) -> Cost:
    return _shared_attention_block(ctx) + dense_mlp_block(ctx)


def moe_layer(ctx: Context) -> Cost:
    return _shared_attention_block(ctx) + moe_block(ctx)


def embedding(ctx: Context) -> Cost:
    """Token embedding lookup on the first stage; with TP its output is reduce-scattered (SP) or all-reduced."""
    spec, s = ctx.spec, ctx.shapes
    n = len(s.tp)
    c = _zero_cost(n)
    c.fwd_s = memory_bound_s(BF16_BYTES * s.tokens * spec.hidden_size, ctx.hw)
    c.bwd_s = c.fwd_s.copy()
    c.tp_fwd_s = comm.all_gather_s(BF16_BYTES * s.tokens * spec.hidden_size, 1, s.tp, ctx.hw)
    c.dense_params = spec.vocab_size * spec.hidden_size / s.tp
    return c


def output_head(ctx: Context, holds_weights) -> Cost:
    """Final norm, vocabulary-parallel LM head (BF16 even in FP8 recipes: Megatron's output layer is not
    a Transformer Engine module) and cross-entropy, on the last stage."""
    spec, hw, s = ctx.spec, ctx.hw, ctx.shapes
    V, h = spec.vocab_size, spec.hidden_size
    gemm = gemm_s(s.tokens, h, V / s.tp, hw, False)
    ce = memory_bound_s(CROSS_ENTROPY_BYTES_PER_LOGIT * s.tokens * V / s.tp, hw)
    norm = memory_bound_s(NORM_BYTES * s.tokens_sp * h, hw)
    c = _zero_cost(len(s.tp))
    c.fwd_s = gemm + ce / 2 + norm
    c.bwd_s = BACKWARD_FACTOR * gemm + ce / 2 + MEMORY_BOUND_BACKWARD_FACTOR * norm
    c.gemm_fwd_s, c.gemm_bwd_s = gemm, BACKWARD_FACTOR * gemm
    c.tp_fwd_s = c.tp_bwd_s = comm.all_gather_s(BF16_BYTES * s.tokens * h, 1, s.tp, hw)
    c.flops_fwd = 2.0 * s.tokens * h * V / s.tp
    c.act_bytes = memory.logits_bytes(spec, s) + 2 * BF16_BYTES * s.tokens_sp * h
    c.dense_params = holds_weights * V * h / s.tp
    return c


def mtp_extra(ctx: Context) -> Cost:
    """What an MTP module adds to its decoder layer (DeepSeek-V3 §2.2): two norms, the 2h→h projection
    of [hidden; embedded next token], and a pass through the shared output head."""
    spec, s = ctx.spec, ctx.shapes
    h = spec.hidden_size
    proj = gemm_s(s.tokens, 2 * h, h / s.tp, ctx.hw, ctx.fp8)
    cast_fwd, cast_bwd = _fp8_cast_s(ctx, [(s.tokens, 2 * h, h / s.tp)])
    c = output_head(ctx, holds_weights=np.zeros(len(s.tp)))
    c.fwd_s = c.fwd_s + proj + cast_fwd
    c.bwd_s = c.bwd_s + BACKWARD_FACTOR * proj + cast_bwd
    c.gemm_fwd_s = c.gemm_fwd_s + proj
    c.gemm_bwd_s = c.gemm_bwd_s + BACKWARD_FACTOR * proj
    c.flops_fwd = c.flops_fwd + 4.0 * s.tokens * h * h / s.tp
    # The MTP logits live for one micro-batch, as the main head's: the stage's fixed memory counts
    # them (1 + mtp_num_layers logits tensors), so the per-micro-batch activations here leave them out.
    c.act_bytes = c.act_bytes - memory.logits_bytes(spec, s) + 2 * BF16_BYTES * s.tokens_sp * h
    c.dense_params = 2.0 * h * h / s.tp + 4.0 * h
    return c

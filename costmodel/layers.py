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
from .batch import DISPATCHER_ALLGATHER, DISPATCHER_ALLTOALL_SEQ, MODULE_BITS
from .compute import (BF16_BYTES, attention_core_bwd_s, attention_core_s, fp8_quantise_s, gemm_s, grouped_gemm_s,
                      grouped_weight_grad_s, memory_bound_s, unfused_attention_bwd_s, unfused_attention_fwd_s)
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
# Routing metadata the allgather dispatcher gathers with the tokens, per routed copy: the expert index
# (int64, torch.topk's) and its probability (the logits' dtype, bf16: core_r0.6.0 router.py
# ``torch.softmax(..., dtype=torch.float32).type_as(logits)``).
ROUTING_META_BYTES = 8 + BF16_BYTES
# The activation function as its composite's element-wise kernels (bias_activation_fusion off), in bytes
# moved per element of the ffn-wide output, forward: each unary kernel reads and writes one bf16 tensor
# (4 B), each binary one reads two (6 B). SiLU: F.silu (4); GELU (erf): F.gelu (4); GELU with the tanh
# approximation 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) (Hendrycks & Gimpel 2016; HF
# gelu_pytorch_tanh as its formula): x³, ·0.044715, ·√(2/π), tanh, 1 +, 0.5·x unary (6 × 4) and the
# two binary (x + …, the last product: 2 × 6) = 36 B in eight kernels; a gated (GLU) MLP adds the
# product with the up projection (6 B): nine kernels for GeGLU-tanh, as MindSpeed's
# path. Fused (Megatron's bias_swiglu / bias_gelu / bias_geglu jit kernels, MindSpeed --use-fused-swiglu):
# one pass, reading the fc1 output(s) and writing the fc2 input, as the cost model has always priced it.
UNFUSED_ACTIVATION_BYTES = {"silu": 2 * BF16_BYTES, "gelu": 2 * BF16_BYTES, "gelu_tanh": 6 * 2 * BF16_BYTES + 2 * 3 * BF16_BYTES}
GATE_PRODUCT_BYTES = 3 * BF16_BYTES
# Soft-capping cap·tanh(x/cap) as Gemma-2 writes it (HF modeling_gemma2: divide, tanh, multiply): three
# unary passes of 4 B per element (bf16), over the output logits or over unfused attention's scores.
SOFTCAP_BYTES = 3 * 2 * BF16_BYTES
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
    dispatcher: np.ndarray  # batch.DISPATCHER_CODES (moe_token_dispatcher_type; 0 = not stated: an all-to-all)
    cp_comm: np.ndarray  # batch.CP_COMM_CODES: 0 ring, 1 Ulysses all-to-all, 2 K/V all-gather, 3 both
    grad_accum_bytes: np.ndarray  # bytes per element of the main gradients (integer, main_grads_dtype)
    expert_replicas: np.ndarray  # extra expert slots per EP rank (copies of hot experts, routing.py)
    fp8_quant_bytes: np.ndarray  # bytes per element to quantise an FP8 GEMM operand (0 in BF16; compute.py)
    pad_v_head: np.ndarray  # the flash kernel computes V at the QK head dim (Hardware.fa_pads_v_head)

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
    core_fwd, core_bwd = _attention_core(ctx, core_flops * _padded_v_ratio(ctx), scores, ring)
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
        act_bytes=memory.attention_activation_bytes(spec, s),
        transient_bytes=offload + memory.unfused_transient_bytes(spec, s) + z,
        offload_bytes=offload + z,
        dense_params=params.sharded / tp + params.replicated + 2.0 * h + z, expert_params=z,
        # the weight-gradient half of the projections' backward (BACKWARD_FACTOR: dgrad + wgrad)
        delayed_wgrad_s=gemms + z)


def _padded_v_ratio(ctx: Context) -> np.ndarray:
    """Attention-core work the flash kernel does over what the model needs: MindSpeed-LLM's MLA pads V
    from v_head_dim to the QK head dim (192 for DeepSeek-V2/V3) where its flash path needs equal head
    dims, and slices the output back (modellink/core/transformer/multi_head_latent_attention.py at
    d58c5688, the ``F.pad(value, [0, q_head_dim - v_head_dim])`` branch of --shape-order BNSD, which the
    DeepSeek-V2 scripts pass; --mla-fa-without-pad, 2025, turns it off): the PV matmul, the output and
    their gradients run at (qk + qk)/(qk + v) of the unpadded work. The model FLOPs (MFU) stay unpadded."""
    spec = ctx.spec
    return np.where(ctx.pad_v_head, (2.0 * spec.qk_dim) / (spec.qk_dim + spec.v_dim), 1.0)


def _attention_core(ctx: Context, core_flops, scores, ring) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward time of the attention core by ``attention_kernel``: FlashAttention over
    ``ring`` calls, each sweeping s/ring keys (a ring step's K/V chunk; Ulysses and the K/V all-gather
    give each rank whole sequences of its heads), or the unfused path (``compute.unfused_attention_*``:
    s/cp queries of each micro-batch and local head against all s keys, unmasked)."""
    spec, hw, s = ctx.spec, ctx.hw, ctx.shapes
    seq = spec.seq_length
    capped = spec.attn_logit_softcapping is not None
    # Soft-capped scores (Gemma-2): FlashAttention applies cap·tanh(x/cap) to each score in its tile
    # (flash-attn >= 2.6 apply_softcap; FlashAttention-3's Has_softcap), a second special function per
    # score on the same units as the exponential, in the forward and again in the backward's recomputation.
    special = scores * (2.0 if capped else 1.0)
    flash_fwd = attention_core_s(core_flops, special, ring, hw, seq / ring)
    flash_bwd = attention_core_bwd_s(core_flops, special, ring, hw, seq / ring)
    if not s.unfused_attention.any():
        return flash_fwd, flash_bwd
    seq_q = seq / s.cp
    batch_heads = s.tokens / seq_q * spec.num_attention_heads / s.tp
    args = (seq_q, seq, spec.qk_dim, spec.v_dim, batch_heads, hw)
    # Unfused, the soft-cap is three more passes over the materialised scores (SOFTCAP_BYTES), backward twice.
    cap = memory_bound_s((SOFTCAP_BYTES if capped else 0.0) * seq_q * seq * batch_heads, hw)
    return (np.where(s.unfused_attention, unfused_attention_fwd_s(*args) + cap, flash_fwd),
            np.where(s.unfused_attention, unfused_attention_bwd_s(*args) + MEMORY_BOUND_BACKWARD_FACTOR * cap,
                     flash_bwd))


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


def activation_bytes(spec: ModelSpec, tokens, width) -> np.ndarray:
    """Bytes the activation function moves for ``tokens`` × ``width`` outputs (forward): one fused pass
    reading the fc1 output(s) and writing the fc2 input, or, with ``bias_activation_fusion`` off, its
    composite's element-wise kernels (``UNFUSED_ACTIVATION_BYTES``, plus the gate product when gated)."""
    if spec.bias_activation_fusion:
        return BF16_BYTES * tokens * width * (3 if spec.swiglu else 2)
    per_element = UNFUSED_ACTIVATION_BYTES[spec.activation] + (GATE_PRODUCT_BYTES if spec.swiglu else 0)
    return per_element * tokens * width


def _mlp_parts(ctx: Context, ffn: int, tokens, shard):
    """GEMM time, activation-function time, FLOPs and the FP8 casts (forward, backward) of an MLP of
    width ``ffn`` split ``shard`` ways."""
    hw, h = ctx.hw, ctx.spec.hidden_size
    fc1_width = (2 if ctx.spec.swiglu else 1) * ffn / shard
    shapes = [(tokens, h, fc1_width), (tokens, ffn / shard, h)]
    gemms = sum(gemm_s(m, k, n, hw, ctx.fp8) for m, k, n in shapes)
    flops = 2.0 * tokens * mlp_params(h, ffn, ctx.spec.swiglu) / shard
    return (gemms, memory_bound_s(activation_bytes(ctx.spec, tokens, ffn / shard), ctx.hw), flops,
            _fp8_cast_s(ctx, shapes))


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
    act = memory_bound_s(activation_bytes(ctx.spec, tokens, f / etp), hw)
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


def _allgather_group(ctx: Context) -> np.ndarray:
    """The allgather dispatcher's group: the tensor-and-expert-parallel ranks, etp·ep consecutive ranks
    (core_r0.6.0 ``get_tensor_and_expert_parallel_world_size``; etp = tp there)."""
    return ctx.shapes.etp * ctx.shapes.ep


def allgather_dispatch_s(ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    """One pass's dispatch and combine with the allgather dispatcher, and the NIC time of it.

    Megatron-Core core_r0.6.0 MoEAllGatherTokenDispatcher (megatron/core/transformer/moe/
    token_dispatcher.py): ``token_permutation`` all-gathers the hidden states [T_moe, h] of every rank of
    the etp·ep group (``gather_from_sequence_parallel_region_to_moe``), and the routing indices and
    probabilities with them, then keeps the rows routed to its local experts; ``token_unpermutation``
    scatter-adds the expert output into the gathered shape and reduce-scatters it back
    (``reduce_scatter_to_sequence_parallel_region_from_moe``). Every rank receives every token whatever the
    routing, so the volume does not grow with the load imbalance. The backward runs the transposes (the
    all-gather's gradient is a reduce-scatter and the reverse) of the same sizes."""
    s, hw, h, k = ctx.shapes, ctx.hw, ctx.spec.hidden_size, ctx.spec.moe_router_topk
    n = _allgather_group(ctx)
    hidden_bytes = BF16_BYTES * s.tokens_moe * h * n  # the gathered buffer (comm.all_gather_s: full size)
    meta_bytes = ROUTING_META_BYTES * s.tokens_moe * k * n
    t = comm.all_gather_s(hidden_bytes + meta_bytes, 1, n, hw) + comm.reduce_scatter_s(hidden_bytes, 1, n, hw)
    return t, np.where(comm.spans_domains(1, n, hw), t, 0.0)


def etp_dispatch_s(ctx: Context, tokens_per_device) -> np.ndarray:
    """The all-to-all dispatchers' expert-tensor-parallel step, one pass: the received tokens all-gathered
    over the etp group before the experts and the output reduce-scattered after them (Megatron-Core
    MoEAlltoAllTokenDispatcher ``gather_from_sequence_parallel_region`` / ``reduce_scatter_to_sequence_
    parallel_region`` over the expert-TP group). It belongs to the dispatcher, not to the linear layers:
    Transformer Engine's TP communication overlap (userbuffers, ``tp_comm_overlap``) never sees it, as
    Megatron-Core builds expert linears with ``parallel_mode=None`` ("The comms between TP and EP group is
    explicitly handled by MoE token dispatcher", megatron/core/extensions/transformer_engine.py, TELinear
    and TEGroupedLinear), and MindSpeed's MC2 does not cover the MoE MLP (MindSpeed megatron_patch.py:
    "MoE MLP not use mc2 linear"). Only the EP overlap (``moe_a2a_overlap``) hides it, with the dispatch."""
    s = ctx.shapes
    return comm.all_reduce_s(BF16_BYTES * tokens_per_device * ctx.spec.hidden_size, 1, s.etp, ctx.hw)


def sequence_a2a_dispatch_s(ctx: Context) -> np.ndarray:
    """The alltoall_seq dispatcher's extra step, one pass: the tokens re-split from sequence to hidden
    over tp before the EP all-to-all and back after the combine (core_r0.6.0 MoEAlltoAllTokenDispatcher,
    MindSpeed-LLM's alltoall_seq: ``all_to_all_sp2hp`` and ``all_to_all_hp2sp``): two all-to-alls in
    which each rank sends its T_moe·h hidden states spread over the tp group."""
    s = ctx.shapes
    return 2.0 * comm.all_to_all_s(BF16_BYTES * s.tokens_moe * ctx.spec.hidden_size, 1, s.tp, ctx.hw)


def permutation_rows(ctx: Context, tokens_per_device, local_experts) -> np.ndarray:
    """Token rows the permutation kernels read and write on one device, per pass, before and after the
    experts (``PERMUTE_BYTES`` each element, dispatch and combine).

    * all-to-all (alltoall, alltoall_seq; flat dispatch unstated): the rank's own tokens permuted into
      their T_moe·k copies before the all-to-all (``permute``), and, with more than one local expert, the
      received rows (× etp once all-gathered) sorted by expert (``sort_chunks_by_idxs``);
    * flex (DeepEP; hierarchical unstated): DeepEP's dispatch sends the tokens unpermuted, the received
      rows are permuted once;
    * allgather: two gathers of the local rows, out of the gathered buffer and into expert order
      (``torch.gather`` twice in ``token_permutation``), and their scatters back in the combine."""
    s = ctx.shapes
    own = s.tokens_moe * ctx.spec.moe_router_topk
    a2a = own + np.where(local_experts > 1, tokens_per_device, 0.0)
    flex = tokens_per_device
    allgather = 2.0 * tokens_per_device
    return np.where(ctx.dispatcher == DISPATCHER_ALLGATHER, allgather, np.where(ctx.a2a_hierarchical, flex, a2a))


def moe_block(ctx: Context) -> Cost:
    """Router, token dispatch (``moe_token_dispatcher_type``: an all-to-all over the EP group, or the
    allgather dispatcher's all-gather and reduce-scatter over etp·ep), routed experts, combine, shared
    experts.

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
    allgather = ctx.dispatcher == DISPATCHER_ALLGATHER
    permute = memory_bound_s(PERMUTE_BYTES * permutation_rows(ctx, tokens_per_device, local_experts) * h, hw)
    # The allgather dispatcher's combine scatter-adds into a zeroed buffer of the gathered shape: one write.
    permute = permute + allgather * memory_bound_s(BF16_BYTES * s.tokens_moe * _allgather_group(ctx) * h, hw)
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
    # Dispatch and combine: with an all-to-all every device sends its tokens' top-k copies and the busiest
    # rank's receive side (imbalance × mean) sets the time, plus the expert-TP gather and scatter of the
    # received tokens and, for alltoall_seq, its sequence/hidden re-split over tp; the allgather
    # dispatcher gathers and reduce-scatters every token of the etp·ep group instead.
    send_bytes = BF16_BYTES * s.tokens_moe * k * h * ctx.imbalance
    a2a = (2.0 * comm.expert_all_to_all_s(send_bytes, k, s.etp, s.ep, ctx.a2a_hierarchical, hw)
           + etp_dispatch_s(ctx, tokens_per_device)
           + (ctx.dispatcher == DISPATCHER_ALLTOALL_SEQ) * sequence_a2a_dispatch_s(ctx))
    a2a_nic = 2.0 * comm.expert_all_to_all_nic_s(send_bytes, k, s.etp, s.ep, ctx.a2a_hierarchical, hw)
    ag, ag_nic = allgather_dispatch_s(ctx)
    dispatch = np.where(allgather, ag, a2a)
    dispatch_nic = np.where(allgather, ag_nic, a2a_nic)
    drop_moe = ctx.drops("moe")
    selective = np.where(drop_moe, fwd, ctx.drops("moe_act") * expert_act
                         + ctx.drops("shared_experts") * (sh_gemms + sh_act + sh_cast_fwd)
                         + ctx.drops("layernorm") * memory_bound_s(NORM_BYTES * s.tokens_sp * h, hw))
    flops = expert_flops + sh_flops + 2.0 * s.tokens_moe * h * E
    selective_flops = np.where(drop_moe, flops, ctx.drops("shared_experts") * sh_flops)
    tp_comm = sh_tp  # the shared experts are dense tensor-parallel linears (TP overlap applies)
    z = np.zeros_like(fwd)
    router_and_shared = h * E + mlp_params(h, fs, spec.swiglu) / s.tp + 2.0 * h
    offload = memory.pre_mlp_offload_bytes(spec, s) + memory.moe_block_offload_bytes(spec, s)
    buffers = np.where(allgather, memory.allgather_dispatch_buffer_bytes(spec, s), memory.dispatch_buffer_bytes(spec, s))
    return Cost(
        fwd_s=fwd, bwd_s=bwd, gemm_fwd_s=gemms, gemm_bwd_s=gemms_bwd,
        selective_s=selective, tp_fwd_s=tp_comm, tp_bwd_s=tp_comm, cp_fwd_s=z, cp_bwd_s=z,
        ep_fwd_s=dispatch, ep_bwd_s=dispatch, ep_nic_s=dispatch_nic, selective_cp_s=z,
        selective_ep_s=drop_moe * dispatch,
        flops_fwd=flops, selective_flops=selective_flops,
        act_bytes=memory.pre_mlp_bytes(spec, s) + memory.moe_block_activation_bytes(spec, s),
        transient_bytes=buffers + offload, offload_bytes=offload + z,
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
    softcap = memory_bound_s(_logit_softcap_bytes(spec) * s.tokens * V / s.tp, hw)
    norm = memory_bound_s(NORM_BYTES * s.tokens_sp * h, hw)
    c = _zero_cost(len(s.tp))
    c.fwd_s = gemm + ce / 2 + softcap + norm
    c.bwd_s = BACKWARD_FACTOR * gemm + ce / 2 + MEMORY_BOUND_BACKWARD_FACTOR * (softcap + norm)
    c.gemm_fwd_s, c.gemm_bwd_s = gemm, BACKWARD_FACTOR * gemm
    c.tp_fwd_s = c.tp_bwd_s = comm.all_gather_s(BF16_BYTES * s.tokens * h, 1, s.tp, hw)
    c.flops_fwd = 2.0 * s.tokens * h * V / s.tp
    c.act_bytes = memory.logits_bytes(spec, s) + 2 * BF16_BYTES * s.tokens_sp * h
    c.dense_params = holds_weights * V * h / s.tp
    return c


def _logit_softcap_bytes(spec: ModelSpec) -> float:
    """Bytes per output logit of ``final_logit_softcapping`` (forward; the backward moves twice that)."""
    return SOFTCAP_BYTES if spec.final_logit_softcapping else 0.0


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

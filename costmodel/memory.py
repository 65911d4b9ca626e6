"""Memory per device: weights, gradients, optimizer states and stored activations.

Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
Models", §4) term by term, with FlashAttention (no s² score or softmax tensor is stored, only Q, K, V,
the output and the row statistics) and dropout-free layers (no masks). With sequence parallelism the
norm and residual tensors are split over tp; everything is split over cp; recompute modules drop the
tensors they recompute (Megatron-Core's ``--recompute-modules``). Sizes are bytes per device for one
micro-batch, arrays one entry per config.

With FP8 matmuls, Transformer Engine keeps the FP8 cast of each GEMM input for the weight gradient
(1 byte per element) instead of the BF16 tensor; tensors other kernels need (FlashAttention's Q, K, V
and output, the norm inputs, fc1 outputs) stay BF16.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .batch import MODULE_BITS, OFFLOAD_BITS
from .spec import ModelSpec

BF16 = 2
FP32 = 4
# Mixed-precision Adam (Megatron-LM distributed optimizer doc, "Distributed Optimizer" table):
# bf16 weights (2) + fp32 main gradients (4) per parameter, and fp32 master weights, momentum and
# variance (12) per parameter, the 12 sharded over the data-parallel group with the distributed optimizer.
WEIGHT_BYTES = BF16
GRAD_BYTES = FP32
OPTIMIZER_BYTES = 12
# Bytes stored per attention score by unfused attention (Korthikanti et al. 2022 §4.1: softmax output 2,
# dropout mask 1, dropout output 2: 5as²b)
UNFUSED_SCORE_BYTES = 2 * BF16 + 1


@dataclass
class Shapes:
    """Per-config sizes shared by the formulas (arrays of shape (N,))."""

    tokens: np.ndarray  # tokens in a micro-batch on one device's GEMMs: mbs · seq / cp
    tokens_sp: np.ndarray  # tokens of the norm/residual stream per device: tokens / tp with SP
    tokens_moe: np.ndarray  # tokens entering the MoE block per device (sequence-parallel shard)
    routed: np.ndarray  # routed token copies the busiest device's experts process: tokens_moe·topk·imbalance
    routed_mean: np.ndarray  # the mean over EP ranks: tokens_moe·topk
    tp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    modules: np.ndarray  # recompute module bit mask, 0 unless recompute is selective
    gemm_input_bytes: np.ndarray  # bytes per stored GEMM-input element: 1 with FP8, else 2
    offload: np.ndarray | int = 0  # offloaded module bit mask (batch.OFFLOAD_BITS), 0: none
    seq_kv: np.ndarray | float = 0.0  # keys each query attends to (the whole sequence); 0: not needed
    unfused_attention: np.ndarray | bool = False  # attention_kernel unfused: the s x s scores are stored
    # bytes per stored element of the activation function's input (the fc1 output): 1 with Megatron's
    # --activation-func-fp8-input-store (SwiGLU), else 2 (``act_input_bytes``)
    act_input_bytes: np.ndarray | float = BF16


def act_input_bytes(spec: ModelSpec, fp8_input_store) -> np.ndarray:
    """Bytes per stored element of the SwiGLU input: Megatron-Core's activation_func_fp8_input_store
    keeps it in FP8 (1 B) for the backward and casts it back there (transformer_config.py: "Store the
    input of MLP activation function in FP8 for backprop to save memory"; SwiGLU only, elsewhere the flag
    is refused: TransformerConfig raises); DeepSeek-V3 §3.3.3 caches the MoE SwiGLU inputs in FP8 too."""
    return np.where(np.asarray(fp8_input_store) & spec.swiglu, 1.0, float(BF16))

def _drops(shapes: Shapes, module: str) -> np.ndarray:
    return (shapes.modules & MODULE_BITS[module]) != 0


def _offloads(shapes: Shapes, module: str) -> np.ndarray:
    return (shapes.offload & OFFLOAD_BITS[module]) != 0


def _on_device(s: Shapes, tensors: list) -> np.ndarray:
    """Bytes of ``(offload module or None, bytes)`` tensors that stay in device memory."""
    return sum(x if m is None else x * ~_offloads(s, m) for m, x in tensors)


def _on_host(s: Shapes, tensors: list) -> np.ndarray:
    """Bytes of ``(offload module or None, bytes)`` tensors offloaded to host memory."""
    return sum(x * _offloads(s, m) for m, x in tensors if m is not None) + 0.0 * s.tokens


def _once_per_shapes(tensors):
    """``tensors(spec, s)`` computed once per Shapes ``s`` and model: a block's stored-tensor list is read
    by both its device and its host (offload) accounting, and by each layer kind that has the block."""
    @functools.wraps(tensors)
    def once(spec: ModelSpec, s: Shapes) -> list:
        memo = s.__dict__.setdefault("_tensor_lists", {})
        key = (tensors, id(spec))
        if key not in memo or memo[key][0] is not spec:
            memo[key] = (spec, tensors(spec, s))
        return memo[key][1]
    return once


@_once_per_shapes
def _attention_tensors(spec: ModelSpec, s: Shapes) -> list:
    """Stored tensors of one layer's input norm, projections and FlashAttention, each with the
    Megatron offload module whose input it is (``--offload-modules``; None: not offloadable)."""
    h, a = spec.hidden_size, spec.num_attention_heads
    T, Tsp, tp = s.tokens, s.tokens_sp, s.tp
    keep_norm_out = ~_drops(s, "layernorm")
    tensors = [("attn_norm", BF16 * Tsp * h),  # layer input (norm input), always kept
               ("qkv_linear", keep_norm_out * s.gemm_input_bytes * Tsp * h)]  # norm output = QKV GEMM input
    lse = FP32 * T * a / tp  # softmax row statistics FlashAttention keeps
    if spec.multi_latent_attention:
        rope = spec.qk_pos_emb_head_dim or 0
        q_lora = spec.q_lora_rank or 0
        # Down-projection outputs: Megatron-Core runs the down-projections on the sequence-parallel
        # shard (tokens / tp with SP) and all-gathers the latents only for the up-projections.
        latents = BF16 * Tsp * (q_lora + spec.kv_lora_rank + rope)
        latent_norm_out = keep_norm_out * s.gemm_input_bytes * T * (q_lora + spec.kv_lora_rank)
        qkv = BF16 * T * a / tp * (2 * (spec.qk_head_dim + rope) + spec.v_head_dim)
        qkv = qkv * ~_drops(s, "mla_up_proj")
        out = BF16 * T * a / tp * spec.v_head_dim
        tensors += [("qkv_linear", latents + latent_norm_out)]
    else:
        d, g = spec.head_dim, spec.query_groups
        qkv = BF16 * T * (a + 2 * g) * d / tp
        out = BF16 * T * a * d / tp
    # FlashAttention saves Q, K, V, its output and the row statistics; the output is linear_proj's input.
    # Unfused attention keeps Q, K, V and the output too, and instead of the statistics the s x s tensors
    # (unfused_scores_bytes); not offloadable (Megatron offloads core_attn's inputs only).
    unfused = np.asarray(s.unfused_attention)
    return tensors + [("core_attn", qkv + np.where(unfused, 0.0, lse)), ("attn_proj", out),
                      (None, np.where(unfused, unfused_scores_bytes(spec, s), 0.0))]


def unfused_scores_bytes(spec: ModelSpec, s: Shapes) -> np.ndarray:
    """What unfused attention stores per layer and micro-batch beyond FlashAttention's tensors: the
    softmax output (2 B), the attention-dropout mask (1 B) and the dropout output (2 B) per score,
    Korthikanti et al. 2022 Eq. 1-2's 5·a·s²·b/t (here s/cp queries against s keys, a/tp heads);
    selective recompute of ``core_attn`` drops exactly these (their §5, "selective activation
    recomputation")."""
    return ~_drops(s, "core_attn") * UNFUSED_SCORE_BYTES * _unfused_scores(spec, s)


def _unfused_scores(spec: ModelSpec, s: Shapes) -> np.ndarray:
    return s.tokens * s.seq_kv * spec.num_attention_heads / s.tp


def unfused_transient_bytes(spec: ModelSpec, s: Shapes) -> np.ndarray:
    """Score tensors of unfused attention alive only while its layer runs: the raw QK^T output (2 B per
    score, freed once the softmax has read it), and, where ``core_attn`` is recomputed, the 5 B per
    score the recomputation rebuilds for the backward. 0 with FlashAttention."""
    rebuilt = _drops(s, "core_attn") * UNFUSED_SCORE_BYTES
    return np.where(s.unfused_attention, (BF16 + rebuilt) * _unfused_scores(spec, s), 0.0)


def attention_activation_bytes(spec: ModelSpec, s: Shapes) -> np.ndarray:
    """Input norm, projections and FlashAttention tensors of one layer kept in device memory."""
    return _on_device(s, _attention_tensors(spec, s))


def attention_offload_bytes(spec: ModelSpec, s: Shapes) -> np.ndarray:
    """The attention tensors of one layer offloaded to host memory (``offload_modules``)."""
    return _on_host(s, _attention_tensors(spec, s))


def mlp_activation_bytes(ffn: int, spec: ModelSpec, T, tp, dropped, gemm_input_bytes,
                         fc1_out_bytes=BF16) -> np.ndarray:
    """A tensor-parallel MLP's internals: fc1 output(s) (``fc1_out_bytes`` per element: the activation
    function's input, ``act_input_bytes``) and the activation output (fc2 input)."""
    fc1_out = (2 if spec.swiglu else 1) * ffn
    return ~dropped * T * (fc1_out_bytes * fc1_out + gemm_input_bytes * ffn) / tp


@_once_per_shapes
def _pre_mlp_tensors(spec: ModelSpec, s: Shapes) -> list:
    keep_norm_out = ~_drops(s, "layernorm")
    return [("mlp_norm", BF16 * s.tokens_sp * spec.hidden_size),
            (None, keep_norm_out * s.gemm_input_bytes * s.tokens_sp * spec.hidden_size)]


def pre_mlp_bytes(spec: ModelSpec, s: Shapes) -> np.ndarray:
    """Residual stream after attention (second norm input) and the second norm's output, on device."""
    return _on_device(s, _pre_mlp_tensors(spec, s))


def pre_mlp_offload_bytes(spec: ModelSpec, s: Shapes) -> np.ndarray:
    """The pre-MLP norm's input offloaded to host memory (``mlp_norm``)."""
    return _on_host(s, _pre_mlp_tensors(spec, s))


def dense_layer_activation_bytes(spec: ModelSpec, s: Shapes) -> np.ndarray:
    return (attention_activation_bytes(spec, s) + pre_mlp_bytes(spec, s)
            + mlp_activation_bytes(spec.ffn_hidden_size, spec, s.tokens, s.tp, _drops(s, "mlp"),
                                   s.gemm_input_bytes, s.act_input_bytes))


@_once_per_shapes
def _moe_block_tensors(spec: ModelSpec, s: Shapes) -> list:
    """Router scores, permuted expert inputs, expert internals and shared experts."""
    h, f = spec.hidden_size, spec.expert_ffn
    drop_moe = _drops(s, "moe")
    router = FP32 * 2 * s.tokens_moe * spec.num_experts  # logits and probabilities
    # Stored activations follow the mean load: which EP rank is busiest changes from layer to layer and
    # micro-batch to micro-batch, so the imbalance does not compound over the layers in flight; only the
    # transient dispatch buffers of the layer running now see the busiest rank's load.
    routed = s.routed_mean
    expert_in = s.gemm_input_bytes * routed * s.etp * h  # etp members all hold their EP rank's tokens
    fc1_out = s.act_input_bytes * routed * (2 if spec.swiglu else 1) * f
    act_out = ~_drops(s, "moe_act") * s.gemm_input_bytes * routed * f
    shared = mlp_activation_bytes(spec.moe_shared_expert_intermediate_size, spec, s.tokens, s.tp,
                                  _drops(s, "shared_experts") | drop_moe, s.gemm_input_bytes, s.act_input_bytes)
    # No combine input: Megatron-Core multiplies the routing probabilities inside the expert activation
    # (weighted SwiGLU), so un-permutation keeps no copy of the expert output. The expert fc1's input
    # and the activation function's input (the fc1 output) are Megatron's expert_fc1 and moe_act offloads.
    keep = ~drop_moe
    return [(None, keep * (router + act_out) + shared), ("expert_fc1", keep * expert_in),
            ("moe_act", keep * fc1_out)]


def moe_block_activation_bytes(spec: ModelSpec, s: Shapes) -> np.ndarray:
    """The MoE block's stored tensors kept in device memory."""
    return _on_device(s, _moe_block_tensors(spec, s))


def moe_block_offload_bytes(spec: ModelSpec, s: Shapes) -> np.ndarray:
    """The MoE block's tensors offloaded to host memory (``expert_fc1``, ``moe_act``)."""
    return _on_host(s, _moe_block_tensors(spec, s))


def moe_layer_activation_bytes(spec: ModelSpec, s: Shapes) -> np.ndarray:
    return attention_activation_bytes(spec, s) + pre_mlp_bytes(spec, s) + moe_block_activation_bytes(spec, s)


def full_recompute_layer_bytes(spec: ModelSpec, s: Shapes) -> np.ndarray:
    """A fully recomputed layer keeps only its input (Korthikanti et al. 2022 §4.2: 2sbh/t with SP)."""
    return BF16 * s.tokens_sp * spec.hidden_size


def dispatch_buffer_bytes(spec: ModelSpec, s: Shapes) -> np.ndarray:
    """All-to-all send and receive buffers of the MoE layer in flight (transient)."""
    return 2 * BF16 * s.routed * spec.hidden_size


def allgather_dispatch_buffer_bytes(spec: ModelSpec, s: Shapes) -> np.ndarray:
    """The allgather dispatcher's transient buffers in the MoE layer in flight: the hidden states gathered
    from the etp·ep group (``global_hidden_states``, [T_moe·etp·ep, h]; in the combine the zeroed buffer of
    the same shape that the expert output is scatter-added into before the reduce-scatter) beside the
    busiest rank's local rows and their expert-ordered copy (core_r0.6.0 MoEAllGatherTokenDispatcher)."""
    h = spec.hidden_size
    return BF16 * h * (s.tokens_moe * s.etp * s.ep + 2 * s.routed * s.etp)


def logits_bytes(spec: ModelSpec, s: Shapes) -> np.ndarray:
    """fp32 logits of the vocabulary-parallel cross-entropy (Korthikanti et al. 2022: 4sbv/t)."""
    return FP32 * s.tokens * spec.vocab_size / s.tp


# An fp32 copy of every parameter for a parameter EMA kept on the device (DeepSeek-V3 §3.2.3 keeps it in
# CPU memory instead, updated asynchronously after each step: nothing on the device).
EMA_BYTES = FP32


def ema_bytes(dense_params, expert_params, ema_code) -> np.ndarray:
    """Device bytes of a parameter EMA (``parameter_ema``, batch.EMA_CODES): 4 B per parameter the device
    holds (NeMo's EMA keeps a full-precision copy of each rank's parameters, not sharded over data
    parallelism) when it is on the device; nothing without one or when it is in host memory."""
    return EMA_BYTES * (dense_params + expert_params) * (np.asarray(ema_code) == 1)


def model_state_bytes(dense_params, expert_params, dense_shard, expert_shard, sharding,
                      grad_bytes=GRAD_BYTES, optimizer_bytes=OPTIMIZER_BYTES):
    """Weights, gradients and optimizer states (bytes).

    Megatron-LM's defaults are bf16 weights (2 B), fp32 main gradients (4 B) and fp32 master weights
    plus Adam's two moments (12 B) per parameter; ``grad_bytes`` and ``optimizer_bytes`` change them
    (Megatron-Core's precision-aware optimizer; NeMo's distributed fused Adam: bf16 gradients and
    2-byte param remainders, 2 + 2 + 10/d). ``sharding`` (``batch.SHARDING_CODES``; True/False read as
    the distributed optimizer on/off) divides them over the data-parallel group (dp·cp for dense
    weights, expert-data-parallel for experts): the optimizer states from ``optim`` (ZeRO-1, the
    distributed optimizer), the gradients from ``optim_grads`` (ZeRO-2), the weights too from
    ``optim_grads_params`` (ZeRO-3 / FSDP)."""
    stage = np.asarray(sharding, dtype=np.int64)

    def sharded(per_param_bytes, from_stage):
        on = stage >= from_stage
        return per_param_bytes * (dense_params / np.where(on, dense_shard, 1)
                                  + expert_params / np.where(on, expert_shard, 1))

    return sharded(WEIGHT_BYTES, 3), sharded(grad_bytes, 2), sharded(optimizer_bytes, 1)

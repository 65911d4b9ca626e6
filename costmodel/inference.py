"""Inference (rollout) costs: KV-cache memory, prefill and decode of one engine instance.

The rollout half of RL planning: a rollout engine instance (vLLM / vLLM-Ascend) spans ``tp``
devices; dense weights and attention heads are split over them, a MoE model's experts too (expert
parallel inside the instance: ``--enable-expert-parallel``, EP = TP). Arrays are per instance config,
broadcast together; sizes bytes, times seconds.

- **KV cache** per token: GQA keeps K and V of every query group, 2 · g · d per layer, the groups split
  over tp and replicated where tp > g (vLLM's KV-head replication); MLA keeps one compressed latent
  and the decoupled RoPE key, kv_lora_rank + rope dims per layer (DeepSeek-V2 §2.1.2, Table 1),
  which every tp rank holds whole (the latent is not split by head).
- **Prefill** is compute-bound: the forward matmuls (2 × active weights per token, the training
  FLOP count's forward third) plus causal attention over the prompt.
- **Decode** is memory-bound: each step reads the device's weights (for MoE, the experts the batch
  touches) and every sequence's KV cache, with the matmuls' compute as the floor, and pays two TP
  all-reduces per layer (row-parallel outputs, Shoeybi et al. 2019; vLLM's FusedMoE reduces the
  experts' outputs with one all-reduce too, with or without expert parallelism inside the instance).

- **Expert parallelism inside the instance** (``ep = tp``, vLLM's ``--enable-expert-parallel``): whole
  experts on each rank instead of every expert split over tp; the MoE layers' output all-reduce is
  replaced by a dispatch and a combine all-to-all of each rank's tokens' top-k copies (``_ep_comm_s``);
  attention and dense layers keep their all-reduces.

Not yet modelled: expert parallelism across instances (DeepEP-style decode), pipeline parallelism in
the engine, speculative decoding, and the prefix cache.
"""

from __future__ import annotations

import numpy as np

from . import comm
from .flops import attention_params, dense_layer_matmul_params, moe_layer_active_matmul_params, total_params
from .hardware import Hardware
from .spec import ModelSpec

BF16_BYTES = 2


def kv_bytes_per_token(spec: ModelSpec, tp, kv_bytes: float = BF16_BYTES) -> np.ndarray:
    """KV-cache bytes one token of context holds on one device of a ``tp``-wide instance, all layers."""
    tp = np.asarray(tp)
    if spec.multi_latent_attention:
        per_layer = (spec.kv_lora_rank + (spec.qk_pos_emb_head_dim or 0)) * kv_bytes + 0 * tp
    else:
        groups_per_rank = np.ceil(spec.query_groups / tp)
        per_layer = 2 * groups_per_rank * spec.head_dim * kv_bytes
    return spec.num_layers * per_layer


def full_weight_bytes(spec: ModelSpec, weight_bytes: float = BF16_BYTES) -> float:
    """Bytes of the whole unsharded model (every parameter once)."""
    return float(weight_bytes * total_params(spec))


def hf_tensor_count(spec: ModelSpec) -> int:
    """Weight tensors of the model in its Hugging Face layout, the unit a refit exports, sends and
    loads one by one: every routed expert's projections separately (3 with SwiGLU, else 2), per layer
    the attention projections (7 for MLA: q_a, q_a_norm, q_b, kv_a, kv_a_norm, kv_b, o; else q, k, v,
    o, plus q/k norms where present), two layer norms, the dense MLP or the router and shared expert,
    and the embedding, final norm and output head. DeepSeek-V3: 45,337 (NeMo-RL counts 45,395 loaded
    per vLLM rank)."""
    n_dense, n_moe = _layer_counts(spec)
    mlp = 3 if spec.swiglu else 2
    attn = 7 if spec.multi_latent_attention else 4 + (2 if spec.qk_layernorm else 0)
    per_layer = attn + 2
    moe = (1 + spec.num_experts * mlp + (mlp if spec.moe_shared_expert_intermediate_size else 0)) if n_moe else 0
    head = 3 if spec.untie_embeddings_and_output_weights else 2
    return int(spec.num_layers * per_layer + n_dense * mlp + n_moe * moe + head)


def weight_bytes_per_device(spec: ModelSpec, tp, weight_bytes: float = BF16_BYTES) -> np.ndarray:
    """Weights one device of a ``tp``-wide instance holds: everything split over tp except MLA's
    latent down-projections, which every rank keeps whole (as in training, ``flops.attention_params``)."""
    tp = np.asarray(tp)
    replicated = attention_params(spec).replicated * spec.num_layers
    return weight_bytes * ((total_params(spec) - replicated) / tp + replicated)


def _layer_counts(spec: ModelSpec) -> tuple[int, int]:
    n_moe = sum(spec.moe_layer_pattern())
    return spec.num_layers - n_moe, n_moe


def active_params_per_token(spec: ModelSpec) -> float:
    """Matmul weights one token passes through in the forward (the output head included)."""
    n_dense, n_moe = _layer_counts(spec)
    params = n_dense * dense_layer_matmul_params(spec) + spec.vocab_size * spec.hidden_size
    if n_moe:
        params += n_moe * moe_layer_active_matmul_params(spec)
    return float(params)


def experts_touched(spec: ModelSpec, tokens) -> np.ndarray:
    """Expected distinct experts of one MoE layer that ``tokens`` tokens route to (top-k each, uniform
    routing): E · (1 − (1 − k/E)^tokens). Decode reads only those experts' weights."""
    e, k = spec.num_experts, spec.moe_router_topk
    return e * (1.0 - (1.0 - k / e) ** np.asarray(tokens, dtype=np.float64))


def _expert_bytes(spec: ModelSpec, weight_bytes: float) -> float:
    return weight_bytes * (3 if spec.swiglu else 2) * spec.hidden_size * spec.expert_ffn


def decode_weight_read_bytes(spec: ModelSpec, tp, batch, weight_bytes: float = BF16_BYTES) -> np.ndarray:
    """Weight bytes one device reads in one decode step of ``batch`` sequences: all of its weights
    for a dense model; for MoE, all but the routed experts, and of those only the ones the batch
    touches (each device holds E/tp of them)."""
    held = weight_bytes_per_device(spec, tp, weight_bytes)
    if not spec.is_moe:
        return held + 0 * np.asarray(batch)
    _, n_moe = _layer_counts(spec)
    all_experts = n_moe * spec.num_experts * _expert_bytes(spec, weight_bytes) / np.asarray(tp)
    touched = n_moe * experts_touched(spec, batch) * _expert_bytes(spec, weight_bytes) / np.asarray(tp)
    return held - all_experts + touched


def attention_flops(spec: ModelSpec, queries, context) -> np.ndarray:
    """Forward FLOPs of the score and value products of ``queries`` query tokens attending to
    ``context`` keys each, all layers: 2 · heads · (qk + v) per query and key."""
    return (2.0 * spec.num_attention_heads * (spec.qk_dim + spec.v_dim) * spec.num_layers
            * np.asarray(queries, dtype=np.float64) * np.asarray(context, dtype=np.float64))


def _tp_comm_s(spec: ModelSpec, hw: Hardware, tp, tokens, ep=1) -> np.ndarray:
    """Two all-reduces of the hidden states per layer (attention and MLP outputs), each ``tokens``·h
    in bf16, over the instance's tp ranks (adjacent: stride 1). With expert parallelism (ep > 1) the
    MoE layers' MLP all-reduce gives way to ``_ep_comm_s``."""
    nbytes = BF16_BYTES * spec.hidden_size * np.asarray(tokens, dtype=np.float64)
    per = small_all_reduce_s(nbytes, np.asarray(tp), hw)
    _, n_moe = _layer_counts(spec)
    per_layer = np.where(np.asarray(ep) > 1, 2 * spec.num_layers - n_moe, 2 * spec.num_layers)
    return per_layer * np.where(np.asarray(tp) > 1, per, 0.0) + _ep_comm_s(spec, hw, ep, tokens)


def small_all_reduce_s(nbytes, size, hw: Hardware) -> np.ndarray:
    """All-reduce of an engine's activations over ``size`` adjacent ranks: a ring's bandwidth term
    (2(n−1)/n of the buffer) with a tree's latency, 2·ceil(log2 n) steps. Decode buffers are a few
    hundred KiB, where NCCL picks its tree / low-latency protocols and vLLM its one-shot custom
    all-reduce inside a node (vllm/distributed/device_communicators/custom_all_reduce.py) rather than
    the 2(n−1) steps of a ring (``comm.all_reduce_s``, the training collectives' model)."""
    size = np.asarray(size)
    bw, lat = comm.group_bus_bandwidth(1, size, hw)
    n = np.maximum(size, 1)
    steps = 2 * np.ceil(np.log2(n))
    return np.where(size > 1, 2.0 * (n - 1) / n * nbytes / bw + steps * lat, 0.0)


def _ep_comm_s(spec: ModelSpec, hw: Hardware, ep, tokens) -> np.ndarray:
    """Dispatch and combine all-to-alls of every MoE layer with ``ep`` expert-parallel ranks: each rank
    sends its 1/ep of the ``tokens`` as top-k bf16 copies of h (Megatron's and vLLM's all-to-all
    token dispatcher); 0 where ep = 1."""
    ep = np.asarray(ep)
    if not spec.is_moe:
        return 0.0 * ep * np.asarray(tokens, dtype=np.float64)
    _, n_moe = _layer_counts(spec)
    send = (BF16_BYTES * spec.hidden_size * spec.moe_router_topk * np.asarray(tokens, dtype=np.float64)
            / np.maximum(ep, 1))
    return 2 * n_moe * np.where(ep > 1, comm.all_to_all_s(send, 1, ep, hw), 0.0)


def prefill_s(spec: ModelSpec, hw: Hardware, tp, prompts, prompt_len, ep=1) -> np.ndarray:
    """Time for one instance to prefill ``prompts`` prompts of ``prompt_len`` tokens: the forward
    matmuls and causal attention at the large-GEMM efficiency of the profile, split over tp, plus
    the TP all-reduces."""
    tokens = np.asarray(prompts, dtype=np.float64) * prompt_len
    matmul = 2.0 * active_params_per_token(spec) * tokens
    attn = attention_flops(spec, tokens, prompt_len / 2.0)  # causal: each query sees half on average
    compute = matmul / (np.asarray(tp) * hw.peak_bf16_flops * hw.gemm_eff_max) \
        + attn / (np.asarray(tp) * hw.peak_bf16_flops * hw.attn_eff)
    return compute + _tp_comm_s(spec, hw, tp, tokens, ep)


def decode_step_s(spec: ModelSpec, hw: Hardware, tp, batch, context, ep=1) -> np.ndarray:
    """One decode step of ``batch`` sequences with ``context`` tokens of context each: the slower of
    reading weights and KV cache from HBM and the matmuls' compute, plus per-layer launch overhead
    (one forward pass) and the TP all-reduces."""
    batch = np.asarray(batch, dtype=np.float64)
    read = decode_weight_read_bytes(spec, tp, batch) + batch * context * kv_bytes_per_token(spec, tp)
    memory = read / hw.hbm_bytes_per_s
    flops = 2.0 * active_params_per_token(spec) * batch + attention_flops(spec, batch, context)
    compute = flops / (np.asarray(tp) * hw.peak_bf16_flops * hw.gemm_eff_max)
    return (np.maximum(memory, compute) + spec.num_layers * hw.layer_overhead_s
            + _tp_comm_s(spec, hw, tp, batch, ep))


def max_decode_batch(spec: ModelSpec, hw: Hardware, tp, context, memory_fraction: float = 0.9,
                     reserved_bytes=0.0) -> np.ndarray:
    """Most sequences of ``context`` tokens one instance keeps in flight: the KV cache fills what
    ``memory_fraction`` of each device (vLLM's ``--gpu-memory-utilization``) leaves after the weights,
    the framework's overhead and ``reserved_bytes`` per device (a co-located trainer's states kept on
    the device). 0 where the weights alone do not fit."""
    room = (hw.memory_bytes * memory_fraction - weight_bytes_per_device(spec, tp) - hw.framework_overhead_bytes
            - np.asarray(reserved_bytes, dtype=np.float64))
    per_seq = kv_bytes_per_token(spec, tp) * context
    return np.maximum(np.floor(room / per_seq), 0.0)

"""Parameter counts and FLOPs of the model's matmuls, per token, whole model (no parallelism).

Forward FLOPs of a matmul are 2 × its parameters per token; backward is twice the forward
(Narayanan et al. SC21 §5.1: "3 × forward"). Causal attention's score and value products cost
2·s·heads·(qk + v) per token forward with a full mask, half of that causal; the contract counts
3 · s · heads · (qk + v) per layer forward+backward.
"""

from __future__ import annotations

from dataclasses import dataclass

from .spec import ModelSpec


def mlp_params(hidden: int, ffn: int, swiglu: bool) -> int:
    """SwiGLU has gate, up and down matrices; a plain MLP has up and down."""
    return (3 if swiglu else 2) * hidden * ffn


@dataclass(frozen=True)
class AttentionParams:
    """Attention projection weights, split by how tensor parallelism shards them."""

    sharded: int  # split over tp (column/row parallel)
    replicated: int  # MLA down-projections: duplicated on every tp rank in Megatron-Core


def attention_params(spec: ModelSpec) -> AttentionParams:
    h, a = spec.hidden_size, spec.num_attention_heads
    if not spec.multi_latent_attention:
        d, g = spec.head_dim, spec.query_groups
        return AttentionParams(sharded=h * a * d + 2 * h * g * d + a * d * h, replicated=0)
    # MLA (DeepSeek-V2 §2.1, DeepSeek-V3 §2.1.1): latent down-projections, per-head up-projections.
    rope, qk, v = spec.qk_pos_emb_head_dim or 0, spec.qk_head_dim, spec.v_head_dim
    q_lora, kv_lora = spec.q_lora_rank, spec.kv_lora_rank
    replicated = h * (kv_lora + rope)
    if q_lora:
        replicated += h * q_lora
        sharded = q_lora * a * (qk + rope)
    else:
        sharded = h * a * (qk + rope)
    sharded += kv_lora * a * (qk + v) + a * v * h
    return AttentionParams(sharded=sharded, replicated=replicated)


def mla_up_proj_params(spec: ModelSpec) -> int:
    """The per-head up-projections that the ``mla_up_proj`` recompute module repeats."""
    if not spec.multi_latent_attention:
        return 0
    a, rope = spec.num_attention_heads, spec.qk_pos_emb_head_dim or 0
    q_in = spec.q_lora_rank or spec.hidden_size
    return q_in * a * (spec.qk_head_dim + rope) + spec.kv_lora_rank * a * (spec.qk_head_dim + spec.v_head_dim)


def attention_core_flops_per_token(spec: ModelSpec) -> float:
    """Forward FLOPs of the causal score and value products per token and layer."""
    return spec.seq_length * spec.num_attention_heads * (spec.qk_dim + spec.v_dim)


def dense_layer_matmul_params(spec: ModelSpec) -> int:
    att = attention_params(spec)
    return att.sharded + att.replicated + mlp_params(spec.hidden_size, spec.ffn_hidden_size, spec.swiglu)


def moe_layer_active_matmul_params(spec: ModelSpec) -> int:
    """Matmul weights one token passes through in a MoE layer: attention, router, top-k and shared experts."""
    att = attention_params(spec)
    h = spec.hidden_size
    return (att.sharded + att.replicated + h * spec.num_experts
            + spec.moe_router_topk * mlp_params(h, spec.expert_ffn, spec.swiglu)
            + mlp_params(h, spec.moe_shared_expert_intermediate_size, spec.swiglu))


def mtp_matmul_params(spec: ModelSpec) -> int:
    """One MTP module (DeepSeek-V3 §2.2): the 2h→h projection, one decoder layer like the last one, and
    the shared output head, which each MTP token passes through again."""
    last_is_moe = spec.moe_layer_pattern()[-1] == 1
    layer = moe_layer_active_matmul_params(spec) if last_is_moe else dense_layer_matmul_params(spec)
    return 2 * spec.hidden_size * spec.hidden_size + layer + spec.vocab_size * spec.hidden_size


def model_flops_per_token(spec: ModelSpec) -> float:
    """The contract's model FLOPs per token (forward + backward), without recompute."""
    pattern = spec.moe_layer_pattern()
    n_moe = sum(pattern)
    n_dense = spec.num_layers - n_moe
    params = n_dense * dense_layer_matmul_params(spec) + spec.vocab_size * spec.hidden_size
    if n_moe:
        params += n_moe * moe_layer_active_matmul_params(spec)
    params += spec.mtp_num_layers * mtp_matmul_params(spec)
    attention = 3 * attention_core_flops_per_token(spec) * (spec.num_layers + spec.mtp_num_layers)
    return 6.0 * params + attention


def total_params(spec: ModelSpec) -> int:
    """Every weight of the model, embeddings and all experts included (norms excluded)."""
    h = spec.hidden_size
    att = attention_params(spec)
    pattern = spec.moe_layer_pattern()
    n_moe = sum(pattern)
    dense = (spec.num_layers - n_moe) * dense_layer_matmul_params(spec)
    moe = 0
    if n_moe:
        moe = n_moe * (att.sharded + att.replicated + h * spec.num_experts
                       + spec.num_experts * mlp_params(h, spec.expert_ffn, spec.swiglu)
                       + mlp_params(h, spec.moe_shared_expert_intermediate_size, spec.swiglu))
    emb = spec.vocab_size * h * (2 if spec.untie_embeddings_and_output_weights else 1)
    per_moe_layer = moe // n_moe if n_moe else 0
    mtp_layer = per_moe_layer if pattern[-1] == 1 else dense_layer_matmul_params(spec)
    mtp = spec.mtp_num_layers * (2 * h * h + mtp_layer)  # the output head is shared, counted once
    return dense + moe + emb + mtp

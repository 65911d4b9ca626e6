"""Hugging Face ``config.json`` → ParaPlan model spec (contract: "Model spec ... a Hugging Face config.json").

A mapping is taken for a Hugging Face config when it has ``architectures`` or ``model_type``. The
architecture is chosen by ``model_type`` (else by ``architectures[0]``). A config.json carries no training
sequence length: ``seq_length`` is ``--seq-length`` (or a ``seq_length`` key added to the mapping), else
4096. Keys not listed below (rope, norm eps, dtype, router scoring, ...) do not change the cost and are
ignored.

Fields read, per architecture (HF key → spec field):

=========================================  =====================================================================
HF key                                     spec field
=========================================  =====================================================================
*all*: ``num_hidden_layers``               ``num_layers``
``hidden_size``                            ``hidden_size``
``num_attention_heads``                    ``num_attention_heads``
``num_key_value_heads`` (default heads)    ``num_query_groups``
``head_dim`` (default hidden/heads)        ``kv_channels``
``intermediate_size``                      ``ffn_hidden_size`` (the dense MLP)
``vocab_size``                             ``vocab_size``
``tie_word_embeddings`` (default false)    ``untie_embeddings_and_output_weights`` = not it
``_name_or_path`` (else ``model_type``)    ``name``
*(gated MLP in every supported family)*    ``swiglu`` = true
``hidden_activation`` (else ``hidden_act``)  ``activation_func`` where not SiLU: ``gelu`` → gelu,
                                           ``gelu_pytorch_tanh``/``gelu_new``/``gelu_fast`` → gelu_tanh
``final_logit_softcapping``                ``final_logit_softcapping`` (Gemma-2)
``attn_logit_softcapping``                 ``attn_logit_softcapping`` (Gemma-2)
**deepseek_v3 / deepseek_v2**              (``DeepseekV3ForCausalLM``, ``DeepseekV2ForCausalLM``)
``q_lora_rank`` (null: no compression)     ``q_lora_rank``; ``multi_latent_attention`` = true
``kv_lora_rank``                           ``kv_lora_rank``
``qk_nope_head_dim``                       ``qk_head_dim`` and ``kv_channels``
``qk_rope_head_dim``                       ``qk_pos_emb_head_dim``
``v_head_dim``                             ``v_head_dim``
``n_routed_experts`` (null: dense)         ``num_experts``
``num_experts_per_tok``                    ``moe_router_topk``
``moe_intermediate_size``                  ``moe_ffn_hidden_size``
``n_shared_experts`` × moe_intermediate    ``moe_shared_expert_intermediate_size``
``first_k_dense_replace``, ``moe_layer_freq``  ``moe_layer_freq`` list: layer i is MoE when i ≥ k and i % freq == 0
``num_nextn_predict_layers``               ``mtp_num_layers``
**pangu_ultra_moe** (openPangu Ultra MoE)
``attention_q_lora_dim``                   ``q_lora_rank``; ``multi_latent_attention`` = true
``attention_kv_lora_dim``                  ``kv_lora_rank``
``attention_qk_dim``                       ``qk_head_dim`` and ``kv_channels``
``attention_qk_rope_dim``                  ``qk_pos_emb_head_dim``
``attention_v_dim``                        ``v_head_dim``
``num_routed_experts``                     ``num_experts``
``num_experts_per_tok``                    ``moe_router_topk``
``moe_intermediate_size``                  ``moe_ffn_hidden_size``
``num_shared_experts`` × moe_intermediate  ``moe_shared_expert_intermediate_size``
``num_dense_layers``                       ``moe_layer_freq`` list: that many dense layers, then MoE
``num_mtp_layers``                         ``mtp_num_layers``
**llama, qwen2, qwen3**                    (``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``)
*(the common keys only)*                   dense
**qwen3_moe** (``Qwen3MoeForCausalLM``)
``num_experts``                            ``num_experts``
``num_experts_per_tok``                    ``moe_router_topk``
``moe_intermediate_size``                  ``moe_ffn_hidden_size``
``decoder_sparse_step`` (default 1),       ``moe_layer_freq`` list: layer i is MoE when i ∉ mlp_only_layers and
``mlp_only_layers`` (default [])           (i + 1) % decoder_sparse_step == 0 (as transformers' Qwen3MoeDecoderLayer)
**mixtral** (``MixtralForCausalLM``)
``num_local_experts``                      ``num_experts`` (every layer MoE)
``num_experts_per_tok``                    ``moe_router_topk``
``intermediate_size``                      ``moe_ffn_hidden_size`` (and ``ffn_hidden_size``)
=========================================  =====================================================================
"""

from __future__ import annotations

import json
from pathlib import Path

from .errors import InputError

DEFAULT_SEQ_LENGTH = 4096  # contract: a config.json has no training sequence length

# model_type → architecture class names (either identifies the family)
FAMILIES = {
    "deepseek_v3": ("DeepseekV3ForCausalLM",),
    "deepseek_v2": ("DeepseekV2ForCausalLM",),
    "pangu_ultra_moe": ("PanguUltraMoEForCausalLM", "OpenPanguUltraMoEForCausalLM"),
    "llama": ("LlamaForCausalLM",),
    "qwen2": ("Qwen2ForCausalLM",),
    "qwen3": ("Qwen3ForCausalLM",),
    "qwen3_moe": ("Qwen3MoeForCausalLM",),
    "mixtral": ("MixtralForCausalLM",),
}


# transformers' ACT2FN names -> the spec's activation_func (activations.py: gelu_pytorch_tanh, gelu_new and
# gelu_fast are the tanh approximation; silu and swish the same function)
HF_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
                  "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh"}


def supported() -> list[str]:
    return [a for archs in FAMILIES.values() for a in archs]


def is_hf_config(data) -> bool:
    return isinstance(data, dict) and ("architectures" in data or "model_type" in data)


def _family(cfg: dict) -> str:
    mt = cfg.get("model_type")
    if isinstance(mt, str) and mt in FAMILIES:
        return mt
    archs = cfg.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs else (archs if isinstance(archs, str) else None)
    for family, names in FAMILIES.items():
        if arch in names:
            return family
    what = arch or mt or "?"
    raise InputError("model", f"unsupported architecture {what}; supported: {', '.join(supported())}")


def _get(cfg: dict, key: str, default=...):
    if key in cfg and cfg[key] is not None:
        return cfg[key]
    if default is ...:
        raise InputError(f"model.{key}", "missing from the Hugging Face config")
    return default


def _int(cfg: dict, key: str, default=...):
    v = _get(cfg, key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise InputError(f"model.{key}", f"must be an integer, got {v!r}")
    return v


def to_spec_data(cfg: dict, seq_length: int | None = None) -> dict:
    """The ModelSpec fields (a dict, validated by the caller) of a Hugging Face config."""
    family = _family(cfg)
    heads = _int(cfg, "num_attention_heads")
    hidden = _int(cfg, "hidden_size")
    layers = _int(cfg, "num_hidden_layers")
    seq = seq_length or cfg.get("seq_length") or DEFAULT_SEQ_LENGTH
    spec = {
        "name": cfg.get("_name_or_path") or cfg.get("name") or family,
        "num_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_query_groups": _int(cfg, "num_key_value_heads", heads),
        "ffn_hidden_size": _int(cfg, "intermediate_size"),
        "vocab_size": _int(cfg, "vocab_size"),
        "seq_length": seq,
        "swiglu": True,
        "untie_embeddings_and_output_weights": not bool(cfg.get("tie_word_embeddings", False)),
    }
    act = cfg.get("hidden_activation") or cfg.get("hidden_act")
    if isinstance(act, str) and HF_ACTIVATIONS.get(act, "silu") != "silu":
        spec["activation_func"] = HF_ACTIVATIONS[act]
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        if isinstance(cfg.get(key), (int, float)) and not isinstance(cfg.get(key), bool):
            spec[key] = float(cfg[key])
    head_dim = _int(cfg, "head_dim", None)
    if head_dim is not None:
        spec["kv_channels"] = head_dim
    elif heads and hidden and hidden % heads == 0:
        spec["kv_channels"] = hidden // heads
    if family in ("deepseek_v3", "deepseek_v2"):
        moe_ffn = _int(cfg, "moe_intermediate_size", None)
        spec.update(multi_latent_attention=True, q_lora_rank=_int(cfg, "q_lora_rank", None),
                    kv_lora_rank=_int(cfg, "kv_lora_rank"), qk_head_dim=_int(cfg, "qk_nope_head_dim"),
                    qk_pos_emb_head_dim=_int(cfg, "qk_rope_head_dim"), v_head_dim=_int(cfg, "v_head_dim"),
                    kv_channels=_int(cfg, "qk_nope_head_dim"),
                    mtp_num_layers=_int(cfg, "num_nextn_predict_layers", 0))
        experts = _int(cfg, "n_routed_experts", None)
        if experts:
            k, freq = _int(cfg, "first_k_dense_replace", 0), _int(cfg, "moe_layer_freq", 1)
            spec.update(num_experts=experts, moe_router_topk=_int(cfg, "num_experts_per_tok"),
                        moe_ffn_hidden_size=moe_ffn,
                        moe_shared_expert_intermediate_size=_int(cfg, "n_shared_experts", 0) * (moe_ffn or 0),
                        moe_layer_freq=[1 if i >= k and i % freq == 0 else 0 for i in range(layers)])
    elif family == "pangu_ultra_moe":
        moe_ffn = _int(cfg, "moe_intermediate_size")
        dense = _int(cfg, "num_dense_layers", 0)
        spec.update(multi_latent_attention=True, q_lora_rank=_int(cfg, "attention_q_lora_dim", None),
                    kv_lora_rank=_int(cfg, "attention_kv_lora_dim"), qk_head_dim=_int(cfg, "attention_qk_dim"),
                    qk_pos_emb_head_dim=_int(cfg, "attention_qk_rope_dim"), v_head_dim=_int(cfg, "attention_v_dim"),
                    kv_channels=_int(cfg, "attention_qk_dim"),
                    num_experts=_int(cfg, "num_routed_experts"), moe_router_topk=_int(cfg, "num_experts_per_tok"),
                    moe_ffn_hidden_size=moe_ffn,
                    moe_shared_expert_intermediate_size=_int(cfg, "num_shared_experts", 0) * moe_ffn,
                    moe_layer_freq=[0 if i < dense else 1 for i in range(layers)],
                    mtp_num_layers=_int(cfg, "num_mtp_layers", 0))
    elif family == "qwen3_moe":
        experts = _int(cfg, "num_experts", None)
        if experts:
            step = _int(cfg, "decoder_sparse_step", 1)
            dense_only = set(_get(cfg, "mlp_only_layers", []))
            pattern = [1 if i not in dense_only and (i + 1) % step == 0 else 0 for i in range(layers)]
            spec.update(num_experts=experts, moe_router_topk=_int(cfg, "num_experts_per_tok"),
                        moe_ffn_hidden_size=_int(cfg, "moe_intermediate_size"),
                        moe_layer_freq=1 if all(pattern) else pattern)
    elif family == "mixtral":
        spec.update(num_experts=_int(cfg, "num_local_experts"), moe_router_topk=_int(cfg, "num_experts_per_tok"),
                    moe_ffn_hidden_size=_int(cfg, "intermediate_size"), moe_layer_freq=1)
    if isinstance(spec.get("moe_layer_freq"), list) and all(spec["moe_layer_freq"]):
        spec["moe_layer_freq"] = 1
    return {k: v for k, v in spec.items() if v is not None}


def maybe_hf(model, seq_length: int | None = None):
    """``model`` unchanged unless it is (a path to) a Hugging Face config; then its spec fields."""
    data = model
    if isinstance(model, str):
        path = Path(model)
        if path.suffix != ".json" or not path.is_file():
            return model
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            return model  # the spec loader reports it
    if not is_hf_config(data):
        return model
    return to_spec_data(data, seq_length)

"""Input schemas of the cost model: the model spec, the training config and the cluster profile.

Field names are Megatron-Core's, as in ``shared/CONTRACT.md``. The pydantic models reject wrong types,
out-of-range values, unknown enums and unknown fields with an error naming the field; structural
problems of a config (tp not dividing the heads, ...) are *not* input errors: they are infeasible
reasons reported by :mod:`costmodel.validity`.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationInfo, field_validator, model_validator

RECOMPUTE_MODULES = ("core_attn", "layernorm", "mla_up_proj", "moe_act", "mlp", "moe", "shared_experts")
# Megatron-Core's fine-grained activation offloading (docs/source/api-guide/fine_grained_activation_offloading.md:
# --fine-grained-activation-offloading --offload-modules, choices attn_norm, qkv_linear, core_attn,
# attn_proj, mlp_norm, expert_fc1, moe_act): each module's input (its saved-for-backward tensors) goes to
# host memory after its forward and comes back before its backward.
OFFLOAD_MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act")


class ModelSpec(BaseModel):
    """A transformer decoder, dense or MoE, in Megatron-Core's names."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    num_layers: PositiveInt
    hidden_size: PositiveInt
    num_attention_heads: PositiveInt
    ffn_hidden_size: PositiveInt
    vocab_size: PositiveInt
    seq_length: PositiveInt
    num_query_groups: PositiveInt | None = None
    kv_channels: PositiveInt | None = None
    swiglu: bool = True
    untie_embeddings_and_output_weights: bool = True
    # Multi-latent attention (DeepSeek-V2/V3, Pangu Ultra MoE).
    multi_latent_attention: bool = False
    q_lora_rank: PositiveInt | None = None
    kv_lora_rank: PositiveInt | None = None
    qk_head_dim: PositiveInt | None = None
    qk_pos_emb_head_dim: int | None = Field(default=None, ge=0)
    v_head_dim: PositiveInt | None = None
    # Mixture of experts.
    num_experts: PositiveInt | None = None
    moe_router_topk: PositiveInt | None = None
    moe_ffn_hidden_size: PositiveInt | None = None
    moe_shared_expert_intermediate_size: int = Field(default=0, ge=0)
    moe_layer_freq: PositiveInt | list[Literal[0, 1]] = 1
    mtp_num_layers: int = Field(default=0, ge=0)
    # Launch facts: what a training framework needs to build this architecture, in Megatron-Core's
    # TransformerConfig names, with defaults of a Llama-style decoder (not Megatron's own defaults, which
    # are GPT-2's). The cost model does not price them (norms, biases and the router's score function are
    # memory-bound work of a few bytes per token, rotary settings none); app/formats/launch.py states them
    # so that a launch builds the model that was planned.
    normalization: Literal["RMSNorm", "LayerNorm"] = "RMSNorm"
    position_embedding_type: Literal["rope", "learned_absolute", "none"] = "rope"
    rotary_base: PositiveInt = 10000  # RoPE theta (Megatron --rotary-base, an int)
    add_bias_linear: bool = False  # biases in every linear layer (Megatron's default true: --disable-bias-linear)
    add_qkv_bias: bool = False  # biases in the QKV projection only (Qwen2)
    qk_layernorm: bool = False  # norms on queries and keys (Qwen3), on the MLA latents (DeepSeek-V3)
    # MLA's YaRN rotary scaling (Megatron MLATransformerConfig): null = the framework's default
    rotary_scaling_factor: float | None = Field(default=None, gt=0)
    mscale: float | None = Field(default=None, ge=0)
    mscale_all_dim: float | None = Field(default=None, ge=0)
    # The router (MoE models)
    moe_router_score_function: Literal["softmax", "sigmoid"] = "softmax"
    moe_router_pre_softmax: bool = False
    moe_router_enable_expert_bias: bool = False  # aux-loss-free balancing bias (DeepSeek-V3)
    moe_router_topk_scaling_factor: float | None = Field(default=None, gt=0)
    moe_router_num_groups: PositiveInt | None = None  # node-limited (group) routing
    moe_router_group_topk: PositiveInt | None = None
    # Element-wise work the cost model prices (costmodel/layers.py): the MLP's activation function
    # (Megatron-Core TransformerConfig.activation_func, gated by --swiglu; HF hidden_act/hidden_activation;
    # MindSpeed-LLM --geglu, --gelu-tanh). None: Megatron's default, SiLU when swiglu (SwiGLU), else GELU.
    activation_func: Literal["silu", "gelu", "gelu_tanh"] | None = None
    # Whether the activation (with its gate) runs as one fused kernel (Megatron-Core
    # TransformerConfig.bias_activation_fusion: --no-bias-swiglu-fusion / --no-bias-gelu-fusion turn it off;
    # MindSpeed --use-fused-swiglu). False: its composite's element-wise kernels, each a pass over HBM.
    bias_activation_fusion: bool = True
    # Gemma-2's soft-capping, cap·tanh(x/cap) (HF Gemma2Config names; MindSpeed-LLM
    # --output-logit-softcapping, --attn-logit-softcapping): of the output logits, of the attention scores.
    final_logit_softcapping: float | None = Field(default=None, gt=0)
    attn_logit_softcapping: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _check_consistency(self) -> "ModelSpec":
        if self.num_query_groups is not None and self.num_attention_heads % self.num_query_groups:
            raise ValueError(
                f"num_query_groups ({self.num_query_groups}) must divide num_attention_heads "
                f"({self.num_attention_heads})")
        if self.kv_channels is None and self.hidden_size % self.num_attention_heads:
            raise ValueError("kv_channels is required when num_attention_heads does not divide hidden_size")
        if self.multi_latent_attention:
            missing = [f for f in ("kv_lora_rank", "qk_head_dim", "v_head_dim") if getattr(self, f) is None]
            if missing:
                raise ValueError(f"multi_latent_attention needs {', '.join(missing)}")
        if self.num_experts is not None:
            if self.moe_router_topk is None:
                raise ValueError("moe_router_topk is required when num_experts is set")
            if self.moe_router_topk > self.num_experts:
                raise ValueError(
                    f"moe_router_topk ({self.moe_router_topk}) exceeds num_experts ({self.num_experts})")
        if (self.moe_router_num_groups is None) != (self.moe_router_group_topk is None):
            raise ValueError("moe_router_num_groups and moe_router_group_topk go together")
        if self.moe_router_num_groups is not None:
            if self.num_experts is None or self.num_experts % self.moe_router_num_groups:
                raise ValueError(f"moe_router_num_groups ({self.moe_router_num_groups}) must divide num_experts")
            if self.moe_router_group_topk > self.moe_router_num_groups:
                raise ValueError(f"moe_router_group_topk ({self.moe_router_group_topk}) exceeds "
                                 f"moe_router_num_groups ({self.moe_router_num_groups})")
        if self.moe_router_enable_expert_bias and self.moe_router_score_function != "sigmoid":
            # Megatron-Core's router (transformer_config.py): the expert bias needs sigmoid scores
            raise ValueError("moe_router_enable_expert_bias needs moe_router_score_function sigmoid")
        if isinstance(self.moe_layer_freq, list) and len(self.moe_layer_freq) != self.num_layers:
            raise ValueError(
                f"moe_layer_freq has {len(self.moe_layer_freq)} entries for {self.num_layers} layers")
        return self

    # ---- derived dimensions -------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None

    @property
    def query_groups(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def qk_dim(self) -> int:
        """Per-head query/key width used by the attention score product (MLA: nope + rope part)."""
        if self.multi_latent_attention:
            return self.qk_head_dim + (self.qk_pos_emb_head_dim or 0)
        return self.head_dim

    @property
    def v_dim(self) -> int:
        return self.v_head_dim if self.multi_latent_attention else self.head_dim

    @property
    def activation(self) -> str:
        """The activation function in force: the stated one, else Megatron's default by ``swiglu``."""
        return self.activation_func or ("silu" if self.swiglu else "gelu")

    @property
    def expert_ffn(self) -> int:
        return self.moe_ffn_hidden_size or self.ffn_hidden_size

    def moe_layer_pattern(self) -> list[int]:
        """1 for each MoE layer, 0 for each dense layer, one entry per decoder layer."""
        if not self.is_moe:
            return [0] * self.num_layers
        if isinstance(self.moe_layer_freq, list):
            return list(self.moe_layer_freq)
        k = self.moe_layer_freq
        return [1 if i % k == 0 else 0 for i in range(self.num_layers)]  # Megatron-Core's int rule


def _one_routing_statement(field: str, info: ValidationInfo) -> None:
    """The imbalance follows from the routing: a config states one of the three, not two."""
    given = [k for k in ("moe_load_imbalance", "moe_expert_load") if k != field and info.data.get(k) is not None]
    if given:
        raise ValueError(f"give {field} or {given[0]}, not both: the imbalance follows from the routing")


class TrainingConfig(BaseModel):
    """One parallel/training configuration (what the search chooses)."""

    model_config = ConfigDict(extra="forbid")

    tp: PositiveInt = 1
    pp: PositiveInt = 1
    vpp: PositiveInt = 1
    cp: PositiveInt = 1
    ep: PositiveInt = 1
    etp: PositiveInt = 1
    dp: PositiveInt | None = None
    micro_batch_size: PositiveInt = 1
    global_batch_size: PositiveInt
    sequence_parallel: bool | None = None
    tp_comm_overlap: bool = False
    recompute: Literal["none", "selective", "full"] = "none"
    recompute_modules: list[str] | None = None
    recompute_num_layers: PositiveInt | None = None
    # Activation offload (swap) to host memory, per layer: Megatron-Core's --offload-modules (with
    # --fine-grained-activation-offloading); MindSpeed's --swap-attention --swap-modules covers the
    # attention-side ones (see search/frameworks/options.py). None or []: nothing is offloaded.
    offload_modules: list[str] | None = None
    distributed_optimizer: bool = True
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = True
    first_stage_layers: int | None = Field(default=None, ge=0)
    last_stage_layers: int | None = Field(default=None, ge=0)
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    pipeline_layout: str | None = None
    # The pipeline schedule. None: Megatron-Core's 1F1B with vpp 1, its interleaved 1F1B with vpp > 1.
    # "dualpipe": DeepSeek-V3's bidirectional DualPipe (§3.2.1; deepseek-ai/DualPipe), each rank holding
    # stages r and pp-1-r; "dualpipev": its V-shaped half (MindSpeed --schedules-method dualpipev), each
    # rank holding model chunks r and 2pp-1-r. Both run vpp 1 (their two chunks per rank are the schedule's).
    pipeline_schedule: Literal["1f1b", "interleaved", "dualpipe", "dualpipev"] | None = None
    precision: Literal["bf16", "fp8"] = "bf16"
    # The FP8 scaling recipe (Megatron-Core --fp8-recipe, megatron/training/arguments.py): "delayed" scales
    # by an amax history (the cast kernel records the amax in the same pass), "tensorwise" is per-tensor
    # current scaling (an amax pass over each tensor before its cast), "blockwise" / "mxfp8" scale per
    # block inside the cast. None: what the export states (delayed, tensorwise where a recomputed
    # layernorm / moe_act needs it: search/frameworks/options.py _fp8). Priced per GEMM operand (compute.fp8_quantise_s).
    fp8_recipe: Literal["delayed", "tensorwise", "blockwise", "mxfp8"] | None = None
    moe_a2a_overlap: bool = False
    # Megatron-Core --delay-wgrad-compute: the combined 1F1B runs the attention block's weight-gradient
    # GEMMs after the layer's overlapped region (model_chunk_schedule_plan.py), where they hide no
    # all-to-all. Megatron allows it only with --overlap-moe-expert-parallel-comm (transformer_config.py)
    # and its MoE README gives the two together as the EP overlap; None: on exactly with moe_a2a_overlap.
    delay_wgrad_compute: bool | None = None
    # Megatron-Core --activation-func-fp8-input-store (TransformerConfig.activation_func_fp8_input_store,
    # SwiGLU only): the activation function's input (the fc1 output) is stored in FP8 for the backward, in
    # the dense MLP, the shared and the routed experts; DeepSeek-V3 §3.3.3 "Low-Precision Activation" (2).
    activation_func_fp8_input_store: bool = False
    # An exponential moving average of the parameters (DeepSeek-V3 §3.2.3, "Exponential Moving Average in
    # CPU"): "none", "device" (an fp32 copy of every parameter the device holds, 4 B each), "host" (kept in
    # CPU memory and updated asynchronously: no device memory, no step time). No Megatron-LM or MindSpeed
    # flag (NeMo's exp_manager.ema with cpu_offload is the nearest): the field is named after the paper.
    parameter_ema: Literal["none", "device", "host"] = "none"
    # MindSpeed-LLM's --mla-fa-without-pad (2025): without it, its MLA pads V from v_head_dim to the QK
    # head dim before the Ascend flash kernel and slices the output back (see Hardware.fa_pads_v_head).
    # Only a profile whose flash path pads (fact flash_attention_pads_v_head) is affected.
    mla_fa_without_pad: bool = False
    moe_load_imbalance: float | None = Field(default=None, ge=1.0, le=64.0)
    # The router's expected per-expert token shares (any positive numbers, one per expert, normalised
    # by their sum), or a Zipf skew of one parameter, and where experts sit on the EP ranks: the
    # imbalance then follows from them (costmodel/routing.py) instead of being guessed.
    moe_expert_load: list[float] | None = Field(default=None, min_length=1, max_length=4096)
    moe_expert_skew: float | None = Field(default=None, ge=0.0, le=4.0)
    expert_placement: Literal["contiguous", "balanced"] = "contiguous"
    # Extra expert slots per EP rank, each holding a copy of a hot expert that splits its tokens with the
    # original (balanced placement only; costmodel/routing.py): memory for a lower imbalance.
    moe_expert_replicas: int = Field(default=0, ge=0, le=256)
    # Expert-parallel dispatch across nodes: "hierarchical" sends a token once per destination node and
    # fans it out inside the node (DeepEP's normal kernels, Huawei's hierarchical all-to-all on Atlas
    # 800T A2); "flat" sends one copy per destination expert rank (Megatron's alltoall dispatcher).
    moe_a2a_algorithm: Literal["flat", "hierarchical"] = "hierarchical"
    # The MoE token dispatcher (Megatron-Core --moe-token-dispatcher-type; MindSpeed-LLM passes the same
    # flag): "allgather" gathers every token of the tp·ep group and reduce-scatters the combined output
    # (MoEAllGatherTokenDispatcher, core_r0.6.0's default), "alltoall" the flat all-to-all of each token's
    # k copies, "alltoall_seq" its sequence-level variant (core_r0.6.0's MoEAlltoAllTokenDispatcher: an
    # sp->hp all-to-all over tp before the EP all-to-all), "flex" DeepEP/HybridEP (one copy per destination
    # node: what moe_a2a_algorithm "hierarchical" prices). None: moe_a2a_algorithm decides, as before
    # (flat = alltoall, hierarchical = flex). costmodel/layers.py prices each.
    moe_token_dispatcher_type: Literal["allgather", "alltoall", "alltoall_seq", "flex"] | None = None
    # Context-parallel attention (Megatron-Core --cp-comm-type; MindSpeed --context-parallel-algo):
    # "p2p" ring (megatron_cp_algo), "a2a" Ulysses (ulysses_cp_algo), "a2a+p2p" Ulysses inside the
    # scale-up domain and a ring across (hybrid_cp_algo), "allgather" K/V all-gather.
    cp_comm_type: Literal["p2p", "a2a", "allgather", "a2a+p2p"] = "p2p"
    # The attention kernel (Megatron-LM --attention-backend {flash,fused,unfused,local,auto}, before
    # core_r0.10 --use-flash-attn; MindSpeed-LLM --use-flash-attn): "flash" is FlashAttention (TE/cuDNN
    # fused attention, npu_fusion_attention), "unfused" Megatron's CoreAttention with
    # FusedScaleMaskSoftmax, which materialises the s x s scores (the SC21 and Korthikanti et al. 2022
    # runs, before FlashAttention).
    attention_kernel: Literal["flash", "unfused"] = "flash"
    # Model-state dtypes and sharding (Megatron-Core's precision-aware optimizer flags
    # --main-grads-dtype, --main-params-dtype, --exp-avg-dtype, --exp-avg-sq-dtype; Megatron-FSDP's
    # --data-parallel-sharding-strategy). "bf16" main params stand for NeMo's distributed fused Adam
    # with store_param_remainders (the 16 low bits of the fp32 master beside the bf16 weights).
    main_grads_dtype: Literal["fp32", "bf16"] = "fp32"
    main_params_dtype: Literal["fp32", "fp16", "bf16"] = "fp32"
    exp_avg_dtype: Literal["fp32", "bf16", "fp16", "fp8"] = "fp32"
    exp_avg_sq_dtype: Literal["fp32", "bf16", "fp16", "fp8"] = "fp32"
    # None: "optim" with distributed_optimizer, else "no_shard" (ZeRO-1 / DDP). "optim_grads" is
    # ZeRO-2 (gradients reduce-scattered and kept sharded), "optim_grads_params" ZeRO-3 / FSDP.
    data_parallel_sharding_strategy: Literal["no_shard", "optim", "optim_grads", "optim_grads_params"] | None = None

    @field_validator("moe_expert_load")
    @classmethod
    def _positive_shares(cls, v: list[float] | None, info: ValidationInfo) -> list[float] | None:
        if v is None:
            return v
        if min(v) < 0 or not sum(v) > 0 or not all(math.isfinite(x) for x in v):
            raise ValueError("shares must be finite, non-negative and not all zero")
        _one_routing_statement("moe_expert_load", info)
        return v

    @field_validator("moe_expert_skew")
    @classmethod
    def _skew_alone(cls, v: float | None, info: ValidationInfo) -> float | None:
        if v is not None:
            _one_routing_statement("moe_expert_skew", info)
        return v

    @field_validator("moe_expert_replicas")
    @classmethod
    def _replicas_need_a_balanced_routing(cls, v: int, info: ValidationInfo) -> int:
        if v and info.data.get("expert_placement") != "balanced":
            raise ValueError("replicas of hot experts need expert_placement=balanced (contiguous places each "
                             "expert once)")
        if v and info.data.get("moe_expert_load") is None and info.data.get("moe_expert_skew") is None:
            raise ValueError("replicas copy the hottest experts: give the routing (moe_expert_load or "
                             "moe_expert_skew) that says which")
        return v

    @field_validator("recompute_modules")
    @classmethod
    def _known_modules(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        unknown = [m for m in v if m not in RECOMPUTE_MODULES]
        if unknown:
            raise ValueError(f"unknown recompute module(s) {unknown}; known: {list(RECOMPUTE_MODULES)}")
        return v

    @field_validator("offload_modules")
    @classmethod
    def _known_offload_modules(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        unknown = [m for m in v if m not in OFFLOAD_MODULES]
        if unknown:
            raise ValueError(f"unknown offload module(s) {unknown}; known: {list(OFFLOAD_MODULES)}")
        if len(set(v)) != len(v):
            raise ValueError(f"offload module(s) named twice: {sorted(m for m in set(v) if v.count(m) > 1)}")
        if "attn_proj" in v and "core_attn" not in v:
            # Megatron-Core core_v0.16.1 TransformerConfig.__post_init__ refuses it: attn_proj's input is
            # FlashAttention's output, which core_attn's backward keeps too, so alone it frees nothing.
            raise ValueError("attn_proj is offloaded only with core_attn (its input is core_attn's output, "
                             "which core_attn's backward also needs)")
        return v

    @model_validator(mode="after")
    def _schedule_matches_vpp(self) -> "TrainingConfig":
        schedule, vpp = self.pipeline_schedule, self.vpp
        if schedule == "1f1b" and vpp > 1:
            raise ValueError(f"pipeline_schedule 1f1b runs one model chunk per rank: vpp must be 1 (got {vpp}; "
                             "vpp > 1 is the interleaved schedule)")
        if schedule == "interleaved" and vpp == 1:
            raise ValueError("pipeline_schedule interleaved needs vpp > 1")
        if schedule in ("dualpipe", "dualpipev") and vpp > 1:
            raise ValueError(f"pipeline_schedule {schedule} places two model chunks per rank itself: vpp must be "
                             f"1 (got {vpp}; MindSpeed refuses dualpipev with a virtual pipeline)")
        return self

    @model_validator(mode="after")
    def _dispatcher_matches_a2a_algorithm(self) -> "TrainingConfig":
        # flex is the hierarchical dispatch, the other dispatchers send one copy per expert rank (flat): a
        # config may state both fields only where they agree (moe_a2a_algorithm alone keeps its meaning).
        d = self.moe_token_dispatcher_type
        if d is not None and "moe_a2a_algorithm" in self.model_fields_set:
            implied = "hierarchical" if d == "flex" else "flat"
            if self.moe_a2a_algorithm != implied:
                raise ValueError(f"moe_token_dispatcher_type {d} dispatches {implied}: moe_a2a_algorithm "
                                 f"{self.moe_a2a_algorithm} contradicts it (state one, or both agreeing)")
        return self

    @property
    def a2a_hierarchical(self) -> bool:
        """Whether the expert dispatch sends one copy per destination node: the flex dispatcher, or
        moe_a2a_algorithm hierarchical where no dispatcher is stated."""
        d = self.moe_token_dispatcher_type
        return d == "flex" if d is not None else self.moe_a2a_algorithm == "hierarchical"

    @model_validator(mode="after")
    def _delay_wgrad_needs_overlap(self) -> "TrainingConfig":
        if self.delay_wgrad_compute and not self.moe_a2a_overlap:
            # Megatron-Core transformer_config.py: "overlap_moe_expert_parallel_comm must be enabled when
            # enabling delay_wgrad_compute"
            raise ValueError("delay_wgrad_compute needs moe_a2a_overlap (Megatron-Core's "
                             "--overlap-moe-expert-parallel-comm)")
        if self.fp8_recipe is not None and self.precision != "fp8":
            raise ValueError("fp8_recipe applies to precision fp8 only")
        return self

    @property
    def delays_wgrad(self) -> bool:
        """Whether the weight-gradient GEMMs are delayed (the field, else with the all-to-all overlap)."""
        return self.moe_a2a_overlap if self.delay_wgrad_compute is None else self.delay_wgrad_compute

    @property
    def fp8_recipe_in_force(self) -> str:
        """The FP8 recipe a launch uses: the field, else the export's rule (search/frameworks/options.py ``_fp8``):
        tensorwise where a recomputed layernorm or moe_act needs it, else Megatron's default delayed."""
        if self.fp8_recipe is not None:
            return self.fp8_recipe
        modules = (self.recompute_modules or ["core_attn"]) if self.recompute == "selective" else []
        return "tensorwise" if any(m in ("layernorm", "moe_act") for m in modules) else "delayed"

    @property
    def schedule(self) -> str:
        """The schedule in force: the explicit field, else 1f1b or interleaved by vpp."""
        return self.pipeline_schedule or ("interleaved" if self.vpp > 1 else "1f1b")

    @property
    def sp(self) -> bool:
        return self.tp > 1 if self.sequence_parallel is None else self.sequence_parallel

    @property
    def sharding(self) -> str:
        """The data-parallel sharding stage in force (the explicit field, else the optimizer flag's)."""
        if self.data_parallel_sharding_strategy is not None:
            return self.data_parallel_sharding_strategy
        return "optim" if self.distributed_optimizer else "no_shard"


class Fact(BaseModel):
    model_config = ConfigDict(extra="forbid")
    value: float | None
    source: str
    confidence: Literal["high", "medium", "low"] | None = None
    # A fitted efficiency factor that ends at one of its bounds (hardware_profiles/calibrate.py BOUNDS)
    # stays there only with the physical reason written here; `paraplan validate` reports the others.
    bound_reason: str | None = None


EFFICIENCY_KEYS = (
    "gemm_eff_max", "gemm_half_gflop", "attn_eff", "fp8_gemm_eff_ratio", "hbm_eff",
    "scale_up_bw_eff", "scale_out_bw_eff", "tp_overlap", "ep_overlap", "dp_overlap",
    "layer_overhead_us", "softmax_gscores_per_s", "moe_gemm_eff_ratio",
    "pp_chunk_overhead_us",
)
# Factors a profile may omit, with the value that leaves the model as it was before they existed (a
# profile written before a factor was added keeps its predictions).
OPTIONAL_EFFICIENCY = {"straggler_cv": 0.0}

# The host link (device <-> host memory) and the host memory of a node: optional, since a profile without
# them can still score every config that offloads nothing (offloading then breaks ``offload_needs_host_link``).
HOST_FACTS = ("host_link_bandwidth_gbps", "host_link_devices", "host_memory_gib")
REQUIRED_FACTS = (
    "peak_bf16_tflops", "peak_fp8_tflops", "memory_gib", "hbm_bandwidth_gbps", "devices_per_node",
    "scale_up_domain", "scale_up_bandwidth_gbps", "scale_out_bandwidth_gbps", "scale_up_latency_us",
    "scale_out_latency_us", "framework_overhead_gib",
)


class CalibrationInfo(BaseModel):
    """What a profile's fitted factors were fitted on; drives the out-of-range warnings."""

    model_config = ConfigDict(extra="allow")
    fitted_on: list[str] = []
    precisions: list[str] = []
    moe: bool = False
    max_devices: int = 0


class ClusterProfile(BaseModel):
    """One kind of machine: per-device facts, topology and the (calibrated) efficiency factors."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    calibrate_from: str | None = None
    facts: dict[str, Fact]
    efficiency: dict[str, Fact]
    # Failure rates, checkpoint storage and recovery times (costmodel/resilience.py, RELIABILITY_DEFAULTS for
    # what a profile leaves out): they price interruptions, never a step, so they leave every step time as it is.
    reliability: dict[str, Fact] = {}
    notes: str = ""
    calibration: CalibrationInfo | None = None

    @model_validator(mode="after")
    def _check_keys(self) -> "ClusterProfile":
        missing = [k for k in REQUIRED_FACTS if k not in self.facts]
        if missing:
            raise ValueError(f"profile facts missing: {missing}")
        missing = [k for k in EFFICIENCY_KEYS if k not in self.efficiency]
        if missing:
            raise ValueError(f"profile efficiency factors missing: {missing}")
        for k in REQUIRED_FACTS:
            v = self.facts[k].value
            if k != "peak_fp8_tflops" and (v is None or v <= 0):
                raise ValueError(f"facts.{k} must be a positive number")
        for k in HOST_FACTS:
            if k in self.facts and (self.facts[k].value is None or self.facts[k].value <= 0):
                raise ValueError(f"facts.{k} must be a positive number")
        for k, f in self.reliability.items():
            # rates and times may be 0 (a perfect part, an instant step); bandwidths must move data
            bandwidth = k.endswith("_gbps")
            if f.value is None or not math.isfinite(f.value) or f.value < 0 or (bandwidth and f.value == 0):
                raise ValueError(f"reliability.{k} must be a {'positive' if bandwidth else 'non-negative'} "
                                 f"number (got {f.value})")
        return self

    def fact(self, key: str) -> float | None:
        return self.facts[key].value

    def eff(self, key: str) -> float:
        if key not in self.efficiency and key in OPTIONAL_EFFICIENCY:
            return OPTIONAL_EFFICIENCY[key]
        v = self.efficiency[key].value
        return 0.0 if v is None else float(v)

    @property
    def has_host_link(self) -> bool:
        """Whether the profile states a host link and host memory (what activation offload needs)."""
        return all(k in self.facts for k in HOST_FACTS)

    @property
    def has_fp8(self) -> bool:
        return bool(self.fact("peak_fp8_tflops"))

    def version(self) -> str:
        """A short content hash: results name the exact profile (facts and factors) they used."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

"""What each framework can launch, by name: the frameworks, the communication algorithms and dispatchers each
offers, the index of every TrainingConfig field to the rule that states it, the MindSpeed-LLM flag names of
the cost model's modules, and ``Refusal`` (a choice a framework cannot carry out, and why). The package
docstring (``search/frameworks/__init__.py``) has the table in words and the sources read."""

from __future__ import annotations

from dataclasses import dataclass


FRAMEWORKS = ("megatron", "mindspeed")


LABELS = {"megatron": "Megatron-LM", "mindspeed": "MindSpeed-LLM"}


# Every TrainingConfig field and where ``express`` states it; tests/test_frameworks.py fails when a field is
# added without a line here, and checks that a non-default value of each changes the flags or is refused.
FIELDS = {
    "tp": "--tensor-model-parallel-size (app/formats/launch.py)",
    "pp": "--pipeline-model-parallel-size (app/formats/launch.py)",
    "vpp": "pipeline_split", "cp": "--context-parallel-size (app/formats/launch.py)",
    "ep": "--expert-model-parallel-size (app/formats/launch.py)",
    "etp": "--expert-tensor-parallel-size (app/formats/launch.py)",
    "dp": "no flag: the frameworks derive it from the device count",
    "micro_batch_size": "--micro-batch-size (app/formats/launch.py)",
    "global_batch_size": "--global-batch-size (app/formats/launch.py)",
    "sequence_parallel": "--sequence-parallel (app/formats/launch.py); _tp_overlap, _moe, _mindspeed_selective",
    "tp_comm_overlap": "_tp_overlap", "recompute": "_recompute", "recompute_modules": "_recompute",
    "recompute_num_layers": "_full_recompute", "offload_modules": "_offload", "distributed_optimizer": "_sharding",
    "overlap_grad_reduce": "_sharding", "overlap_param_gather": "_sharding",
    "first_stage_layers": "pipeline_split", "last_stage_layers": "pipeline_split",
    "account_for_embedding_in_pipeline_split": "pipeline_split", "account_for_loss_in_pipeline_split": "pipeline_split",
    "pipeline_layout": "pipeline_split", "pipeline_schedule": "_schedule", "precision": "--fp8-format (express)", "moe_a2a_overlap": "_moe",
    "moe_load_imbalance": "no flag: a modelling input (the router's balance), not a launch setting",
    "moe_expert_load": "no flag: a modelling input (the router's per-expert shares, costmodel/routing.py)",
    "moe_expert_skew": "no flag: a modelling input (the router's skew, costmodel/routing.py)",
    "expert_placement": "express: contiguous is both frameworks' own; balanced is refused (no placement flag)",
    "moe_expert_replicas": "express: refused above 0 (neither framework replicates experts in training)",
    "moe_a2a_algorithm": "_moe", "moe_token_dispatcher_type": "_moe (--moe-token-dispatcher-type)",
    "cp_comm_type": "_context_parallel", "main_grads_dtype": "_optimizer_dtypes",
    "main_params_dtype": "_optimizer_dtypes", "exp_avg_dtype": "_optimizer_dtypes",
    "exp_avg_sq_dtype": "_optimizer_dtypes", "data_parallel_sharding_strategy": "_sharding",
    "attention_kernel": "_attention",
    "mla_fa_without_pad": "_attention (MindSpeed-LLM --mla-fa-without-pad; Megatron-LM has no padding to turn off)",
    "fp8_recipe": "_fp8 (--fp8-recipe)", "delay_wgrad_compute": "_moe (--delay-wgrad-compute)",
    "activation_func_fp8_input_store": "_memory_savings: refused (a TransformerConfig field, no command-line flag)",
    "parameter_ema": "_memory_savings: refused unless none (no EMA flag in either framework)",
}


# The values of the searched communication algorithms each framework can launch: the search offers only
# these (search/space.py), and express refuses any other where it matters (_moe, _context_parallel).
#
# moe_a2a_algorithm: Megatron-LM's flat dispatch is --moe-token-dispatcher-type alltoall, hierarchical
# (one copy per destination node, then the fan-out inside it) is the flex dispatcher with DeepEP
# (67f3515c arguments.py: --moe-token-dispatcher-type {allgather,alltoall,flex}, --moe-flex-dispatcher-
# backend {deepep,hybridep}, --moe-enable-deepep deprecated for it; HEAD d98e8a64 transformer_config.py
# accepts overlap_moe_expert_parallel_comm with alltoall or flex). MindSpeed has no hierarchical
# all-to-all flag on the line MindSpeed-LLM runs: --moe-hierarchical-alltoallv is registered
# (add_argument in mindspeed/arguments.py) only on MindSpeed's core_r0.8.0 branches (core_r0.8.0
# 46f6ca8c, 2.1.0_core_r0.8.0 1e898a29); on 2.1.0 … 26.1.0_core_r0.12.1 (5a9ee296, a654440c, 674226a1,
# 3c44c134, 57a33053) and master 028de58c it is only read by getattr in incompatibility checks
# (features_manager/moe/fb_overlap.py) and MindSpeed-LLM c77308a1 registers none, so argparse would
# reject it: MindSpeed-LLM plans flat.
# cp_comm_type: Megatron-LM --cp-comm-type p2p|a2a|allgather|a2a+p2p (67f3515c arguments.py, with
# --hierarchical-context-parallel-sizes); MindSpeed-LLM --context-parallel-algo (MINDSPEED_CP_ALGO below).
ALGORITHMS = {
    "megatron": {"moe_a2a_algorithm": ("flat", "hierarchical"), "cp_comm_type": ("p2p", "a2a", "allgather", "a2a+p2p")},
    "mindspeed": {"moe_a2a_algorithm": ("flat",), "cp_comm_type": ("p2p", "a2a", "allgather", "a2a+p2p")},
}


def algorithm_values(framework: str | None, name: str) -> tuple[str, ...]:
    """The values of ``name`` (``moe_a2a_algorithm`` or ``cp_comm_type``) that ``framework`` can launch
    (every value the cost model prices without a framework)."""
    if framework is None:
        return tuple(dict.fromkeys(v for table in ALGORITHMS.values() for v in table[name]))
    return ALGORITHMS[framework][name]


def default_framework(profile_name: str) -> str:
    """The framework a search plans for unless told: MindSpeed-LLM on Ascend profiles (names starting
    with ``ascend``), since Megatron-LM runs on NPUs only through MindSpeed's patches; Megatron-LM on GPUs."""
    return "mindspeed" if profile_name.startswith("ascend") else "megatron"


@dataclass(frozen=True)
class Refusal:
    """A choice of the plan (``field`` = ``value``) that the framework cannot carry out, and why."""

    field: str
    value: object
    reason: str

    def __str__(self) -> str:
        return f"{self.field}={_show(self.value)}: {self.reason}"


def _show(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(map(str, value)) + "]"
    return str(value)


class InexpressibleError(ValueError):
    """The config uses options the format cannot express (``refusals``; ``field`` names the first)."""

    def __init__(self, framework: str, refusals: list[Refusal]):
        self.framework, self.refusals = framework, refusals
        self.field = refusals[0].field
        super().__init__(f"{LABELS[framework]} cannot express " + "; ".join(map(str, refusals)))


# moe_token_dispatcher_type as launched: Megatron-LM 67f3515c arguments.py offers --moe-token-dispatcher-type
# {allgather, alltoall, flex} (alltoall_seq, the legacy sequence-level all-to-all, was removed); MindSpeed-LLM
# passes the flag through with allgather, alltoall and alltoall_seq (MindSpeed docs/features/
# moe-token-permute-and-unpermute.md names alltoall and alltoall_seq) and has no flex dispatcher (no DeepEP
# on NPUs: ALGORITHMS offers it flat dispatch only).
DISPATCHERS = {"megatron": ("allgather", "alltoall", "flex"), "mindspeed": ("allgather", "alltoall", "alltoall_seq")}


# cp_comm_type -> MindSpeed-LLM --context-parallel-algo (features_manager/context_parallel/
# context_parallel_feature.py choices megatron_cp_algo, hybrid_cp_algo, kvallgather_cp_algo, plus
# ulysses_cp_algo from MindSpeed's UlyssesContextParallelFeature; --ulysses-degree-in-cp for hybrid).
MINDSPEED_CP_ALGO = {"p2p": "megatron_cp_algo", "a2a": "ulysses_cp_algo", "allgather": "kvallgather_cp_algo",
                     "a2a+p2p": "hybrid_cp_algo"}


# MindSpeed-LLM's selective recompute. core_v0.12.1 already has --recompute-modules (megatron/training/
# arguments.py:1568, choices core_attn, moe_act, layernorm, mla_up_proj, mlp, moe; no shared_experts), and
# MindSpeed-LLM keeps Megatron's code for four of them: core_attn (its attention and MLA check
# checkpoint_core_attention: mindspeed_llm/core/transformer/attention.py, tasks/models/transformer/
# multi_latent_attention.py), layernorm and mlp (its TransformerLayer, which replaces Megatron's in
# features_manager/megatron_basic/megatron_basic.py, reads recompute_input_layernorm / recompute_pre_mlp_
# layernorm / recompute_mlp set by core_v0.12.1's TransformerLayer.__init__), moe (moe_layer_forward in
# mindspeed_llm/core/transformer/moe/moe_layer.py checkpoints when MoELayer.moe_layer_recompute, which
# core_v0.12.1 sets from "moe" in recompute_modules; only without the all-to-all overlap, see _moe). Its
# own MLA and MindSpeed's grouped-GEMM experts ignore Megatron's mla_up_proj and moe_act, and have flags:
MINDSPEED_MODULE_FLAGS = {
    # mindspeed_llm/features_manager/transformer/multi_latent_attention/mla_feature.py
    "mla_up_proj": ["--recompute-mla-up-proj"],
    # MindSpeed features_manager/recompute/activation_function.py; honoured by the grouped-GEMM experts
    # (mindspeed/core/transformer/moe/experts.py, moe_feature/overlap/grouped_mlp_with_comp_and_comm_
    # overlap_all2all.py) and, beyond the plan, by the dense and shared-expert MLPs (mindspeed_llm/core/
    # transformer/mlp.py): the run saves at least the activations the plan dropped.
    "moe_act": ["--recompute-activation-function"],
}


MINDSPEED_MEGATRON_MODULES = ("core_attn", "layernorm", "mlp", "moe")


# MindSpeed's swap-attention (features_manager SwapAttentionFeature: --swap-attention, --swap-modules, default
# "input_norm,self_attention,post_attention_norm") swaps whole modules: input_norm is Megatron's attn_norm,
# self_attention the attention's inputs (qkv_linear, core_attn, attn_proj together), post_attention_norm
# mlp_norm. It has no expert swap.
MINDSPEED_SWAP_MODULES = (("input_norm", ("attn_norm",)), ("self_attention", ("qkv_linear", "core_attn", "attn_proj")),
                          ("post_attention_norm", ("mlp_norm",)))


# Recompute modules whose fp8 inputs Transformer Engine must re-quantise in the recomputation: Megatron's
# default delayed scaling refuses them (HEAD transformer_config.py "Delayed scaling does not support moe_act
# and layernorm recompute for fp8")
FP8_CURRENT_SCALING_MODULES = ("layernorm", "moe_act")

"""The training frameworks a plan is for, and how each expresses the plan on its command line.

One table that the search space (``search/space.py``: a search offers only configs its framework can
run) and the launch exporter (``app/formats/launch.py``: an export prints these flags) both read, so the two
cannot disagree. ``express(config, spec, framework)`` returns the flags of every choice the cost model
planned, and a ``Refusal`` for each choice the framework cannot carry out as planned; a non-empty
``refusals`` means the export refuses (never drops an option silently). A field at its default needs no
flag when the framework's own default does the same; a choice that has no effect on the model (an
all-to-all setting of a dense model, the param all-gather overlap without a sharded optimizer) needs none.

What each framework can express (``docs/search.md`` has the user-facing table):

=========================== ===================================== =======================================
choice                      Megatron-LM                           MindSpeed-LLM
=========================== ===================================== =======================================
selective recompute modules all (``--recompute-modules``)          core_attn, layernorm, mlp, moe through
                                                                  ``--recompute-modules`` (core 0.12.1);
                                                                  moe_act ``--recompute-activation-
                                                                  function``; mla_up_proj ``--recompute-
                                                                  mla-up-proj``; no shared_experts
full recompute, N per stage ``block`` with N / vpp per chunk when as Megatron, or N per pipeline rank
                            that recomputes N layers per stage    (``--enable-recompute-layers-per-pp-rank``)
pipeline split              every split (flags or layout string)  every split (no-op padding, else layout)
EP dispatch (searched)      flat ``alltoall``; hierarchical       flat ``alltoall``; no hierarchical
                            ``flex`` + DeepEP                     all-to-all (when EP leaves the node)
CP algorithm (searched)     ``--cp-comm-type`` (all four)         ``--context-parallel-algo`` (all four)
TP overlap                  ``--tp-comm-overlap``                 ``--use-ascend-mc2`` (not with the
                                                                  all-to-all overlap, not with fp8, not
                                                                  in MoE models: grouped GEMM)
EP all-to-all overlap       not with full recompute, the moe      ``--moe-alltoall-overlap-comm`` (not
                            module, MTP > 1, or pp > 1 without    with the moe module)
                            interleaving
model-state dtypes          precision-aware optimizer: bf16 main  ``--reuse-fp32-param`` (bf16 main
                            params (remainders), bf16 grads, any  params), ``--quant-states fp8`` (both
                            moment dtype                          moments fp8)
DP sharding                 all four (Megatron-FSDP for ZeRO-2/3) no_shard, optim
=========================== ===================================== =======================================

Sources read (file and commit):

* Megatron-LM: NVIDIA/Megatron-LM ``megatron/training/arguments.py`` at 67f3515c8a0539d38c23f59dd8b85efdcbb3af3d
  (the last commit that spells every flag as a literal ``add_argument``, as tests/test_launch.py does),
  and the checks of ``megatron/core/transformer/transformer_config.py``, ``megatron/training/arguments.py``
  and ``megatron/core/optimizer/`` at d98e8a64ddf34856e74b24714e3bedb2f5a39553 (called "HEAD" below).
* MindSpeed-LLM: Ascend/MindSpeed-LLM at c77308a14bfcb1aa7ca61da9c1aa24a893cb1b91, which runs on Megatron-LM
  core_v0.12.1 (a845aa7e12b3a117e24c2352b9e3e60bad2e3a17; docs/en/pytorch/training/install_guide.md) and
  Ascend/MindSpeed at 028de58ca629d035185b00ff7d1eb7eff4f7fd48. Only the features MindSpeed-LLM registers
  count (the lists in mindspeed_llm/features_manager/__init__.py); their ``validate_args`` run at start-up
  (mindspeed_llm/training/arguments.py ``validate_args_v2_decorator``), MindSpeed's legacy
  ``mindspeed/arguments.py`` checks do not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from costmodel import ModelSpec, TrainingConfig
from costmodel.batch import NO_VALUE
from costmodel.pipeline import _virtual_stage_tokens, parse_layout

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


@dataclass
class Split:
    """How the framework places the cost model's pipeline split."""

    flags: list[str]
    num_layers: int  # --num-layers (MindSpeed pads virtual stages with no-op layers)
    real: list[int]  # positions of the model's layers among the num_layers
    chunks: list[list[int]]  # decoder layers of each pipeline rank's model chunks: chunks[rank][chunk]


@dataclass
class Expression:
    """A config's flags by concern (``groups``, in launch order) and what the framework cannot express."""

    split: Split
    groups: dict[str, list[str]] = field(default_factory=dict)
    refusals: list[Refusal] = field(default_factory=list)

    def add(self, group: str, flags: list[str], refusals: list[Refusal] = ()) -> None:
        self.groups.setdefault(group, []).extend(flags)
        self.refusals.extend(refusals)


def express(config: TrainingConfig, spec: ModelSpec, framework: str,
            scale_up_domain: int | None = None, split_rules: bool = True) -> Expression:
    """The flags of ``config`` in ``framework`` and the refusals of what it cannot express.

    ``scale_up_domain`` (devices per scale-up domain, from the cluster profile) decides whether the
    expert-parallel group leaves the domain (then the dispatch algorithm matters) and the Ulysses degree
    of ``cp_comm_type=a2a+p2p``; unknown, the choices that depend on it are refused rather than guessed.
    ``split_rules=False`` leaves out the all-to-all overlap's pipeline rules (``_a2a_overlap_pipeline``),
    for the search's probes at pp = 1, which score those per split (``split_refusals``).
    """
    if framework not in FRAMEWORKS:
        raise ValueError(f"unknown framework {framework!r}; known: {', '.join(FRAMEWORKS)}")
    ms = framework == "mindspeed"
    out = Expression(split=pipeline_split(config, spec, framework))
    out.add("recompute", *_recompute(config, spec, ms, out.split))
    out.add("offload", *_offload(config, ms))
    out.add("sharding", *_sharding(config, ms))
    out.add("optimizer", *_optimizer_dtypes(config, ms))
    out.add("tp_overlap", *_tp_overlap(config, spec, ms))
    out.add("context_parallel", *_context_parallel(config, spec, ms, scale_up_domain))
    out.add("attention", _attention(config, ms))
    out.add("moe", *_moe(config, spec, ms, scale_up_domain))
    out.add("schedule", *_schedule(config, spec, ms, out.split))
    if split_rules:
        out.refusals += _a2a_overlap_pipeline(config, spec, ms)
    if config.expert_placement == "balanced":
        # Megatron-Core places local experts contiguously (expert e on EP rank e // (E / ep)); neither it nor
        # MindSpeed-LLM has a flag that permutes experts over ranks at launch.
        out.refusals.append(Refusal("expert_placement", "balanced", "no launch flag places experts by load "
                                                                    "(both frameworks place them contiguously)"))
    if config.moe_expert_replicas:
        # Megatron-Core's and MindSpeed-LLM's expert layers hold E / ep experts per rank, each once;
        # replicated experts (DeepSeek's EPLB) exist in inference engines only.
        out.refusals.append(Refusal("moe_expert_replicas", str(config.moe_expert_replicas),
                                    "no launch flag replicates experts in training (each rank holds E / ep)"))
    out.add("precision", *_fp8(config, ms))
    out.add("memory_savings", *_memory_savings(config, ms))
    return out


def _memory_savings(cfg: TrainingConfig, ms: bool) -> tuple[list[str], list[Refusal]]:
    """DeepSeek-V3's memory measures (§3.2.3, §3.3.3) as far as a framework has a flag for them."""
    args, bad = [], []
    if cfg.activation_func_fp8_input_store:
        # Megatron-Core's TransformerConfig.activation_func_fp8_input_store has no command-line flag: d98e8a64
        # megatron/training/arguments.py _add_network_size_args excludes it from the generated arguments
        # and 67f3515c had no literal one (Megatron-Bridge sets it in its model provider); not found among
        # MindSpeed-LLM's features either
        bad.append(Refusal("activation_func_fp8_input_store", True, f"{LABELS['mindspeed' if ms else 'megatron']} "
                           "has no launch flag for it (Megatron-Core's TransformerConfig field is set in code)"))
    if cfg.parameter_ema != "none":
        bad.append(Refusal("parameter_ema", cfg.parameter_ema, "neither Megatron-LM nor MindSpeed-LLM keeps an "
                                                               "EMA of the parameters (no launch flag)"))
    if cfg.mla_fa_without_pad and not ms:
        bad.append(Refusal("mla_fa_without_pad", True, "Megatron-LM's attention takes unequal QK and V head dims: "
                                                       "there is no padding to turn off (a MindSpeed-LLM flag)"))
    return args, bad


# Recompute modules whose fp8 inputs Transformer Engine must re-quantise in the recomputation: Megatron's
# default delayed scaling refuses them (HEAD transformer_config.py "Delayed scaling does not support moe_act
# and layernorm recompute for fp8")
FP8_CURRENT_SCALING_MODULES = ("layernorm", "moe_act")


def _fp8(cfg: TrainingConfig, ms: bool) -> tuple[list[str], list[Refusal]]:
    """The cost model prices fp8 as per-tensor scaled E4M3/E5M2 GEMMs with one-byte inputs (the H100
    profile's fp8_gemm_eff_ratio: "delayed or current scaling"): Megatron's ``delayed`` recipe (its
    default, stated), or per-tensor current scaling (``tensorwise``, core_v0.12.1 and HEAD --fp8-recipe)
    where the recompute modules need it. MindSpeed states Megatron's default (its MC2 rule reads it)."""
    if cfg.precision != "fp8":
        return [], []
    modules = (cfg.recompute_modules or ["core_attn"]) if cfg.recompute == "selective" else []
    bad = []
    if cfg.fp8_recipe == "delayed" and any(m in FP8_CURRENT_SCALING_MODULES for m in modules):
        bad.append(Refusal("fp8_recipe", "delayed", "Megatron's delayed scaling refuses the layernorm and moe_act "
                                                    "recompute modules in fp8"))
    if ms:  # MindSpeed parses Megatron's --fp8-recipe: stated when the config states one
        return ["--fp8-format", "hybrid"] + (["--fp8-recipe", cfg.fp8_recipe] if cfg.fp8_recipe else []), bad
    # the stated recipe, else tensorwise where those modules are recomputed (TrainingConfig.fp8_recipe_in_force)
    return ["--fp8-format", "hybrid", "--fp8-recipe", cfg.fp8_recipe_in_force], bad


def refusals(config: TrainingConfig, spec: ModelSpec, framework: str,
             scale_up_domain: int | None = None, split_rules: bool = True) -> list[Refusal]:
    """What ``framework`` cannot express of ``config`` (empty: a launch carries the plan out)."""
    return express(config, spec, framework, scale_up_domain, split_rules).refusals


# ---- pipeline split -------------------------------------------------------------------------------

def stage_tokens(cfg: TrainingConfig, spec: ModelSpec) -> list[str]:
    """The cost model's split: one token string (``E``, ``t``, ``m``, ``L``) per virtual stage, in model
    order (DualPipeV: 2·pp of them, costmodel.pipeline.split_chunks)."""
    if cfg.pipeline_layout is not None:
        return parse_layout(cfg.pipeline_layout)
    first = NO_VALUE if cfg.first_stage_layers is None else cfg.first_stage_layers
    last = NO_VALUE if cfg.last_stage_layers is None else cfg.last_stage_layers
    vpp = 2 if cfg.schedule == "dualpipev" else cfg.vpp
    return _virtual_stage_tokens(spec, cfg.pp, vpp, first, last,
                                 cfg.account_for_embedding_in_pipeline_split,
                                 cfg.account_for_loss_in_pipeline_split)


def layout_string(tokens: list[str]) -> str:
    """Megatron's ``--pipeline-model-parallel-layout`` for per-virtual-stage tokens (runs compressed)."""
    def stage(tok: str) -> str:
        out, i = [], 0
        while i < len(tok):
            j = i
            while j < len(tok) and tok[j] == tok[i]:
                j += 1
            out.append(tok[i] if j - i == 1 else f"{tok[i]}*{j - i}")
            i = j
        return ",".join(out)
    return "|".join(stage(t) for t in tokens)


def _chunks(counts: list[int], cfg: TrainingConfig) -> list[list[int]]:
    """Per pipeline rank, its chunks' layer counts: virtual stage k·pp + r is chunk k of rank r; under
    DualPipeV rank r holds r and 2pp − 1 − r, under DualPipe stages r and pp − 1 − r."""
    pp = cfg.pp
    if cfg.schedule == "dualpipev":
        return [[counts[r], counts[2 * pp - 1 - r]] for r in range(pp)]
    if cfg.schedule == "dualpipe":
        return [[counts[r], counts[pp - 1 - r]] for r in range(pp)]
    return [[counts[k * pp + r] for k in range(len(counts) // pp)] for r in range(pp)]


def pipeline_split(cfg: TrainingConfig, spec: ModelSpec, framework: str) -> Split:
    tokens = stage_tokens(cfg, spec)
    counts = [t.count("t") for t in tokens]
    if framework == "megatron":
        return Split(_megatron_split_flags(cfg, spec, tokens), spec.num_layers, list(range(spec.num_layers)),
                     _chunks(counts, cfg))
    if _noop_expressible(tokens, spec):
        return _noop_split(cfg, counts)
    # MindSpeed's PipelineModelParallelLayoutFeature ("Support --pipeline-model-parallel-layout from
    # Megatron dev on core_r0.12.1", mindspeed/features_manager/pipeline_parallel/
    # pipeline_model_parallel_layout_feature.py, registered by MindSpeed-LLM): for splits that place the
    # embedding, MTP or loss elsewhere than no-op padding can (it derives vpp from the string).
    layout = cfg.pipeline_layout or layout_string(tokens)
    return Split(["--pipeline-model-parallel-layout", layout], spec.num_layers, list(range(spec.num_layers)),
                 _chunks(counts, cfg))


def _megatron_split_flags(cfg: TrainingConfig, spec: ModelSpec, tokens: list[str]) -> list[str]:
    """A layout states the split; first/last stage sizes need --num-virtual-stages-per-pipeline-rank
    (Megatron requires it for uneven splits); else --account-for-* with the layers per virtual stage, or,
    when the slots do not divide by pp·vpp, the layout string of the even-spread rule."""
    if cfg.pipeline_layout is not None:
        return ["--pipeline-model-parallel-layout", cfg.pipeline_layout]
    if cfg.first_stage_layers is not None or cfg.last_stage_layers is not None:
        if cfg.pp > 1 and not _megatron_uneven_exact(cfg, spec):
            return ["--pipeline-model-parallel-layout", layout_string(tokens)]
        args = ["--num-virtual-stages-per-pipeline-rank", str(cfg.vpp)] if cfg.pp > 1 else []
        if cfg.first_stage_layers is not None:
            args += ["--decoder-first-pipeline-num-layers", str(cfg.first_stage_layers)]
        if cfg.last_stage_layers is not None:
            args += ["--decoder-last-pipeline-num-layers", str(cfg.last_stage_layers)]
        return args
    ae, al = cfg.account_for_embedding_in_pipeline_split, cfg.account_for_loss_in_pipeline_split
    slots, stages = spec.num_layers + int(ae) + int(al), cfg.pp * cfg.vpp
    if slots % stages:
        return ["--pipeline-model-parallel-layout", layout_string(tokens)]
    args = (["--account-for-embedding-in-pipeline-split"] if ae else []) + \
           (["--account-for-loss-in-pipeline-split"] if al else [])
    if cfg.vpp > 1:
        return args + ["--num-layers-per-virtual-pipeline-stage", str(slots // stages)]
    # With one stage the flag states nothing, and older Megatron-LM releases assert it needs pp > 1.
    return args + (["--num-virtual-stages-per-pipeline-rank", "1"] if cfg.pp > 1 else [])


def _megatron_uneven_exact(cfg: TrainingConfig, spec: ModelSpec) -> bool:
    """Whether --decoder-first/last-pipeline-num-layers give the cost model's split: Megatron (HEAD
    transformer_config.py, "Uneven PP") requires the first and last counts and the layers of each middle
    rank to divide by vpp and the middle layers to divide by the middle ranks, then spreads evenly; the
    cost model spreads any remainder (pipeline.py), which only a layout string can state."""
    fixed = [n for n in (cfg.first_stage_layers, cfg.last_stage_layers) if n is not None]
    middle = cfg.pp - len(fixed)
    rest = spec.num_layers - sum(fixed)
    if any(n <= 0 or n % cfg.vpp for n in fixed):
        return False
    if middle == 0:
        return rest == 0
    return rest > 0 and rest % middle == 0 and (rest // middle) % cfg.vpp == 0


def _noop_expressible(tokens: list[str], spec: ModelSpec) -> bool:
    """No-op padding keeps the embedding on the first virtual stage and the MTP layers and the loss on
    the last (where MindSpeed-LLM builds them): any other placement needs a layout string."""
    tail = "m" * spec.mtp_num_layers + "L"
    inner = [tokens[0].removeprefix("E")] + tokens[1:-1] + [tokens[-1].removesuffix(tail)]
    if len(tokens) == 1:
        inner = [tokens[0].removeprefix("E").removesuffix(tail)]
    return tokens[0].startswith("E") and tokens[-1].endswith(tail) and all(set(t) <= {"t"} for t in inner)


def _noop_split(cfg: TrainingConfig, counts: list[int]) -> Split:
    """Every virtual stage padded with no-op layers (``--noop-layers``, as MindSpeed-LLM's DeepSeek-V3
    recipe pads 61 layers to 64) up to the largest, real layers first, so that --num-layers divides by
    pp·vpp and each stage holds exactly the layers the cost model placed there."""
    width = max(counts)
    real, noop = [], []
    for v, n in enumerate(counts):
        real += [v * width + i for i in range(n)]
        noop += [v * width + i for i in range(n, width)]
    args = ["--num-layers-per-virtual-pipeline-stage", str(width)] if cfg.vpp > 1 else []
    if noop:
        # --noop-layers: MindSpeed mindspeed/arguments.py (_add_training_args), NoopLayersFeature in
        # MindSpeed-LLM; "--noop-layers 61,62,63" in examples/mcore/deepseek3/pretrain_deepseek3_671b_4k_ptd.sh
        args += ["--noop-layers", ",".join(map(str, noop))]
    return Split(args, width * len(counts), real, _chunks(counts, cfg))


# ---- recompute ------------------------------------------------------------------------------------

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


def _recompute(cfg: TrainingConfig, spec: ModelSpec, ms: bool, split: Split) -> tuple[list[str], list[Refusal]]:
    if cfg.recompute == "full":
        return _full_recompute(cfg, ms, split)
    if cfg.recompute != "selective":
        return [], []
    modules = list(cfg.recompute_modules or ["core_attn"])
    bad = []
    if "mla_up_proj" in modules and not spec.multi_latent_attention:
        # core_v0.12.1 / HEAD transformer_config.py: "mla_up_proj in recompute_modules is only supported
        # with multi_latent_attention"
        bad.append(Refusal("recompute_modules", modules, "mla_up_proj needs a multi-latent-attention model"))
    if "moe_act" in modules and not spec.is_moe and not ms:
        # transformer_config.py: "moe_act in recompute_modules is only supported with moe_grouped_gemm"
        bad.append(Refusal("recompute_modules", modules, "moe_act needs an MoE model (grouped GEMM)"))
    if not ms:
        return ["--recompute-granularity", "selective", "--recompute-modules", *modules], bad
    return _mindspeed_selective(cfg, modules, bad)


# MindSpeed's swap-attention (features_manager SwapAttentionFeature: --swap-attention, --swap-modules, default
# "input_norm,self_attention,post_attention_norm") swaps whole modules: input_norm is Megatron's attn_norm,
# self_attention the attention's inputs (qkv_linear, core_attn, attn_proj together), post_attention_norm
# mlp_norm. It has no expert swap.
MINDSPEED_SWAP_MODULES = (("input_norm", ("attn_norm",)), ("self_attention", ("qkv_linear", "core_attn", "attn_proj")),
                          ("post_attention_norm", ("mlp_norm",)))


def _offload(cfg: TrainingConfig, ms: bool) -> tuple[list[str], list[Refusal]]:
    """Activation offload: Megatron-Core's --fine-grained-activation-offloading --offload-modules (its
    names are the config's), MindSpeed's --swap-attention --swap-modules where the set is whole modules."""
    modules = list(cfg.offload_modules or [])
    if not modules:
        return [], []
    if not ms:
        return ["--fine-grained-activation-offloading", "--offload-modules", *modules], []
    bad, names = [], []
    for name, parts in MINDSPEED_SWAP_MODULES:
        held = [m for m in parts if m in modules]
        if held and len(held) < len(parts):
            bad.append(Refusal("offload_modules", modules, f"MindSpeed's --swap-modules {name} swaps "
                                                           f"{', '.join(parts)} together, not {', '.join(held)} alone"))
        elif held:
            names.append(name)
    experts = [m for m in modules if m in ("expert_fc1", "moe_act")]
    if experts:
        bad.append(Refusal("offload_modules", modules, f"MindSpeed's --swap-modules has no expert swap "
                                                       f"({', '.join(experts)})"))
    return ["--swap-attention", "--swap-modules", ",".join(names)], bad


def _mindspeed_selective(cfg: TrainingConfig, modules: list[str],
                         bad: list[Refusal]) -> tuple[list[str], list[Refusal]]:
    if "shared_experts" in modules:
        bad.append(Refusal("recompute_modules", modules, "MindSpeed-LLM has no shared-expert recompute (core "
                                                         "0.12.1's --recompute-modules has no shared_experts, and "
                                                         "MindSpeed-LLM adds none)"))
    if "moe" in modules and cfg.moe_a2a_overlap:
        bad.append(Refusal("recompute_modules", modules, "moe recompute with moe_a2a_overlap: MindSpeed's "
                           "all-to-all-overlap MoE layer (mindspeed/core/transformer/moe/moe_feature/overlap/"
                           "moe_layer.py) never checkpoints the layer"))
    core = [m for m in modules if m in MINDSPEED_MEGATRON_MODULES]
    args = ["--recompute-granularity", "selective", "--recompute-modules", *core] if core else []
    for m in modules:
        args += MINDSPEED_MODULE_FLAGS.get(m, [])
    if "mla_up_proj" in modules and cfg.tp > 1:
        # mla_feature.py validate_args: with tp > 1 --recompute-mla-up-proj needs --mla-up-proj-tp-overlap,
        # which needs --mla-mm-split and --sequence-parallel
        if not cfg.sp:
            bad.append(Refusal("recompute_modules", modules, "mla_up_proj with tp > 1 needs sequence "
                                                             "parallelism (--mla-up-proj-tp-overlap)"))
        args += ["--mla-up-proj-tp-overlap", "--mla-mm-split"]
    return args, bad


def _full_recompute(cfg: TrainingConfig, ms: bool, split: Split) -> tuple[list[str], list[Refusal]]:
    """Every layer (``uniform`` of 1), or N decoder layers per pipeline stage. Megatron's ``block`` counts
    per model chunk: N / vpp per chunk when that recomputes exactly min(N, layers) on every stage.
    MindSpeed's block recompute (features_manager/recompute/recompute_method.py, mindspeed/core/memory/
    common.py) can also count per pipeline rank with --enable-recompute-layers-per-pp-rank."""
    head = ["--recompute-granularity", "full"]
    n = cfg.recompute_num_layers
    if n is None:
        return head + ["--recompute-method", "uniform", "--recompute-num-layers", "1"], []
    want = [min(n, sum(ch)) for ch in split.chunks]
    widest = max(max(ch) for ch in split.chunks)
    for per_chunk in range(1, widest + 1):
        if [sum(min(per_chunk, k) for k in ch) for ch in split.chunks] == want:
            return head + ["--recompute-method", "block", "--recompute-num-layers", str(per_chunk)], []
    if ms and cfg.schedule != "dualpipev" and _per_rank_exact(n, split, cfg.vpp, want):
        return head + ["--recompute-method", "block", "--recompute-num-layers", str(n),
                       "--enable-recompute-layers-per-pp-rank"], []
    return [], [Refusal("recompute_num_layers", n, f"{n} fully recomputed layers per stage cannot be stated "
                        f"as block recompute over {cfg.vpp} model chunks of {split.chunks[0]} layers")]


def _per_rank_exact(n: int, split: Split, vpp: int, want: list[int]) -> bool:
    """With --enable-recompute-layers-per-pp-rank MindSpeed recomputes the chunk layers of priority
    layer_idx·vpp + chunk < n; the no-op padding sits after each chunk's real layers."""
    width = split.num_layers // (len(split.chunks) * vpp)
    per_chunk = [min(max(math.ceil((n - k) / vpp), 0), width) for k in range(vpp)]
    return [sum(min(c, real) for c, real in zip(per_chunk, ch)) for ch in split.chunks] == want


# ---- data parallelism and model-state dtypes --------------------------------------------------------

def _sharding(cfg: TrainingConfig, ms: bool) -> tuple[list[str], list[Refusal]]:
    stage, args, bad = cfg.sharding, [], []
    if stage in ("optim_grads", "optim_grads_params"):
        if ms:
            # MindSpeed-LLM registers neither MindSpeed's CustomFSDPFeature nor any ZeRO-2/3 feature for the
            # Megatron path (mindspeed_llm/features_manager/__init__.py); its FSDP2 trainer is another program
            bad.append(Refusal("data_parallel_sharding_strategy", stage, "MindSpeed-LLM shards only the "
                                                                          "optimizer states (distributed optimizer)"))
        else:
            # Megatron-FSDP (67f3515c arguments.py --use-megatron-fsdp, --data-parallel-sharding-strategy; v1
            # needs the distributed optimizer: HEAD arguments.py). HEAD's --megatron-fsdp-main-grads-dtype
            # defaults to "auto" (the bf16 model dtype): state the planned one.
            args += ["--use-distributed-optimizer", "--use-megatron-fsdp", "--data-parallel-sharding-strategy",
                     stage, "--megatron-fsdp-main-grads-dtype", cfg.main_grads_dtype]
    elif stage == "optim":
        args.append("--use-distributed-optimizer")
    if cfg.overlap_grad_reduce:
        args.append("--overlap-grad-reduce")
    if cfg.overlap_param_gather and stage != "no_shard":  # without sharded weights there is nothing to gather
        if not cfg.overlap_grad_reduce:
            # HEAD arguments.py: "Must use --overlap-param-gather with --overlap-grad-reduce"; the plan hides
            # the all-gather, so the launch cannot drop the overlap either: refused, and no flag emitted
            bad.append(Refusal("overlap_param_gather", True, "needs overlap_grad_reduce"))
        else:
            args.append("--overlap-param-gather")
    return args, bad


def _optimizer_dtypes(cfg: TrainingConfig, ms: bool) -> tuple[list[str], list[Refusal]]:
    changed = {k: getattr(cfg, k) for k in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype",
                                            "exp_avg_sq_dtype") if getattr(cfg, k) != "fp32"}
    if not changed:
        return [], []
    return _mindspeed_dtypes(cfg, changed) if ms else _megatron_dtypes(cfg, changed)


def _megatron_dtypes(cfg: TrainingConfig, changed: dict) -> tuple[list[str], list[Refusal]]:
    """Megatron-Core's precision-aware optimizer (67f3515c arguments.py --use-precision-aware-optimizer,
    --main-grads-dtype fp32|bf16, --main-params-dtype fp32|fp16, --exp-avg(-sq)-dtype fp32|fp16|bf16|fp8).
    With it and bf16 training the fp32 master weights are kept as 16-bit remainders beside the bf16
    weights (HEAD optimizer_config.py store_param_remainders=True, no flag; TE >= 2.1): what
    main_params_dtype=bf16 plans. It needs the distributed optimizer (HEAD optimizer/__init__.py)."""
    bad = []
    fsdp = cfg.sharding in ("optim_grads", "optim_grads_params")
    if cfg.sharding == "no_shard":
        key = next(iter(changed))
        bad.append(Refusal(key, changed[key], "Megatron-LM's precision-aware optimizer needs the distributed "
                                              "optimizer"))
    if fsdp:
        other = {k: v for k, v in changed.items() if k != "main_grads_dtype"}  # stated by _sharding
        bad += [Refusal(k, v, "not mapped for Megatron-FSDP (its own --megatron-fsdp-*-dtype flags)")
                for k, v in other.items()]
        return [], bad
    if cfg.main_params_dtype == "fp32":
        bad.append(Refusal("main_params_dtype", "fp32", "Megatron-LM's precision-aware optimizer keeps the fp32 "
                           "master weights as 16-bit remainders (store_param_remainders, no flag): plan "
                           "main_params_dtype=bf16 with it"))
    elif cfg.main_params_dtype == "fp16":
        bad.append(Refusal("main_params_dtype", "fp16", "fp16 master weights are not mapped with bf16 training"))
    args = ["--use-precision-aware-optimizer"]
    for key in ("main_grads_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
        if key in changed:
            args += ["--" + key.replace("_", "-"), changed[key]]
    return args, bad


def _mindspeed_dtypes(cfg: TrainingConfig, changed: dict) -> tuple[list[str], list[Refusal]]:
    """No precision-aware optimizer on NPUs (it is Transformer Engine's FusedAdam). MindSpeed's
    --reuse-fp32-param (features_manager/memory/reuse_fp32_param.py, docs/zh/features/reuse-fp32-param.md:
    fp32 = bf16 + residual) is main_params_dtype=bf16; MindSpeed-LLM's --quant-states fp8 (features_manager/
    low_precision/low_precision_optimizer_feature.py) stores both Adam moments in fp8 (E4M3); its
    --quant-grads stores fp16, not bf16, gradients."""
    args, bad = [], []
    if changed.get("main_params_dtype") == "bf16":
        args.append("--reuse-fp32-param")
    elif "main_params_dtype" in changed:
        bad.append(Refusal("main_params_dtype", changed["main_params_dtype"],
                           "MindSpeed-LLM offers only the bf16 + residual form (--reuse-fp32-param)"))
    if "main_grads_dtype" in changed:
        bad.append(Refusal("main_grads_dtype", changed["main_grads_dtype"], "MindSpeed-LLM quantises gradients "
                                                                            "to fp16 only (--quant-grads)"))
    moments = (cfg.exp_avg_dtype, cfg.exp_avg_sq_dtype)
    if moments == ("fp8", "fp8"):
        args += ["--quant-states", "fp8"]
    elif moments != ("fp32", "fp32"):
        key = "exp_avg_dtype" if cfg.exp_avg_dtype != "fp8" or cfg.exp_avg_sq_dtype == "fp32" else "exp_avg_sq_dtype"
        bad.append(Refusal(key, getattr(cfg, key), "MindSpeed-LLM stores the Adam moments in fp32, or both in "
                                                    "fp8 (--quant-states fp8)"))
    return args, bad


# ---- tensor, context and expert parallelism ----------------------------------------------------------

def _tp_overlap(cfg: TrainingConfig, spec: ModelSpec, ms: bool) -> tuple[list[str], list[Refusal]]:
    """Megatron --tp-comm-overlap (67f3515c arguments.py: "can happen only when sequence parallelism is
    enabled"; tp = 1 turns sequence parallelism off); MindSpeed MC2 --use-ascend-mc2 (MindSpeed
    features_manager/tensor_parallel/mc2.py: tp > 1 and sequence parallelism; MindSpeed-LLM deprecates its
    old --use-mc2 for it, features_manager/arguments/deprecated_args.py)."""
    if not cfg.tp_comm_overlap:
        return [], []
    bad = []
    if cfg.tp == 1 or not cfg.sp:
        bad.append(Refusal("tp_comm_overlap", True, "needs tp > 1 and sequence parallelism"))
    if ms and cfg.precision == "fp8":
        # MindSpeed features_manager/megatron_basic/transformer_engine_basic.py: "MC2 is supported only by
        # the mxfp8 recipe in fp8" (the export states Megatron's default recipe)
        bad.append(Refusal("tp_comm_overlap", True, "MindSpeed's MC2 runs fp8 only with the mxfp8 recipe"))
    if ms and spec.is_moe:
        # MindSpeed-LLM mindspeed_llm/training/arguments.py _validate_moe_args: "Moe Grouped Gemm is not
        # supported with mc2 in MOE model" (--moe-grouped-gemm is how the plan's experts run)
        bad.append(Refusal("tp_comm_overlap", True, "MindSpeed-LLM refuses MC2 (--use-ascend-mc2) with the "
                                                    "grouped-GEMM experts of an MoE model"))
    return ["--use-ascend-mc2" if ms else "--tp-comm-overlap"], bad


def ulysses_degree(cfg: TrainingConfig, scale_up_domain: int | None) -> int | None:
    """The all-to-all (Ulysses) part of the context-parallel group, as the cost model prices it
    (costmodel/layers.py ``_cp_degrees``): cp for a2a, 1 for p2p and allgather, and for a2a+p2p the
    members inside one scale-up domain (None when the domain is unknown)."""
    if cfg.cp_comm_type == "a2a":
        return cfg.cp
    if cfg.cp_comm_type != "a2a+p2p":
        return 1
    if scale_up_domain is None:
        return None
    return math.gcd(cfg.cp, max(scale_up_domain // cfg.tp, 1))


# cp_comm_type -> MindSpeed-LLM --context-parallel-algo (features_manager/context_parallel/
# context_parallel_feature.py choices megatron_cp_algo, hybrid_cp_algo, kvallgather_cp_algo, plus
# ulysses_cp_algo from MindSpeed's UlyssesContextParallelFeature; --ulysses-degree-in-cp for hybrid).
MINDSPEED_CP_ALGO = {"p2p": "megatron_cp_algo", "a2a": "ulysses_cp_algo", "allgather": "kvallgather_cp_algo",
                     "a2a+p2p": "hybrid_cp_algo"}


def _attention(cfg: TrainingConfig, ms: bool) -> list[str]:
    """The attention kernel. Megatron-LM: --attention-backend {flash,fused,unfused,local,auto} (core_r0.10
    and later, megatron/core/transformer/enums.py AttnBackend; core_v0.16.1 validate_args reads it), whose
    default auto picks Transformer Engine's flash or fused (cuDNN) attention, both FlashAttention-class:
    flash states nothing, unfused is --attention-backend unfused (before core_r0.10 unfused was the
    default and --use-flash-attn opted in). MindSpeed-LLM: --use-flash-attn (MindSpeed features_manager/
    transformer/flash_attention/fusion_attention_v1_feature.py, npu_fusion_attention), left out for the
    unfused path. MindSpeed-LLM's --mla-fa-without-pad keeps its MLA from padding V to the QK head dim
    (mla_fa_without_pad); Megatron-LM's attention takes unequal head dims and has nothing to turn off."""
    if ms:
        return (["--use-flash-attn"] if cfg.attention_kernel == "flash" else []) + (
            ["--mla-fa-without-pad"] if cfg.mla_fa_without_pad else [])
    return [] if cfg.attention_kernel == "flash" else ["--attention-backend", "unfused"]


def _context_parallel(cfg: TrainingConfig, spec: ModelSpec, ms: bool,
                      scale_up_domain: int | None) -> tuple[list[str], list[Refusal]]:
    if cfg.cp == 1:
        return [], []
    u = ulysses_degree(cfg, scale_up_domain)
    if u is None:
        return [], [Refusal("cp_comm_type", cfg.cp_comm_type, "the Ulysses degree depends on the cluster's "
                                                              "scale-up domain, which is unknown here")]
    kind = {1: "p2p", cfg.cp: "a2a"}.get(u, "a2a+p2p") if cfg.cp_comm_type != "allgather" else "allgather"
    bad = []
    if kind not in ALGORITHMS["mindspeed" if ms else "megatron"]["cp_comm_type"]:
        bad.append(Refusal("cp_comm_type", cfg.cp_comm_type, f"{LABELS['mindspeed' if ms else 'megatron']} "
                                                             f"has no {kind} context parallelism"))
        return [], bad
    if u > 1 and spec.num_attention_heads % (u * cfg.tp):
        # MindSpeed ulysses/hybrid: "num_attention_heads must be divisible by ... * tensor_model_parallel_size"
        bad.append(Refusal("cp_comm_type", cfg.cp_comm_type, f"Ulysses over {u} ranks needs the attention "
                                                             f"heads ({spec.num_attention_heads}) divisible by "
                                                             f"{u}·tp"))
    if ms:
        args = ["--context-parallel-algo", MINDSPEED_CP_ALGO[kind]]
        return (args + ["--ulysses-degree-in-cp", str(u)] if kind == "a2a+p2p" else args), bad
    if kind == "p2p":
        return [], bad  # Megatron's default --cp-comm-type p2p
    # 67f3515c arguments.py --cp-comm-type p2p|a2a|allgather|a2a+p2p; a2a+p2p takes the two levels from
    # --hierarchical-context-parallel-sizes (first the a2a level inside the domain, then the ring)
    args = ["--cp-comm-type", kind]
    return (args + ["--hierarchical-context-parallel-sizes", str(u), str(cfg.cp // u)]
            if kind == "a2a+p2p" else args), bad


def ep_leaves_domain(cfg: TrainingConfig, scale_up_domain: int | None) -> bool:
    """Whether the expert-parallel group (ranks etp apart, Megatron-Core's expert rank order) spans more
    than one scale-up domain (assumed when the domain is unknown): only then flat and hierarchical
    dispatch differ (costmodel/comm.py ``expert_all_to_all_s``)."""
    if cfg.ep == 1:
        return False
    return scale_up_domain is None or cfg.ep > max(scale_up_domain // cfg.etp, 1)


def _moe(cfg: TrainingConfig, spec: ModelSpec, ms: bool,
         scale_up_domain: int | None) -> tuple[list[str], list[Refusal]]:
    """Dispatcher, grouped GEMM and the all-to-all overlap (an MoE model's; none of it matters to a dense one)."""
    if not spec.is_moe:
        return [], []
    bad = []
    if cfg.tp > 1 and not cfg.sp:
        # megatron/core/transformer/moe/moe_layer.py (core_v0.12.1 and HEAD) raises in training
        bad.append(Refusal("sequence_parallel", False, "MoE layers with tp > 1 need sequence parallelism"))
    if spec.add_bias_linear and cfg.etp > 1:
        # HEAD transformer_config.py: "Bias in Moe is only supported when ETP==1"
        bad.append(Refusal("etp", cfg.etp, "the experts' linear biases need etp = 1"))
    dispatcher = cfg.moe_token_dispatcher_type
    hierarchical = cfg.moe_a2a_algorithm == "hierarchical" and ep_leaves_domain(cfg, scale_up_domain)
    if dispatcher is not None:
        args, bad_dispatch = _dispatcher_args(dispatcher, ms)
        bad += bad_dispatch
    elif not hierarchical:
        args = ["--moe-token-dispatcher-type", "alltoall"]
    elif "hierarchical" not in ALGORITHMS["mindspeed" if ms else "megatron"]["moe_a2a_algorithm"]:
        args = ["--moe-token-dispatcher-type", "alltoall"]
        bad.append(Refusal("moe_a2a_algorithm", "hierarchical", "MindSpeed-LLM has no hierarchical all-to-all "
                           "and this expert-parallel group leaves the scale-up domain (plan flat)"))
    else:
        # DeepEP's normal kernels send a token once per node (ALGORITHMS above)
        args = ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "deepep"]
    args.append("--moe-grouped-gemm")
    if cfg.moe_a2a_overlap:
        flag, problems = _a2a_overlap(cfg, spec, ms)
        args.append(flag)
        bad += problems
        if ms and cfg.delay_wgrad_compute is not None:
            bad.append(Refusal("delay_wgrad_compute", cfg.delay_wgrad_compute, "MindSpeed-LLM has no "
                               "--delay-wgrad-compute (its all-to-all overlap schedules the weight gradients)"))
        elif not ms and cfg.delays_wgrad:
            # HEAD megatron/core/transformer/moe/README.md: the EP all-to-all overlap is
            # "--overlap-moe-expert-parallel-comm --delay-wgrad-compute"
            args.append("--delay-wgrad-compute")
    return args, bad


# moe_token_dispatcher_type as launched: Megatron-LM 67f3515c arguments.py offers --moe-token-dispatcher-type
# {allgather, alltoall, flex} (alltoall_seq, the legacy sequence-level all-to-all, was removed); MindSpeed-LLM
# passes the flag through with allgather, alltoall and alltoall_seq (MindSpeed docs/features/
# moe-token-permute-and-unpermute.md names alltoall and alltoall_seq) and has no flex dispatcher (no DeepEP
# on NPUs: ALGORITHMS offers it flat dispatch only).
DISPATCHERS = {"megatron": ("allgather", "alltoall", "flex"), "mindspeed": ("allgather", "alltoall", "alltoall_seq")}


def _dispatcher_args(dispatcher: str, ms: bool) -> tuple[list[str], list[Refusal]]:
    """The launch arguments of a stated ``moe_token_dispatcher_type`` (refused where the framework has none)."""
    framework = "mindspeed" if ms else "megatron"
    args = ["--moe-token-dispatcher-type", dispatcher]
    if dispatcher == "flex":
        args += ["--moe-flex-dispatcher-backend", "deepep"]  # DeepEP's normal kernels (ALGORITHMS above)
    if dispatcher not in DISPATCHERS[framework]:
        return args, [Refusal("moe_token_dispatcher_type", dispatcher,
                              f"{LABELS[framework]} has no {dispatcher} dispatcher (it offers "
                              f"{', '.join(DISPATCHERS[framework])})")]
    return args, []


def _a2a_overlap(cfg: TrainingConfig, spec: ModelSpec, ms: bool) -> tuple[str, list[Refusal]]:
    def no(reason: str) -> Refusal:
        return Refusal("moe_a2a_overlap", True, reason)

    bad = [no("needs expert parallelism (ep > 1)")] if cfg.ep == 1 else []
    if cfg.moe_token_dispatcher_type == "allgather":
        # Megatron-LM HEAD transformer_config.py takes overlap_moe_expert_parallel_comm with the alltoall or
        # flex dispatcher only; MindSpeed's --moe-alltoall-overlap-comm overlaps the alltoall dispatcher's
        bad.append(no("the EP all-to-all overlap needs an all-to-all dispatcher, not allgather"))
    if ms:
        # MindSpeed features_manager/moe/moe_alltoall_overlap.py: incompatible_check(args, 'use_ascend_mc2');
        # needs --moe-grouped-gemm with the alltoall dispatcher (always emitted)
        if cfg.tp_comm_overlap:
            bad.append(no("MindSpeed's --moe-alltoall-overlap-comm and MC2 (tp_comm_overlap) are incompatible"))
        # DualPipeV's overlap is MindSpeed's forward-backward overlap across micro-batches (its rules: _schedule)
        return "--moe-fb-overlap" if cfg.schedule == "dualpipev" else "--moe-alltoall-overlap-comm", bad
    # HEAD transformer_config.py, the overlap_moe_expert_parallel_comm checks
    if cfg.recompute == "full":
        bad.append(no("Megatron-LM disables full recompute with the EP all-to-all overlap"))
    if cfg.recompute == "selective" and "moe" in (cfg.recompute_modules or []):
        bad.append(no("Megatron-LM forbids the moe recompute module with the EP all-to-all overlap"))
    if spec.mtp_num_layers > 1:
        bad.append(no("Megatron-LM's EP all-to-all overlap supports at most one MTP layer"))
    return "--overlap-moe-expert-parallel-comm", bad


def _a2a_overlap_pipeline(cfg: TrainingConfig, spec: ModelSpec, ms: bool) -> list[Refusal]:
    """HEAD transformer_config.py: with pp > 1 Megatron's EP all-to-all overlap needs
    virtual_pipeline_model_parallel_size set, which Megatron clears for vpp = 1 (arguments.py); and the
    released core_v0.16.1 (the megatron-core wheel, tests/test_megatron_validate.py) asserts "Pipeline
    model parallel size must be larger than 1 when enabling overlap_moe_expert_parallel_comm with MTP layer"."""
    if ms or not (spec.is_moe and cfg.moe_a2a_overlap):
        return []
    if cfg.pp > 1 and cfg.vpp == 1:
        return [Refusal("moe_a2a_overlap", True, "Megatron-LM's EP all-to-all overlap needs the interleaved "
                                                 "schedule (vpp > 1) when pp > 1")]
    if cfg.pp == 1 and spec.mtp_num_layers:
        return [Refusal("moe_a2a_overlap", True, "Megatron-LM's EP all-to-all overlap with an MTP layer needs "
                                                 "pp > 1 (core_v0.16.1)")]
    return []


# ---- pipeline schedule -----------------------------------------------------------------------------

def _schedule(cfg: TrainingConfig, spec: ModelSpec, ms: bool, split: Split) -> tuple[list[str], list[Refusal]]:
    """1F1B and interleaving follow from vpp in both frameworks. DualPipeV is MindSpeed's ``--schedules-method
    dualpipev`` (features_manager/pipeline_parallel/dualpipev_feature.py at 028de58c, registered by
    MindSpeed-LLM c77308a1); Megatron-LM has no DualPipe (HEAD megatron/core/pipeline_parallel/schedules.py:
    1F1B, interleaved and combined 1F1B) and neither has DeepSeek's bidirectional DualPipe."""
    schedule = cfg.schedule
    if schedule in ("1f1b", "interleaved"):
        return [], []

    def no(reason: str) -> Refusal:
        return Refusal("pipeline_schedule", schedule, reason)

    if not ms:
        return [], [no("Megatron-LM has no DualPipe schedule (1F1B, interleaved and combined 1F1B only)")]
    if schedule == "dualpipe":
        return [], [no("MindSpeed-LLM runs DualPipeV only (--schedules-method choices: dualpipev); DeepSeek's "
                       "bidirectional DualPipe, two parameter copies per rank, has no flag")]
    bad = []  # MindSpeed's DualpipeVFeature.validate_args
    if cfg.overlap_grad_reduce:
        bad.append(Refusal("overlap_grad_reduce", True, "MindSpeed's dualpipev and overlap_grad_reduce are "
                                                        "incompatible"))
    if cfg.cp > 1:
        bad.append(Refusal("cp", cfg.cp, "MindSpeed's dualpipev and context parallelism are incompatible"))
    if not spec.untie_embeddings_and_output_weights:
        bad.append(no("MindSpeed's dualpipev needs untied embedding and output weights"))
    if spec.is_moe and cfg.moe_a2a_overlap and cfg.etp != 1:
        # features_manager/moe/fb_overlap.py at 028de58c: "fb overlap only support expert-tensor-parallel-size=1"
        bad.append(Refusal("moe_a2a_overlap", True, "MindSpeed's --moe-fb-overlap (the all-to-all overlap under "
                                                    "dualpipev) needs etp 1"))
    if split.flags and split.flags[0] == "--pipeline-model-parallel-layout":
        # dualpipev_chunks.py get_num_layers_to_build: --num-layers // pp // 2 layers in every chunk
        bad.append(no("MindSpeed's DualPipeV builds --num-layers / (2·pp) layers in every chunk: only the even "
                      "split, padded with no-op layers, can be stated"))
    return ["--schedules-method", "dualpipev"], bad


def split_refusals(config: TrainingConfig, spec: ModelSpec, framework: str, split: Split | None = None) -> list[Refusal]:
    """The refusals that depend on the pipeline split (pp, vpp, split fields): the full-recompute count and
    the all-to-all overlap's schedule. Every other rule reads tp, cp, ep, etp, sequence parallelism and
    the options only (the search probes them at pp = 1 with ``split_rules=False``) and scores these apart
    (search/space.py). ``split``: ``pipeline_split`` of the config, where the caller has it (it reads the
    split fields only, so one split serves every option)."""
    ms = framework == "mindspeed"
    split = pipeline_split(config, spec, framework) if split is None else split
    out = _a2a_overlap_pipeline(config, spec, ms) + _schedule(config, spec, ms, split)[1]
    if config.recompute == "full":
        out += _full_recompute(config, ms, split)[1]
    return out

"""Every planned choice but the pipeline split, as each framework states it (``ms``: MindSpeed-LLM, else
Megatron-LM): recompute, offload, data-parallel sharding and model-state dtypes, TP overlap, context
parallelism, attention kernel, the MoE dispatcher and all-to-all overlap, the pipeline schedule, fp8 and
DeepSeek-V3's memory measures. Each returns its flags and the refusals of what the framework cannot do."""

from __future__ import annotations

import math

from costmodel import ModelSpec, TrainingConfig

from .megatron import _megatron_dtypes
from .mindspeed import _mindspeed_dtypes, _mindspeed_selective, _per_rank_exact
from .split import Split
from .table import (ALGORITHMS, DISPATCHERS, FP8_CURRENT_SCALING_MODULES, LABELS, MINDSPEED_CP_ALGO,
                    MINDSPEED_SWAP_MODULES, Refusal)


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

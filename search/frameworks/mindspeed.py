"""The rules only MindSpeed-LLM has: its selective-recompute flags, its model-state dtypes
(--reuse-fp32-param, --quant-states) and the per-pipeline-rank block recompute count."""

from __future__ import annotations

import math

from costmodel import TrainingConfig

from .split import Split
from .table import MINDSPEED_MEGATRON_MODULES, MINDSPEED_MODULE_FLAGS, Refusal


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


def _per_rank_exact(n: int, split: Split, vpp: int, want: list[int]) -> bool:
    """With --enable-recompute-layers-per-pp-rank MindSpeed recomputes the chunk layers of priority
    layer_idx·vpp + chunk < n; the no-op padding sits after each chunk's real layers."""
    width = split.num_layers // (len(split.chunks) * vpp)
    per_chunk = [min(max(math.ceil((n - k) / vpp), 0), width) for k in range(vpp)]
    return [sum(min(c, real) for c, real in zip(per_chunk, ch)) for ch in split.chunks] == want

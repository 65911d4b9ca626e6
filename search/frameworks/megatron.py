"""The rules only Megatron-LM has: its precision-aware optimizer's dtypes and the EP all-to-all overlap's
pipeline requirements."""

from __future__ import annotations

from costmodel import ModelSpec, TrainingConfig

from .table import Refusal


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

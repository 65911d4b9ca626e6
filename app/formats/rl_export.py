"""An RL plan (``paraplan rl --json``, an ``rl`` job's result) as launch arguments: the training side's
Megatron-LM / MindSpeed-LLM arguments (``app.formats.launch.launch_args`` for the plan's training config, on the
training sequence prompt + response) and the rollout side's engine arguments under vLLM's option names, which
vLLM-Ascend (the vLLM plugin for Ascend NPUs) takes unchanged.

``export_rl(result, fmt, mode)`` gives two blocks, each a ``#`` comment header then one flag per line
joined with `` \\`` (``format_args``), separated by a blank line: paste each block into its launcher.
Bad input raises ``InputError`` naming the field.
"""

from __future__ import annotations

import math

from .errors import InputError
from .launch import InexpressibleError, format_args, launch_args, launch_env
from .rl import is_rl

MODES = ("colocated", "disaggregated")
FRACTION_STEP = 1e-3  # --gpu-memory-utilization is rounded up to this (80 MiB of an 80 GiB device)


def chosen_plan(result, mode: str | None) -> tuple[str, dict]:
    """``(mode, plan)``: the plan of ``mode``, or with None the result's ``best``."""
    if not is_rl(result):
        raise InputError("result", "not an RL plan: `colocated` and `disaggregated` missing (what `paraplan rl "
                                   "--json` prints)")
    if mode is None:
        best = result.get("best")
        if not isinstance(best, dict) or best.get("mode") not in MODES:
            raise InputError("best", "no RL plan fits: nothing to export")
        mode = best["mode"]
    plan = result.get(mode)
    if not isinstance(plan, dict):
        raise InputError(mode, "no plan of this mode fits: nothing to export")
    for key in ("rollout", "training", "memory"):
        if not isinstance(plan.get(key), dict):
            raise InputError(f"{mode}.{key}", "missing or not an object")
    return mode, plan


def _workload(result: dict) -> dict:
    wl = (result.get("inputs") or {}).get("workload")
    if not isinstance(wl, dict):
        raise InputError("inputs.workload", "missing: not a `paraplan rl --json` result")
    for key in ("prompt_length", "response_length"):
        if isinstance(wl.get(key), bool) or not isinstance(wl.get(key), int) or wl[key] < 1:
            raise InputError(f"inputs.workload.{key}", "missing or not a positive integer")
    return wl


def training_spec(result: dict, wl: dict):
    """The policy's spec on the training sequence (prompt + response tokens, as the RL search trained it):
    ``inputs.model_spec``, else ``inputs.model`` resolved as ``--model`` is (results from before model_spec)."""
    from costmodel import ModelSpec

    from .inputs import _validated, load_model

    inputs = result.get("inputs") or {}
    if isinstance(inputs.get("model_spec"), dict):
        spec = _validated(ModelSpec, inputs["model_spec"], "inputs.model_spec")
    elif isinstance(inputs.get("model"), str):
        spec = load_model(inputs["model"])
    else:
        raise InputError("inputs.model_spec", "missing: not a `paraplan rl --json` result")
    return spec.model_copy(update={"seq_length": wl["prompt_length"] + wl["response_length"]})


def training_args(result: dict, mode: str, plan: dict, fmt: str, domain: int | None) -> list[str]:
    """The training script's arguments of the plan's training config; ``domain``: devices per scale-up domain of
    the plan's cluster (None when unknown: the options that depend on it are refused, not guessed)."""
    from pydantic import ValidationError

    from costmodel import TrainingConfig

    from .inputs import _validated

    config = plan["training"].get("config")
    if not isinstance(config, dict):
        raise InputError(f"{mode}.training.config", "missing or not an object")
    cfg = _validated(TrainingConfig, config, f"{mode}.training.config")
    spec = training_spec(result, _workload(result))
    try:
        return launch_args(cfg, spec, fmt, domain)
    except InexpressibleError as exc:
        raise InputError(f"{mode}.training.config.{exc.field}", str(exc)) from None
    except (ValueError, ValidationError) as exc:
        raise InputError(f"{mode}.training.config", str(exc)) from None


def _number(plan_part: dict, key: str, where: str) -> float:
    value = plan_part.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InputError(f"{where}.{key}", "missing or not a non-negative number")
    return float(value)


def kept_states_gib(mode: str, plan: dict, wl: dict) -> float:
    """GiB per device the trainer keeps on the device during rollout: a co-located plan that does not offload
    keeps every trained model's weights, gradients and optimizer states (``costmodel.rl._states_bytes`` ×
    models trained: the critic's too for PPO); otherwise none."""
    if mode != "colocated" or plan["rollout"].get("offload_training_state"):
        return 0.0
    mem = ((plan["training"].get("evaluation") or {}).get("memory")) or {}
    where = f"{mode}.training.evaluation.memory"
    states = sum(_number(mem, k, where) for k in ("params_gib", "grads_gib", "optimizer_gib"))
    return states * (2 if wl.get("critic") else 1)


def gpu_memory_utilization(mode: str, plan: dict, wl: dict) -> float:
    """vLLM's ``--gpu-memory-utilization`` (the fraction of a device's memory the engine may take: weights,
    activations and the KV cache) that the plan used: the rollout phase's peak per device
    (``memory.rollout_peak_gib``: weights + the KV cache of the plan's batch + the framework overhead + the
    trainer's states it keeps there) less the trainer's states (not the engine's: vLLM refuses to start when
    its fraction exceeds the memory free), over the capacity; rounded up to ``FRACTION_STEP`` but never above
    the budget the plan sized its batches with (``rollout.memory_fraction`` less the trainer's share)."""
    mem, where = plan["memory"], f"{mode}.memory"
    capacity = _number(mem, "capacity_gib", where)
    if capacity <= 0:
        raise InputError(f"{where}.capacity_gib", "must be positive")
    kept = kept_states_gib(mode, plan, wl)
    used = (_number(mem, "rollout_peak_gib", where) - kept) / capacity
    budget = _number(plan["rollout"], "memory_fraction", f"{mode}.rollout") - kept / capacity
    rounded = math.ceil(used / FRACTION_STEP - 1e-9) * FRACTION_STEP
    return rounded if used > budget else min(rounded, budget)  # printed to 3 places: never below the peak


def _positive_int(part: dict, key: str, where: str) -> int:
    value = part.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{where}.{key}", "missing or not a positive integer")
    return value


def rollout_args(mode: str, plan: dict, wl: dict) -> list[str]:
    """vLLM engine arguments of the plan's rollout: one engine instance's tp (and expert parallelism when the
    plan's ep > 1), the dp instances, the plan's batch per instance, its memory fraction and the longest
    sequence (prompt + the longest response)."""
    r, where = plan["rollout"], f"{mode}.rollout"
    tp, ep, dp, batch = (_positive_int(r, k, where) for k in ("tp", "ep", "dp", "batch"))
    longest = wl.get("max_response_length") or wl["response_length"]
    args = ["--tensor-parallel-size", str(tp)]
    if ep > 1:
        args.append("--enable-expert-parallel")
    args += ["--data-parallel-size", str(dp), "--max-num-seqs", str(batch),
             "--gpu-memory-utilization", f"{gpu_memory_utilization(mode, plan, wl):.3f}",
             "--max-model-len", str(wl["prompt_length"] + longest)]
    return args


def _rollout_header(mode: str, plan: dict, wl: dict, moe: bool) -> list[str]:
    r, mem = plan["rollout"], plan["memory"]
    kept = kept_states_gib(mode, plan, wl)
    ep = f" ep {r['ep']}" if r["ep"] > 1 else ""
    lines = [f"# rollout ({mode}): vLLM / vLLM-Ascend engine arguments, {r['dp']} instance(s) of tp {r['tp']}{ep} "
             f"on {plan.get('rollout_devices', '?')} devices",
             f"# --gpu-memory-utilization: the rollout peak {mem['rollout_peak_gib']:.2f} GiB per device"
             + (f" less the trainer's states kept there ({kept:.2f} GiB)" if kept else "")
             + f", of {mem['capacity_gib']:g} GiB, rounded up (the plan's budget: {r['memory_fraction']:g})"]
    if moe and r["dp"] > 1:
        lines.append("# note: with --data-parallel-size vLLM joins a MoE model's expert layers across the dp "
                     "instances (tp x dp ranks); the plan priced independent instances (ep = tp inside each): run "
                     "dp engines without --data-parallel-size to match it")
    return lines


def export_rl(result, fmt: str, mode: str | None = None, domain: int | None = None) -> tuple[str, dict]:
    """Both blocks, training then rollout, for the plan of ``mode`` (None: the best), and the environment the
    training flags need (``launch_env``); ``domain`` as in ``training_args``."""
    mode, plan = chosen_plan(result, mode)
    wl = _workload(result)
    train = training_args(result, mode, plan, fmt, domain)
    rollout = rollout_args(mode, plan, wl)
    moe = bool(training_spec(result, wl).is_moe)
    head = (f"# training ({mode}): {fmt} arguments on {plan.get('train_devices', '?')} devices, "
            f"step {plan.get('step_time_s', 0):.2f} s")
    text = "\n".join([head, format_args(train).rstrip("\n"), "", *_rollout_header(mode, plan, wl, moe),
                      format_args(rollout)])
    return text, launch_env(train)

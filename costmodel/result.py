"""The contract's evaluation result (a JSON-ready dict) for one config of a scored batch."""

from __future__ import annotations

import math
from importlib import metadata

import numpy as np

from . import resilience, routing
from .batch import ConfigBatch
from .evaluate import TIME_KEYS, BatchResult, evaluate_batch
from .hardware import GIB
from .spec import ClusterProfile, ModelSpec, TrainingConfig

try:
    PARAPLAN_VERSION = metadata.version("paraplan")
except metadata.PackageNotFoundError:  # running from a source tree
    PARAPLAN_VERSION = "0.0.0+source"


def _num(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def infeasible_reasons(br: BatchResult, i: int) -> list[dict]:
    reasons = [{"code": r.code, "message": r.message(i)} for r in br.rules if r.broken[i]]
    if br.broken["pipeline_split"][i]:
        reasons.append({"code": "pipeline_split", "message": br.stages.errors[br.stages.split_index[i]]})
    if br.valid[i] and not br.feasible[i] and br.peak_bytes[i] > br.capacity_bytes:
        reasons.append({"code": "oom", "message": (
            f"stage {int(br.peak_rank[i])} needs {br.peak_bytes[i] / GIB:.1f} GiB of "
            f"{br.capacity_bytes / GIB:.1f} (over by {(br.peak_bytes[i] - br.capacity_bytes) / GIB:.1f} GiB)")})
    if br.valid[i] and _offloads(br, i) and br.host_bytes_per_node[i] > br.host_capacity_bytes:
        reasons.append({"code": "host_oom", "message": (
            f"offloaded activations need {br.host_bytes_per_node[i] / GIB:.1f} GiB of host memory per node of "
            f"{br.host_capacity_bytes / GIB:.1f} (offload_modules; over by "
            f"{(br.host_bytes_per_node[i] - br.host_capacity_bytes) / GIB:.1f} GiB)")})
    return reasons


def _offloads(br: BatchResult, i: int) -> bool:
    return br.offload_modules is not None and bool(br.offload_modules[i])


def calibration_warnings(profile: ClusterProfile, spec: ModelSpec, config: TrainingConfig,
                         devices: int) -> list[str]:
    """Where a config lies outside what the profile's efficiency factors were fitted on."""
    cal = profile.calibration
    if cal is None or not cal.fitted_on:
        return [f"profile {profile.name} is not calibrated on published runs: its efficiency factors are priors"]
    out = []
    if cal.precisions and config.precision not in cal.precisions:
        out.append(f"precision {config.precision} is outside the calibration of {profile.name} "
                   f"(fitted on {', '.join(cal.precisions)} runs)")
    if spec.is_moe and not cal.moe:
        out.append(f"profile {profile.name} was calibrated on dense runs only; MoE costs are extrapolated")
    if cal.max_devices and devices > 2 * cal.max_devices:
        out.append(f"{devices} devices is far beyond the largest calibration run on {profile.name} "
                   f"({cal.max_devices} devices)")
    return out


def result_dict(br: BatchResult, i: int, profile: ClusterProfile, warnings: list[str]) -> dict:
    """The evaluation result of config ``i``: nulls for what a structurally invalid config cannot have."""
    valid = bool(br.valid[i])
    val = (lambda x: _num(x)) if valid else (lambda x: None)
    # an invalid config has no stages to report (a large batch does not score it: UNSCORED placeholders)
    per_stage = (br.stage_peaks(i) / GIB).tolist() if valid else None
    return {
        "feasible": bool(br.feasible[i]),
        "infeasible_reasons": infeasible_reasons(br, i),
        "warnings": warnings,
        "step_time_s": val(br.step_time_s[i]),
        "tokens_per_s": val(br.tokens_per_s[i]),
        "tokens_per_s_per_device": val(br.tokens_per_s_per_device[i]),
        "model_tflops_per_device": val(br.model_tflops_per_device[i]),
        "mfu": val(br.mfu[i]),
        "hfu": val(br.hfu[i]),
        # offload_s (extends the contract) only where something is offloaded: elsewhere it is 0
        "time": {k: val(br.time[k][i]) for k in TIME_KEYS if k != "offload_s" or _offloads(br, i)},
        "memory": {
            "peak_gib": val(br.peak_bytes[i] / GIB),
            "capacity_gib": br.capacity_bytes / GIB,
            "headroom_gib": val((br.capacity_bytes - br.peak_bytes[i]) / GIB),  # capacity - peak; < 0: does not fit
            "params_gib": val(br.params_bytes[i] / GIB),
            "grads_gib": val(br.grads_bytes[i] / GIB),
            "optimizer_gib": val(br.optimizer_bytes[i] / GIB),
            "activations_gib": val(br.activations_bytes[i] / GIB),
            # with the four above they add up to peak_gib (extends the contract)
            "buffers_gib": val(br.buffers_bytes[i] / GIB),
            "overhead_gib": val(br.overhead_bytes / GIB),
            "per_stage_peak_gib": [val(v) for v in per_stage] if valid else None,
            **(_host_memory(br, i, val) if _offloads(br, i) else {}),
        },
        "versions": {"paraplan": PARAPLAN_VERSION, "profile": profile.version()},
    }


def _host_memory(br: BatchResult, i: int, val) -> dict:
    """What activation offload moves to host memory (extends the contract): per device at the peak
    stage and per stage, and per node against the node's host memory. ``evaluate_many`` adds each
    stage's peak without offload (``per_stage_peak_without_offload_gib``)."""
    per_stage = br.stage_offloaded(i) / GIB
    return {"offloaded_gib": val(per_stage[int(br.peak_rank[i])]),
            "per_stage_offloaded_gib": [val(v) for v in per_stage] if bool(br.valid[i]) else None,
            "host_per_node_gib": val(br.host_bytes_per_node[i] / GIB),
            "host_capacity_gib": br.host_capacity_bytes / GIB}


def evaluate(spec: ModelSpec, profile: ClusterProfile, devices: int, config: TrainingConfig,
             resilience_options: resilience.ResilienceOptions | None = None) -> dict:
    """Evaluate one config: the vectorised path with a batch of one, every stage kept. A config with a
    routing distribution (``moe_expert_load`` / ``moe_expert_skew``) is scored with the imbalance its
    expert placement gives, reported under ``moe_routing``; ValueError where it does not fit the model."""
    return evaluate_many(spec, profile, devices, [config], resilience_options)[0]


def evaluate_many(spec: ModelSpec, profile: ClusterProfile, devices: int, configs: list[TrainingConfig],
                  resilience_options: resilience.ResilienceOptions | None = None) -> list[dict]:
    """Evaluate configs; each result carries the goodput block of ``resilience_options`` (the defaults
    when None: synchronous checkpoints at Young's interval, no hot spare)."""
    if not configs:
        return []
    resolved = [routing.resolved(spec, c) for c in configs]
    # Configs that offload are scored again without it (appended to the batch): the result shows each
    # stage's peak both ways.
    offloading = [i for i, (c, _) in enumerate(resolved) if c.offload_modules]
    batch = [c for c, _ in resolved] + [resolved[i][0].model_copy(update={"offload_modules": None}) for i in offloading]
    br = evaluate_batch(spec, profile, devices, ConfigBatch.from_configs(batch), all_stages=True)
    without = dict(zip(offloading, range(len(resolved), len(batch))))
    out = []
    for i, (c, report) in enumerate(resolved):
        res = result_dict(br, i, profile, calibration_warnings(profile, spec, c, devices))
        if i in without and br.valid[i]:
            res["memory"]["per_stage_peak_without_offload_gib"] = [
                _num(v) for v in (br.stage_peaks(without[i]) / GIB).tolist()]
        if report is not None:  # extends the contract: the imbalance the routing and placement give
            res["moe_routing"] = report
        out.append(res)
    # extends the contract: failures, checkpoints and restarts (costmodel/resilience.py), beside the numbers
    return resilience.attach_goodput(out, profile, devices, [c for c, _ in resolved], resilience_options)

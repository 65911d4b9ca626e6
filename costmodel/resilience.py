"""What failures cost a training job: checkpoints, interruptions, lost work and restarts (docs/guides/goodput.md).

A synchronous job stops whenever one of its devices, nodes, links or processes fails, restarts from its last
persisted checkpoint and redoes the work since. With a failure rate λ (per second of the whole job), a
checkpoint every Δ seconds of training that stalls the step for w seconds, L seconds of work lost and D
seconds of downtime per failure, the fraction of wall-clock time that advances training (the effective
training time ratio, ETTR, of Kokolis et al., HPCA 2025, arXiv 2410.21680) is, to first order in λ,

    goodput = (1 − λ·(L + D)) · Δ / (Δ + w)

(their E[ETTR] ≈ (1 − N·r_f·(u0 + Δ/2)) / (1 + w/Δ)). The interval, when not given, is Young's first-order
optimum sqrt(2·w·MTBF) (Young 1974; Daly 2006 adds higher-order terms this model leaves out).

Every function takes numpy arrays (one entry per config) or scalars, as the rest of the cost model.
Nothing here changes a step time: the goodput scales the throughput a config would have without failures.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from .spec import ClusterProfile, Fact

SECONDS_PER_HOUR = 3_600
SECONDS_PER_DAY = 86_400
GIB = 2**30
FAILURE_CATEGORIES = ("gpu", "hbm", "network", "host", "software")
CHECKPOINT_MODES = ("sync", "async", "in_memory")

# What a profile without reliability facts is priced with: the shipped H100 profile's figures (Llama 3's
# per-GPU failure counts, arXiv 2407.21783 §3.3.4 Table 5; hardware_profiles/nvidia-h100-80gb.yaml gives each
# source). A profile states its own under ``reliability:`` to replace any of them.
_L3_GPU_HOURS = 16_384 * 54 * 24
RELIABILITY_DEFAULTS = {
    "failure_rate_gpu_per_device_hour": 196 / _L3_GPU_HOURS,
    "failure_rate_hbm_per_device_hour": 72 / _L3_GPU_HOURS,
    "failure_rate_network_per_device_hour": 42 / _L3_GPU_HOURS,
    "failure_rate_host_per_device_hour": 46 / _L3_GPU_HOURS,
    "failure_rate_software_per_device_hour": 63 / _L3_GPU_HOURS,
    "planned_interruptions_per_device_hour": 47 / _L3_GPU_HOURS,
    "checkpoint_write_gbps_per_node": 10.0,  # a node's sustained write to a parallel file system (assumption)
    "checkpoint_read_gbps_per_node": 10.0,
    "storage_write_gbps": 2000.0,  # Llama 3 §3.3.1: Tectonic sustains 2 TB/s
    "storage_read_gbps": 2000.0,
    "detect_s": 60.0,
    "reschedule_s": 240.0,
    "restart_s": 300.0,
    "hot_spare_swap_s": 60.0,
}


class ResilienceOptions(BaseModel):
    """How a job protects itself (the CLI's and API's checkpoint options). Bandwidths given here replace
    the profile's; ``None`` keeps the profile's (or ``RELIABILITY_DEFAULTS``)."""

    model_config = ConfigDict(extra="forbid")

    # sync: the step waits for the write to storage (Megatron's default save); async: only the device-to-host
    # copy stalls, the write runs behind training (Megatron --async-save, MindSpeed's equivalent); in_memory:
    # the copy goes to a peer node's host memory (Gemini, SOSP 2023; torchft / MindSpeed in-memory recovery),
    # and a restart reads it back from there.
    checkpoint_mode: Literal["sync", "async", "in_memory"] = "sync"
    checkpoint_interval_s: float | None = Field(default=None, gt=0, le=30 * SECONDS_PER_DAY)
    hot_spare_nodes: int = Field(default=0, ge=0, le=4096)
    # at least 1 MB/s: a slower link is a typo, and keeps every time finite
    checkpoint_write_gbps_per_node: float | None = Field(default=None, ge=1e-3, le=1e6)
    checkpoint_read_gbps_per_node: float | None = Field(default=None, ge=1e-3, le=1e6)


def reliability(profile: ClusterProfile, key: str) -> float:
    """A reliability figure of the profile, else its documented default."""
    f: Fact | None = profile.reliability.get(key)
    return RELIABILITY_DEFAULTS[key] if f is None or f.value is None else float(f.value)


def unexpected_rate_per_device_hour(profile: ClusterProfile) -> float:
    """Unexpected interruptions per device-hour: the sum over failure categories (each stops the job)."""
    return sum(reliability(profile, f"failure_rate_{c}_per_device_hour") for c in FAILURE_CATEGORIES)


def interruptions_per_s(devices, rate_per_device_hour):
    """Interruptions per second of a job on ``devices`` devices: any one device (or its node, link or
    process) failing stops a synchronous job, so the rates add (Kokolis et al.: MTTF ∝ 1 / job size)."""
    return np.asarray(devices, dtype=np.float64) * rate_per_device_hour / SECONDS_PER_HOUR


def checkpoint_bytes_per_rank(weights_bytes, optimizer_bytes, weight_replicas):
    """Bytes one rank writes per checkpoint: its optimizer states as held (costmodel/memory.py's
    ``model_state_bytes``: the distributed optimizer's shard; without it the whole copy, which Megatron's
    checkpoint has data-parallel rank 0 write) and its share of the bf16 weights, which every data-parallel
    replica holds and the fully parallel save spreads over them. First order: expert weights have fewer
    replicas (expert-data-parallel) than ``weight_replicas`` (dp·cp), which undercounts them by at most
    their weights' share of the states (2 of 14 bytes per parameter with fp32 Adam). Gradients are not saved."""
    return np.asarray(optimizer_bytes, dtype=np.float64) + np.asarray(weights_bytes) / np.maximum(weight_replicas, 1)


def storage_transfer_s(bytes_per_rank, ranks_per_node, devices, node_gbps, aggregate_gbps):
    """Seconds to move a checkpoint between the job and shared storage: the busiest node pushes its ranks'
    bytes through its own link (``node_gbps``, GB/s), and all nodes together share the storage system's
    aggregate bandwidth (``aggregate_gbps``); the slower of the two binds."""
    b = np.asarray(bytes_per_rank, dtype=np.float64)
    per_node = b * ranks_per_node / (node_gbps * 1e9)
    whole_job = b * np.asarray(devices, dtype=np.float64) / (aggregate_gbps * 1e9)
    return np.maximum(per_node, whole_job)


def device_to_host_s(bytes_per_rank, host_bytes_per_s):
    """Seconds to copy a rank's checkpoint bytes from device memory to host memory over its host link
    (its share of the PCIe link, costmodel/hardware.py): all an asynchronous save stalls the step for."""
    return np.asarray(bytes_per_rank, dtype=np.float64) / host_bytes_per_s


def peer_copy_s(bytes_per_rank, scale_out_bytes_per_s):
    """Seconds to send a rank's checkpoint bytes to a peer node's host memory over its scale-out link (the
    in-memory checkpoint's background transfer, and its restart read)."""
    return np.asarray(bytes_per_rank, dtype=np.float64) / scale_out_bytes_per_s


def checkpoint_stall_s(mode: str, write_s, d2h_s):
    """Seconds a checkpoint stops training: the whole write when synchronous, the device-to-host copy when
    asynchronous or in memory (the rest runs behind the next steps)."""
    return np.asarray(write_s if mode == "sync" else d2h_s, dtype=np.float64)


def checkpoint_background_s(mode: str, write_s, peer_s):
    """Seconds a checkpoint takes to become safe after training resumes: 0 when synchronous, the storage
    write when asynchronous, the peer copy when in memory."""
    if mode == "sync":
        return np.zeros_like(np.asarray(write_s, dtype=np.float64))
    return np.asarray(write_s if mode == "async" else peer_s, dtype=np.float64)


def young_daly_interval_s(stall_s, mtbf_s):
    """Young's first-order optimum checkpoint interval, sqrt(2 · checkpoint cost · MTBF) (seconds of
    training between checkpoints); valid while the cost is small against the MTBF."""
    return np.sqrt(2.0 * np.asarray(stall_s, dtype=np.float64) * mtbf_s)


def checkpoint_interval_s(given_s, stall_s, background_s, mtbf_s, step_s):
    """The interval used: the given one, else Young's optimum but no shorter than the background write
    (a checkpoint must be safe before the next starts); whole steps (checkpoints are taken between steps,
    Megatron's --save-interval counts iterations), at least one."""
    if given_s is None:
        want = np.maximum(young_daly_interval_s(stall_s, mtbf_s), background_s)
    else:
        want = np.full_like(np.asarray(step_s, dtype=np.float64), given_s)
    steps = np.maximum(np.ceil(want / step_s - 1e-9), 1.0)
    return steps * step_s, steps


def lost_work_per_failure_s(interval_s, background_s):
    """Expected training seconds a failure throws away: a failure falls uniformly within an interval and
    loses the work since the last *safe* checkpoint, interval/2 on average; while the newest checkpoint is
    still being written (its background time B) the one before is the safe one, which adds B:
    (1/Δ)·(∫₀ᴮ (x+Δ) dx + ∫ᴮ^Δ x dx) = Δ/2 + B."""
    return np.asarray(interval_s, dtype=np.float64) / 2 + background_s


def downtime_per_failure_s(detect_s, reschedule_s, restart_s, load_s):
    """Seconds a failure keeps the job down before training resumes: detect it, replace the node (a hot
    spare's swap where one stands by), restart the processes and communicators, load the checkpoint."""
    return detect_s + reschedule_s + restart_s + np.asarray(load_s, dtype=np.float64)


def goodput_fraction(unexpected_per_s, planned_per_s, lost_s, downtime_s, planned_downtime_s, interval_s, stall_s):
    """Fraction of wall-clock time that advances training (ETTR, first order): failures cost their lost work
    and downtime, planned interruptions (checkpointed first) their downtime only, and each interval of
    training pays one checkpoint stall. 0 where failures come faster than the job can recover."""
    up = 1.0 - unexpected_per_s * (lost_s + downtime_s) - planned_per_s * planned_downtime_s
    interval = np.asarray(interval_s, dtype=np.float64)
    return np.clip(up, 0.0, 1.0) * interval / (interval + stall_s)


def goodput_arrays(profile: ClusterProfile, devices: int, step_time_s, weights_bytes, optimizer_bytes,
                   weight_replicas, host_bytes_per_s: float, scale_out_bytes_per_s: float,
                   opts: ResilienceOptions | None = None) -> dict:
    """Every figure of the goodput block, as arrays over configs (see ``goodput_block``)."""
    opts = opts or ResilienceOptions()
    node = int(profile.fact("devices_per_node"))
    ranks_per_node = min(node, devices)
    write_node = opts.checkpoint_write_gbps_per_node or reliability(profile, "checkpoint_write_gbps_per_node")
    read_node = opts.checkpoint_read_gbps_per_node or reliability(profile, "checkpoint_read_gbps_per_node")
    per_rank = checkpoint_bytes_per_rank(weights_bytes, optimizer_bytes, weight_replicas)
    write = storage_transfer_s(per_rank, ranks_per_node, devices, write_node,
                               reliability(profile, "storage_write_gbps"))
    d2h = device_to_host_s(per_rank, host_bytes_per_s)
    peer = peer_copy_s(per_rank, scale_out_bytes_per_s)
    mode = opts.checkpoint_mode
    stall = checkpoint_stall_s(mode, write, d2h)
    background = checkpoint_background_s(mode, write, peer)
    load = (peer if mode == "in_memory" else
            storage_transfer_s(per_rank, ranks_per_node, devices, read_node, reliability(profile, "storage_read_gbps")))
    unexpected = interruptions_per_s(devices, unexpected_rate_per_device_hour(profile))
    planned = interruptions_per_s(devices, reliability(profile, "planned_interruptions_per_device_hour"))
    mtbf = 1.0 / np.maximum(unexpected + planned, 1e-30)
    interval, steps = checkpoint_interval_s(opts.checkpoint_interval_s, stall, background, mtbf, step_time_s)
    lost = lost_work_per_failure_s(interval, background)
    replace = reliability(profile, "hot_spare_swap_s" if opts.hot_spare_nodes else "reschedule_s")
    restart = reliability(profile, "restart_s")
    down = downtime_per_failure_s(reliability(profile, "detect_s"), replace, restart, load)
    planned_down = downtime_per_failure_s(0.0, replace, restart, load)  # announced: nothing to detect
    good = goodput_fraction(unexpected, planned, lost, down, planned_down, interval, stall)
    paid = devices + opts.hot_spare_nodes * node
    return dict(per_rank=per_rank, write=write, d2h=d2h, stall=stall, background=background, load=load,
                unexpected=unexpected, planned=planned, mtbf=mtbf, interval=interval, steps=steps, lost=lost,
                down=down, planned_down=planned_down, goodput=good, paid_devices=paid,
                young_daly=young_daly_interval_s(stall, mtbf))


def goodput_block(profile: ClusterProfile, devices: int, evaluation: dict, config_dp_cp: int,
                  host_bytes_per_s: float, scale_out_bytes_per_s: float,
                  opts: ResilienceOptions | None = None) -> dict | None:
    """The goodput block of one evaluation result (JSON-ready; null where the config has no step time)."""
    opts = opts or ResilienceOptions()
    step, mem = evaluation.get("step_time_s"), evaluation.get("memory") or {}
    if step is None or mem.get("params_gib") is None:
        return None
    a = goodput_arrays(profile, devices, np.array([step]), np.array([mem["params_gib"] * GIB]),
                       np.array([mem["optimizer_gib"] * GIB]), config_dp_cp, host_bytes_per_s,
                       scale_out_bytes_per_s, opts)
    x = {k: float(np.asarray(v).ravel()[0]) for k, v in a.items()}
    if not all(np.isfinite(list(x.values()))):  # a profile beyond any real machine: nothing to report
        return None
    per_day = (x["unexpected"] + x["planned"]) * SECONDS_PER_DAY
    interval, stall = x["interval"], x["stall"]
    overhead = stall / (interval + stall)
    lost_frac = x["unexpected"] * x["lost"]
    restart_frac = x["unexpected"] * x["down"] + x["planned"] * x["planned_down"]
    tps = evaluation["tokens_per_s"]
    rule = ("given" if opts.checkpoint_interval_s is not None else
            "background_write" if x["background"] > x["young_daly"] else "young_daly")
    return {
        "checkpoint_mode": opts.checkpoint_mode,
        "checkpoint_gib_per_rank": x["per_rank"] / GIB,
        "checkpoint_gib": x["per_rank"] * devices / GIB,
        "checkpoint_write_s": x["write"],
        "checkpoint_stall_s": stall,
        "checkpoint_background_s": x["background"],
        "checkpoint_load_s": x["load"],
        "checkpoint_interval_s": interval,
        "checkpoint_interval_steps": int(x["steps"]),
        "checkpoint_interval_rule": rule,
        "mtbf_h": x["mtbf"] / SECONDS_PER_HOUR,
        "interruptions_per_day": per_day,
        "unexpected_per_day": x["unexpected"] * SECONDS_PER_DAY,
        "planned_per_day": x["planned"] * SECONDS_PER_DAY,
        "lost_work_per_failure_s": x["lost"],
        "downtime_per_failure_s": x["down"],
        "checkpoint_overhead": overhead,
        "lost_fraction": lost_frac,
        "restart_fraction": restart_frac,
        "goodput_fraction": x["goodput"],
        "effective_tokens_per_s": tps * x["goodput"],
        "hot_spare_nodes": opts.hot_spare_nodes,
        "paid_devices": int(x["paid_devices"]),
        "effective_tokens_per_s_per_paid_device": tps * x["goodput"] / x["paid_devices"],
    }


# A device without a stated host link (a profile that prices no offload) copies at PCIe Gen4 x16's
# 32 GB/s per direction, the slowest link a current accelerator sits on.
FALLBACK_HOST_BYTES_PER_S = 32e9


def checkpoint_links(profile: ClusterProfile) -> tuple[float, float]:
    """The links a checkpoint crosses, bytes/s per device: to host memory (``FALLBACK_HOST_BYTES_PER_S``
    where the profile states none) and out of the node (the in-memory copy to a peer)."""
    from .hardware import Hardware

    hw = Hardware.from_profile(profile)
    return hw.host_bytes_per_s or FALLBACK_HOST_BYTES_PER_S, hw.scale_out_bytes_per_s


def weight_replicas_of(devices: int, tp, pp, cp):
    """The ranks that hold the same weights, dp · cp (Megatron's data-parallel group with context
    parallelism; dp = devices / (tp · pp · cp)): each writes its share of them (``checkpoint_bytes_per_rank``)."""
    return np.maximum(devices // (tp * pp * cp), 1) * cp


def attach_goodput(results: list[dict], profile: ClusterProfile, devices: int, configs: list,
                   opts: ResilienceOptions | None = None) -> list[dict]:
    """Add the goodput block to each evaluation result (``goodput``; null where the config has no step
    time). The result's other numbers are left as they are."""
    host, scale_out = checkpoint_links(profile)
    for res, c in zip(results, configs):
        res["goodput"] = goodput_block(profile, devices, res, int(weight_replicas_of(devices, c.tp, c.pp, c.cp)), host,
                                       scale_out, opts)
    return results

"""Capacity planning: for each device count of a range, the best config, days to train T tokens,
device-hours, cost, the Pareto front of days against device-hours, and the smallest count that meets a
deadline (``docs/search.md``, "Capacity planning").

Every count is one exhaustive search (``run_search(sampler="exhaustive")``, one vectorised pass: the
planning pins leave no offload plan for a second pass) over the *planning space*: the parallel layout
(tp, pp, vpp, cp, ep, the pipeline split) and the micro-batch searched in full, the secondary options
pinned (``planning_fixed``). What the pins cost was measured against the full search on Pangu Ultra MoE
718B / ascend-910b (docs/guides/capacity.md; ``benchmarks/plan.py`` prints it).

The global batch is held in tokens across counts (``global_batch_size``, the rounding rule).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

from costmodel import ClusterProfile, ModelSpec
from costmodel.resilience import ResilienceOptions

from .engine import SearchRequest, run_search
from .margin import DEFAULT_MEMORY_MARGIN_GIB
from .pool import map_ordered, worker_check
from .space import SpaceError, validate_fixed

SECONDS_PER_DAY = 86_400
SECONDS_PER_HOUR = 3_600
MAX_COUNTS = 256  # device counts in one plan: 256 exhaustive searches is minutes already; more is a typo
DEFAULT_DEVICES_MAX = 16_384  # the largest published scale this project cites (Llama 3 405B on 16K H100s)
MAX_COUNTS_BY_DEFAULT = 32  # the default step keeps a plan at ≤ 32 counts: under a minute for Pangu (docs/guides/capacity.md)
# The batch (tokens per optimizer step) a preset was trained with, where it is published; the planner holds
# it across counts unless told otherwise.
PUBLISHED_BATCH_TOKENS = {
    # DeepSeek-V3 technical report §4.2: the batch ramps to 15,360 sequences of 4,096 tokens.
    "deepseek-v3-671b": 15_360 * 4_096,
    # Llama 3 paper §3.4.1: 405B pre-training batch 4M tokens, then 8M, then 16M tokens.
    "llama3-405b": 16 * 2**20,
    # GPT-3 paper, Table 2.1: 175B trained with a 3.2M-token batch.
    "gpt3-175b": 3_200_000,
    # Not published (shared/facts/ascend.md §1.2: "Global batch: unknown"): the 7,680 sequences of 8,192
    # tokens the project's Pangu examples assume, at DeepSeek-V3's batch-token scale.
    "pangu-ultra-moe-718b": 7_680 * 8_192,
}
# Any other model: 4M tokens (2^22), Llama 2's published pre-training batch (Touvron et al. 2023, §2.2).
DEFAULT_BATCH_TOKENS = 2**22
# Rounding the batch to a multiple of a divisor of the count no larger than 1/16 of it moves the batch by
# at most 1/32 (~3 %) of itself.
BATCH_UNIT_FRACTION = 16

ProgressFn = Callable[[int, int], None]  # (device counts planned so far, total counts)


class PlanError(ValueError):
    """A plan request that cannot be planned, naming the field."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


def planning_fixed(spec: ModelSpec) -> dict:
    """The secondary options the planner pins (everything else of the search space is searched):

    * ``offload_modules: []``: no activation offload (it doubles the options and needs a second pass);
      recompute still trades memory for time;
    * ``cp_comm_type: a2a``: Ulysses context parallelism, what the full Pangu search picks at every count
      measured (ring ``p2p`` there is 6–8 % slower);
    * MoE only: ``etp: 1`` (expert tensor parallelism off, as every best config measured) and
      ``moe_a2a_overlap: true`` (the dispatch overlap on, as every best config measured).

    Measured on Pangu Ultra MoE 718B / ascend-910b: the planner's best is 2.0 % below the full search's at
    1,024 NPUs and 1.0 % at 6,144 (the full search swaps the attention modules to host memory instead of
    recomputing); docs/guides/capacity.md."""
    fixed: dict = {"offload_modules": [], "cp_comm_type": "a2a"}
    if spec.is_moe:
        fixed.update(etp=1, moe_a2a_overlap=True)
    return fixed


def default_batch_tokens(spec: ModelSpec) -> int:
    """Tokens per step when none is given: the preset's published batch, else ``DEFAULT_BATCH_TOKENS``."""
    return PUBLISHED_BATCH_TOKENS.get(spec.name or "", DEFAULT_BATCH_TOKENS)


def global_batch_size(batch_tokens: float, seq_length: int, devices: int) -> int:
    """Sequences per step for ``devices``: ``batch_tokens / seq_length`` rounded to the nearest multiple of
    the largest divisor u of ``devices`` not above 1/16 of it (``BATCH_UNIT_FRACTION``), at least u.

    Every data-parallel size dp dividing u then divides the batch, i.e. every layout whose model-parallel
    size (tp·pp·cp) is a multiple of devices / u; the batch moves by at most u/2, 1/32 of itself."""
    target = max(1, round(batch_tokens / seq_length))
    limit = max(1, target // BATCH_UNIT_FRACTION)
    unit = max(d for d in _divisors(devices) if d <= limit)
    return max(unit, round(target / unit) * unit)


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def default_step(devices_min: int, devices_max: int, node: int) -> int:
    """The step when none is given: the node size times the smallest power of two that leaves at most
    ``MAX_COUNTS_BY_DEFAULT`` counts (1,024–16,384 on 8-NPU nodes: 512, 31 counts)."""
    step = node
    while (devices_max - devices_min) // step + 1 > MAX_COUNTS_BY_DEFAULT:
        step *= 2
    return step


def device_counts(devices_min: int, devices_max: int, step: int, node: int) -> list[int]:
    """``devices_min``, ``devices_min + step``, … up to ``devices_max``, keeping the multiples of the node
    size ``node`` (a job takes whole nodes)."""
    if devices_min < 1:
        raise PlanError("devices_min", f"must be at least 1 (got {devices_min})")
    if devices_max < devices_min:
        raise PlanError("devices_max", f"{devices_max} is below devices_min {devices_min}")
    if step < 1:
        raise PlanError("devices_step", f"must be at least 1 (got {step})")
    counts = [n for n in range(devices_min, devices_max + 1, step) if n % node == 0]
    if not counts:
        raise PlanError("devices_min", f"{devices_min}–{devices_max} in steps of {step} holds no multiple of the "
                                       f"node size ({node} devices per node)")
    if len(counts) > MAX_COUNTS:
        raise PlanError("devices_step", f"the range holds {len(counts)} device counts; at most {MAX_COUNTS}")
    return counts


@dataclass
class PlanRequest:
    spec: ModelSpec
    profile: ClusterProfile
    tokens: float  # tokens to train
    devices_min: int | None = None  # default: one node
    devices_max: int | None = None  # default: DEFAULT_DEVICES_MAX
    devices_step: int | None = None  # default: default_step
    deadline_days: float | None = None
    price_per_device_hour: float | None = None  # any currency; cost = device-hours × price
    global_batch_tokens: float | None = None  # default: default_batch_tokens
    precision: str = "bf16"
    moe_load_imbalance: float | None = None
    memory_margin_gib: float = DEFAULT_MEMORY_MARGIN_GIB
    framework: str | None = None
    fixed: dict | None = None  # the caller's pins (--fix), merged over planning_fixed(spec)
    # checkpoints, hot spares and storage (costmodel/resilience.py); the defaults when None
    resilience: ResilienceOptions | None = None
    jobs: int = 1  # processes that search the counts at once (search.pool); the plan is the same

    def resolved(self) -> "PlanRequest":
        """The request with every default filled in and checked (``PlanError`` naming the field)."""
        node = int(self.profile.fact("devices_per_node"))
        for name in ("tokens", "deadline_days", "price_per_device_hour", "global_batch_tokens"):
            value = getattr(self, name)
            if value is not None and (not math.isfinite(value) or value <= 0) and not (
                    name == "price_per_device_hour" and value == 0):
                raise PlanError(name, f"must be a positive number (got {value})")
        lo = node if self.devices_min is None else self.devices_min
        hi = max(lo, DEFAULT_DEVICES_MAX) if self.devices_max is None else self.devices_max
        if hi < lo:
            raise PlanError("devices_max", f"{hi} is below devices_min {lo}")
        step = default_step(lo, hi, node) if self.devices_step is None else self.devices_step
        batch = default_batch_tokens(self.spec) if self.global_batch_tokens is None else self.global_batch_tokens
        if batch < self.spec.seq_length:
            raise PlanError("global_batch_tokens", f"{batch:g} is less than one sequence ({self.spec.seq_length} tokens)")
        fixed = {**planning_fixed(self.spec), **validate_fixed(dict(self.fixed or {}),
                                                            max(1, int(batch // self.spec.seq_length)))}
        return PlanRequest(**{**self.__dict__, "devices_min": lo, "devices_max": hi, "devices_step": step,
                              "global_batch_tokens": batch, "fixed": fixed,
                              "resilience": self.resilience or ResilienceOptions()})


def point_figures(devices: int, tokens_per_s: float, tokens: float, price: float | None) -> dict:
    """Days to train ``tokens`` at ``tokens_per_s`` (whole cluster), device-hours and cost."""
    seconds = tokens / tokens_per_s
    device_hours = devices * seconds / SECONDS_PER_HOUR
    return {"days": seconds / SECONDS_PER_DAY, "device_hours": device_hours,
            "cost": None if price is None else device_hours * price}


def effective_figures(point: dict, goodput: dict | None, price: float | None) -> dict:
    """Days and device-hours once failures are priced: the raw days over the goodput fraction, device-hours
    over the devices paid for (hot spares included), the interruptions expected over the run and the
    checkpoint interval chosen (``costmodel.resilience``)."""
    if goodput is None or not goodput["goodput_fraction"] > 0:
        return {"effective_days": None, "effective_device_hours": None, "effective_cost": None,
                "goodput_fraction": None if goodput is None else goodput["goodput_fraction"],
                "interruptions": None, "checkpoint_interval_s": None}
    days = point["days"] / goodput["goodput_fraction"]
    device_hours = goodput["paid_devices"] * days * SECONDS_PER_DAY / SECONDS_PER_HOUR
    return {"effective_days": days, "effective_device_hours": device_hours,
            "effective_cost": None if price is None else device_hours * price,
            "goodput_fraction": goodput["goodput_fraction"],
            "interruptions": goodput["interruptions_per_day"] * days,
            "checkpoint_interval_s": goodput["checkpoint_interval_s"]}


def pareto_devices(points: list[dict]) -> list[int]:
    """Device counts of the feasible points no other point beats on both days and device-hours (at least
    as good on both, better on one)."""
    ok = [p for p in points if p["feasible"]]
    return [p["devices"] for p in ok
            if not any(q["days"] <= p["days"] and q["device_hours"] <= p["device_hours"]
                       and (q["days"] < p["days"] or q["device_hours"] < p["device_hours"]) for q in ok)]


def effective_view(points: list[dict]) -> list[dict]:
    """The points as ``choose`` and ``pareto_devices`` read them, with the effective days and device-hours in
    place of the raw ones (a count whose goodput is 0 never finishes: not feasible)."""
    return [{**p, "feasible": p["feasible"] and p.get("effective_days") is not None,
             "days": p.get("effective_days"), "device_hours": p.get("effective_device_hours")} for p in points]


def choose(points: list[dict], deadline_days: float | None, label: str = "") -> tuple[int | None, str]:
    """The smallest count that trains within ``deadline_days``; without a deadline the count with the fewest
    device-hours. Returns (devices or None, why). ``run_plan`` passes the effective figures
    (``effective_view``): days and device-hours with failures, checkpoints and restarts priced."""
    ok = [p for p in points if p["feasible"]]
    if not ok:
        return None, "no device count of the range has a config that fits"
    if deadline_days is None:
        best = min(ok, key=lambda p: (p["device_hours"], p["devices"]))
        return best["devices"], (f"no deadline: the count with the fewest {label}device-hours "
                                 f"({best['device_hours']:,.0f})")
    meeting = [p for p in ok if p["days"] <= deadline_days]
    if not meeting:
        fastest = min(ok, key=lambda p: p["days"])
        return None, (f"no count meets the {deadline_days:g}-day deadline: the fastest, {fastest['devices']:,} "
                      f"devices, takes {fastest['days']:.1f} {label}days")
    first = min(meeting, key=lambda p: p["devices"])
    return first["devices"], (f"the smallest count that trains in at most {deadline_days:g} days "
                              f"({first['days']:.1f} {label}days)")


def plan_point(req: PlanRequest, devices: int, check: Callable[[], None] | None = None) -> dict:
    """One device count: the planning-space search's best config and its figures, or why nothing fits."""
    gbs = global_batch_size(req.global_batch_tokens, req.spec.seq_length, devices)
    sreq = SearchRequest(spec=req.spec, profile=req.profile, devices=devices, global_batch_size=gbs,
                         sampler="exhaustive", top_k=1, fixed=req.fixed, precision=req.precision,
                         moe_load_imbalance=req.moe_load_imbalance, memory_margin_gib=req.memory_margin_gib,
                         framework=req.framework, resilience=req.resilience)
    point = {"devices": devices, "global_batch_size": gbs, "feasible": False, "config": None, "evaluation": None,
             "tokens_per_s": None, "days": None, "device_hours": None, "cost": None, "pareto": False,
             "meets_deadline": None, "keeps_margin": None, "space_size": 0, "search_time_s": 0.0,
             "smallest_peak_gib": None, "reason": None, **effective_figures({}, None, None)}
    try:
        result = run_search(sreq, check=check)
    except SpaceError as exc:
        point["reason"] = f"no valid config: {exc}"
        return point
    point.update(space_size=result["space_size"], search_time_s=result["search_time_s"])
    best = result["best"]
    if best is None:
        peak = result.get("smallest_peak_gib")
        point["smallest_peak_gib"] = peak
        capacity = req.profile.fact("memory_gib")
        point["reason"] = (f"no config fits in {capacity:g} GiB: the smallest peak is {peak:.1f} GiB"
                           if peak is not None else "no structurally valid config")
        return point
    tps = best["evaluation"]["tokens_per_s"]
    point.update(feasible=True, config=best["config"], evaluation=best["evaluation"], tokens_per_s=tps,
                 keeps_margin=best.get("keeps_margin"),
                 **point_figures(devices, tps, req.tokens, req.price_per_device_hour))
    point.update(effective_figures(point, best["evaluation"].get("goodput"), req.price_per_device_hour))
    if req.deadline_days is not None:
        point["meets_deadline"] = point["effective_days"] is not None and point["effective_days"] <= req.deadline_days
    return point


def _pooled_point(args: tuple[PlanRequest, int]) -> dict:
    """``plan_point`` in a pool process (``search.pool``), stopping when the pool is told to."""
    req, devices = args
    return plan_point(req, devices, worker_check)


def run_plan(req: PlanRequest, progress: ProgressFn | None = None, check: Callable[[], None] | None = None) -> dict:
    """The plan: one point per device count (``plan_point``), the Pareto front and the chosen count.
    ``progress(done, total)`` counts device counts; ``check()`` may raise to stop (a cancelled job).
    ``req.jobs`` > 1: the counts are searched by that many processes at once, this one among them (each count
    one search in one process), the points kept in the order of the counts; ``check()`` runs here between
    results."""
    started = time.perf_counter()
    req = req.resolved()
    node = int(req.profile.fact("devices_per_node"))
    counts = device_counts(req.devices_min, req.devices_max, req.devices_step, node)
    if req.jobs > 1:
        points = map_ordered(req.jobs, _pooled_point, [(req, n) for n in counts], check,
                             None if progress is None else lambda done: progress(done, len(counts)),
                             local=lambda item: plan_point(item[0], item[1], check))
    else:
        points = []
        for i, devices in enumerate(counts):
            if check is not None:
                check()
            points.append(plan_point(req, devices, check))
            if progress is not None:
                progress(i + 1, len(counts))
    effective = effective_view(points)
    front = pareto_devices(effective)
    for p in points:
        p["pareto"] = p["devices"] in front
    chosen, why = choose(effective, req.deadline_days, "effective ")
    raw_chosen, _ = choose(points, req.deadline_days)
    return {"points": points, "pareto": front, "chosen": chosen, "chosen_reason": why,
            # the count the same rule picks on the raw figures, as if nothing ever failed
            "chosen_without_failures": raw_chosen,
            "resilience": req.resilience.model_dump(),
            "planning_fixed": req.fixed, "resolved": {"devices_min": req.devices_min, "devices_max": req.devices_max,
                                                      "devices_step": req.devices_step,
                                                      "global_batch_tokens": req.global_batch_tokens},
            "plan_time_s": time.perf_counter() - started}

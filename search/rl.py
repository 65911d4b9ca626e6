"""The RL plan search: the best co-located and the best disaggregated plan of one RL workload.

The training side is searched with the ordinary training search (``run_search``: the same space and
engines, ``global_batch_size`` = the step's samples, ``seq_length`` = prompt + response); its top
``training_top_k`` configs are combined with every rollout config (tp, ep inside the instance, and
co-located the offload of the trainer's states), enumerated and scored at once
(``costmodel.rl``). Disaggregated, the split is swept over node multiples; a split is searched only
when a lower bound on its step (its best rollout + the training FLOPs at the profile's best
efficiency) beats the best step found, so the answer equals a full sweep's (``split_sweep``).

``run_rl_search(request, progress)`` is the entry point a worker calls; ``progress(done, total)``
counts training searches.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from costmodel import ClusterProfile, ModelSpec, model_flops_per_token, rl
from costmodel.hardware import Hardware

from .engine import SearchRequest, run_search
from .frameworks import default_framework
from .margin import DEFAULT_MEMORY_MARGIN_GIB
from .pool import Pool, pool, worker_check
from .space import SpaceError

MODES = ("colocated", "disaggregated")
DEFAULT_TRAINING_TOP_K = 3

ProgressFn = Callable[[int, int], None]
CheckFn = Callable[[], None]  # may raise to stop (a cancelled job), as run_search's check


@dataclass
class RLRequest:
    spec: ModelSpec
    profile: ClusterProfile
    devices: int
    workload: rl.Workload
    modes: tuple[str, ...] = MODES
    training_top_k: int = DEFAULT_TRAINING_TOP_K
    sampler: str = "auto"
    framework: str | None = None
    memory_margin_gib: float = DEFAULT_MEMORY_MARGIN_GIB
    fixed: dict = field(default_factory=dict)
    seed: int = 0  # every training search's sampler seed (spaces too big to enumerate): same request, same plan
    jobs: int = 1  # processes for the training searches (search.pool); the plan is the same

    @property
    def training_spec(self) -> ModelSpec:
        return self.spec.model_copy(update={"seq_length": self.workload.seq_length})


def rollout_configs(spec: ModelSpec, hw: Hardware, devices: int, colocated: bool) -> tuple[np.ndarray, ...]:
    """Engine instances a pool of ``devices`` can run: tp a power of two inside the scale-up domain and
    the pool that divides the attention heads (dp = devices // tp instances; devices left over idle);
    ep = 1, or ep = tp for a MoE model whose experts divide by tp; co-located, each with and without the
    trainer's states offloaded. Arrays (tp, ep, offload)."""
    rows = []
    tp = 1
    while tp <= min(devices, hw.scale_up_domain):
        if spec.num_attention_heads % tp == 0:
            eps = [1] + ([tp] if spec.is_moe and tp > 1 and spec.num_experts % tp == 0 else [])
            for ep in eps:
                for off in ((False, True) if colocated else (False,)):
                    rows.append((tp, ep, off))
        tp *= 2
    tp_, ep_, off_ = (np.array(c) for c in zip(*rows)) if rows else (np.array([], int),) * 3
    return tp_, ep_, off_.astype(bool)


def evaluate_plan(req: RLRequest, mode: str, config: dict, tp: int, ep: int = 1, offload: bool = False,
                  rollout_devices: int | None = None) -> dict:
    """One given RL plan scored (no search): ``config`` the training config (on all devices co-located,
    on the ``devices − rollout_devices`` others disaggregated), one rollout engine config."""
    from costmodel import TrainingConfig, evaluate

    hw = Hardware.from_profile(req.profile)
    train_devices = req.devices if mode == "colocated" else req.devices - rollout_devices
    rollout_devices = req.devices if mode == "colocated" else rollout_devices
    cfg = TrainingConfig.model_validate({**config, "global_batch_size": req.workload.samples})
    ev = evaluate(req.training_spec, req.profile, train_devices, cfg)
    cand = {"config": cfg.model_dump(mode="json", exclude_none=True), "evaluation": ev}
    tp_, ep_, off_ = np.array([tp]), np.array([ep]), np.array([offload])
    if mode == "colocated":
        scored = rl.colocated_step(req.spec, hw, req.devices, ev, req.workload, tp_, ep_, off_)
    else:
        scored = rl.disaggregated_step(req.spec, hw, rollout_devices, train_devices, ev, req.workload, tp_, ep_)
    return rl.plan_dict(scored, 0, hw, mode=mode, tp=tp_, ep=ep_, offload=off_, rollout_devices=rollout_devices,
                        train_devices=train_devices, training=cand)


def training_candidates(req: RLRequest, devices: int, check: CheckFn | None = None) -> list[dict]:
    """The top configs of the training search on ``devices`` (``{"config", "evaluation"}``), [] where
    none fits, or where the pins leave no config on this many devices (a split's pool may be too small for
    pins the whole pool takes)."""
    framework = req.framework or default_framework(req.profile.name)
    sreq = SearchRequest(spec=req.training_spec, profile=req.profile, devices=devices,
                         global_batch_size=req.workload.samples, sampler=req.sampler, top_k=req.training_top_k,
                         framework=framework, memory_margin_gib=req.memory_margin_gib, fixed=dict(req.fixed),
                         seed=req.seed)
    try:
        result = run_search(sreq, check=check)
    except SpaceError:
        return []
    return [{"config": e["config"], "evaluation": e["evaluation"]} for e in result["top"]]


def _best(scored: dict) -> int | None:
    """Index of the fastest feasible plan, None where none is."""
    step = np.where(scored["feasible"], scored["step_time_s"], np.inf)
    return None if not np.isfinite(step).any() else int(np.argmin(step))


def best_colocated(req: RLRequest, check: CheckFn | None = None) -> dict | None:
    """The best co-located plan: every training candidate on all devices with every rollout config."""
    hw = Hardware.from_profile(req.profile)
    tp, ep, off = rollout_configs(req.spec, hw, req.devices, colocated=True)
    best = None
    for cand in training_candidates(req, req.devices, check):
        scored = rl.colocated_step(req.spec, hw, req.devices, cand["evaluation"], req.workload, tp, ep, off)
        i = _best(scored)
        if i is not None and (best is None or scored["step_time_s"][i] < best["step_time_s"]):
            best = rl.plan_dict(scored, i, hw, mode="colocated", tp=tp, ep=ep, offload=off,
                                rollout_devices=req.devices, train_devices=req.devices, training=cand)
    return best


def splits(req: RLRequest, hw: Hardware) -> list[int]:
    """Rollout pool sizes: node multiples leaving at least one node to training."""
    node = hw.devices_per_node
    return list(range(node, req.devices - node + 1, node))


def best_split_plan(req: RLRequest, hw: Hardware, rollout_devices: int, check: CheckFn | None = None) -> dict | None:
    """The best disaggregated plan with ``rollout_devices`` generating and the rest training."""
    train_devices = req.devices - rollout_devices
    tp, ep, _ = rollout_configs(req.spec, hw, rollout_devices, colocated=False)
    if not len(tp):
        return None
    best = None
    for cand in training_candidates(req, train_devices, check):
        scored = rl.disaggregated_step(req.spec, hw, rollout_devices, train_devices, cand["evaluation"],
                                       req.workload, tp, ep)
        i = _best(scored)
        if i is not None and (best is None or scored["step_time_s"][i] < best["step_time_s"]):
            best = rl.plan_dict(scored, i, hw, mode="disaggregated", tp=tp, ep=ep, offload=np.zeros(len(tp), bool),
                                rollout_devices=rollout_devices, train_devices=train_devices, training=cand)
    return best


def train_lower_bound_s(req: RLRequest, hw: Hardware, train_devices: int) -> float:
    """No training config on ``train_devices`` trains the step's samples faster than its model FLOPs at
    the profile's best efficiency (large dense GEMMs, grouped expert GEMMs, attention): every other
    term of the training cost model only adds time."""
    flops = model_flops_per_token(req.training_spec) * req.workload.samples * req.workload.seq_length
    eff = max(hw.gemm_eff_max * max(1.0, hw.moe_gemm_eff_ratio), hw.attn_eff)
    return req.workload.models_trained * flops / (train_devices * hw.peak_bf16_flops * eff)


def split_lower_bound_s(req: RLRequest, hw: Hardware, rollout_devices: int) -> float:
    """A lower bound on the step of a split: its exact rollout and sync (over every rollout config) with
    the training side at ``train_lower_bound_s``."""
    train_devices = req.devices - rollout_devices
    tp, ep, _ = rollout_configs(req.spec, hw, rollout_devices, colocated=False)
    if not len(tp):
        return float("inf")
    gen = rl.generation(req.spec, hw, tp, ep, rollout_devices // tp, req.workload)
    roll = np.where(gen["max_batch"] >= 1, gen["prefill_s"] + gen["decode_s"], np.inf)
    sync = rl.weight_sync_s(req.spec, hw, tp, rollout_devices, train_devices)
    train = train_lower_bound_s(req, hw, train_devices)
    step = (np.maximum(roll, train) if req.workload.stale_sync else roll + train) + sync
    return float(np.min(step))


def _pooled_split(args: tuple[RLRequest, int]) -> dict | None:
    """``best_split_plan`` in a pool process (``search.pool``), stopping when the pool is told to."""
    req, rollout_devices = args
    return best_split_plan(req, Hardware.from_profile(req.profile), rollout_devices, worker_check)


def _pooled_colocated(req: RLRequest) -> dict | None:
    """``best_colocated`` in a pool process."""
    return best_colocated(req, worker_check)


def _beyond_reach(bound_s: float, best: dict | None) -> bool:
    """Whether a split whose step is at least ``bound_s`` (s) can no longer beat the best plan so far: the
    sweep stops at the first such split."""
    return not np.isfinite(bound_s) or (best is not None and bound_s >= best["step_time_s"])


class _Ahead:
    """The splits searched ahead of the in-order sweep, only splits the sweep may still reach (their bound
    below the best step so far), in the sweep's order: the pool's processes take the next ones, one each,
    and while the sweep waits for one of theirs, this process searches the next one not yet taken. The
    sweep takes each split's plan from here, so it decides exactly as one process would; what it never asks
    for is dropped (the pool's when it closes)."""

    def __init__(self, procs: Pool, req: RLRequest, hw: Hardware, order: list[int], bounds: dict[int, float]):
        self.procs, self.req, self.hw, self.order, self.bounds = procs, req, hw, order, bounds
        self.futures: dict = {}  # split -> its search on a pool process
        self.searched: dict = {}  # split -> its plan, searched here ahead of the sweep
        self.next = 0  # the first split of the order not yet taken

    def _take(self, best: dict | None) -> int | None:
        """The next split not yet taken, if the sweep may reach it."""
        if self.next >= len(self.order):
            return None
        r = self.order[self.next]
        if _beyond_reach(self.bounds[r], best):
            return None  # the sweep stops here or before: the bounds only grow along it
        self.next += 1
        return r

    def _fill(self, best: dict | None) -> None:
        """Give each pool process a split to search."""
        while len(self.futures) < self.procs.jobs - 1 and (r := self._take(best)) is not None:
            self.futures[r] = self.procs.submit(_pooled_split, (self.req, r))

    def plan(self, at: int, best: dict | None, check: CheckFn | None) -> dict | None:
        """The plan of split ``order[at]`` (which the sweep reaches), the next splits started meanwhile."""
        r = self.order[at]
        if self.next <= at:  # not taken yet: it is the sweep's next, searched here
            self.next = at + 1
            self._fill(best)
            return best_split_plan(self.req, self.hw, r, check)
        if r in self.searched:
            plan = self.searched.pop(r)
            self._fill(best)
            return plan
        future = self.futures.pop(r)
        self._fill(best)
        while not future.done() and (q := self._take(best)) is not None:
            self.searched[q] = best_split_plan(self.req, self.hw, q, check)
        return self.procs.result(future, check)


def best_disaggregated(req: RLRequest, progress: ProgressFn | None = None, done: int = 0,
                       total: int | None = None, check: CheckFn | None = None,
                       procs: Pool | None = None) -> tuple[dict | None, list[dict]]:
    """The best disaggregated plan, searching splits in the order of their lower bounds and stopping
    where the bound reaches the best step found. Returns the plan and one row per split. With ``procs``
    (a ``search.pool.Pool``) the next splits are searched ahead on its processes and, while the sweep waits
    for them, in this one (``_Ahead``): the same plan and rows."""
    hw = Hardware.from_profile(req.profile)
    bounds = {r: split_lower_bound_s(req, hw, r) for r in splits(req, hw)}
    rows = {r: {"rollout_devices": r, "train_devices": req.devices - r, "lower_bound_s": b, "searched": False,
                "step_time_s": None} for r, b in bounds.items()}
    best = None
    order = sorted(bounds, key=bounds.get)
    ahead = None if procs is None else _Ahead(procs, req, hw, order, bounds)
    for at, r in enumerate(order):
        if _beyond_reach(bounds[r], best):
            break
        plan = best_split_plan(req, hw, r, check) if ahead is None else ahead.plan(at, best, check)
        rows[r]["searched"] = True
        rows[r]["step_time_s"] = None if plan is None else plan["step_time_s"]
        done += 1
        if progress is not None:
            progress(done, total or done)
        if plan is not None and (best is None or plan["step_time_s"] < best["step_time_s"]):
            best = plan
    for row in rows.values():
        row["lower_bound_s"] = row["lower_bound_s"] if np.isfinite(row["lower_bound_s"]) else None
    return best, [rows[r] for r in sorted(rows)]


def split_sweep(req: RLRequest) -> list[dict | None]:
    """Every split's best plan, no pruning: the ground truth ``best_disaggregated`` must agree with."""
    hw = Hardware.from_profile(req.profile)
    return [best_split_plan(req, hw, r) for r in splits(req, hw)]


def run_rl_search(req: RLRequest, progress: ProgressFn | None = None, check: CheckFn | None = None) -> dict:
    """Search the requested modes. Returns ``{"colocated": plan | None, "disaggregated": plan | None,
    "best": the faster of the two | None, "splits": [per-split row], "training_searches": int,
    "search_time_s": float}``; a plan is ``costmodel.rl.plan_dict``'s shape. ``check()`` runs inside every
    training search and may raise to stop. ``req.jobs`` > 1: the co-located search and the splits run on
    that many processes (``search.pool``), the splits searched ahead of the sweep; the same result."""
    with (pool(req.jobs) if req.jobs > 1 else nullcontext()) as procs:
        return _run_rl_search(req, progress, check, procs)


def _run_rl_search(req: RLRequest, progress: ProgressFn | None, check: CheckFn | None, procs: Pool | None) -> dict:
    started = time.perf_counter()
    hw = Hardware.from_profile(req.profile)
    total = int("colocated" in req.modes) + (len(splits(req, hw)) if "disaggregated" in req.modes else 0)
    out: dict = {"colocated": None, "disaggregated": None, "splits": []}
    done = 0
    # with a pool, the co-located search runs on one process while the splits take the others (and here,
    # where there are no splits to search)
    pooled = procs is not None and "colocated" in req.modes and "disaggregated" in req.modes
    colocated = procs.submit(_pooled_colocated, req) if pooled else None
    if "colocated" in req.modes and colocated is None:
        out["colocated"] = best_colocated(req, check)
        done += 1
        if progress is not None:
            progress(done, total)
    if "disaggregated" in req.modes:
        out["disaggregated"], out["splits"] = best_disaggregated(req, progress, done, total, check, procs)
        done += sum(row["searched"] for row in out["splits"])
    if colocated is not None:
        out["colocated"] = procs.result(colocated, check)
        done += 1
        if progress is not None:
            progress(done, total)
    if progress is not None:
        progress(total, total)
    plans = [p for p in (out["colocated"], out["disaggregated"]) if p is not None]
    out["best"] = min(plans, key=lambda p: p["step_time_s"]) if plans else None
    out["training_searches"] = done
    out["search_time_s"] = time.perf_counter() - started
    return out

"""One search: build the space, run an engine, rank and evaluate the top configs and layouts.

``run_search`` returns the contract's search output without ``inputs`` (the caller knows how the
model and cluster were named), plus ``layouts`` (the best config of each of the top K distinct parallel
layouts) and, on every ranked entry, whether it keeps the memory margin (``search.margin``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from costmodel import ClusterProfile, ModelSpec, TrainingConfig, evaluate_many

from .exhaustive import ProgressFn, Ranked, run_exhaustive
from .margin import DEFAULT_MEMORY_MARGIN_GIB, margin_fields
from .objective import OBJECTIVES
from .pool import Pool, pool
from .space import SearchSpace, build_space

# The Optuna samplers (search/samplers.py, imported when one runs: Optuna and its storage layer take longer
# to import than a small exhaustive search takes to run).
SAMPLERS = ("tpe", "nsga2", "random")
ENGINES = ("auto", "exhaustive") + SAMPLERS
# ``auto`` enumerates spaces up to this many configs (a few seconds on one core), else runs TPE.
AUTO_EXHAUSTIVE_MAX = 20_000_000


def auto_engine(space: SearchSpace) -> str:
    """What sampler ``auto`` runs: ``exhaustive`` where the configs it must score (those without offload,
    ``SearchSpace.plain_size``; an offload plan is scored only where its counterpart does not fit) number
    at most ``AUTO_EXHAUSTIVE_MAX``, else ``tpe``."""
    return "exhaustive" if space.plain_size <= AUTO_EXHAUSTIVE_MAX else "tpe"
DEFAULT_TRIALS = 500
DEFAULT_TOP_K = 10


@dataclass
class SearchRequest:
    spec: ModelSpec
    profile: ClusterProfile
    devices: int
    global_batch_size: int
    sampler: str = "auto"
    n_trials: int = DEFAULT_TRIALS
    top_k: int = DEFAULT_TOP_K
    seed: int | None = None
    fixed: dict | None = None
    precision: str = "bf16"
    moe_load_imbalance: float | None = None
    allow_cross_domain_tp: bool = False
    storage: object = None  # Optuna storage (URL or object); in-memory when None
    study_name: str | None = None
    timeout_s: float | None = None
    worker: str | None = None  # recorded on the trials this process runs (shared studies)
    memory_margin_gib: float = DEFAULT_MEMORY_MARGIN_GIB  # headroom (GiB) a recommendation should keep
    framework: str | None = None  # search.frameworks: offer only what it can express (None: all the model has)
    objective: str = "throughput"  # search.objective: "goodput" ranks by throughput with failures priced
    resilience: object = None  # costmodel.resilience.ResilienceOptions for the goodput block (None: defaults)
    jobs: int = 1  # processes the exhaustive engine scores with (search.pool); the samplers use one


def _evaluations(req: SearchRequest, configs: list[dict]) -> list[dict]:
    return evaluate_many(req.spec, req.profile, req.devices, [TrainingConfig.model_validate(c) for c in configs],
                         req.resilience)


def _entries(req: SearchRequest, ranked: Ranked) -> tuple[list[dict], list[dict]]:
    """The ranked top K and the top K layouts, each config evaluated once (a layout's best config is
    often in the top K already), with the margin fields."""
    margin = req.memory_margin_gib
    outside = [lay["config"] for lay in ranked.layouts if lay["best_rank"] > len(ranked.configs)]
    evaluations = _evaluations(req, ranked.configs + outside)
    top = [{"rank": i + 1, "config": c, "evaluation": e, **margin_fields(e, margin)}
           for i, (c, e) in enumerate(zip(ranked.configs, evaluations))]
    rest = iter(evaluations[len(top):])
    layouts = []
    for lay in ranked.layouts:
        e = top[lay["best_rank"] - 1]["evaluation"] if lay["best_rank"] <= len(top) else next(rest)
        layouts.append({"layout": lay["layout"], "best_rank": lay["best_rank"], "config": lay["config"],
                        "evaluation": e, "variants": lay["variants"], **margin_fields(e, margin)})
    return top, layouts


def _checked(progress: ProgressFn | None, check: Callable[[], None]) -> ProgressFn:
    """``progress`` (or nothing) preceded by ``check()``."""
    def report(done: int, total: int) -> None:
        check()
        if progress is not None:
            progress(done, total)
    return report


def run_search(req: SearchRequest, progress: ProgressFn | None = None,
               check: Callable[[], None] | None = None,
               on_engine: Callable[[str, int], None] | None = None) -> dict:
    """Run one search. ``progress(done, total)`` is called as trials (or configs) are scored;
    ``check()`` before and while the space is built (seconds on a big space, before any progress);
    ``on_engine(engine, space_size)`` once the space is built and ``auto`` resolved, before any scoring
    (a job records them). Any of them may raise to stop the search (a cancelled job, a worker shutting
    down); ``check()`` also runs whenever progress is reported, so a search without a progress callback
    (one in a pool process) stops there too."""
    if req.jobs > 1 and req.sampler in ("auto", "exhaustive"):  # the samplers run in this process
        with pool(req.jobs) as procs:
            procs.warm()  # the processes start while this one builds the space
            return _run_search(req, progress, check, on_engine, procs)
    return _run_search(req, progress, check, on_engine, None)


def _run_search(req: SearchRequest, progress: ProgressFn | None, check: Callable[[], None] | None,
                on_engine: Callable[[str, int], None] | None, procs: Pool | None) -> dict:
    started = time.perf_counter()
    if check is not None:
        check()
        progress = _checked(progress, check)
    space = build_space(req.spec, req.profile, req.devices, req.global_batch_size, precision=req.precision,
                        moe_load_imbalance=req.moe_load_imbalance, fixed=req.fixed,
                        allow_cross_domain_tp=req.allow_cross_domain_tp, framework=req.framework, check=check)
    if req.objective not in OBJECTIVES:
        raise ValueError(f"objective: {req.objective!r} is not one of {', '.join(OBJECTIVES)}")
    space.objective, space.resilience = req.objective, req.resilience
    size = space.size
    engine = req.sampler
    if engine == "auto":
        engine = auto_engine(space)
    if on_engine is not None:
        on_engine(engine, size)
    if engine == "exhaustive":
        ranked: Ranked = run_exhaustive(space, req.top_k, progress, margin_gib=req.memory_margin_gib, check=check,
                                        procs=procs)
    else:
        from .samplers import run_sampler

        ranked = run_sampler(space, engine, req.n_trials, req.top_k, seed=req.seed, storage=req.storage,
                             study_name=req.study_name, progress=progress, timeout_s=req.timeout_s,
                             worker=req.worker, margin_gib=req.memory_margin_gib)
    top, layouts = _entries(req, ranked)
    out = {
        "best": top[0] if top else None,
        "top": top,
        "layouts": layouts,
        "feasible_layouts": ranked.feasible_layouts,
        "engine": engine,
        "space_size": size,
        "trials": ranked.trials,
        "feasible_trials": ranked.feasible_trials,
        "search_time_s": time.perf_counter() - started,
        "objective": req.objective,
    }
    if ranked.history is not None:
        out["history"] = ranked.history
    if ranked.pareto is not None:
        out["pareto"] = ranked.pareto
    if not top:
        out["smallest_peak_gib"] = ranked.smallest_peak_gib
        out["smallest_peak_config"] = ranked.smallest_peak_config
    out.update(ranked.extra)  # samplers: study_name, configs_scored
    return out

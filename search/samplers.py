"""Optuna engines (TPE, NSGA-II, random) over the same space, one study per search.

Trials are asked in rounds, scored together through the vectorised cost model, then told back
(Optuna's ask-and-tell interface). Structurally invalid and out-of-memory configs are infeasible
trials through Optuna's constraints (``Trial.set_constraint``: a positive value is a violation, here
the GiB over capacity), so the samplers learn to avoid them. Conditional parameters are suggested only where they mean something
(``vpp`` with pp > 1, the module set with selective recompute, ...). The same seed gives the same
trials and the same result.
"""

from __future__ import annotations

import math
import warnings
from typing import Callable

import numpy as np
import optuna

from costmodel import evaluate_batch

from .exhaustive import ProgressFn, Ranked, _rank_order
from .space import SearchSpace

SAMPLERS = ("tpe", "nsga2", "random")
TPE_ROUND = 8  # trials asked before the next tell: TPE's model is refitted between rounds
NSGA2_POPULATION = 50
INVALID_VIOLATION = 1e3  # constraint value of a structurally invalid config (GiB-like scale)
CONSTRAINT = "memory_over_capacity_gib"


def make_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    if name == "tpe":
        with warnings.catch_warnings():  # ``group`` is marked experimental; conditional spaces need it
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, n_startup_trials=20)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=NSGA2_POPULATION)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"unknown sampler {name!r}")


def _round_size(name: str, remaining: int) -> int:
    return min(remaining, {"tpe": TPE_ROUND, "nsga2": NSGA2_POPULATION, "random": 64}[name])


LAYOUT_KEYS = ("tp", "cp", "pp", "ep", "etp")


def suggest(trial: optuna.trial.Trial, space: SearchSpace) -> dict:
    """One parallel layout, conditional parameters only where they apply (vpp and the split with
    pp > 1, expert sizes for MoE models)."""
    v = space.values
    c = {key: trial.suggest_categorical(key, v[key]) for key in LAYOUT_KEYS if len(v[key]) > 1}
    c.update({key: v[key][0] for key in LAYOUT_KEYS if len(v[key]) == 1})
    c["vpp"] = trial.suggest_categorical("vpp", v["vpp"]) if c["pp"] > 1 and len(v["vpp"]) > 1 else (
        v["vpp"][0] if c["pp"] > 1 else 1)
    c["split"] = trial.suggest_categorical("split", v["split"]) if c["pp"] > 1 and len(v["split"]) > 1 else v["split"][0]
    return c


def nearest_valid(space: SearchSpace, layout: dict) -> dict:
    """Repair a suggested layout to the closest one the space holds (log2 distance per size, a
    different split counts half a doubling): samplers then spend no trial on invalid combinations,
    and TPE still learns from what it suggested."""
    table = space.layout_table()
    dist = np.zeros(len(table["tp"]))
    for key in ("tp", "cp", "pp", "vpp", "ep", "etp"):
        dist += np.abs(np.log2(table[key]) - np.log2(layout[key]))
    dist += 0.5 * (table["split"] != space.values["split"].index(layout["split"]))
    i = int(np.argmin(dist))
    return {key: (space.values["split"][int(table[key][i])] if key == "split" else int(table[key][i]))
            for key in ("tp", "cp", "pp", "vpp", "ep", "etp", "split")}


def expand(space: SearchSpace, layout: dict) -> list[dict]:
    """Every micro-batch size and option (recompute, optimizer, overlaps) of one layout: these are
    scored together in one vectorised batch, the layout's value is its best feasible config."""
    allowed = np.flatnonzero(space.allowed_options(np.array([layout["tp"]]), np.array([layout["ep"]]))[0])
    return [{**layout, "micro_batch_size": mbs, "option": int(i)}
            for mbs in space.values["micro_batch_size"] for i in allowed]


def _key(choice: dict) -> tuple:
    return tuple(sorted(choice.items()))


def run_sampler(space: SearchSpace, name: str, n_trials: int, top_k: int, seed: int | None = None,
                storage: str | optuna.storages.BaseStorage | None = None, study_name: str | None = None,
                progress: ProgressFn | None = None, timeout_s: float | None = None,
                clock: Callable[[], float] | None = None) -> Ranked:
    """``n_trials`` Optuna trials; each trial is one parallel layout, scored with all of its
    micro-batch sizes and options, and told the best feasible throughput."""
    import time

    clock = clock or time.monotonic
    started = clock()
    multi = name == "nsga2"
    study = optuna.create_study(
        storage=storage, study_name=study_name, sampler=make_sampler(name, seed),
        directions=["maximize", "maximize"] if multi else ["maximize"], load_if_exists=storage is not None)
    capacity_gib = space.profile.fact("memory_gib")
    history: list[dict] = []
    seen: dict[tuple, tuple[float, float, int]] = {}  # feasible choice -> (tokens/s, peak, order seen)
    choices_by_key: dict[tuple, dict] = {}
    feasible_trials = configs_scored = 0
    min_peak, min_choice = math.inf, None
    done = 0
    while done < n_trials:
        if timeout_s is not None and clock() - started > timeout_s:
            break
        trials = [study.ask() for _ in range(_round_size(name, n_trials - done))]
        layouts = [nearest_valid(space, suggest(t, space)) for t in trials]
        expanded = [expand(space, lay) for lay in layouts]
        flat = [c for group in expanded for c in group]
        batch, split_ok = space.choice_batch(flat)
        br = evaluate_batch(space.spec, space.profile, space.devices, batch, keep_stages=False)
        valid = br.valid & split_ok
        ok = valid & br.feasible
        peaks = br.peak_bytes / 2**30
        configs_scored += len(flat)
        start = 0
        for trial, group in zip(trials, expanded):
            sl = slice(start, start + len(group))
            start += len(group)
            v, f, tok, pk = valid[sl], ok[sl], br.tokens_per_s[sl], peaks[sl]
            best = int(np.argmax(np.where(f, tok, -np.inf))) if f.any() else None
            if v.any():
                j = int(np.argmin(np.where(v, pk, np.inf)))
                if pk[j] < min_peak:
                    min_peak, min_choice = float(pk[j]), group[j]
                violation = float(min(pk[v].min() - capacity_gib, INVALID_VIOLATION)) if best is None else 0.0
            else:
                violation = INVALID_VIOLATION
            trial.set_constraint(CONSTRAINT, violation)
            tokens = float(tok[best]) if best is not None else 0.0
            if multi:
                headroom = capacity_gib - float(pk[best]) if best is not None else -INVALID_VIOLATION
                study.tell(trial, [tokens, headroom])
            else:
                study.tell(trial, tokens)
            history.append({"trial": trial.number, "tokens_per_s": tokens if best is not None else None,
                            "feasible": best is not None})
            if best is None:
                continue
            feasible_trials += 1
            for j in np.nonzero(f)[0]:
                key = _key(group[j])
                if key not in seen:
                    seen[key] = (float(tok[j]), float(pk[j]), len(seen))
                    choices_by_key[key] = group[j]
        done += len(trials)
        if progress:
            progress(done, n_trials)
    keys = list(seen)
    configs = []
    if keys:
        arr = np.array([seen[k] for k in keys])
        order = _rank_order(arr[:, 0], arr[:, 1], arr[:, 2])[:top_k]
        configs = [space.choice_config(choices_by_key[keys[i]]) for i in order]
    pareto = _pareto(study, space) if multi else None
    return Ranked(configs=configs, trials=done, feasible_trials=feasible_trials,
                  smallest_peak_gib=None if min_choice is None else min_peak,
                  smallest_peak_config=None if min_choice is None else space.choice_config(min_choice),
                  history=history, pareto=pareto,
                  extra={"study_name": study.study_name, "configs_scored": configs_scored})


def _pareto(study: optuna.Study, space: SearchSpace) -> list[dict]:
    """Optuna's non-dominated feasible trials: throughput against memory headroom, each with the
    layout's best config (re-scored, so that the front carries full configs)."""
    front = []
    for t in study.best_trials:
        layout = nearest_valid(space, suggest(optuna.trial.FixedTrial(t.params), space))
        group = expand(space, layout)
        batch, split_ok = space.choice_batch(group)
        br = evaluate_batch(space.spec, space.profile, space.devices, batch, keep_stages=False)
        f = br.valid & split_ok & br.feasible
        if not f.any():
            continue
        j = int(np.argmax(np.where(f, br.tokens_per_s, -np.inf)))
        front.append({"trial": t.number, "tokens_per_s": t.values[0], "memory_headroom_gib": t.values[1],
                      "config": space.choice_config(group[j])})
    front.sort(key=lambda p: -p["tokens_per_s"])
    return front

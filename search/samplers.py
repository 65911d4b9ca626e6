"""Optuna engines (TPE, NSGA-II, random) over the same space, one study per search.

Trials are asked in rounds, scored together through the vectorised cost model, then told back
(Optuna's ask-and-tell interface). Structurally invalid and out-of-memory configs are infeasible
trials through Optuna's constraints (``Trial.set_constraint``: a positive value is a violation, here
the GiB over capacity), so the samplers learn to avoid them. Conditional parameters are suggested only where they mean something
(``vpp`` with pp > 1, the module set with selective recompute, ...). The same seed gives the same
trials and the same result.

A study may be run by several processes at once and continued after a crash (``search.storages``):
the budget counts finished trials, and the ranking is computed from the study's finished trials, not
from what one process saw.
"""

from __future__ import annotations

import contextlib
import math
import uuid
import warnings
from typing import Callable

import numpy as np
import optuna

from costmodel import evaluate_batch

from .engine import SAMPLERS  # noqa: F401 - the names, listed where the engine offers them
from .exhaustive import LAYOUT_FIELDS, ProgressFn, Ranked, _rank_order, layout_firsts
from .objective import ranking_tokens_per_s
from .space import CP_COMM_CODES, CP_COMM_NAMES, SearchSpace
from .storages import ReservationTurns, TrialHeartbeat, fail_stale_trials, open_rdb_storage, reservation_lock
from .trial_writes import OwnTrialsStorage

COMPLETE, RUNNING = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING
TPE_ROUND = 8  # trials asked before the next tell: TPE's model is refitted between rounds
NSGA2_POPULATION = 50
INVALID_VIOLATION = 1e3  # constraint value of a structurally invalid config (GiB-like scale)
CONSTRAINT = "memory_over_capacity_gib"
KEEPS_MARGIN = "keeps_margin"  # user attribute of a feasible trial: its told config keeps the memory margin


def make_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    if name == "tpe":
        with warnings.catch_warnings():  # ``group`` is marked experimental; conditional spaces need it
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            # constant_liar off (Optuna 5 turned it on by default): with it, TPE re-reads the study's running
            # trials from the database for every parameter group of every trial (528 reads, 14 s of a 35 s
            # 200-trial Pangu job on SQLite) instead of using the study's trial cache; the best found over
            # 4 seeds was the same either way (Pangu 280 vs 279 tokens/s/device, DeepSeek-V3 1247 vs 1262),
            # and the trials of one round still differ, each the best of its own candidate draws.
            return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, n_startup_trials=20,
                                              constant_liar=False)
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
    pp > 1, expert sizes for MoE models, the dispatch algorithm where the EP group leaves the scale-up
    domain, the CP algorithm with cp > 1)."""
    v = space.values
    c = {key: trial.suggest_categorical(key, v[key]) for key in LAYOUT_KEYS if len(v[key]) > 1}
    c.update({key: v[key][0] for key in LAYOUT_KEYS if len(v[key]) == 1})
    c["vpp"] = trial.suggest_categorical("vpp", v["vpp"]) if c["pp"] > 1 and len(v["vpp"]) > 1 else (
        v["vpp"][0] if c["pp"] > 1 else 1)
    c["split"] = trial.suggest_categorical("split", v["split"]) if c["pp"] > 1 and len(v["split"]) > 1 else v["split"][0]
    for key, matters in (("moe_a2a_algorithm", bool(space.ep_leaves_domain(c["ep"], c["etp"]))),
                         ("cp_comm_type", c["cp"] > 1)):
        c[key] = trial.suggest_categorical(key, v[key]) if matters and len(v[key]) > 1 else space.resting(key)
    return c


def _log2_sizes(space: SearchSpace, table: dict) -> dict[str, np.ndarray]:
    """log2 of each size column of the layout table, computed once per space: the repair runs for
    every trial over the whole table (millions of rows once the algorithms multiply the layouts)."""
    cache = space.__dict__.get("_log2_sizes_cache")
    if cache is None or cache[0] is not table:
        cache = (table, {key: np.log2(table[key]) for key in ("tp", "cp", "pp", "vpp", "ep", "etp")})
        space.__dict__["_log2_sizes_cache"] = cache
    return cache[1]


def nearest_valid(space: SearchSpace, layout: dict) -> dict:
    """Repair a suggested layout to the closest one the space holds (log2 distance per size, a
    different split counts half a doubling, a different algorithm a quarter): samplers then spend no
    trial on invalid combinations, and TPE still learns from what it suggested. Repairs are remembered
    per space: ranking a study repairs every trial's suggestion again."""
    memo = space.__dict__.setdefault("_nearest_valid_memo", {})
    key = _key(layout)
    if key not in memo:
        memo[key] = _nearest_valid(space, layout)
    return dict(memo[key])


def _nearest_valid(space: SearchSpace, layout: dict) -> dict:
    table = space.layout_table()
    logs = _log2_sizes(space, table)
    dist = np.zeros(len(table["tp"]))
    for key in ("tp", "cp", "pp", "vpp", "ep", "etp"):
        dist += np.abs(logs[key] - np.log2(layout[key]))
    dist += 0.5 * (table["split"] != space.values["split"].index(layout["split"]))
    dist += 0.25 * (table["moe_a2a_hierarchical"] != (layout["moe_a2a_algorithm"] == "hierarchical"))
    dist += 0.25 * (table["cp_comm"] != CP_COMM_CODES[layout["cp_comm_type"]])
    i = int(np.argmin(dist))
    out = {key: (space.values["split"][int(table[key][i])] if key == "split" else int(table[key][i]))
           for key in ("tp", "cp", "pp", "vpp", "ep", "etp", "split")}
    out["moe_a2a_algorithm"] = "hierarchical" if table["moe_a2a_hierarchical"][i] else "flat"
    out["cp_comm_type"] = CP_COMM_NAMES[int(table["cp_comm"][i])]
    return out


def expand(space: SearchSpace, layout: dict) -> list[dict]:
    """Every micro-batch size and option (recompute, optimizer, overlaps) of one layout: these are
    scored together in one vectorised batch, the layout's value is its best feasible config."""
    allowed = np.flatnonzero(space.layout_options(layout))
    return [{**layout, "micro_batch_size": mbs, "option": int(i)}
            for mbs in space.values["micro_batch_size"] for i in allowed]


def scored_groups(space: SearchSpace, layouts: list[dict], margin_gib: float = 0.0) -> tuple[list[list[dict]], tuple]:
    """Each layout's scored choices (in ``expand`` order) and their ``_score`` arrays over all of them.

    An offload plan costs at least the time of the same plan without offload (its exposed copy is
    ≥ 0) and ranks after it at equal time, so it matters only where that counterpart does not fit or
    falls short of the memory margin. Choices without offload are scored first; an offload plan is
    scored only where its counterpart (same micro-batch size and options) fails so. Every layout keeps
    the best config it has when all are scored, at about half the cost where the profile has a host link."""
    groups = [expand(space, lay) for lay in layouts]
    flat = [c for g in groups for c in g]
    layout_of = np.repeat(np.arange(len(groups)), [len(g) for g in groups])
    opt = np.array([c["option"] for c in flat], dtype=np.int64)
    base = np.asarray(space.offload_counterpart, dtype=np.int64)[opt] if len(opt) else opt
    plain = np.flatnonzero(base == opt)
    s1 = _score_some(space, flat, plain)
    good = {(int(layout_of[i]), flat[i]["micro_batch_size"], int(opt[i]))
            for i, f, r in zip(plain, s1[1], s1[4]) if f and r >= margin_gib}
    need = np.array([i for i in np.flatnonzero(base != opt)
                     if (int(layout_of[i]), flat[i]["micro_batch_size"], int(base[i])) not in good], dtype=np.int64)
    s2 = _score_some(space, flat, need)
    keep = np.sort(np.concatenate([plain, need]))
    at = np.empty(len(flat), dtype=np.int64)  # each kept choice's row in the concatenated scores
    at[plain], at[need] = np.arange(len(plain)), len(plain) + np.arange(len(need))
    scores = tuple(np.concatenate([x, y])[at[keep]] for x, y in zip(s1, s2))
    kept: list[list[dict]] = [[] for _ in groups]
    for i in keep:
        kept[layout_of[i]].append(flat[i])
    return kept, scores


def _score_some(space: SearchSpace, flat: list[dict], index: np.ndarray) -> tuple[np.ndarray, ...]:
    if len(index):
        return _score(space, [flat[i] for i in index])
    return (np.zeros(0, bool),) * 2 + (np.zeros(0),) * 3 + (np.zeros(0, bool),)


def _key(choice: dict) -> tuple:
    return tuple(sorted(choice.items()))


def _as_storage(storage) -> optuna.storages.BaseStorage:
    """A storage object (a URL opens an RDB storage; None is a study in memory)."""
    if storage is None:
        return optuna.storages.InMemoryStorage()
    if isinstance(storage, str):
        storage = open_rdb_storage(storage)
    if isinstance(storage, optuna.storages.RDBStorage):
        return OwnTrialsStorage(storage)  # fewer round trips per trial (search/trial_writes.py)
    return storage


def run_sampler(space: SearchSpace, name: str, n_trials: int, top_k: int, seed: int | None = None,
                storage: str | optuna.storages.BaseStorage | None = None, study_name: str | None = None,
                progress: ProgressFn | None = None, timeout_s: float | None = None,
                clock: Callable[[], float] | None = None, worker: str | None = None,
                poll_s: float = 0.2, margin_gib: float = 0.0) -> Ranked:
    """Run the study until it holds ``n_trials`` finished trials; each trial is one parallel layout,
    scored with all of its micro-batch sizes and options, and told the best feasible throughput.

    The study may be shared: other processes running this function on the same ``storage`` and
    ``study_name`` add trials to it at the same time, and a study left by a worker that died is
    continued (its lost trials are failed and run again, see ``search.storages``). Trials are reserved
    under the study's lock so that together the processes never exceed ``n_trials``; the ranking is
    taken from every finished trial of the study, whoever ran it. ``worker`` is recorded on each trial
    this process runs (user attribute ``worker``). ``timeout_s`` stops this process from asking for
    more trials after that many seconds (the ranking then covers the trials finished so far).
    ``margin_gib``: the memory margin (GiB of headroom); a trial's value is the throughput of its best
    config that keeps it, else of its best config that fits, and the ranking puts configs that keep it
    first.
    """
    import time

    clock = clock or time.monotonic
    started = clock()
    multi = name == "nsga2"
    storage = _as_storage(storage)
    study = optuna.create_study(
        storage=storage, study_name=study_name, sampler=make_sampler(name, seed),
        directions=["maximize", "maximize"] if multi else ["maximize"], load_if_exists=True)
    heartbeat = TrialHeartbeat(storage)
    turns = ReservationTurns(study, worker or uuid.uuid4().hex)
    complete = 0

    def waiting() -> None:  # while waiting for the lock: keep the turn marked, notice a cancel or a stop
        turns.waiting()
        if progress:
            progress(complete, n_trials)

    try:
        while True:
            if progress:
                progress(complete, n_trials)  # may raise to stop this worker (cancelled, shutting down)
            timed_out = timeout_s is not None and clock() - started > timeout_s
            if not timed_out:
                turns.waiting()
            with reservation_lock(storage, study.study_name, on_wait=waiting):
                fail_stale_trials(study, storage)
                states = [t.state for t in study.get_trials(deepcopy=False, states=(COMPLETE, RUNNING))]
                complete = states.count(COMPLETE)
                free = n_trials - len(states)  # running trials are slots reserved by whoever runs them
                k = 0 if timed_out else min(_round_size(name, n_trials - complete), free)
                if k > 0 and turns.must_yield():  # another worker's turn (search.storages.ReservationTurns)
                    k = 0
                trials = []
                for _ in range(max(k, 0)):
                    with warnings.catch_warnings():  # "heartbeats are meant for Study.optimize": ours beat here
                        warnings.filterwarnings("ignore", message="Heartbeat of storage", category=UserWarning)
                        trials.append(study.ask())
                    heartbeat.first_beat(trials[-1]._trial_id)  # noqa: SLF001 - Optuna's heartbeats key on it
                heartbeat.track([t._trial_id for t in trials])  # noqa: SLF001
                if trials:
                    turns.reserved()
            if complete >= n_trials or timed_out:
                break
            if not trials:  # the budget is reserved by trials in flight (or by a dead worker's, until stale)
                time.sleep(poll_s)
                continue
            complete += _score_round(space, study, trials, multi, worker, margin_gib,
                                     write_params=getattr(storage, "write_params", None))
    finally:
        heartbeat.close()
        with contextlib.suppress(Exception):  # a database gone here: the mark goes stale by itself
            turns.done()
    ranked = rank_trials(space, study.get_trials(deepcopy=False, states=(COMPLETE,)), top_k, margin_gib)
    ranked.pareto = _pareto(study, space, margin_gib) if multi else None
    ranked.extra["study_name"] = study.study_name
    return ranked


def _score_round(space: SearchSpace, study: optuna.Study, trials: list, multi: bool, worker: str | None,
                 margin_gib: float = 0.0, write_params: Callable[[], None] | None = None) -> int:
    """Score the layouts of a round of trials in one vectorised batch and tell each its value; returns
    how many were told. A trial that another worker failed meanwhile (its heartbeat looked stale to it:
    a stalled process) is dropped: it is already queued to run again."""
    layouts, live = [], []
    for t in trials:
        try:
            layouts.append(nearest_valid(space, suggest(t, space)))
            live.append(t)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass
    if write_params is not None:  # the round's parameters land before scoring (a crash retries them)
        write_params()
    expanded, scores = scored_groups(space, layouts, margin_gib)
    start, told = 0, 0
    for trial, group in zip(live, expanded):
        sl = slice(start, start + len(group))
        start += len(group)
        try:
            told += _tell(study, trial, *(a[sl] for a in scores[:5]), capacity_gib=space.profile.fact("memory_gib"),
                          multi=multi, worker=worker, margin_gib=margin_gib)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass
    return told


def _tell(study: optuna.Study, trial, valid, ok, tok, pk, room, *, capacity_gib: float, multi: bool,
          worker: str | None, margin_gib: float = 0.0) -> bool:
    """Tell one trial its layout's best throughput (and memory headroom for NSGA-II), with the memory
    violation as its constraint; False when another worker failed the trial first. The best is the one
    the ranking would put first: among the configs that keep the margin if any does, else among those
    that fit (a layout that only fits inside the margin is still a feasible trial)."""
    best = _best_index(ok, tok, room, margin_gib)
    if best is not None:
        violation = 0.0
    elif valid.any():
        violation = float(min(pk[valid].min() - capacity_gib, INVALID_VIOLATION))
    else:
        violation = INVALID_VIOLATION
    trial.set_constraint(CONSTRAINT, violation)
    if worker is not None:
        trial.set_user_attr("worker", worker)
    if best is not None:  # the history (a job's report reads it from the study) marks configs short of the margin
        trial.set_user_attr(KEEPS_MARGIN, bool(room[best] >= margin_gib))
    tokens = float(tok[best]) if best is not None else 0.0
    if multi:
        headroom = float(room[best]) if best is not None else -INVALID_VIOLATION
        values = [tokens, headroom]
    else:
        values = tokens
    # skip_if_finished: a trial failed as stale meanwhile stays failed (its rerun is queued)
    return study.tell(trial, values, skip_if_finished=True).state == COMPLETE


def _best_index(ok: np.ndarray, tok: np.ndarray, room: np.ndarray, margin_gib: float) -> int | None:
    """The config of one layout the ranking puts first (by throughput among those that keep the margin,
    else among those that fit); None when none fits."""
    keep = ok & (room >= margin_gib)
    pool = keep if keep.any() else ok
    return int(np.argmax(np.where(pool, tok, -np.inf))) if pool.any() else None


def _score(space: SearchSpace, choices: list[dict]) -> tuple[np.ndarray, ...]:
    """(valid, feasible, tokens/s, peak GiB, headroom GiB, offloads) of each choice, from one vectorised
    evaluation; the headroom is computed as the result's ``memory.headroom_gib`` (capacity − peak),
    ``offloads`` whether the choice offloads any module (a tie-break of the ranking)."""
    batch, split_ok = space.choice_batch(choices)
    br = evaluate_batch(space.spec, space.profile, space.devices, batch, keep_stages=False)
    valid = br.valid & split_ok
    return (valid, valid & br.feasible, ranking_tokens_per_s(space, br, batch), br.peak_bytes / 2**30,
            (br.capacity_bytes - br.peak_bytes) / 2**30, batch.offload_modules != 0)


def trial_layout(space: SearchSpace, trial: optuna.trial.FrozenTrial) -> dict:
    """The layout a finished trial scored (its suggested parameters, repaired as when it ran)."""
    return nearest_valid(space, suggest(optuna.trial.FixedTrial(trial.params), space))


def rank_trials(space: SearchSpace, trials: list[optuna.trial.FrozenTrial], top_k: int,
                margin_gib: float = 0.0) -> Ranked:
    """The ranking of a set of finished trials: every config of every trial's layout, re-scored, the
    feasible ones ranked with those that keep ``margin_gib`` of headroom first, then by tokens/s, then
    those that offload nothing, then the smaller peak, then the order first seen (trial number, then
    position in the layout's options). Offload plans whose counterpart without offload keeps the margin
    are not scored (``scored_groups``): they could only rank behind it.
    Deterministic in the trials alone, so any process that reads the same study ranks it the same.
    Also the best config of each of the top K distinct parallel layouts (``Ranked.layouts``)."""
    trials = sorted(trials, key=lambda t: t.number)
    layouts = [trial_layout(space, t) for t in trials]
    keys = list(dict.fromkeys(_key(lay) for lay in layouts))
    scored, (valid, ok, tok, pk, room, off) = scored_groups(space, [dict(key) for key in keys], margin_gib)
    groups = dict(zip(keys, scored))
    flat = [c for key in keys for c in groups[key]]
    offsets, start = {}, 0
    for key in keys:
        offsets[key] = start
        start += len(groups[key])
    seen: dict[tuple, int] = {}  # feasible config -> its index in ``flat``
    history, feasible_trials, configs_scored = [], 0, 0
    min_peak, min_index = math.inf, None
    for trial, lay in zip(trials, layouts):
        key = _key(lay)
        sl = slice(offsets[key], offsets[key] + len(groups[key]))
        configs_scored += len(groups[key])
        f = ok[sl]
        if valid[sl].any():
            j = int(np.argmin(np.where(valid[sl], pk[sl], np.inf)))
            if pk[sl][j] < min_peak:
                min_peak, min_index = float(pk[sl][j]), sl.start + j
        history.append(_history_entry(trial.number, ok[sl], tok[sl], room[sl], margin_gib))
        if not f.any():
            continue
        feasible_trials += 1
        for j in np.nonzero(f)[0]:
            seen.setdefault(_key(flat[sl.start + j]), sl.start + int(j))
    index = np.array(list(seen.values()), dtype=np.int64)
    order = _rank_order(tok[index], pk[index], np.arange(len(index)), room[index] < margin_gib, off[index]) \
        if len(index) else np.zeros(0, dtype=np.int64)
    ranked = index[order]  # indices into ``flat``, best first
    shape_of = {}  # layout (tp, pp, cp, ep, etp) -> its code
    codes = np.array([shape_of.setdefault(tuple(flat[i][k] for k in LAYOUT_FIELDS), len(shape_of))
                      for i in ranked], dtype=np.int64)
    variants = np.bincount(codes, minlength=len(shape_of))
    best_of_layouts = [{"layout": {k: int(flat[ranked[p]][k]) for k in LAYOUT_FIELDS}, "best_rank": int(p) + 1,
                        "config": space.choice_config(flat[ranked[p]]), "variants": int(variants[codes[p]])}
                       for p in layout_firsts(codes, top_k)]
    return Ranked(configs=[space.choice_config(flat[i]) for i in ranked[:top_k]], trials=len(trials),
                  feasible_trials=feasible_trials,
                  smallest_peak_gib=None if min_index is None else min_peak,
                  smallest_peak_config=None if min_index is None else space.choice_config(flat[min_index]),
                  history=history, extra={"configs_scored": configs_scored}, layouts=best_of_layouts,
                  feasible_layouts=len(shape_of))


def _history_entry(number: int, ok: np.ndarray, tok: np.ndarray, room: np.ndarray, margin_gib: float) -> dict:
    """One trial as the history shows it: the tokens/s of the layout's config the ranking puts first (the
    value the trial was told), and whether that config keeps the memory margin. A config that only fits
    inside the margin ranks after every one that keeps it, so a history that showed the layout's fastest
    fitting config would climb above the ranked best."""
    j = _best_index(ok, tok, room, margin_gib)
    if j is None:
        return {"trial": number, "tokens_per_s": None, "feasible": False}
    return {"trial": number, "tokens_per_s": float(tok[j]), "feasible": True,
            "keeps_margin": bool(room[j] >= margin_gib)}


def _pareto(study: optuna.Study, space: SearchSpace, margin_gib: float = 0.0) -> list[dict]:
    """Optuna's non-dominated feasible trials: throughput against memory headroom, each with the
    layout's best config (re-scored, so that the front carries full configs; the one its trial was told)."""
    front = []
    for t in study.best_trials:
        (group,), (_, ok, tok, _, room, _) = scored_groups(space, [trial_layout(space, t)], margin_gib)
        j = _best_index(ok, tok, room, margin_gib)
        if j is not None:
            front.append({"trial": t.number, "tokens_per_s": t.values[0], "memory_headroom_gib": t.values[1],
                          "config": space.choice_config(group[j])})
    front.sort(key=lambda p: -p["tokens_per_s"])
    return front

"""Fitting a profile's efficiency factors on training runs (``scripts/calibrate.py``, ``paraplan calibrate``,
``paraplan validate --cv``).

A handful of physically meaningful factors (GEMM efficiency curve, attention efficiency, achievable
bandwidth fractions, overlap fractions, per-layer launch overhead, stragglers) are fitted to minimise
the mean absolute relative error of tokens/s per device, with a pull towards the profile's current
factors (the priors: datasheets, benchmarks) so that factors the runs cannot see stay where those put
them. Never a factor per run, per model or per source. Runs are duck-typed: ``name``, ``spec``,
``config``, ``devices``, ``reported``, and ``source`` for the cross-validation
(``app.formats.validation.Run``).

The fit is fast because it never builds a profile per candidate: the scorer takes the efficiency
factors as arrays, one value per config, so each run is scored once per generation for a whole
population of candidate factor sets (``RunScorer``), and a CMA-ES (the ``cmaes`` package, Optuna's
own CMA-ES backend) moves the population. A fit of one device takes seconds, which is what lets
leave-one-source-out cross-validation (``cross_validate``) run inside the test suite. Its folds are fitted
in lockstep (``_fit_together``): each round scores every fold's candidates in one call per run, a fifth of
the CPU of fitting them one after another, with the same factors to the bit.
"""

from __future__ import annotations

import datetime as dt
import json
import multiprocessing
import re
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Callable, Generator

import numpy as np

from costmodel import ConfigBatch, evaluate_batch
from costmodel.hardware import Hardware
from costmodel.spec import ClusterProfile

from . import raw


@dataclass
class Fit:
    """Fitted factors and the relative errors (predicted/reported − 1) of the runs before and after."""

    factors: dict[str, float]
    before: np.ndarray
    after: np.ndarray
    objective: str
    at_bound: dict[str, str] = field(default_factory=dict)  # factor -> "lower" | "upper"

    @property
    def mape_before(self) -> float:
        return float(np.mean(np.abs(self.before)))

    @property
    def mape_after(self) -> float:
        return float(np.mean(np.abs(self.after)))


# (lower, upper) bounds: physical ranges, not fitting conveniences. A fitted factor that ends at one is
# reported (``Fit.at_bound``); a shipped profile keeps it there only with a ``bound_reason`` saying
# why physically (the fit is then pressing on a limit the physics sets, not on a knob).
BOUNDS = {
    "gemm_eff_max": (0.4, 0.95),
    # Size (GFLOP) at which a GEMM reaches half its peak efficiency: tens of MFLOP for the smallest
    # tiles a kernel library pads to; tens of GFLOP where each call pays tens of microseconds of host
    # dispatch (Ascend's operator-by-operator launch; the profiles' priors say why).
    "gemm_half_gflop": (0.05, 50.0),
    "attn_eff": (0.15, 0.75),
    "fp8_gemm_eff_ratio": (0.4, 1.0),
    "hbm_eff": (0.5, 0.95),
    "scale_up_bw_eff": (0.4, 0.95),
    "scale_out_bw_eff": (0.4, 0.95),
    "tp_overlap": (0.05, 0.95),
    "ep_overlap": (0.05, 0.95),
    "dp_overlap": (0.05, 0.98),
    "layer_overhead_us": (5.0, 2000.0),
    "softmax_gscores_per_s": (200.0, 20000.0),
    # Grouped expert GEMMs reach at least 0.8 of a dense GEMM of the same size (per-expert wave tails
    # on tens to thousands of tokens per expert).
    "moe_gemm_eff_ratio": (0.8, 1.0),
    "pp_chunk_overhead_us": (5.0, 5000.0),
    # Per-replica step-time variation: under 0.2 % is below what any published series resolves, over
    # 5 % would be a broken cluster rather than jitter.
    "straggler_cv": (0.002, 0.05),
}
# Pull towards the priors: PRIOR_WEIGHT * mean over factors of (log(value / prior))², added to the MAPE.
# A factor 2x off its prior costs 0.48 * PRIOR_WEIGHT / (number of factors) of MAPE. Chosen by
# leave-one-source-out cross-validation on the shared calibration runs (``scripts/calibrate.py
# --sweep-prior``; docs/accuracy.md): weaker pulls fit the runs better and predict unseen sources worse.
PRIOR_WEIGHT = 0.01
# ... and firmer for a handful of runs (a team's own, ``paraplan calibrate``), which cannot pin a dozen
# factors: at least PRIOR_WEIGHT_RUNS / number of runs (0.025 for ten runs).
PRIOR_WEIGHT_RUNS = 0.25
# CMA-ES population and stopping: a population of 48 candidate factor sets costs one vectorised call
# per run, barely more than one candidate (the per-call overhead dominates).
POPULATION = 48
MAX_GENERATIONS = 400
PATIENCE_GENERATIONS = 60  # stop once the best objective has not improved by 0.01 % for this many


def scale_series(runs) -> list[list]:
    """Runs of one model and one layout at several data-parallel sizes (weak or strong scaling):
    only these separate the stragglers' growth with dp from the per-device efficiencies."""
    groups: dict[tuple, list] = {}
    for r in runs:
        layout = r.config.model_dump(exclude={"dp", "global_batch_size"})
        groups.setdefault((r.spec.model_dump_json(), json.dumps(layout, sort_keys=True, default=str)), []).append(r)
    return [g for g in groups.values() if len({r.devices for r in g}) >= 2]


def factors_seen(runs) -> list[str]:
    """Only fit what the runs exercise: FP8 needs FP8 runs, EP overlap needs MoE overlap runs, ..."""
    keys = ["gemm_eff_max", "gemm_half_gflop", "attn_eff", "hbm_eff", "layer_overhead_us",
            "softmax_gscores_per_s"]
    cfgs = [r.config for r in runs]
    if sum(r.config.pp > 1 for r in runs) >= 3:
        keys.append("pp_chunk_overhead_us")
    if sum(r.spec.is_moe for r in runs) >= 3:
        keys.append("moe_gemm_eff_ratio")
    if any(c.precision == "fp8" for c in cfgs):
        keys.append("fp8_gemm_eff_ratio")
    if any(c.tp > 1 for c in cfgs):
        keys.append("scale_up_bw_eff")
    if any(c.tp_comm_overlap for c in cfgs):
        keys.append("tp_overlap")
    if sum(r.devices > 8 for r in runs) >= 3:
        keys.append("scale_out_bw_eff")
        keys.append("dp_overlap")
    if any(c.moe_a2a_overlap for c in cfgs):
        keys.append("ep_overlap")
    if sum(len(g) for g in scale_series(runs)) >= 4:
        keys.append("straggler_cv")
    return keys


def _set_factors(base: dict, keys: list[str], values) -> dict:
    data = json.loads(json.dumps(base))
    for k, v in zip(keys, values):
        data["efficiency"][k]["value"] = float(v)
    return data


def run_errors(profile: ClusterProfile, runs) -> np.ndarray:
    """Relative error of each run under ``profile`` (1.0 for a run it cannot score)."""
    return RunScorer(profile, runs).errors({})[0]


class RunScorer:
    """The runs of one device, scored for many candidate factor sets per call."""

    def __init__(self, profile: ClusterProfile, runs):
        self.profile = profile
        self.runs = list(runs)
        self.reported = np.array([r.reported for r in self.runs], dtype=float)
        self._batches: dict[tuple[int, int], ConfigBatch] = {}
        self.calls = 0  # candidate factor sets scored

    def _batch(self, i: int, n: int) -> ConfigBatch:
        key = (i, n)
        if key not in self._batches:
            self._batches[key] = ConfigBatch.from_configs([self.runs[i].config] * n)
        return self._batches[key]

    def errors(self, factors: dict[str, np.ndarray]) -> np.ndarray:
        """(candidates, runs) relative errors of tokens/s per device; ``factors`` maps profile keys
        to arrays of one value per candidate (or scalars: one candidate). A candidate under which a
        run is invalid or not finite counts |error| 1, as ``paraplan validate`` counts it."""
        n = max([np.size(v) for v in factors.values()] + [1])
        hw = Hardware.from_profile(self.profile, {k: np.broadcast_to(np.asarray(v, float), (n,))
                                                  for k, v in factors.items()})
        out = np.empty((n, len(self.runs)))
        for i, run in enumerate(self.runs):
            res = evaluate_batch(run.spec, self.profile, run.devices, self._batch(i, n), keep_stages=False, hw=hw)
            pred = np.where(res.valid, res.tokens_per_s_per_device, np.nan)
            err = pred / self.reported[i] - 1.0
            out[:, i] = np.where(np.isfinite(err), err, 1.0)
        self.calls += n
        return out


def fit_straggler_cv(base: dict, runs) -> float:
    """``straggler_cv`` from the shape of each scale series alone: the within-series spread of the
    errors, each series' mean removed (the level is what the per-device efficiencies set; only the
    growth with dp is the stragglers'), least squares over the series. Two log-spaced grids, the
    second around the first's best point."""
    series = scale_series(runs)
    profile = ClusterProfile.model_validate(base)
    scorers = [RunScorer(profile, g) for g in series]
    lo, hi = BOUNDS["straggler_cv"]
    grid = np.geomspace(lo, hi, 64)
    for _ in range(2):
        spread = sum(((e - e.mean(axis=1, keepdims=True)) ** 2).sum(axis=1)
                     for e in (s.errors({"straggler_cv": grid}) for s in scorers))
        best = int(np.argmin(spread))
        grid = np.geomspace(grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)], 64)
    return float(grid[len(grid) // 2]) if len(series) else float(base["efficiency"]["straggler_cv"]["value"])


def _search(dim: int, x0: np.ndarray, *, seed: int, max_evals: int) -> Generator[np.ndarray, np.ndarray, np.ndarray]:
    """Minimise an objective over [0, 1]^dim by CMA-ES from ``x0``, as a generator: it yields each batch of
    points to score (rows) and is sent their objective values; it returns the best point seen. Written as
    a generator so that several fits can be scored together (``_minimise`` drives one, ``_fit_together``
    many in lockstep)."""
    from cmaes import CMA

    best_x = x0.copy()
    best_f = float((yield x0[None, :])[0])
    stale, evals = 0, 1
    # The last third of the budget is the polish's (``_polish``); a budget too small for a CMA-ES to learn
    # anything (under 20 candidates a factor) is all the polish's.
    budget, max_evals = max_evals, max_evals * 2 // 3
    if budget < 20 * dim:
        return (yield from _polish(best_x, best_f, budget - evals))
    # A budget of a few thousand candidates buys ~100 generations of a smaller population (CMA-ES needs
    # generations more than width to converge).
    population = int(np.clip(max_evals // 200, 4, POPULATION))
    opt = CMA(mean=x0.copy(), sigma=0.15, bounds=np.array([[0.0, 1.0]] * dim), seed=seed,
              population_size=population)
    for _ in range(MAX_GENERATIONS):
        if evals + population > max_evals or opt.should_stop():
            break
        xs = np.array([opt.ask() for _ in range(population)])
        fs = yield xs
        evals += len(xs)
        opt.tell(list(zip(xs, fs)))
        i = int(np.argmin(fs))
        if fs[i] < best_f * (1 - 1e-4):
            stale = 0
        else:
            stale += 1
        if fs[i] < best_f:
            best_x, best_f = xs[i].copy(), float(fs[i])
        if stale >= PATIENCE_GENERATIONS:
            break
    return (yield from _polish(best_x, best_f, budget - evals))


def _polish(x: np.ndarray, f: float, max_evals: int) -> Generator[np.ndarray, np.ndarray, np.ndarray]:
    """Finish a CMA-ES run in a flat valley, where its population stalls: every coordinate's line at
    several step sizes in one batch, then a line along the move those coordinate steps add up to (the
    idea of Powell's and Hooke-Jeeves' pattern moves, batched); the steps shrink when nothing improves.
    A generator as ``_search``."""
    steps = np.array([-4.0, -2.0, -1.0, -0.5, 0.5, 1.0, 2.0, 4.0])
    alphas = np.array([0.25, 0.5, 1.0, 1.5, 2.0, 3.0])
    dim, step = len(x), 0.02
    while step > 1e-4 and max_evals >= 2 * dim + len(alphas):
        if max_evals < dim * len(steps) + len(alphas):  # a small budget: one step each way
            steps = np.array([-1.0, 1.0])
        cand = np.repeat(x[None, :], dim * len(steps), axis=0)
        for i in range(dim):
            cand[i * len(steps):(i + 1) * len(steps), i] += step * steps
        cand = np.clip(cand, 0.0, 1.0)
        fs = (yield cand).reshape(dim, len(steps))
        # each coordinate's best step (as clipped), where it beats the current point
        best = cand[np.arange(dim) * len(steps) + fs.argmin(axis=1), np.arange(dim)]
        move = np.where(fs.min(axis=1) < f, best - x, 0.0)
        if not move.any():
            step /= 4
            max_evals -= fs.size
            continue
        line = np.clip(x[None, :] + alphas[:, None] * move[None, :], 0.0, 1.0)
        fl = yield line
        max_evals -= fs.size + len(fl)
        options = [(float(fs.min()), cand[int(fs.argmin())]), (float(fl.min()), line[int(fl.argmin())])]
        best_f, best_x = min(options, key=lambda o: o[0])
        if best_f < f:
            x, f = best_x.copy(), best_f
        else:
            step /= 4
    return x


def _minimise(objective: Callable[[np.ndarray], np.ndarray], steps: Generator) -> np.ndarray:
    """Run one ``_search`` generator to its end, scoring each batch it yields with ``objective``."""
    try:
        xs = next(steps)
        while True:
            xs = steps.send(objective(xs))
    except StopIteration as done:
        return done.value


def at_bounds(factors: dict[str, float], rel: float = 0.01) -> dict[str, str]:
    """The factors within ``rel`` (in log terms) of a bound: ``{key: "lower" | "upper"}``."""
    out = {}
    for k, v in factors.items():
        lo, hi = BOUNDS[k]
        if np.log(v / lo) < rel * np.log(hi / lo):
            out[k] = "lower"
        elif np.log(hi / v) < rel * np.log(hi / lo):
            out[k] = "upper"
    return out


@dataclass
class _Problem:
    """One fit's objective: the factors ``keys`` in the unit cube of their log bounds, pulled towards the
    priors. ``base`` is the profile data with ``straggler_cv`` fitted already (it is fitted apart, see
    ``fit``)."""

    base: dict
    keys: list[str]
    prior_weight: float
    stragglers: bool  # whether straggler_cv is fitted (apart, before and after the others)
    lo: np.ndarray = field(init=False)
    hi: np.ndarray = field(init=False)
    prior: np.ndarray = field(init=False)

    def __post_init__(self):
        self.lo = np.log([BOUNDS[k][0] for k in self.keys])
        self.hi = np.log([BOUNDS[k][1] for k in self.keys])
        self.prior = np.clip(np.log([self.base["efficiency"][k]["value"] for k in self.keys]), self.lo, self.hi)

    @property
    def straggler_cv(self) -> float:
        return float(self.base["efficiency"]["straggler_cv"]["value"])

    def log_factors(self, us: np.ndarray) -> np.ndarray:
        return self.lo + np.clip(us, 0.0, 1.0) * (self.hi - self.lo)

    def factors(self, us: np.ndarray) -> dict[str, np.ndarray]:
        """Each key's value per candidate (rows of ``us``)."""
        z = self.log_factors(us)
        return {k: np.exp(z[:, j]) for j, k in enumerate(self.keys)}

    def value(self, us: np.ndarray, err: np.ndarray) -> np.ndarray:
        """The objective per candidate from its (candidates, runs) errors."""
        z = self.log_factors(us)
        return np.abs(err).mean(axis=1) + self.prior_weight * ((z - self.prior) ** 2).mean(axis=1)

    def steps(self, maxfev: int, seed: int) -> Generator:
        u0 = (self.prior - self.lo) / (self.hi - self.lo)
        return _search(len(self.keys), u0, seed=seed, max_evals=maxfev)

    def fitted(self, x: np.ndarray, runs) -> dict[str, float]:
        """The factors of the search's best point ``x``, with straggler_cv refitted around them."""
        keys, values = list(self.keys), np.exp(self.log_factors(x)) if self.keys else np.array([])
        if self.stragglers:
            cv = fit_straggler_cv(_set_factors(self.base, keys, values), runs)
            keys, values = keys + ["straggler_cv"], np.append(values, cv)
        return {k: float(v) for k, v in zip(keys, values)}


def _without_calibration(base: dict) -> dict:
    data = json.loads(json.dumps(base))
    data.pop("calibration", None)
    return data


def _problem(base: dict, runs, keys: list[str] | None, prior_weight: float | None) -> _Problem:
    base = _without_calibration(base)
    keys = list(factors_seen(runs) if keys is None else keys)
    if prior_weight is None:
        prior_weight = max(PRIOR_WEIGHT, PRIOR_WEIGHT_RUNS / len(runs))
    # The straggler factor is fitted apart, on the series' shapes, before and after the others: in
    # the MAPE its few-point drift is outweighed by the level of every run, which the efficiencies
    # fit as well, so a joint fit leaves the drift in place.
    stragglers = "straggler_cv" in keys
    if stragglers:
        keys.remove("straggler_cv")
        base = _set_factors(base, ["straggler_cv"], [fit_straggler_cv(base, runs)])
    return _Problem(base, keys, prior_weight, stragglers)


def fit(base: dict, runs, *, maxfev: int = 8000, progress: Callable[[int], None] | None = None,
        keys: list[str] | None = None, prior_weight: float | None = None, seed: int = 0) -> Fit:
    """Fit the factors ``keys`` (default: those ``runs`` exercise, ``factors_seen``), starting from and
    pulled towards the profile data ``base`` (its current factors are the priors) with ``prior_weight``
    (default: PRIOR_WEIGHT, firmer for few runs). ``progress(n)`` is
    called with the number of candidate factor sets scored so far (at most about ``maxfev``)."""
    problem = _problem(base, runs, keys, prior_weight)
    before = run_errors(ClusterProfile.model_validate(_without_calibration(base)), runs)
    scorer = RunScorer(ClusterProfile.model_validate(problem.base), runs)

    def objective(us: np.ndarray) -> np.ndarray:
        err = scorer.errors(problem.factors(us))
        if progress is not None:
            progress(scorer.calls)
        return problem.value(us, err)

    x = _minimise(objective, problem.steps(maxfev, seed)) if problem.keys else np.array([])
    factors = problem.fitted(x, runs)
    after = run_errors(ClusterProfile.model_validate(_set_factors(problem.base, list(factors), list(factors.values()))),
                       runs)
    return Fit(factors=factors, before=before, after=after, at_bound=at_bounds(factors),
               objective="mean |predicted/reported - 1| of tokens/s per device + "
                         f"{problem.prior_weight:g} * mean (log(factor/prior))^2")


# ---------------------------------------------------------------------------------------------------
# Leave-one-source-out cross-validation

_REPO = re.compile(r"github\.com/([\w.-]+/[\w.-]+)|\b([A-Za-z][\w-]*/[A-Za-z][\w.-]+)")
_ARXIV = re.compile(r"arXiv[ :]*(\d{4}\.\d{4,5})", re.IGNORECASE)


def source_group(run) -> str:
    """The source a run is left out with: its repository (``owner/name``) or paper (arXiv id, else the
    source text before its first comma), and its model family (the model name's leading letters).
    Runs of one publication and one model family share their scripts, software stack and measurement,
    so their errors are correlated: cross-validating within such a group would leak. Grouping by the
    repository alone would leave the Ascend 910B one group (every published 910B run is a
    MindSpeed-LLM README row)."""
    src = getattr(run, "source", "") or ""
    m = _ARXIV.search(src)
    if m:
        origin = "arXiv:" + m.group(1)
    else:
        m = _REPO.search(src)
        origin = (m.group(1) or m.group(2)) if m else (src.split(",")[0].strip() or run.name)
    family = re.match(r"[a-z]*", run.spec.name.lower()).group(0) or run.spec.name.lower()
    return f"{origin} / {family}"


@dataclass
class CrossValidation:
    """Each run's error when its source was left out of the fit, and the factors of each fold."""

    errors: dict[str, float]  # run name -> relative error predicted by the fold without its source
    groups: dict[str, list[str]]  # source -> run names
    folds: dict[str, dict[str, float]]  # source -> factors fitted without it

    def mape(self, names=None) -> float:
        vals = [abs(v) for k, v in self.errors.items() if names is None or k in names]
        return float(np.mean(vals)) if vals else 0.0


def cross_validate(base: dict, runs, *, prior_weight: float | None = None, maxfev: int = 8000,
                   workers: int = 1, progress: Callable[[str], None] | None = None) -> CrossValidation:
    """Leave-one-source-out: refit ``base``'s factors (the same factors the in-sample fit fits, from
    the same priors) without each source's runs, and score that source's runs with them. The folds are
    fitted together (``_fit_together``), in ``workers`` processes (each takes a share of the folds). A
    device with one source only cannot be cross-validated: its runs get no CV error. ``progress(source)``
    is called as each fold ends."""
    keys = factors_seen(runs)
    groups: dict[str, list] = {}
    for r in runs:
        groups.setdefault(source_group(r), []).append(r)
    names = {g: [r.name for r in rs] for g, rs in groups.items()}
    if len(groups) < 2:
        return CrossValidation({}, names, {})
    shares = [list(groups)[i::workers] for i in range(min(max(workers, 1), len(groups)))]
    args = [(base, runs, share, keys, prior_weight, maxfev) for share in shares]
    folds: dict[str, dict[str, float]] = {}
    if len(shares) > 1:
        # fork: the children inherit the parsed runs and the imported cost model
        ctx = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None
        with ProcessPoolExecutor(max_workers=len(shares), mp_context=ctx) as pool:
            for fut in as_completed([pool.submit(_fit_together, *a) for a in args]):
                folds.update(fut.result())
                for g in fut.result():
                    if progress is not None:
                        progress(g)
    else:
        folds = _fit_together(*args[0], progress=progress)
    errors: dict[str, float] = {}
    for g, held in groups.items():  # in the runs' order, whatever order the folds ended in
        errors.update(zip(names[g], (float(e) for e in run_errors(base_profile(base, folds[g]), held))))
    return CrossValidation(errors, names, {g: folds[g] for g in groups})


def _fit_together(base: dict, runs, left_out: list[str], keys: list[str], prior_weight: float | None,
                  maxfev: int, progress: Callable[[str], None] | None = None) -> dict[str, dict[str, float]]:
    """The factors of each fold (the fit without source ``g`` for each ``g`` of ``left_out``), each fold's
    search exactly as ``fit``'s, but run in lockstep: each round, every fold's batch of candidates is
    scored in one call per run (``RunScorer``), so the scorer's per-call cost is paid once per round
    instead of once per fold. A candidate's scores do not depend on the others in its batch (every
    formula is element-wise), so each fold ends where it would alone (``tests/test_calibration_fit.py``)."""
    trains = {g: [i for i, r in enumerate(runs) if source_group(r) != g] for g in left_out}
    problems = {g: _problem(base, [runs[i] for i in idx], keys, prior_weight) for g, idx in trains.items()}
    # Each fold's straggler_cv (fitted on its own runs, before the search) rides along as a factor column.
    scorer = RunScorer(ClusterProfile.model_validate(_without_calibration(base)), runs)
    steps = {g: p.steps(maxfev, seed=0) for g, p in problems.items() if p.keys}
    best = {g: np.array([]) for g, p in problems.items() if not p.keys}
    if progress is not None:
        for g in best:  # nothing to search: such a fold ends at once
            progress(g)
    asked = {}
    for g, s in steps.items():
        asked[g] = next(s)
    while asked:
        order = list(asked)
        cands = {g: problems[g].factors(asked[g]) for g in order}
        columns = {k: np.concatenate([cands[g][k] for g in order]) for k in problems[order[0]].keys}
        if problems[order[0]].stragglers:
            columns["straggler_cv"] = np.concatenate([np.full(len(asked[g]), problems[g].straggler_cv)
                                                      for g in order])
        err = scorer.errors(columns)
        start = 0
        for g in order:
            n = len(asked[g])
            values = problems[g].value(asked[g], err[start:start + n][:, trains[g]])
            start += n
            try:
                asked[g] = steps[g].send(values)
            except StopIteration as done:
                best[g] = done.value
                del asked[g]
                if progress is not None:
                    progress(g)
    return {g: problems[g].fitted(best[g], [runs[i] for i in trains[g]]) for g in left_out}


def base_profile(base: dict, factors: dict[str, float]) -> ClusterProfile:
    data = json.loads(json.dumps(base))
    data.pop("calibration", None)
    return ClusterProfile.model_validate(_set_factors(data, list(factors), list(factors.values())))


def fit_profile(name: str, runs, *, prior_weight: float | None = None) -> dict:
    """The calibration file of shipped profile ``name`` (``calibration/<name>.json``), fitted on
    published ``runs`` from its YAML priors."""
    result = fit(raw(name), runs, prior_weight=prior_weight)
    return {
        "profile": name,
        "factors": {k: round(v, 4) for k, v in result.factors.items()},
        "at_bound": result.at_bound,
        "fitted_on": [r.name for r in runs],
        "precisions": sorted({r.config.precision for r in runs}),
        "moe": any(r.spec.is_moe for r in runs),
        "max_devices": max(r.devices for r in runs),
        "mape_before": round(result.mape_before, 4),
        "mape_after": round(result.mape_after, 4),
        "objective": result.objective,
        "script": "scripts/calibrate.py",
        "date": dt.date.today().isoformat(),
    }

"""Fitting a profile's efficiency factors on training runs (``scripts/calibrate.py``, ``paraplan calibrate``).

A handful of physically meaningful factors (GEMM efficiency curve, attention efficiency, achievable
bandwidth fractions, overlap fractions, per-layer launch overhead, stragglers) are fitted to minimise
the mean absolute relative error of tokens/s per device, with a weak pull towards the profile's
current factors so that factors the runs cannot see stay where the datasheets, benchmarks or an
earlier calibration put them. Never a factor per run, per model or per source. Runs are duck-typed:
``name``, ``spec``, ``config``, ``devices``, ``reported`` (``app.formats.validation.Run``). Needs
scipy (the ``calibrate`` extra).
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Callable

import numpy as np

from costmodel import ConfigBatch, evaluate_batch
from costmodel.spec import ClusterProfile

from . import raw


@dataclass
class Fit:
    """Fitted factors and the relative errors (predicted/reported − 1) of the runs before and after."""

    factors: dict[str, float]
    before: np.ndarray
    after: np.ndarray
    objective: str

    @property
    def mape_before(self) -> float:
        return float(np.mean(np.abs(self.before)))

    @property
    def mape_after(self) -> float:
        return float(np.mean(np.abs(self.after)))


# (lower, upper) bounds: physical ranges, not fitting conveniences.
BOUNDS = {
    "gemm_eff_max": (0.4, 0.95),
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
    # on tens to thousands of tokens per expert); lower fitted values only absorbed the costs of the
    # MindSpeed-LLM core_r0.6.0 runs' allgather dispatcher, which would then mis-price modern MoE.
    "moe_gemm_eff_ratio": (0.8, 1.0),
    "pp_chunk_overhead_us": (5.0, 5000.0),
    # Per-replica step-time variation: under 0.2 % is below what any published series resolves, over
    # 5 % would be a broken cluster rather than jitter.
    "straggler_cv": (0.002, 0.05),
}
# Pull towards the priors, per factor on (log(value / prior))²: gentle where many runs constrain the
# factors, firmer for a device with a handful of runs.
PRIOR_WEIGHT_RUNS = 0.25  # weight = PRIOR_WEIGHT_RUNS / number of runs


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


def _with_factors(base: dict, keys: list[str], values) -> ClusterProfile:
    return ClusterProfile.model_validate(_set_factors(base, keys, values))


def _errors(profile: ClusterProfile, runs, batches) -> np.ndarray:
    errs = []
    for run, batch in zip(runs, batches):
        res = evaluate_batch(run.spec, profile, run.devices, batch)
        pred = res.tokens_per_s_per_device[0] if res.valid[0] else np.nan
        errs.append(pred / run.reported - 1.0 if np.isfinite(pred) else 1.0)
    return np.array(errs)


def fit_straggler_cv(base: dict, runs) -> float:
    """``straggler_cv`` from the shape of each scale series alone: the within-series spread of the
    errors, each series' mean removed (the level is what the per-device efficiencies set; only the
    growth with dp is the stragglers'), least squares over the series."""
    series = scale_series(runs)
    batches = [[ConfigBatch.from_configs([r.config]) for r in g] for g in series]

    def spread(cv):
        prof = _with_factors(base, ["straggler_cv"], [cv])
        errs = (_errors(prof, g, b) for g, b in zip(series, batches))
        return sum(float(np.sum((e - e.mean()) ** 2)) for e in errs)

    from scipy.optimize import minimize_scalar

    return float(minimize_scalar(spread, bounds=BOUNDS["straggler_cv"], method="bounded",
                                 options={"xatol": 1e-4}).x)


def fit(base: dict, runs, *, maxfev: int = 3000, progress: Callable[[int], None] | None = None) -> Fit:
    """Fit the factors ``runs`` exercise (``factors_seen``), starting from and pulled towards the
    profile data ``base`` (its current factors are the priors). ``progress(evaluations)`` is called
    as the optimiser scores candidate factor sets (at most ``maxfev`` of them)."""
    base = json.loads(json.dumps(base))
    base.pop("calibration", None)
    keys = factors_seen(runs)
    batches = [ConfigBatch.from_configs([r.config]) for r in runs]
    before = _errors(ClusterProfile.model_validate(base), runs, batches)
    # The straggler factor is fitted apart, on the series' shapes, before and after the others: in
    # the MAPE its few-point drift is outweighed by the level of every run, which the efficiencies
    # fit as well, so a joint fit leaves the drift in place (0.004 against the series' 0.013).
    stragglers = "straggler_cv" in keys
    if stragglers:
        keys.remove("straggler_cv")
        base = _set_factors(base, ["straggler_cv"], [fit_straggler_cv(base, runs)])
    prior = np.array([base["efficiency"][k]["value"] for k in keys], dtype=float)
    lo = np.array([BOUNDS[k][0] for k in keys])
    hi = np.array([BOUNDS[k][1] for k in keys])
    prior = np.clip(prior, lo, hi)
    weight = PRIOR_WEIGHT_RUNS / len(runs)
    calls = [0]

    # Optimise in log space so factors of very different scales move alike.
    def objective(z):
        x = np.exp(np.clip(z, np.log(lo), np.log(hi)))
        err = _errors(_with_factors(base, keys, x), runs, batches)
        calls[0] += 1
        if progress is not None:
            progress(calls[0])
        return float(np.mean(np.abs(err)) + weight * np.mean(np.log(x / prior) ** 2))

    from scipy.optimize import minimize

    best = minimize(objective, np.log(prior), method="Powell", bounds=list(zip(np.log(lo), np.log(hi))),
                    options={"maxfev": maxfev, "xtol": 1e-3, "ftol": 1e-5})
    x = np.exp(np.clip(best.x, np.log(lo), np.log(hi)))
    if stragglers:
        cv = fit_straggler_cv(_set_factors(base, keys, x), runs)
        keys, x = keys + ["straggler_cv"], np.append(x, cv)
    after = _errors(_with_factors(base, keys, x), runs, batches)
    return Fit(factors={k: float(v) for k, v in zip(keys, x)}, before=before, after=after,
               objective="mean |predicted/reported - 1| of tokens/s per device + "
                         f"{weight:.4f} * mean (log(factor/prior))^2")


def fit_profile(name: str, runs) -> dict:
    """The calibration file of shipped profile ``name`` (``calibration/<name>.json``), fitted on
    published ``runs`` from its YAML priors."""
    result = fit(raw(name), runs)
    return {
        "profile": name,
        "factors": {k: round(v, 4) for k, v in result.factors.items()},
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

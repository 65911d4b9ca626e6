"""A cluster profile refitted on a team's measured runs: the fit, the fitted profile and its figures.

One function, ``refit``, for ``paraplan calibrate`` and the service's profile versions
(``POST /v1/clusters/{name}/versions``): the project's fit (``hardware_profiles.calibrate.fit``),
started from and pulled towards the profile the runs were measured on, then the error on those runs
before and after and on the published runs of that cluster before and after. A refit that makes the
published set worse by more than ``PUBLISHED_WORSE_BY`` is flagged (``published_worse``), never hidden.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Callable

import numpy as np

from costmodel.spec import ClusterProfile

from .validation import Run, read_runs

# The published set's MAPE may rise this much (absolute) before the refit is called worse there: the
# shipped profiles' per-cluster MAPEs sit at 0.05-0.11, so 0.05 is half again as much error.
PUBLISHED_WORSE_BY = 0.05
PUBLISHED_RUNS = Path(__file__).resolve().parents[2].parent / "shared" / "validation" / "calibration_runs.json"


def published_runs(cluster: str, path: Path | None = PUBLISHED_RUNS) -> list[Run]:
    """The scorable published runs of ``cluster`` in ``path`` (none when there is no such file)."""
    if path is None or not Path(path).is_file():
        return []
    return [r for r in read_runs(path) if r.problem is None and r.cluster == cluster]


def score_problem(run: Run, profile: ClusterProfile) -> str | None:
    """Why the cost model cannot score ``run`` on ``profile`` (its infeasibility reasons), None when it can:
    such a run would count as |error| = 1 in every candidate fit, so it is refused, not fitted on."""
    from .results import evaluate

    result = evaluate(run.spec, profile, run.devices, run.config)
    if result["tokens_per_s_per_device"] is not None:
        return None
    return f"cannot be scored on {profile.name}: " + "; ".join(r["message"] for r in result["infeasible_reasons"])


def _mape(errors) -> float:
    return float(np.mean(np.abs(errors)))


def fitted_profile(base: dict, fit, name: str, runs: list[Run], origin: str) -> dict:
    """``base`` with the fitted factors, named ``name``; every factor's source says what it was fitted on
    (``origin``: the runs file, or the service's measurements) and from which value."""
    data = json.loads(json.dumps(base))
    data.pop("calibrate_from", None)  # the fitted factors are final: no shipped calibration merged over them
    data["name"] = name
    today = dt.date.today().isoformat()
    for key, value in fit.factors.items():
        prior = data["efficiency"].get(key, {})
        data["efficiency"][key] = {
            "value": round(value, 4),
            "source": f"fitted by paraplan calibrate on {len(runs)} measured runs ({origin}, "
                      f"{today}) from {base['name']}'s {prior.get('value')}: {prior.get('source', '')}",
            "confidence": "medium"}
    data["calibration"] = {
        "fitted_on": [r.name for r in runs], "precisions": sorted({r.config.precision for r in runs}),
        "moe": any(r.spec.is_moe for r in runs), "max_devices": max(r.devices for r in runs),
        "fitted_from": base["name"], "mape_before": round(fit.mape_before, 4),
        "mape_after": round(fit.mape_after, 4), "date": today}
    return data


def published_figures(start: ClusterProfile, fitted: dict, runs: list[Run]) -> dict | None:
    """The published runs' MAPE under the starting and the fitted profile (None without runs)."""
    if not runs:
        return None
    from hardware_profiles.calibrate import run_errors

    before = run_errors(start, runs)
    after = run_errors(ClusterProfile.model_validate(fitted), runs)
    return {"runs": len(runs), "mape_before": _mape(before), "mape_after": _mape(after)}


def refit(start: ClusterProfile, runs: list[Run], *, name: str, origin: str, published: list[Run],
          max_evals: int, progress: Callable[[int], None] | None = None) -> tuple[dict, dict]:
    """Fit ``start``'s factors on ``runs``: (the fitted profile data, the report). The report holds the
    runs' MAPE before/after, each factor before/after, each run's reported tokens/s per device and its
    relative error before/after, the ``published`` runs' figures and ``published_worse``."""
    from hardware_profiles.calibrate import fit

    base = json.loads(start.model_dump_json())
    result = fit(base, runs, maxfev=max_evals, progress=progress)
    fitted = fitted_profile(base, result, name, runs, origin)
    pub = published_figures(start, fitted, published)
    report = {
        "cluster": base["name"], "name": name, "runs": len(runs),
        "mape_before": result.mape_before, "mape_after": result.mape_after,
        "factors": {k: {"before": base["efficiency"][k]["value"], "after": v} for k, v in result.factors.items()},
        "run_errors": [{"name": r.name, "reported": r.reported, "before": float(b), "after": float(a)}
                       for r, b, a in zip(runs, result.before, result.after)],
        "published": pub,
        "published_worse": pub is not None and pub["mape_after"] > pub["mape_before"] + PUBLISHED_WORSE_BY,
    }
    return fitted, report

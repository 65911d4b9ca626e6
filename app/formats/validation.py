"""Scoring published training runs against the cost model (``paraplan validate``, calibration).

Each run is predicted with the config fields its source states; ``tokens_per_s_per_device`` is the
figure compared. A run that cannot be scored (bad spec, unknown profile, invalid config) counts as
|error| = 1, as the contract says.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import queue
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from costmodel import ClusterProfile

from .inputs import InputError, load_cluster, load_config, load_model
from .results import evaluate


@dataclass
class Run:
    name: str
    cluster: str
    devices: int
    reported: float
    spec: object = None
    config: object = None
    problem: str | None = None  # why the run cannot be scored
    problem_field: str | None = None  # the field of the run to blame for it (``config.tp``)
    source: str = ""  # where the figure was published (groups runs for cross-validation)


def read_runs(path: str | Path) -> list[Run]:
    """Parse a published-runs file; raises InputError naming the run and field when it is malformed."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise InputError("RUNS", f"cannot read {path} ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise InputError("RUNS", f"{path} is not valid JSON ({exc})") from None
    if not isinstance(data, list):
        raise InputError("RUNS", "must be a JSON list of runs")
    return [parse_run(r, f"runs[{i}]") for i, r in enumerate(data)]


def parse_run(r, where: str = "") -> Run:
    """One run of a published-runs file (also one measurement posted to the service). A malformed run
    raises InputError naming ``where`` and the field; a run whose model, config or devices cannot be
    scored is returned with ``problem`` (and ``problem_field``, the field to blame) set."""
    at = (lambda key: f"{where}.{key}") if where else (lambda key: key)  # noqa: E731
    if not isinstance(r, dict):
        raise InputError(where or "run", "must be an object")
    for key in ("name", "cluster", "devices", "model", "config", "reported"):
        if key not in r:
            raise InputError(at(key), "field required")
    rep = (r["reported"] or {}).get("tokens_per_s_per_device") if isinstance(r["reported"], (dict, type(None))) \
        else None
    if isinstance(rep, bool) or not isinstance(rep, (int, float)) or not rep > 0 or rep == float("inf"):
        raise InputError(at("reported.tokens_per_s_per_device"), "must be a positive number")
    run = Run(name=str(r["name"]), cluster=str(r["cluster"]), devices=r["devices"], reported=float(rep),
              source=str(r.get("source") or ""))
    try:
        run.spec = load_model(r["model"])
        run.config = load_config(r["config"])
        if isinstance(run.devices, bool) or not isinstance(run.devices, int) or run.devices <= 0:
            raise InputError("devices", "must be a positive integer")
    except InputError as exc:
        run.problem, run.problem_field = str(exc), exc.field
    return run


def score_runs(runs: list[Run], profiles: dict[str, ClusterProfile] | None = None) -> dict:
    """The contract's validate output for ``runs`` (profiles by name may be given, e.g. while fitting)."""
    profiles = dict(profiles or {})
    rows = []
    for run in runs:
        row = {"name": run.name, "cluster": run.cluster, "predicted": None, "reported": run.reported,
               "error": None, "feasible": False}
        problem = run.problem
        if problem is None:
            try:
                if run.cluster not in profiles:
                    profiles[run.cluster] = load_cluster(run.cluster)
                result = evaluate(run.spec, profiles[run.cluster], run.devices, run.config)
            except InputError as exc:
                problem = str(exc)
            else:
                row["feasible"] = result["feasible"]
                predicted = result["tokens_per_s_per_device"]
                if predicted is None:
                    problem = "; ".join(r["message"] for r in result["infeasible_reasons"])
                else:
                    row["predicted"] = predicted
                    row["error"] = predicted / run.reported - 1.0
                row["infeasible_reasons"] = result["infeasible_reasons"]
                row["breakdown"] = result["time"]
        if problem is not None:
            row["problem"] = problem
        rows.append(row)
    abs_err = lambda rs: [1.0 if r["error"] is None else abs(r["error"]) for r in rs]  # noqa: E731
    clusters = sorted({r["cluster"] for r in rows})
    return {
        "runs": rows,
        "mape": float(np.mean(abs_err(rows))) if rows else 0.0,
        "count": len(rows),
        "by_cluster": {c: float(np.mean(abs_err([r for r in rows if r["cluster"] == c]))) for c in clusters},
        "infeasible": sum(1 for r in rows if not r["feasible"]),
    }


def factors_at_bound(clusters) -> dict:
    """For each named shipped profile, its efficiency factors that sit at a fitting bound:
    ``{cluster: {factor: {"value", "bound": "lower"|"upper", "reason": str|None}}}``. A factor at a
    bound without a reason is the fit pressing on a knob: some effect is missing from the model."""
    import hardware_profiles
    from hardware_profiles.calibrate import BOUNDS, at_bounds

    out = {}
    for name in clusters:
        if name not in hardware_profiles.names():
            continue
        data = hardware_profiles.load_data(name)
        eff = {k: v["value"] for k, v in data["efficiency"].items() if k in BOUNDS and v.get("value")}
        prior = hardware_profiles.raw(name)["efficiency"]
        out[name] = {k: {"value": eff[k], "bound": side, "reason": prior.get(k, {}).get("bound_reason")}
                     for k, side in at_bounds(eff).items()}
    return out


def cross_validated(runs: list[Run], *, progress=None) -> dict:
    """Leave-one-source-out cross-validation of the calibration (``hardware_profiles.calibrate``):
    for each shipped profile with runs, its factors are refitted from its priors without each source,
    and that source's runs are scored with them. Returns ``{"mape", "by_cluster", "method", "groups",
    "errors": {run name: error}}``; runs that cannot be scored count |error| = 1, as in the in-sample
    figures, and a profile that is not shipped (no priors to refit from) is left out."""
    import hardware_profiles

    by_cluster: dict[str, list[Run]] = {}
    for r in runs:
        if r.cluster in hardware_profiles.names():
            by_cluster.setdefault(r.cluster, []).append(r)
    errors: dict[str, float] = {}
    groups: dict[str, dict[str, list[str]]] = {}
    for name, cv in _cross_validate_clusters(by_cluster, progress):
        errors.update(cv.errors)
        errors.update({r.name: 1.0 for r in by_cluster[name] if r.problem is not None})
        groups[name] = cv.groups
    mape = lambda names: float(np.mean([abs(errors[n]) for n in names])) if names else 0.0  # noqa: E731
    counted = {c: [r.name for r in rs if r.name in errors] for c, rs in by_cluster.items()}
    return {
        "method": "leave-one-source-out (a source: one repository or paper and one model family)",
        "mape": mape([n for ns in counted.values() for n in ns]),
        "by_cluster": {c: mape(ns) for c, ns in sorted(counted.items())},
        "groups": groups,
        "errors": errors,
    }


def _cross_validate_clusters(by_cluster: dict[str, list[Run]], progress=None):
    """``(cluster, CrossValidation)`` per cluster, in the clusters' order: the clusters in parallel, one
    process each up to the machine's cores (a cluster's folds are fitted together in one process, which
    costs the least CPU: ``cross_validate``), ``progress(cluster, source)`` called as each fold ends."""
    import hardware_profiles
    from hardware_profiles.calibrate import cross_validate

    names = sorted(by_cluster)
    args = {n: (hardware_profiles.raw(n), [r for r in by_cluster[n] if r.problem is None]) for n in names}
    workers = min(os.cpu_count() or 1, len(names))
    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        for n in names:
            yield n, cross_validate(*args[n], progress=None if progress is None else (lambda g, n=n: progress(n, g)))
        return
    # fork: the children inherit the parsed runs, the imported cost model and the queue their folds'
    # ends come back through, which the parent drains while it waits
    ctx = multiprocessing.get_context("fork")
    ends = ctx.Queue()
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_set_fold_ends, initargs=(ends,)) as pool:
        futures = {n: pool.submit(_cross_validate_one, n, *args[n]) for n in names}
        folds = cv_folds([r for n in names for r in by_cluster[n]])
        while folds:
            try:
                cluster, source = ends.get(timeout=0.5)
            except queue.Empty:
                if all(f.done() for f in futures.values()):
                    break  # every cluster has ended (a fold's error is raised below): never wait on a tick
                continue
            folds -= 1
            if progress is not None:
                progress(cluster, source)
        results = {n: f.result() for n, f in futures.items()}  # a fold's error is raised here
    yield from results.items()


_FOLD_ENDS = None  # a pool process's queue of (cluster, source) as its folds end


def _set_fold_ends(ends) -> None:
    global _FOLD_ENDS
    _FOLD_ENDS = ends


def _cross_validate_one(name: str, base: dict, runs: list[Run]):
    from hardware_profiles.calibrate import cross_validate

    return cross_validate(base, runs, progress=lambda g: _FOLD_ENDS.put((name, g)))


def cv_folds(runs: list[Run]) -> int:
    """How many refits ``cross_validated`` runs (for a progress bar)."""
    import hardware_profiles
    from hardware_profiles.calibrate import source_group

    groups = {(r.cluster, source_group(r)) for r in runs if r.problem is None and r.cluster in hardware_profiles.names()}
    per_cluster = Counter(c for c, _ in groups)
    return sum(n for n in per_cluster.values() if n >= 2)  # one source alone is not cross-validated

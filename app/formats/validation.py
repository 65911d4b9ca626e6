"""Scoring published training runs against the cost model (``paraplan validate``, calibration).

Each run is predicted with the config fields its source states; ``tokens_per_s_per_device`` is the
figure compared. A run that cannot be scored (bad spec, unknown profile, invalid config) counts as
|error| = 1, as the contract says.
"""

from __future__ import annotations

import json
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
    run = Run(name=str(r["name"]), cluster=str(r["cluster"]), devices=r["devices"], reported=float(rep))
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

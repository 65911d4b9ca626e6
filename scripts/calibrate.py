"""Fit each shipped profile's efficiency factors on published training runs.

    .venv/bin/python scripts/calibrate.py [RUNS.json] [--profile NAME ...] [--dry-run] [--cv]
    .venv/bin/python scripts/calibrate.py --sweep-prior 0.01,0.03,0.1,0.3   # choose PRIOR_WEIGHT by CV

For every profile with runs in the file, ``hardware_profiles.calibrate.fit_profile`` fits the factors
the runs exercise from the profile's YAML priors and writes ``hardware_profiles/calibration/<profile>.json``,
which is merged over the priors when a profile loads. ``--cv`` adds the leave-one-source-out
cross-validated MAPE to each file (what the fit predicts for a source it never saw). ``--sweep-prior``
prints in-sample and CV MAPE for each prior weight and writes nothing: the shipped weight
(``PRIOR_WEIGHT``) is the one after which CV stops improving. A team's own runs go through ``paraplan
calibrate`` instead (the same fit, starting from the calibrated profile, written as a new profile).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import hardware_profiles  # noqa: E402
from app.formats.validation import read_runs  # noqa: E402
from hardware_profiles.calibrate import PRIOR_WEIGHT, PRIOR_WEIGHT_RUNS, cross_validate, fit_profile  # noqa: E402

DEFAULT_RUNS = ROOT.parent / "shared" / "validation" / "calibration_runs.json"


def _by_cluster(path: str, only: list[str] | None) -> dict[str, list]:
    runs = [r for r in read_runs(path) if r.problem is None]
    by: dict[str, list] = {}
    for r in runs:
        if r.cluster in hardware_profiles.names() and (not only or r.cluster in only):
            by.setdefault(r.cluster, []).append(r)
    return dict(sorted(by.items()))


def sweep(by_cluster: dict[str, list], weights: list[float]) -> None:
    print(f"{'prior weight':>12}  {'in-sample':>9}  {'CV':>6}  " + "  ".join(f"{c + ' (in/CV)':>30}" for c in by_cluster))
    for w in weights:
        ins, cvs, cells = [], [], []
        for name, runs in by_cluster.items():
            fitted = fit_profile(name, runs, prior_weight=w)
            cv = cross_validate(hardware_profiles.raw(name), runs, prior_weight=w)
            ins += [fitted["mape_after"]] * len(runs)
            cvs += [abs(e) for e in cv.errors.values()]
            cells.append(f"{fitted['mape_after']:.3f} / {cv.mape():.3f} ({len(fitted['at_bound'])} at bound)")
        print(f"{w:>12g}  {np.mean(ins):>9.3f}  {np.mean(cvs):>6.3f}  " + "  ".join(f"{c:>30}" for c in cells),
              flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="?", default=str(DEFAULT_RUNS))
    ap.add_argument("--profile", action="append", help="only these profiles (default: all with runs)")
    ap.add_argument("--dry-run", action="store_true", help="print, do not write calibration files")
    ap.add_argument("--cv", action="store_true", help="also cross-validate (leave one source out)")
    ap.add_argument("--sweep-prior", help="comma-separated prior weights: print in-sample and CV MAPE of each")
    args = ap.parse_args(argv)
    by_cluster = _by_cluster(args.runs, args.profile)
    if args.sweep_prior:
        sweep(by_cluster, [float(w) for w in args.sweep_prior.split(",")])
        return 0
    for name, runs in by_cluster.items():
        result = fit_profile(name, runs)
        if args.cv:
            cv = cross_validate(hardware_profiles.raw(name), runs)
            result["cv_mape"] = round(cv.mape(), 4)
            result["cv_method"] = "leave-one-source-out"
            result["cv_sources"] = len(cv.groups)
        print(f"{name}: {len(runs)} runs, MAPE {result['mape_before']:.3f} -> {result['mape_after']:.3f}"
              + (f", CV {result['cv_mape']:.3f}" if args.cv else "")
              + f" (prior weight {max(PRIOR_WEIGHT, PRIOR_WEIGHT_RUNS / len(runs)):g}); {result['factors']}; "
              f"at bound: {result['at_bound'] or 'none'}",
              flush=True)
        if not args.dry_run:
            out = hardware_profiles.CALIBRATION_DIR / f"{name}.json"
            out.parent.mkdir(exist_ok=True)
            out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

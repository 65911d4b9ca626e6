"""Fit each shipped profile's efficiency factors on published training runs.

    .venv/bin/python scripts/calibrate.py [RUNS.json] [--profile NAME ...] [--dry-run]

For every profile with runs in the file, ``hardware_profiles.calibrate.fit_profile`` fits the factors
the runs exercise from the profile's YAML priors and writes ``hardware_profiles/calibration/<profile>.json``,
which is merged over the priors when a profile loads. A team's own runs go through ``paraplan
calibrate`` instead (the same fit, starting from the calibrated profile, written as a new profile).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import hardware_profiles  # noqa: E402
from app.formats.validation import read_runs  # noqa: E402
from hardware_profiles.calibrate import fit_profile  # noqa: E402

DEFAULT_RUNS = ROOT.parent / "shared" / "validation" / "calibration_runs.json"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="?", default=str(DEFAULT_RUNS))
    ap.add_argument("--profile", action="append", help="only these profiles (default: all with runs)")
    ap.add_argument("--dry-run", action="store_true", help="print, do not write calibration files")
    args = ap.parse_args(argv)
    runs = [r for r in read_runs(args.runs) if r.problem is None]
    by_cluster: dict[str, list] = {}
    for r in runs:
        by_cluster.setdefault(r.cluster, []).append(r)
    for name in sorted(by_cluster):
        if args.profile and name not in args.profile:
            continue
        result = fit_profile(name, by_cluster[name])
        print(f"{name}: {len(by_cluster[name])} runs, MAPE {result['mape_before']:.3f} -> "
              f"{result['mape_after']:.3f}; {result['factors']}", flush=True)
        if not args.dry_run:
            out = hardware_profiles.CALIBRATION_DIR / f"{name}.json"
            out.parent.mkdir(exist_ok=True)
            out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

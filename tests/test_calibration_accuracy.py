"""The accuracy gate: no change may lose the cost model's fit to published runs unnoticed.

Runs ``paraplan validate`` on the shared calibration file exactly as a user would and checks the
contract's thresholds (issue: MAPE ≤ 0.15 overall, no cluster above 0.20, every run scored).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

RUNS = Path(__file__).resolve().parents[2] / "shared" / "validation" / "calibration_runs.json"

pytestmark = pytest.mark.skipif(not RUNS.is_file(), reason=f"{RUNS} not present")


@pytest.fixture(scope="module")
def report():
    proc = subprocess.run([sys.executable, "-m", "app.cli", "validate", str(RUNS), "--json"],
                          capture_output=True, text=True, check=False, cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_every_run_is_scored(report):
    assert report["count"] == len(json.loads(RUNS.read_text()))
    assert all(r["predicted"] is not None for r in report["runs"])


def test_mape_within_contract(report):
    assert report["mape"] <= 0.15, f"MAPE {report['mape']:.3f} > 0.15"


def test_no_cluster_above_020(report):
    worst = max(report["by_cluster"].items(), key=lambda kv: kv[1])
    assert worst[1] <= 0.20, f"{worst[0]} MAPE {worst[1]:.3f} > 0.20"


def test_published_runs_fit(report):
    unfit = [r["name"] for r in report["runs"] if not r["feasible"]]
    assert report["infeasible"] == len(unfit) == 0, f"predicted not to fit: {unfit}"

"""``paraplan calibrate`` (the command line): the team's runs in, a fitted profile out.

The measured runs are synthesised from a known, changed 910B profile (GEMMs 10 % faster, the scale-out
link 30 % slower: ``calibration_util``), so the fit has a right answer to recover; bad files and names
exit 2 naming the field.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import calibration_util
import hardware_profiles
import model_presets
from costmodel.result import evaluate
from costmodel.spec import ClusterProfile, TrainingConfig

ROOT = Path(__file__).resolve().parents[1]
RUNS = [(m, d, c) for m, d, c in calibration_util.RUNS]


def cli(*args):
    return subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, cwd=ROOT)


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """Runs 'measured' on the 910B with GEMMs 10 % less efficient and a scale-out link 30 % slower than
    the shipped profile says."""
    runs = calibration_util.measured_runs()
    path = tmp_path_factory.mktemp("cal") / "runs.json"
    path.write_text(json.dumps(runs))
    return path, calibration_util.truth(), runs


@pytest.fixture(scope="module")
def fitted(measured, tmp_path_factory):
    runs_file, _, _ = measured
    out = tmp_path_factory.mktemp("cal") / "our-910b.yaml"
    proc = cli("calibrate", str(runs_file), "--cluster", "ascend-910b", "-o", str(out), "--max-evals",
               str(calibration_util.FIT_EVALS), "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), out


def test_recovers_the_changed_gemm_efficiency_and_scale_out_link(measured, fitted):
    _, truth, _ = measured
    report, _ = fitted
    shipped = hardware_profiles.load_data("ascend-910b")["efficiency"]
    for key, value in truth.items():
        assert report["factors"][key]["before"] == pytest.approx(shipped[key]["value"])
        assert report["factors"][key]["after"] == pytest.approx(value, rel=0.02), key
    assert report["mape_before"] > 0.03  # the shipped profile is 4-7 % off on these runs
    assert report["mape_after"] < 0.005


def test_written_profile_loads_and_predicts_the_runs(measured, fitted):
    _, _, runs = measured
    report, out = fitted
    data = yaml.safe_load(out.read_text())
    assert data["name"] == "our-910b" and data["calibration"]["fitted_from"] == "ascend-910b"
    assert "paraplan calibrate" in data["efficiency"]["gemm_eff_max"]["source"]
    proc = cli("evaluate", "--model", runs[1]["model"], "--cluster", str(out), "--devices", str(runs[1]["devices"]),
               "--config", json.dumps(runs[1]["config"]), "--json")
    assert proc.returncode == 0, proc.stderr
    predicted = json.loads(proc.stdout)["tokens_per_s_per_device"]
    assert predicted == pytest.approx(runs[1]["reported"]["tokens_per_s_per_device"], rel=0.01)


def test_reports_the_published_set_before_and_after(fitted):
    report, _ = fitted
    pub = report["published"]
    published = ROOT.parent / "shared" / "validation" / "calibration_runs.json"
    if not published.is_file():
        assert pub is None
        return
    assert pub["runs"] == sum(1 for r in json.loads(published.read_text()) if r["cluster"] == "ascend-910b")
    assert report["published_worse"] == (pub["mape_after"] > pub["mape_before"] + 0.05)


def test_a_refit_that_spoils_the_published_set_is_reported(tmp_path):
    """Runs 'measured' on a cluster three times slower than any published 910B: the fit follows them
    and the published set's error rises, which the command says."""
    model, devices, cfg = RUNS[1]
    r = evaluate(model_presets.load(model), hardware_profiles.load("ascend-910b"), devices,
                 TrainingConfig.model_validate(cfg))
    runs = [{"name": "slow", "cluster": "ascend-910b", "devices": devices, "model": model, "config": cfg,
             "reported": {"tokens_per_s_per_device": r["tokens_per_s_per_device"] / 3}}]
    (tmp_path / "runs.json").write_text(json.dumps(runs))
    proc = cli("calibrate", str(tmp_path / "runs.json"), "--cluster", "ascend-910b", "-o", str(tmp_path / "slow.yaml"),
               "--max-evals", "200", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    if report["published"] is not None:
        assert report["published_worse"] is True
        assert "worse" in proc.stderr


@pytest.mark.parametrize("runs,field", [
    ("not json", "RUNS"),
    (json.dumps([{"name": "x", "cluster": "ascend-910b", "devices": 8, "model": "gpt-1.3b", "config": {"tp": 1}}]),
     "runs[0].reported"),
    (json.dumps([{"name": "x", "cluster": "ascend-910b", "devices": 8, "model": "gpt-1.3b", "config": {"tp": 1},
                  "reported": {"tokens_per_s_per_device": -1}}]), "runs[0].reported.tokens_per_s_per_device"),
    (json.dumps([{"name": "x", "cluster": "ascend-910b", "devices": 8, "model": "no-such-model", "config": {"tp": 1},
                  "reported": {"tokens_per_s_per_device": 100}}]), "runs[0] (x)"),
    # 8 sequences cannot split into micro-batches of 3 on dp 8: no fit can score the run (a 422 over HTTP too)
    (json.dumps([{"name": "odd", "cluster": "ascend-910b", "devices": 8, "model": "gpt-1.3b",
                  "config": {"tp": 1, "micro_batch_size": 3, "global_batch_size": 8},
                  "reported": {"tokens_per_s_per_device": 100}}]), "runs[0] (odd).config: cannot be scored on ascend-910b"),
])
def test_bad_runs_files_exit_2_naming_the_field(tmp_path, runs, field):
    (tmp_path / "runs.json").write_text(runs)
    proc = cli("calibrate", str(tmp_path / "runs.json"), "--cluster", "ascend-910b", "-o", str(tmp_path / "p.yaml"))
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: {field}"), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "p.yaml").exists()


def test_a_shipped_name_is_refused(measured, tmp_path):
    runs_file, _, _ = measured
    proc = cli("calibrate", str(runs_file), "--cluster", "ascend-910b", "-o", str(tmp_path / "ascend-910b.yaml"))
    assert proc.returncode == 2 and proc.stderr.startswith("error: --name:"), proc.stderr


def test_an_unknown_cluster_exits_2(measured, tmp_path):
    runs_file, _, _ = measured
    proc = cli("calibrate", str(runs_file), "--cluster", "nope", "-o", str(tmp_path / "p.yaml"))
    assert proc.returncode == 2 and proc.stderr.startswith("error: cluster:"), proc.stderr

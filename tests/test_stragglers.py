"""Stragglers: the step waits for the slowest data-parallel replica.

The expected maximum is checked against its closed forms and the published tables; the step's wait
against the formula of docs/costmodel.md worked out here; the calibration against the published
runs of one model at several scales, which is what the factor is fitted on.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from costmodel import stragglers
from costmodel.result import evaluate
from costmodel.spec import TrainingConfig

from conftest import ROUND_EFFICIENCY, ROUND_FACTS

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT.parent / "shared" / "validation" / "calibration_runs.json"


def test_expected_max_closed_forms_and_tables():
    e = stragglers.expected_max_normal(np.array([1, 2, 3, 5, 1000]))
    assert e[0] == 0.0
    assert e[1] == pytest.approx(1 / math.sqrt(math.pi), abs=1e-6)  # E[max of 2] = 1/√π
    assert e[2] == pytest.approx(3 / (2 * math.sqrt(math.pi)), abs=1e-6)  # E[max of 3] = 3/(2√π)
    # Tippett (1925) / Harter (1961) tables: 1.16296 for 5, 3.24144 for 1000
    assert e[3] == pytest.approx(1.16296, abs=1e-4)
    assert e[4] == pytest.approx(3.24144, abs=1e-4)
    # grows, and stays under the √(2 ln N) bound
    n = np.array([2, 8, 64, 512, 4096, 32768, 1_000_000])
    big = stragglers.expected_max_normal(n)
    assert np.all(np.diff(big) > 0)
    assert np.all(big < np.sqrt(2 * np.log(n)))


@pytest.fixture(scope="module")
def jittery(make_profile):
    return make_profile("nvidia-h100-80gb", efficiency={**ROUND_EFFICIENCY, "straggler_cv": 0.02},
                        facts=ROUND_FACTS)


@pytest.mark.parametrize("devices,dp", [(8, 1), (64, 8), (800, 100)])
def test_step_waits_for_the_slowest_replica(preset, round_profile, jittery, devices, dp):
    spec = preset("gpt-1.3b")
    cfg = TrainingConfig(tp=8, pp=1, global_batch_size=2 * dp, micro_batch_size=1)
    calm = evaluate(spec, round_profile, devices, cfg)
    noisy = evaluate(spec, jittery, devices, cfg)
    assert calm["time"]["straggler_s"] == 0.0
    replica = calm["step_time_s"]
    wait = replica * 0.02 * stragglers.expected_max_normal(np.array([dp]))[0]
    assert noisy["time"]["straggler_s"] == pytest.approx(wait, rel=1e-9)
    assert noisy["step_time_s"] == pytest.approx(replica + wait, rel=1e-9)
    assert sum(noisy["time"].values()) == pytest.approx(noisy["step_time_s"], rel=1e-9)
    if dp == 1:
        assert wait == 0.0
    # 100 replicas: 2.0 % × E[max of 100] = 2.0 % × 2.50759 (Tippett's table) ≈ 5.0 % longer
    if dp == 100:
        assert noisy["step_time_s"] / replica == pytest.approx(1 + 0.02 * 2.50759, abs=1e-5)


def test_a_profile_without_the_factor_has_no_wait(preset, make_profile):
    import hardware_profiles

    data = hardware_profiles.raw("nvidia-h100-80gb")
    data.pop("calibration", None)
    data["efficiency"].pop("straggler_cv")
    from costmodel.spec import ClusterProfile

    old = ClusterProfile.model_validate(data)
    r = evaluate(preset("gpt-1.3b"), old, 64, TrainingConfig(tp=8, global_batch_size=16))
    assert r["time"]["straggler_s"] == 0.0


def _series_drift(errors_by_series):
    """Mean, over series, of the least-squares slope of error against log2(devices)."""
    slopes = [np.polyfit(np.log2(d), e, 1)[0] for d, e in errors_by_series]
    return float(np.mean(slopes))


@pytest.mark.skipif(not RUNS.is_file(), reason=f"{RUNS} not present")
def test_calibrated_wait_takes_out_the_drift_with_scale():
    """The published series of one model at several scales drift less with the fitted factor than
    with none: without it the error grows with the device count."""
    import hardware_profiles
    from hardware_profiles import calibrate
    from app.formats.validation import read_runs
    from costmodel import ConfigBatch, evaluate_batch

    runs = [r for r in read_runs(str(RUNS)) if r.problem is None and r.cluster == "nvidia-h100-80gb"]
    series = calibrate.scale_series(runs)
    assert len(series) >= 3
    fitted = hardware_profiles.load("nvidia-h100-80gb")
    data = json.loads(fitted.model_dump_json())
    data["efficiency"]["straggler_cv"]["value"] = 0.0
    none = type(fitted).model_validate(data)

    def drift(profile):
        out = []
        for g in series:
            errs = [evaluate_batch(r.spec, profile, r.devices, ConfigBatch.from_configs([r.config]))
                    .tokens_per_s_per_device[0] / r.reported - 1 for r in g]
            out.append((np.array([r.devices for r in g], float), np.array(errs)))
        return _series_drift(out)

    with_wait, without = drift(fitted), drift(none)
    assert fitted.eff("straggler_cv") > 0.005
    assert without > 0.002  # the published series: +0.2 points or more per doubling without it
    assert abs(with_wait) < 0.5 * without

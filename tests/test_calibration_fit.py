"""The calibration fit itself: candidate factor sets scored at once equal one profile each, the fit
recovers factors it has the answer to, and leave-one-source-out groups and scores as it says."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import calibration_util
import hardware_profiles
from app.formats.validation import parse_run
from costmodel import ConfigBatch, evaluate_batch
from costmodel.hardware import Hardware
from costmodel.spec import ClusterProfile
from hardware_profiles.calibrate import (BOUNDS, RunScorer, at_bounds, base_profile, cross_validate, factors_seen, fit,
                                         run_errors, source_group)


@pytest.fixture(scope="module")
def runs():
    out = []
    for i, r in enumerate(calibration_util.measured_runs()):
        # three "sources": a GPT, a Llama and a Qwen/Mixtral family, all from one made-up repository
        r["source"] = f"example/team-runs, table {i}"
        out.append(parse_run(r, f"runs[{i}]"))
    return out


def test_candidates_scored_at_once_equal_one_profile_each(runs):
    """Row i of RunScorer.errors under arrays of factors equals the run scored with a profile that
    holds candidate i's factors: the vectorised scorer takes factors element-wise."""
    base = hardware_profiles.load_data("ascend-910b")
    gemm = np.array([0.6, 0.7, 0.8])
    link = np.array([0.5, 0.9, 0.7])
    vec = RunScorer(ClusterProfile.model_validate(base), runs).errors(
        {"gemm_eff_max": gemm, "scale_out_bw_eff": link})
    for i in range(3):
        data = json.loads(json.dumps(base))
        data["efficiency"]["gemm_eff_max"]["value"] = float(gemm[i])
        data["efficiency"]["scale_out_bw_eff"]["value"] = float(link[i])
        one = RunScorer(ClusterProfile.model_validate(data), runs).errors({})[0]
        np.testing.assert_allclose(vec[i], one, rtol=1e-12)


def test_hardware_takes_factor_arrays():
    profile = hardware_profiles.load("nvidia-h100-80gb")
    hw = Hardware.from_profile(profile, {"hbm_eff": np.array([0.5, 1.0]), "layer_overhead_us": 10.0})
    line_rate = profile.fact("hbm_bandwidth_gbps") * 1e9
    np.testing.assert_allclose(hw.hbm_bytes_per_s, [0.5 * line_rate, line_rate])
    assert hw.layer_overhead_s == pytest.approx(10e-6)
    assert dataclasses.replace(hw, hbm_bytes_per_s=1.0).gemm_eff_max == Hardware.from_profile(profile).gemm_eff_max


def test_fit_recovers_the_changed_factors(runs):
    """The runs were 'measured' on the 910B with gemm_eff_max x 0.9 and scale_out_bw_eff x 0.7: a fit
    from the shipped profile finds both within 2 % and leaves the runs within half a percent."""
    result = fit(hardware_profiles.load_data("ascend-910b"), runs, keys=["gemm_eff_max", "scale_out_bw_eff"])
    for key, value in calibration_util.truth().items():
        assert result.factors[key] == pytest.approx(value, rel=0.02), key
    assert result.mape_before > 0.03
    assert result.mape_after < 0.005


def test_source_groups_are_repository_or_paper_and_model_family(runs):
    r = runs[0]
    paper = dataclasses.replace(r, source="Narayanan et al., SC21 'Efficient ...' (arXiv 2104.04473) Table 1")
    repo = dataclasses.replace(r, source="https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/main/docs/x.md")
    mirror = dataclasses.replace(r, source="MindSpeed-LLM GitHub mirror Ascend/MindSpeed-LLM, README.md at d58c5688")
    family = r.spec.name.lower().split("-")[0].rstrip("0123456789.")
    assert source_group(paper) == f"arXiv:2104.04473 / {family}"
    assert source_group(repo) == f"NVIDIA-NeMo/Megatron-Bridge / {family}"
    assert source_group(mirror) == f"Ascend/MindSpeed-LLM / {family}"


def test_leave_one_source_out(runs):
    """Each source is scored by a refit on the other sources only, of the same factors the in-sample
    fit fits, from the same priors: redoing one fold by hand gives the same errors, and the fold's
    factors are not the in-sample fit's."""
    base = hardware_profiles.load_data("ascend-910b")
    cv = cross_validate(base, runs, workers=2)
    assert sorted(n for names in cv.groups.values() for n in names) == sorted(r.name for r in runs)
    assert set(cv.groups) == {f"example/team-runs / {f}" for f in ("gpt", "llama", "mixtral", "qwen")}
    assert set(cv.errors) == {r.name for r in runs}
    held = [r for r in runs if "llama" in r.spec.name]
    train = [r for r in runs if "llama" not in r.spec.name]
    by_hand = fit(base, train, keys=factors_seen(runs))
    assert cv.folds["example/team-runs / llama"] == by_hand.factors
    errs = run_errors(base_profile(base, by_hand.factors), held)
    assert [cv.errors[r.name] for r in held] == pytest.approx(list(errs), abs=1e-12)
    assert by_hand.factors != fit(base, runs).factors


def test_a_single_source_is_not_cross_validated(runs):
    one = [dataclasses.replace(r, source="example/team-runs") for r in runs if "gpt" in r.spec.name]
    cv = cross_validate(hardware_profiles.load_data("ascend-910b"), one, workers=1)
    assert cv.errors == {} and len(cv.groups) == 1


def test_factors_at_bounds_are_reported():
    lo, hi = BOUNDS["hbm_eff"]
    assert at_bounds({"hbm_eff": lo, "attn_eff": 0.4, "tp_overlap": BOUNDS["tp_overlap"][1]}) == {
        "hbm_eff": "lower", "tp_overlap": "upper"}


def test_scorer_counts_an_invalid_candidate_as_error_one(runs):
    profile = hardware_profiles.load("ascend-910b")
    errs = RunScorer(profile, runs[:1]).errors({"gemm_eff_max": np.array([0.7, np.nan])})
    assert errs[1, 0] == 1.0 and abs(errs[0, 0]) < 1

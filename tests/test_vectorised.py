"""The vectorised path against the single-config path.

~3000 seeded random configs (valid and invalid, mixed pipeline splits, layouts, recompute, flags,
precisions) over four models and several profiles. Each (model, profile, devices) group is scored as
ONE batch (so that configs with different pipeline splits share a batch and its stage tables), and
every field of ``result_dict`` of ~300 sampled configs is compared with ``evaluate`` on that config
alone (rel 1e-9).
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from costmodel import ConfigBatch, evaluate, evaluate_batch
from costmodel.evaluate import TIME_KEYS
from costmodel.resilience import attach_goodput
from costmodel.result import calibration_warnings, result_dict

from conftest import assert_same_result, load_preset, load_profile, sample_config

# (model, profile, devices, number of configs)
GROUPS = [
    ("tiny-moe", "nvidia-h100-80gb", 16, 700),
    ("tiny-mla-moe", "ascend-910b", 32, 600),
    ("gpt-1.3b", "nvidia-a100-80gb", 64, 700),
    ("deepseek-v3-671b", "nvidia-h100-80gb", 1024, 600),
    ("deepseek-v3-671b", "ascend-910c-cloudmatrix384", 768, 400),
]
SINGLE_SAMPLE = 300
SEED = 20240611


@pytest.fixture(scope="module")
def scored():
    """Per group: spec, profile, devices, configs, the batch result (default, as searches call it)."""
    rng = np.random.default_rng(SEED)
    out = []
    for model, prof_name, devices, n in GROUPS:
        spec, prof = load_preset(model), load_profile(prof_name)
        configs = [sample_config(rng, spec, devices, p_wild=0.2) for _ in range(n)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # see test_fp8_placeholders_are_finite
            br = evaluate_batch(spec, prof, devices, ConfigBatch.from_configs(configs))
        out.append((spec, prof, devices, configs, br))
    return out


def _sample_indices(scored):
    rng = np.random.default_rng(SEED + 1)
    total = sum(len(g[3]) for g in scored)
    picks = []
    for gi, g in enumerate(scored):
        k = round(SINGLE_SAMPLE * len(g[3]) / total)
        picks += [(gi, int(i)) for i in rng.choice(len(g[3]), size=k, replace=False)]
    return picks


def test_mix_is_varied(scored):
    """The random mix covers what it must: ~3000 configs, both valid and invalid ones, mixed splits in
    one batch, every recompute mode and both precisions."""
    assert sum(len(g[3]) for g in scored) >= 3000
    valid = np.concatenate([g[4].valid for g in scored])
    assert 0.3 < valid.mean() < 0.95
    feasible = np.concatenate([g[4].feasible for g in scored])
    assert feasible.sum() > 100
    assert (valid & ~feasible).sum() > 10  # some oom
    for spec, prof, devices, configs, br in scored:
        assert len(br.stages.errors) > 5  # several distinct pipeline splits in this batch
        assert {c.recompute for c in configs} == {"none", "selective", "full"}
    cfgs = [c for g in scored for c in g[3]]
    assert any(c.pipeline_layout for c in cfgs)
    assert any(c.first_stage_layers is not None for c in cfgs)
    assert any(c.account_for_embedding_in_pipeline_split for c in cfgs)
    assert any(c.precision == "fp8" for c in cfgs)
    codes = {r.code for g in scored for r in g[4].rules if r.broken.any()}
    assert len(codes) >= 8
    assert any((~g[4].stages.valid).any() for g in scored)


def test_batch_matches_single(scored):
    """Every field of the batch's result dict equals the single-config evaluation; per-stage peaks that
    the batch keeps (it keeps one stage per distinct composition) equal the single path's."""
    for gi, i in _sample_indices(scored):
        spec, prof, devices, configs, br = scored[gi]
        cfg = configs[i]
        warn = calibration_warnings(prof, spec, cfg, devices)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            single = evaluate(spec, prof, devices, cfg)
        # the goodput block is priced from the result's own figures: attached to the batch's result, it is the single's
        batch = attach_goodput([result_dict(br, i, prof, warn)], prof, devices, [cfg])[0]
        b_stages = batch["memory"].pop("per_stage_peak_gib")
        s_stages = single["memory"].pop("per_stage_peak_gib")
        assert_same_result(single, batch, rel=1e-9, path=f"{spec.name}[{i}] {cfg.model_dump(exclude_defaults=True)}")
        if s_stages is None:
            assert b_stages is None
        else:
            assert len(b_stages) == len(s_stages) == cfg.pp
            for r, (b, s) in enumerate(zip(b_stages, s_stages)):
                if b is not None:
                    assert b == pytest.approx(s, rel=1e-9), (spec.name, i, r)
            # the stage at the peak is among those the batch kept
            assert max(x for x in b_stages if x is not None) == pytest.approx(max(s_stages), rel=1e-9)


def test_batch_with_all_stages_matches_single_exactly(scored):
    """With ``all_stages=True`` the batch result dict is the single path's, per-stage list included."""
    picks = _sample_indices(scored)[::3]
    for gi in {g for g, _ in picks}:
        spec, prof, devices, configs, _ = scored[gi]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            br = evaluate_batch(spec, prof, devices, ConfigBatch.from_configs(configs), all_stages=True)
            for g, i in picks:
                if g != gi:
                    continue
                cfg = configs[i]
                single = evaluate(spec, prof, devices, cfg)
                batch = attach_goodput([result_dict(br, i, prof, calibration_warnings(prof, spec, cfg, devices))],
                                       prof, devices, [cfg])[0]
                assert_same_result(single, batch, rel=1e-9, path=f"{spec.name}[{i}]")


def test_default_batch_per_stage_peaks_are_all_numbers(scored):
    for spec, prof, devices, configs, br in scored:
        for i in np.flatnonzero(br.valid)[:200]:
            stages = result_dict(br, int(i), prof, [])["memory"]["per_stage_peak_gib"]
            assert all(isinstance(x, float) for x in stages), (spec.name, configs[i])


def test_results_are_json_without_nan(scored):
    """Every result (valid, oom or invalid) serialises with allow_nan=False; valid ones have every
    time and memory number, invalid ones nulls."""
    for spec, prof, devices, configs, br in scored:
        for i in range(len(configs)):
            r = result_dict(br, i, prof, [])
            json.dumps(r, allow_nan=False)
            if br.valid[i]:
                assert r["step_time_s"] > 0 and all(v is not None and v >= 0 for v in r["time"].values())
                assert r["memory"]["peak_gib"] > 0
                assert r["feasible"] == (r["memory"]["peak_gib"] <= r["memory"]["capacity_gib"])
            else:
                assert r["feasible"] is False and r["infeasible_reasons"]
                assert r["step_time_s"] is None and r["memory"]["per_stage_peak_gib"] is None


def test_placeholders_are_finite(scored):
    """evaluate_batch: 'Invalid configs get finite placeholder numbers' (fp8 on a profile without FP8
    has its own test below)."""
    for spec, prof, devices, configs, br in scored:
        no_fp8 = br.broken["fp8_unsupported"]
        arrays = [br.step_time_s, br.tokens_per_s, br.mfu, br.hfu, br.peak_bytes,
                  *(br.time[k] for k in TIME_KEYS)]
        for a in arrays:
            assert np.isfinite(a[~no_fp8]).all()


def test_fp8_placeholders_are_finite():
    from costmodel.spec import TrainingConfig

    spec, prof = load_preset("tiny-dense"), load_profile("ascend-910b")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        br = evaluate_batch(spec, prof, 1, ConfigBatch.from_configs(
            [TrainingConfig(global_batch_size=1, precision="fp8")]))
    assert np.isfinite(br.step_time_s).all() and np.isfinite(br.peak_bytes).all()


def test_batch_order_does_not_matter():
    """Scoring a batch reversed (other split order, other stage tables) gives the same numbers."""
    rng = np.random.default_rng(7)
    spec, prof = load_preset("tiny-moe"), load_profile("nvidia-h100-80gb")
    configs = [sample_config(rng, spec, 16) for _ in range(200)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        a = evaluate_batch(spec, prof, 16, ConfigBatch.from_configs(configs))
        b = evaluate_batch(spec, prof, 16, ConfigBatch.from_configs(configs[::-1]))
    for i in range(len(configs)):
        assert_same_result(result_dict(a, i, prof, []), result_dict(b, len(configs) - 1 - i, prof, []))


def test_take_sub_batch():
    """ConfigBatch.take keeps the columns (and the shared layout table) of the picked configs."""
    rng = np.random.default_rng(3)
    spec, prof = load_preset("deepseek-v3-671b"), load_profile("nvidia-h100-80gb")
    configs = [sample_config(rng, spec, 1024) for _ in range(100)]
    batch = ConfigBatch.from_configs(configs)
    idx = np.arange(0, 100, 7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        full = evaluate_batch(spec, prof, 1024, batch)
        sub = evaluate_batch(spec, prof, 1024, batch.take(idx))
    for j, i in enumerate(idx):
        assert_same_result(result_dict(full, int(i), prof, []), result_dict(sub, j, prof, []))

"""The large-batch path of ``evaluate_batch`` scores every valid config exactly as a small batch does.

A batch of at least ``GROUP_MIN_CONFIGS`` configs scores only its structurally valid configs (the others
hold ``UNSCORED``), grouped by stage count (small groups padded into deeper ones) and in chunks, with the
layer costs of each distinct combination of their inputs computed once and gathered per chunk (only the
fields a chunk reads; a cost or column with one value everywhere sliced instead), and the replayed
schedules of uneven model chunks tabled once for the whole batch. None of that may change a valid
config's number: here seeded mixes of configs (valid and invalid, interleaved and uneven pipelines,
recompute, flags) are scored as one large batch, with chunks small enough that groups span several, and
in slices below the threshold or one config at a time; every valid config's outputs must be equal bit
for bit.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

import hardware_profiles
import model_presets
from costmodel import ConfigBatch, DEFAULT_MOE_LOAD_IMBALANCE, evaluate_batch
from costmodel.batch import MODULE_BITS, NO_VALUE

evaluate_module = sys.modules["costmodel.evaluate"]

CASES = [("pangu-ultra-moe-718b", "ascend-910b", 6144, 7680), ("llama3-405b", "nvidia-h100-80gb", 16384, 2048)]
N = 6000  # above GROUP_MIN_CONFIGS (4096)
SMALL = 1500  # slices scored on the small path


def mix(rng: np.random.Generator, n: int, spec, devices: int, gbs: int) -> ConfigBatch:
    """``n`` random configs as columns, the kind of mix a search scores."""
    ints = lambda choices: rng.choice(np.asarray(choices, dtype=np.int64), n)  # noqa: E731
    flag = lambda p=0.5: rng.random(n) < p  # noqa: E731
    tp = ints([1, 2, 4, 8])
    pp = ints([p for p in range(1, 17) if devices % p == 0])
    modules = ints([MODULE_BITS["core_attn"], MODULE_BITS["core_attn"] | MODULE_BITS["mlp"],
                    MODULE_BITS["layernorm"] | MODULE_BITS["moe_act"]])
    no = np.full(n, NO_VALUE, np.int64)
    return ConfigBatch(
        tp=tp, pp=pp, vpp=np.where(pp > 1, ints([1, 2, 3, 4]), 1), cp=ints([1, 1, 2]),
        ep=ints([e for e in (1, 2, 4, 8, 16, 32) if spec.num_experts % e == 0]) if spec.is_moe
        else np.ones(n, np.int64),
        etp=np.ones(n, np.int64), dp=no.copy(), micro_batch_size=ints([1, 2, 3, 4]),
        global_batch_size=np.full(n, gbs, np.int64), sequence_parallel=(tp > 1) & flag(0.9),
        tp_comm_overlap=flag(), recompute=ints([0, 1, 2]), recompute_modules=modules,
        recompute_num_layers=np.where(flag(0.7), NO_VALUE, rng.integers(1, 9, n, dtype=np.int64)),
        distributed_optimizer=flag(0.9), overlap_grad_reduce=flag(0.8), overlap_param_gather=flag(0.8),
        first_stage_layers=no.copy(), last_stage_layers=no.copy(), account_for_embedding=flag(0.2),
        account_for_loss=flag(0.2), layout_id=no.copy(), precision=np.zeros(n, np.int64),
        moe_a2a_overlap=flag() & spec.is_moe, moe_load_imbalance=np.full(n, DEFAULT_MOE_LOAD_IMBALANCE),
        layouts=[])


def arrays(result) -> dict[str, np.ndarray]:
    """Every per-config output array of a BatchResult (per-stage ones are not kept here)."""
    out = {}
    for name, v in vars(result).items():
        if isinstance(v, np.ndarray) and v.ndim == 1:
            out[name] = v
        elif isinstance(v, dict):
            out.update({f"{name}.{k}": a for k, a in v.items() if isinstance(a, np.ndarray)})
    return out


def bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.int64) if a.dtype == np.float64 else a


@pytest.mark.parametrize("model,cluster,devices,gbs", CASES)
def test_grouped_chunked_batch_equals_small_batches_bit_for_bit(monkeypatch, model, cluster, devices, gbs):
    """Valid configs: the same bits on both paths. Invalid ones: the large path does not score them
    (``UNSCORED`` everywhere), the small path scores them as they come; finite either way."""
    spec, profile = model_presets.load(model), hardware_profiles.load(cluster)
    batch = mix(np.random.default_rng(7), N, spec, devices, gbs)
    monkeypatch.setattr(evaluate_module, "CHUNK_CONFIGS", 700)  # several chunks per stage-count group
    large = arrays(evaluate_batch(spec, profile, devices, batch, keep_stages=False))
    parts = [arrays(evaluate_batch(spec, profile, devices, batch.take(np.arange(a, min(a + SMALL, N))),
                                   keep_stages=False)) for a in range(0, N, SMALL)]
    valid = large["valid"]
    assert valid.any() and not valid.all()  # valid and invalid configs both in the batch
    assert len(large) > 20
    for name, a in large.items():
        b = np.concatenate([p[name] for p in parts])
        assert a.dtype == b.dtype, name
        assert np.array_equal(bits(a[valid]), bits(b[valid])), f"{name}: {np.flatnonzero(bits(a) != bits(b))[:5]}"
        if name.split(".")[0] not in ("valid", "feasible", "broken", "pp", "vpp", "schedule", "offload_modules"):
            assert (a[~valid] == evaluate_module.UNSCORED).all(), name
            assert np.isfinite(b[~valid]).all(), name


@pytest.mark.parametrize("model,cluster,devices,gbs", CASES)
def test_large_batch_scores_each_valid_config_as_a_batch_of_one(monkeypatch, model, cluster, devices, gbs):
    """The large path scores only the valid configs, in an order of its own, and writes them back: each
    valid config's numbers (per-stage peaks too) are those it gets scored alone. Checked on the valid
    configs that follow an invalid one, where a slip of the write-back would put a neighbour's numbers."""
    spec, profile = model_presets.load(model), hardware_profiles.load(cluster)
    batch = mix(np.random.default_rng(11), N, spec, devices, gbs)
    monkeypatch.setattr(evaluate_module, "CHUNK_CONFIGS", 900)
    br = evaluate_batch(spec, profile, devices, batch, keep_stages=True)
    large, valid = arrays(br), br.valid
    after_invalid = np.flatnonzero(valid[1:] & ~valid[:-1]) + 1
    assert len(after_invalid) > 100 and (~valid).sum() > N // 4  # many invalid configs among the valid
    for i in np.random.default_rng(0).choice(after_invalid, 60, replace=False).tolist():
        one_br = evaluate_batch(spec, profile, devices, batch.take([i]), keep_stages=True)
        one = arrays(one_br)
        for name, a in large.items():
            assert np.array_equal(bits(a[i:i + 1]), bits(one[name])), (i, name)
        assert np.array_equal(bits(br.stage_peaks(i)), bits(one_br.stage_peaks(0))), i


def test_a_large_batch_with_no_valid_config_gets_placeholders():
    spec, profile = model_presets.load("llama3-405b"), hardware_profiles.load("nvidia-h100-80gb")
    batch = mix(np.random.default_rng(3), N, spec, 16384, 2048)
    batch.global_batch_size[:] = 2047  # no micro-batch size and dp divide it
    br = evaluate_batch(spec, profile, 16384, batch, keep_stages=True)
    assert not br.valid.any() and not br.feasible.any()
    assert (br.step_time_s == 0).all() and (br.peak_bytes == 0).all() and (br.stage_peak_bytes == 0).all()
    assert br.stage_peak_bytes.shape == br.stage_rank.shape


def test_per_config_hardware_factors_follow_their_configs(monkeypatch):
    """A Hardware whose efficiency factors are arrays of one value per config (a calibration scoring many
    candidate factor sets at once) scores each config with its own factors on the large path too, which
    sorts and chunks the configs: the same numbers as slices scored on the small path with theirs."""
    from dataclasses import replace
    from costmodel.hardware import Hardware

    spec, profile = model_presets.load("pangu-ultra-moe-718b"), hardware_profiles.load("ascend-910b")
    batch = mix(np.random.default_rng(5), N, spec, 6144, 7680)
    rng = np.random.default_rng(1)
    factors = {"gemm_eff_max": rng.uniform(0.5, 0.8, N), "dp_overlap": rng.uniform(0.3, 0.9, N),
               "straggler_cv": rng.uniform(0.0, 0.02, N)}
    hw = Hardware.from_profile(profile, factors)
    monkeypatch.setattr(evaluate_module, "CHUNK_CONFIGS", 800)
    br = evaluate_batch(spec, profile, 6144, batch, keep_stages=False, hw=hw)
    large = arrays(br)
    for a in range(0, N, SMALL):
        idx = np.arange(a, min(a + SMALL, N))
        part_hw = replace(hw, **{k: getattr(hw, k)[idx] for k in ("gemm_eff_max", "dp_overlap", "straggler_cv")})
        part = arrays(evaluate_batch(spec, profile, 6144, batch.take(idx), keep_stages=False, hw=part_hw))
        ok = br.valid[idx]
        for name, v in part.items():
            assert np.array_equal(bits(large[name][idx][ok]), bits(v[ok])), name


def test_evaluate_many_reports_a_large_batch_as_small_ones():
    """``evaluate_many`` on more than ``GROUP_MIN_CONFIGS`` configs (the large path: its invalid configs
    unscored) gives each config the result it gets in batches below the threshold, nulls for the invalid
    ones included, every stage kept."""
    import json
    from conftest import sample_config
    from costmodel.result import evaluate_many

    spec, profile = model_presets.load("tiny-moe"), hardware_profiles.load("nvidia-h100-80gb")
    rng = np.random.default_rng(2)
    configs = [sample_config(rng, spec, 32, p_wild=0.4) for _ in range(evaluate_module.GROUP_MIN_CONFIGS + 200)]
    large = evaluate_many(spec, profile, 32, configs)
    half = len(configs) // 2
    small = evaluate_many(spec, profile, 32, configs[:half]) + evaluate_many(spec, profile, 32, configs[half:])
    assert sum(r["step_time_s"] is None for r in large) > 100  # invalid configs among them
    assert [json.dumps(r, sort_keys=True) for r in large] == [json.dumps(r, sort_keys=True) for r in small]


def test_goodput_ranking_of_a_large_batch_reads_only_its_valid_configs():
    """The goodput objective prices checkpoints per step: on a large batch, whose invalid configs have no
    step time, it prices the valid ones only (no division by a zero step: no warning) and gives each the
    value it gets in a small batch."""
    import warnings
    from types import SimpleNamespace
    from search.objective import ranking_tokens_per_s

    spec, profile = model_presets.load("llama3-405b"), hardware_profiles.load("nvidia-h100-80gb")
    batch = mix(np.random.default_rng(9), N, spec, 16384, 2048)
    space = SimpleNamespace(objective="goodput", devices=16384, profile=profile, resilience=None)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        br = evaluate_batch(spec, profile, 16384, batch, keep_stages=False)
        large = ranking_tokens_per_s(space, br, batch)
    idx = np.arange(SMALL)
    part = batch.take(idx)
    small = ranking_tokens_per_s(space, evaluate_batch(spec, profile, 16384, part, keep_stages=False), part)
    ok = br.valid[idx]
    assert ok.any() and not ok.all()
    assert np.array_equal(bits(large[idx][ok]), bits(small[ok])) and (large[~br.valid] == 0).all()

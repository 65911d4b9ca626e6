"""The large-batch path of ``evaluate_batch`` scores every config exactly as a small batch does.

A batch of at least ``GROUP_MIN_CONFIGS`` configs is scored in groups of equal stage count and in chunks,
with the layer costs of each distinct combination of their inputs computed once and gathered per chunk
(only the fields a chunk reads; a cost or column with one value everywhere sliced instead), and the
replayed schedules of uneven model chunks tabled once for the whole batch. None of that may change a
number: here a seeded mix of configs (valid and invalid, interleaved and uneven pipelines, recompute,
flags) is scored once as one large batch, with chunks small enough that every group spans several, and
once in slices below the threshold; every output array must be equal bit for bit.
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
    spec, profile = model_presets.load(model), hardware_profiles.load(cluster)
    batch = mix(np.random.default_rng(7), N, spec, devices, gbs)
    monkeypatch.setattr(evaluate_module, "CHUNK_CONFIGS", 700)  # several chunks per stage-count group
    large = arrays(evaluate_batch(spec, profile, devices, batch, keep_stages=False))
    parts = [arrays(evaluate_batch(spec, profile, devices, batch.take(np.arange(a, min(a + SMALL, N))),
                                   keep_stages=False)) for a in range(0, N, SMALL)]
    assert large["valid"].any() and not large["valid"].all()  # valid and invalid configs both scored
    assert len(large) > 20
    for name, a in large.items():
        b = np.concatenate([p[name] for p in parts])
        assert a.dtype == b.dtype, name
        assert np.array_equal(bits(a), bits(b)), f"{name}: {np.flatnonzero(bits(a) != bits(b))[:5]}"

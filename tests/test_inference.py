"""The rollout engine's cost model, hand-worked.

KV bytes per token against the published figures (Llama 3 70B's 320 KiB; DeepSeek-V2/V3's 576
elements per layer), decode in its two regimes (memory-bound at small batches, compute-bound at
large), the experts a batch touches, the batch the memory holds, and prefill's compute.
"""

from __future__ import annotations

import numpy as np
import pytest

from costmodel import inference
from costmodel.flops import total_params
from costmodel.hardware import GIB, Hardware


@pytest.fixture(scope="module")
def hw(round_profile) -> Hardware:
    return Hardware.from_profile(round_profile)


def test_gqa_kv_bytes_per_token(preset):
    spec = preset("llama3-70b")  # 80 layers, 8 KV groups of 128
    kv = inference.kv_bytes_per_token(spec, np.array([1, 8, 16]))
    # 2 (K and V) · 8 groups · 128 · 2 B · 80 layers = 327,680 B = 320 KiB per token on one device
    assert kv[0] == 80 * 2 * 8 * 128 * 2 == 320 * 1024
    assert kv[1] == 320 * 1024 / 8  # one group per rank
    assert kv[2] == kv[1]  # tp 16 > 8 groups: each group's K/V is replicated on two ranks


def test_mla_kv_bytes_per_token(preset):
    spec = preset("deepseek-v3-671b")  # kv_lora_rank 512, RoPE key 64: 576 elements per layer
    kv = inference.kv_bytes_per_token(spec, np.array([1, 8]))
    assert kv[0] == 61 * (512 + 64) * 2
    assert kv[1] == kv[0]  # the latent is not split over heads: every tp rank keeps it whole


def test_experts_touched(preset):
    spec = preset("deepseek-v3-671b")  # 256 routed experts, top-8
    t = inference.experts_touched(spec, np.array([1, 32, 100_000]))
    assert t[0] == pytest.approx(8.0)
    assert t[1] == pytest.approx(256 * (1 - (1 - 8 / 256) ** 32))  # 163.3
    assert t[1] == pytest.approx(163.3, abs=0.1)
    assert t[2] == pytest.approx(256.0)


def test_decode_is_memory_bound_at_batch_one_and_compute_bound_at_large_batches(preset, hw):
    spec = preset("llama3-70b")
    weights = 2.0 * total_params(spec)  # bf16, tp 1
    kv = 320 * 1024
    hbm = 2000e9 * 0.8  # round profile: 2,000 GB/s at hbm_eff 0.8
    overhead = 80 * 50e-6  # one pass of 80 layers at 50 us
    t1 = inference.decode_step_s(spec, hw, 1, 1, 4096)
    assert t1 == pytest.approx((weights + 4096 * kv) / hbm + overhead, rel=1e-9)
    # one more sequence costs its KV cache read and nothing else while memory-bound
    t2 = inference.decode_step_s(spec, hw, 1, 2, 4096)
    assert t2 - t1 == pytest.approx(4096 * kv / hbm, rel=1e-9)
    # 4,096 sequences of 1 token of context: the matmuls (2 · active weights per token) dominate
    big = 4096
    flops = 2.0 * inference.active_params_per_token(spec) * big + 2 * 64 * 256 * 80 * big * 1
    tc = inference.decode_step_s(spec, hw, 1, big, 1)
    assert tc == pytest.approx(flops / (1000e12 * 0.8) + overhead, rel=1e-9)
    assert flops / (1000e12 * 0.8) > (weights + big * kv) / hbm


def test_tp_splits_weights_and_adds_all_reduces(preset, hw):
    spec = preset("llama3-70b")
    t1, t8 = inference.decode_step_s(spec, hw, np.array([1, 8]), 8, 2048)
    assert t8 < t1 / 3  # 8 devices read an eighth each, but pay 160 latency-bound all-reduces
    ar = inference._tp_comm_s(spec, hw, np.array([8]), 8)[0]
    assert ar > 0 and ar == pytest.approx(t8 - (inference.decode_weight_read_bytes(spec, 8, 8)
                                                + 8 * 2048 * 40960) / (2000e9 * 0.8) - 80 * 50e-6, rel=1e-9)


def test_moe_decode_reads_only_touched_experts(preset):
    spec = preset("deepseek-v3-671b")
    one = inference.decode_weight_read_bytes(spec, 8, 1)
    held = inference.weight_bytes_per_device(spec, 8)
    expert = 2 * 3 * 7168 * 2048  # bf16 SwiGLU expert, h 7168, expert ffn 2048
    n_moe = sum(spec.moe_layer_pattern())
    assert held - one == pytest.approx(n_moe * (256 - 8) * expert / 8, rel=1e-9)
    assert inference.decode_weight_read_bytes(spec, 8, 1_000_000) == pytest.approx(held, rel=1e-9)


def test_max_decode_batch(preset, hw):
    spec = preset("llama3-70b")
    room = 80 * GIB * 0.9 - 2.0 * total_params(spec) / 8 - 4 * GIB  # round profile: 80 GiB, 4 GiB overhead
    b = inference.max_decode_batch(spec, hw, 8, 8192)
    assert b == np.floor(room / (40960 * 8192))
    assert inference.max_decode_batch(spec, hw, 1, 8192) == 0  # 141 GB of weights on one 80 GiB device


def test_prefill_is_compute(preset, hw):
    spec = preset("llama3-70b")
    t = inference.prefill_s(spec, hw, 1, 4, 1000)
    tokens = 4000
    matmul = 2 * inference.active_params_per_token(spec) * tokens / (1000e12 * 0.8)
    attn = 2 * 64 * 256 * 80 * tokens * 500 / (1000e12 * 0.5)
    assert t == pytest.approx(matmul + attn, rel=1e-9)

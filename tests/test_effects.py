"""One hand-worked case per formula of the cost model.

Every expected number is arithmetic written out here from the formula (the CONTRACT, the module's
docstring or the cited paper), with a profile whose facts and factors are set in the test
(``round_profile`` in conftest.py), never a number read back from the code.
"""

from __future__ import annotations

import numpy as np
import pytest

import model_presets
from costmodel import comm, compute, memory, pipeline
from costmodel.batch import NO_VALUE
from costmodel.flops import attention_params, model_flops_per_token, total_params
from costmodel.hardware import GIB, Hardware
from costmodel.result import evaluate
from costmodel.spec import TrainingConfig

from conftest import ROUND_FACTS

A = np.asarray
GB = 1e9


# ================================================================================================
# flops.py


def test_attention_params_mha(preset):
    # gpt-1.3b: h = 2048, 16 heads of 128, no GQA: Q, K, V and O are h x h each.
    p = attention_params(preset("gpt-1.3b"))
    assert p.sharded == 4 * 2048 * 2048
    assert p.replicated == 0


def test_attention_params_gqa(preset):
    # tiny-dense: h = 256, 8 heads of d = 32, 4 query groups.
    # Q: h·a·d = 256·256; K and V: 2·h·g·d = 2·256·128; O: a·d·h = 256·256.
    p = attention_params(preset("tiny-dense"))
    assert p.sharded == 256 * 256 + 2 * 256 * 4 * 32 + 256 * 256 == 196608
    assert p.replicated == 0


def test_attention_params_mla(preset):
    # tiny-mla-moe: h = 512, a = 8, q_lora 128, kv_lora 64, qk 32, rope 16, v 32 (DeepSeek-V3 §2.1.1).
    # Replicated down-projections: W_DQ h·q_lora, W_DKV h·kv_lora and the shared RoPE key W_KR h·rope.
    # Sharded up-projections: W_UQ+W_QR q_lora·a·(qk+rope); W_UK+W_UV kv_lora·a·(qk+v); W_O a·v·h.
    p = attention_params(preset("tiny-mla-moe"))
    assert p.replicated == 512 * 128 + 512 * (64 + 16) == 106496
    assert p.sharded == 128 * 8 * (32 + 16) + 64 * 8 * (32 + 32) + 8 * 32 * 512 == 212992


def test_attention_params_mla_without_query_compression(preset):
    # q_lora_rank null: queries come straight from h: W_Q h·a·(qk+rope), nothing replicated for Q.
    spec = model_presets.load({"base": "tiny-mla-moe", "q_lora_rank": None})
    p = attention_params(spec)
    assert p.replicated == 512 * (64 + 16)
    assert p.sharded == 512 * 8 * (32 + 16) + 64 * 8 * (32 + 32) + 8 * 32 * 512


def test_model_flops_tiny_dense(preset):
    # tiny-dense: L 4, h 256, a 8, g 4, d 32, SwiGLU ffn 1024, vocab 1024, seq 512.
    L, h, a, g, d, f, V, s = 4, 256, 8, 4, 32, 1024, 1024, 512
    attn = h * a * d + 2 * h * g * d + a * d * h  # 196608
    mlp = 3 * h * f  # gate, up, down: 786432
    params = L * (attn + mlp) + V * h  # LM head, no embedding lookup
    assert params == 4 * 983040 + 262144 == 2**22
    expected = 6 * params + 3 * s * a * (d + d) * L
    assert expected == 25165824 + 3145728
    assert model_flops_per_token(preset("tiny-dense")) == pytest.approx(expected, rel=1e-12)


def test_model_flops_gpt_matches_narayanan(preset):
    # GPT (GELU, ffn 4h, tied embeddings): per token 72·L·h²  + 6·L·h·s (causal: half of SC21's
    # 12·L·h·s) + 6·V·h (the LM head is counted even when tied to the embedding).
    L, h, s, V = 24, 2048, 2048, 51200
    per_layer = 4 * h * h + 2 * h * 8192  # = 12 h²
    assert per_layer == 12 * h * h
    expected = 6 * (L * per_layer + V * h) + 3 * s * 16 * (128 + 128) * L
    assert expected == 72 * L * h * h + 6 * L * h * s + 6 * V * h == 8480882688
    assert model_flops_per_token(preset("gpt-1.3b")) == pytest.approx(expected, rel=1e-12)


def test_model_flops_mla_moe(preset):
    # tiny-mla-moe: layer 0 dense, layers 1-4 MoE (16 experts, top-4, expert ffn 128, one shared
    # expert of 128), SwiGLU, one MTP module, vocab 2048, seq 1024.
    h, a, V, s, f, E, k, fe, fs = 512, 8, 2048, 1024, 1024, 16, 4, 128, 128
    attn = 106496 + 212992  # test_attention_params_mla
    dense = attn + 3 * h * f
    moe = attn + h * E + k * 3 * h * fe + 3 * h * fs  # router, top-k routed, shared
    assert dense == 1892352 and moe == 1310720
    mtp = 2 * h * h + moe + V * h  # projection of [h; emb], a layer like the last (MoE), LM head again
    params = 1 * dense + 4 * moe + V * h + 1 * mtp
    qk, v = 32 + 16, 32  # MLA: qk dim = qk_head_dim + qk_pos_emb_head_dim
    attention = 3 * s * a * (qk + v) * (5 + 1)  # five decoder layers and the MTP layer
    expected = 6 * params + attention
    assert expected == 66404352 + 11796480
    assert model_flops_per_token(preset("tiny-mla-moe")) == pytest.approx(expected, rel=1e-12)


def test_model_flops_moe_layer_freq_int():
    # moe_layer_freq as an int k: layers 0, k, 2k, ... are MoE (Megatron-Core's rule).
    spec = model_presets.load({"base": "tiny-moe", "moe_layer_freq": 2, "mtp_num_layers": 0})
    h, a, d, V, s, f, E, k, fe, fs = 256, 8, 32, 1024, 512, 1024, 8, 2, 256, 256
    attn = 4 * h * h
    dense = attn + 3 * h * f
    moe = attn + h * E + k * 3 * h * fe + 3 * h * fs
    expected = 6 * (3 * dense + 3 * moe + V * h) + 3 * s * a * 2 * d * 6
    assert model_flops_per_token(spec) == pytest.approx(expected, rel=1e-12)


def test_total_params_deepseek_v3_is_671b(preset):
    # DeepSeek-V3 report: 671B total parameters in the main model (norms are a few million).
    spec = preset("deepseek-v3-671b").model_copy(update={"mtp_num_layers": 0})
    assert total_params(spec) == pytest.approx(671e9, rel=2e-3)


def test_total_params_counts_every_expert_of_the_mtp_layer(preset):
    spec = preset("deepseek-v3-671b")
    no_mtp = spec.model_copy(update={"mtp_num_layers": 0})
    h, E, fe, fs = 7168, 256, 2048, 2048
    att = attention_params(spec)
    full_moe_layer = att.sharded + att.replicated + h * E + E * 3 * h * fe + 3 * h * fs
    mtp = 2 * h * h + full_moe_layer  # its output head is the main model's (shared)
    assert total_params(spec) == total_params(no_mtp) + mtp


# ================================================================================================
# compute.py


@pytest.fixture()
def hw(round_profile) -> Hardware:
    return Hardware.from_profile(round_profile)


def test_hardware_from_profile_units(hw):
    # ROUND_FACTS/ROUND_EFFICIENCY: TFLOP/s -> FLOP/s, GB/s × efficiency -> B/s, GiB -> B, us -> s.
    assert hw.peak_bf16_flops == 1000e12
    assert hw.hbm_bytes_per_s == pytest.approx(2000 * GB * 0.8)
    assert hw.scale_up_bytes_per_s == pytest.approx(400 * GB * 0.75)
    assert hw.scale_out_bytes_per_s == pytest.approx(50 * GB * 0.8)
    assert hw.memory_bytes == 80 * 2**30
    assert hw.scale_out_latency_s == pytest.approx(10e-6)
    assert hw.layer_overhead_s == pytest.approx(50e-6)


def test_gemm_compute_bound(hw):
    # 8192³ GEMM: F = 2·8192³ FLOP; efficiency 0.8 · F/(F + 2 GFLOP); peak 1000 TFLOP/s.
    F = 2.0 * 8192**3
    expected = F / (1000e12 * 0.8 * F / (F + 2e9))
    hbm = 3 * 8192 * 8192 * 2 / (2000e9 * 0.8)
    assert hbm < expected  # compute-bound indeed
    assert compute.gemm_s(A([8192.0]), 8192, 8192, hw, A([False]))[0] == pytest.approx(expected, rel=1e-12)
    # count multiplies
    assert compute.gemm_s(A([8192.0]), 8192, 8192, hw, A([False]), count=3)[0] == pytest.approx(
        3 * expected, rel=1e-12)


def test_gemm_fp8(hw):
    # FP8: peak 2000 TFLOP/s × fp8_gemm_eff_ratio 0.75 = 1500 TFLOP/s; the curve keeps its fixed time per
    # call, so the half size scales with the rate: 2 GFLOP · 1500/1000 = 3 GFLOP (compute.fp8_half_flops).
    F = 2.0 * 8192**3
    expected = F / (2000e12 * 0.75 * 0.8 * F / (F + 3e9))
    assert compute.gemm_s(A([8192.0]), 8192, 8192, hw, A([True]))[0] == pytest.approx(expected, rel=1e-12)


def test_gemm_memory_bound(hw):
    # m = 1 (a GEMV): reading the 8192×8192 bf16 weight dominates: (m·k + k·n + m·n)·2 B / (2000 GB/s·0.8).
    F = 2.0 * 1 * 8192 * 8192
    compute_time = F / (1000e12 * 0.8 * F / (F + 2e9))
    expected = (1 * 8192 + 8192 * 8192 + 1 * 8192) * 2 / (2000e9 * 0.8)
    assert expected > compute_time
    assert compute.gemm_s(A([1.0]), 8192, 8192, hw, A([False]))[0] == pytest.approx(expected, rel=1e-12)
    # FP8 operands are one byte
    expected8 = (1 * 8192 + 8192 * 8192 + 1 * 8192) * 1 / (2000e9 * 0.8)
    assert compute.gemm_s(A([1.0]), 8192, 8192, hw, A([True]))[0] == pytest.approx(expected8, rel=1e-12)


def test_gemm_efficiency_halves_at_half_size(hw):
    # A GEMM of exactly gemm_half_gflop runs at half of gemm_eff_max: F/(1000 T·0.8·0.5).
    m = 2e9 / (2 * 1000 * 1000)  # F = 2·m·1000·1000 = 2 GFLOP
    expected = 2e9 / (1000e12 * 0.8 * 0.5)
    assert (m * 1000 + 1000 * 1000 + m * 1000) * 2 / (2000e9 * 0.8) < expected  # compute-bound
    assert compute.gemm_s(A([m]), 1000, 1000, hw, A([False]))[0] == pytest.approx(expected, rel=1e-12)


def test_attention_core(hw):
    # FlashAttention: F / (peak · attn_eff · F/(F + half)) = (F + 2e9) / (1000e12 · 0.5)
    F = 5e11
    assert compute.attention_core_s(A([F]), A([0.0]), A([1]), hw)[0] == pytest.approx(
        (F + 2e9) / (1000e12 * 0.5), rel=1e-12)


def test_attention_core_per_call_and_softmax(hw):
    # Ring attention in 4 calls pays the per-call cost 4 times: (F + 4·2e9)/(peak·eff); the softmax of
    # S score elements adds S / 3.9e12 s whatever the head dim.
    F, S = 5e11, 1e9
    assert compute.attention_core_s(A([F]), A([S]), A([4]), hw)[0] == pytest.approx(
        (F + 4 * 2e9) / (1000e12 * 0.5) + S / 3.9e12, rel=1e-12)


def test_attention_backward_recomputes_the_softmax_once(hw):
    # FlashAttention-2's backward: 2.5x the forward's matmul time (five matmuls against two) but one
    # exponential per score again, so the softmax part is the forward's: 2.5·(F + 2e9)/(peak·eff) + S/3.9e12.
    F, S = 5e11, 1e9
    assert compute.attention_core_bwd_s(A([F]), A([S]), A([1]), hw)[0] == pytest.approx(
        2.5 * (F + 2e9) / (1000e12 * 0.5) + S / 3.9e12, rel=1e-12)


def test_attention_head_dim_64_runs_further_from_peak(hw):
    # Same score count, half the head dim: half the matmul FLOPs but the same softmax time, so the
    # achieved fraction of the matmul peak falls.
    S = 1e10
    t128 = compute.attention_core_s(A([S * 2 * 256]), A([S]), A([1]), hw)[0]
    t64 = compute.attention_core_s(A([S * 2 * 128]), A([S]), A([1]), hw)[0]
    assert t64 > t128 / 2
    assert (S * 2 * 128 / t64) < (S * 2 * 256 / t128)


def test_memory_bound(hw):
    assert compute.memory_bound_s(A([3.2e9]), hw)[0] == pytest.approx(3.2e9 / (2000e9 * 0.8), rel=1e-12)


# ================================================================================================
# comm.py — switched domain of 8: scale-up 400 GB/s·0.75 = 300 GB/s, scale-out 50·0.8 = 40 GB/s,
# latencies 5 us / 10 us.

UP, OUT, LAT_UP, LAT_OUT = 300e9, 40e9, 5e-6, 10e-6
B = 2.0**30


def test_all_gather_in_domain(hw):
    # 8 ranks, stride 1: all in one domain, (n−1)/n of the buffer at scale-up, n−1 steps.
    expected = 7 / 8 * B / UP + 7 * LAT_UP
    assert comm.all_gather_s(A([B]), A([1]), A([8]), hw)[0] == pytest.approx(expected, rel=1e-12)
    assert comm.reduce_scatter_s(A([B]), A([1]), A([8]), hw)[0] == pytest.approx(expected, rel=1e-12)
    assert comm.all_reduce_s(A([B]), A([1]), A([8]), hw)[0] == pytest.approx(2 * expected, rel=1e-12)


def test_all_gather_cross_domain_nic_bound(hw):
    # dp group of 4 with stride tp = 4: 8 // 4 = 2 members share a domain, so the ring runs at
    # min(scale_up, 2 · scale_out) = min(300, 80) GB/s with scale-out latency.
    expected = 3 / 4 * B / min(UP, 2 * OUT) + 3 * LAT_OUT
    assert comm.all_gather_s(A([B]), A([4]), A([4]), hw)[0] == pytest.approx(expected, rel=1e-12)
    assert comm.all_reduce_s(A([B]), A([4]), A([4]), hw)[0] == pytest.approx(2 * expected, rel=1e-12)


def test_all_gather_cross_domain_scale_up_bound(hw):
    # 16 ranks, stride 1: 8 per domain, min(300, 8·40 = 320) = 300 GB/s, scale-out latency.
    expected = 15 / 16 * B / min(UP, 8 * OUT) + 15 * LAT_OUT
    assert comm.all_gather_s(A([B]), A([1]), A([16]), hw)[0] == pytest.approx(expected, rel=1e-12)


def test_group_of_one_costs_nothing(hw):
    assert comm.all_gather_s(A([B]), A([1]), A([1]), hw)[0] == 0.0
    assert comm.all_reduce_s(A([B]), A([1]), A([1]), hw)[0] == 0.0
    assert comm.all_to_all_s(A([B]), A([1]), A([1]), hw)[0] == 0.0


def test_all_to_all_in_domain(hw):
    # 8 ranks in one domain; each sends B spread over 8 (itself included): 7/8·B at scale-up.
    expected = B * 7 / 8 / UP + LAT_UP
    assert comm.all_to_all_s(A([B]), A([1]), A([8]), hw)[0] == pytest.approx(expected, rel=1e-12)


def test_all_to_all_cross_domain(hw):
    # 32 ranks, stride 1: 7/32·B inside the domain at 300 GB/s and 24/32·B through the NIC at
    # 40 GB/s, concurrently: the NIC phase sets the time.
    intra = B * 7 / 32 / UP
    inter = B * 24 / 32 / OUT
    assert comm.all_to_all_s(A([B]), A([1]), A([32]), hw)[0] == pytest.approx(
        max(intra, inter) + LAT_OUT, rel=1e-12)


def test_p2p(hw):
    # pipeline neighbours 4 ranks apart share the domain: one scale-up transfer; 8 apart: the NIC.
    assert comm.p2p_s(A([B]), A([4]), hw)[0] == pytest.approx(B / UP + LAT_UP, rel=1e-12)
    assert comm.p2p_s(A([B]), A([8]), hw)[0] == pytest.approx(B / OUT + LAT_OUT, rel=1e-12)


@pytest.fixture()
def mesh_hw(make_profile) -> Hardware:
    # Full-mesh domain of 8 (HCCS, Atlas 800T A2): aggregate 400 GB/s, one pair link 50 GB/s,
    # both at scale_up_bw_eff 0.75 -> 300 GB/s and 37.5 GB/s.
    facts = {k: v for k, v in ROUND_FACTS.items() if k != "peak_fp8_tflops"}
    facts["scale_up_link_gbps"] = 50.0
    prof = make_profile("ascend-910b", efficiency={"scale_up_bw_eff": 0.75, "scale_out_bw_eff": 0.8},
                        facts=facts)
    return Hardware.from_profile(prof)


def test_full_mesh_small_group_gets_its_links(mesh_hw):
    link = 50e9 * 0.75
    # tp = 2: one peer, one link.
    assert comm.all_gather_s(A([B]), A([1]), A([2]), mesh_hw)[0] == pytest.approx(
        1 / 2 * B / link + 1 * LAT_UP, rel=1e-12)
    # tp = 4: three links.
    assert comm.all_reduce_s(A([B]), A([1]), A([4]), mesh_hw)[0] == pytest.approx(
        2 * (3 / 4 * B / (3 * link) + 3 * LAT_UP), rel=1e-12)
    # tp = 8: seven links (262.5 GB/s) but capped by the aggregate 300 GB/s: 262.5.
    assert comm.all_gather_s(A([B]), A([1]), A([8]), mesh_hw)[0] == pytest.approx(
        7 / 8 * B / min(UP, 7 * link) + 7 * LAT_UP, rel=1e-12)
    # point to point: one link
    assert comm.p2p_s(A([B]), A([2]), mesh_hw)[0] == pytest.approx(B / link + LAT_UP, rel=1e-12)


def test_full_mesh_all_to_all(mesh_hw):
    link = 50e9 * 0.75
    # ep = 4 inside the node: 3/4 of B over 3 links.
    assert comm.all_to_all_s(A([B]), A([1]), A([4]), mesh_hw)[0] == pytest.approx(
        B * 3 / 4 / (3 * link) + LAT_UP, rel=1e-12)


def test_exposed():
    # max(comm·(1 − overlap), comm − window)
    assert comm.exposed_s(A([10.0]), A([4.0]), 0.7)[0] == pytest.approx(6.0)  # window too short
    assert comm.exposed_s(A([10.0]), A([20.0]), 0.7)[0] == pytest.approx(3.0)  # overlap-limited
    assert comm.exposed_s(A([10.0]), A([20.0]), 0.0)[0] == pytest.approx(10.0)  # no overlap
    assert comm.exposed_s(A([10.0]), A([20.0]), 1.0)[0] == pytest.approx(0.0)


# ================================================================================================
# pipeline.py

DENSE, MOE, EMB, HEAD, MTP = pipeline.DENSE, pipeline.MOE, pipeline.EMB, pipeline.HEAD, pipeline.MTP


def split(spec, pp, vpp, first=NO_VALUE, last=NO_VALUE, acc_emb=False, acc_loss=False, layout=None):
    return pipeline.split_stages(spec, pp, vpp, first, last, acc_emb, acc_loss, layout)


def test_even_split_61_layers_pp16_vpp2(preset):
    # 61 layers over 32 virtual stages: 1 each, remainder 29 to the middle virtual stages 1..29.
    # So v0 = 1 layer, v1..v29 = 2, v30 = 1, v31 = 1. In model order v_k (1 ≤ k ≤ 29) holds layers
    # 2k−1, 2k; v30 layer 59; v31 layer 60. Rank r runs v_r and v_{16+r}.
    spec = preset("deepseek-v3-671b")  # layers 0-2 dense, 3-60 MoE, one MTP layer
    comp = split(spec, 16, 2)
    assert comp.shape == (16, 5)
    # rank 0: v0 = [0] (dense) + v16 = [31, 32] (MoE), the embedding
    assert comp[0].tolist() == [1, 2, 1, 0, 0]
    # rank 1: v1 = [1, 2] (dense) + v17 = [33, 34]
    assert comp[1].tolist() == [2, 2, 0, 0, 0]
    for r in range(2, 14):
        assert comp[r].tolist() == [0, 4, 0, 0, 0]
    # rank 14: v14 = [27, 28] + v30 = [59]
    assert comp[14].tolist() == [0, 3, 0, 0, 0]
    # rank 15: v15 = [29, 30] + v31 = [60] + MTP + loss
    assert comp[15].tolist() == [0, 3, 0, 1, 1]
    assert comp[:, DENSE].sum() == 3 and comp[:, MOE].sum() == 58


def test_even_split_two_stages_first_then_last():
    # With two virtual stages there is no middle: the remainder goes to the first one.
    spec = model_presets.load({"base": "tiny-dense", "num_layers": 5})
    assert split(spec, 2, 1)[:, DENSE].tolist() == [3, 2]


def test_first_and_last_stage_layers():
    # 10 layers, pp 4: rank 0 takes 1, rank 3 takes 2, ranks 1-2 share 7 as evenly as possible (4, 3).
    spec = model_presets.load({"base": "tiny-dense", "num_layers": 10})
    comp = split(spec, 4, 1, first=1, last=2)
    assert comp[:, DENSE].tolist() == [1, 4, 3, 2]
    assert comp[:, EMB].tolist() == [1, 0, 0, 0] and comp[:, HEAD].tolist() == [0, 0, 0, 1]
    # only the first given: the other three share 9 (3 each)
    assert split(spec, 4, 1, first=1)[:, DENSE].tolist() == [1, 3, 3, 3]


def test_first_last_that_do_not_add_up():
    spec = model_presets.load({"base": "tiny-dense", "num_layers": 10})
    with pytest.raises(pipeline.LayoutError):
        split(spec, 2, 1, first=3, last=3)
    with pytest.raises(pipeline.LayoutError):
        split(spec, 4, 1, first=6, last=6)


def test_account_for_embedding_and_loss():
    # 6 layers + embedding + loss = 8 slots over 4 stages, 2 each:
    # v0 = E + 1 layer, v1 = 2, v2 = 2, v3 = 1 layer + L.
    spec = model_presets.load({"base": "tiny-dense", "num_layers": 6})
    comp = split(spec, 4, 1, acc_emb=True, acc_loss=True)
    assert comp[:, DENSE].tolist() == [1, 2, 2, 1]
    # 7 layers: 9 slots, 2 each and the remainder 1 to the middle stage v1: [E+1, 3, 2, 1+L]
    spec7 = model_presets.load({"base": "tiny-dense", "num_layers": 7})
    assert split(spec7, 4, 1, acc_emb=True, acc_loss=True)[:, DENSE].tolist() == [1, 3, 2, 1]
    # only the embedding: 7 slots over 4 -> [2, 2, 2, 1] slots, remainder 3 to v1, v2, then v0
    assert split(spec, 4, 1, acc_emb=True)[:, DENSE].tolist() == [1, 2, 2, 1]


def test_embedding_and_loss_slots_fill_virtual_stages():
    # 6 layers, pp 4 × vpp 2 = 8 virtual stages, embedding and loss counted as slots: 8 slots,
    # v0 holds only E and v7 only L, and the split is valid.
    spec = model_presets.load({"base": "tiny-dense", "num_layers": 6})
    comp = split(spec, 4, 2, acc_emb=True, acc_loss=True)
    # rank 0 runs v0 (E) and v4 (1 layer); rank 3 runs v3 (1) and v7 (L)
    assert comp[:, DENSE].tolist() == [1, 2, 2, 1]
    assert comp[0, EMB] == 1 and comp[3, HEAD] == 1


def test_pipeline_layout_deepseek_pp8_vpp4(preset):
    # "Et|(tt|)*30mL": v0 = E + layer 0, v1..v30 = 2 layers each (v_k: layers 2k−1, 2k), v31 = MTP + loss.
    # pp 8: rank r runs v_r, v_{r+8}, v_{r+16}, v_{r+24}.
    spec = preset("deepseek-v3-671b")
    stages = pipeline.parse_layout("Et|(tt|)*30mL")
    assert len(stages) == 32 and stages[0] == "Et" and stages[1] == "tt" and stages[31] == "mL"
    comp = split(spec, 8, 4, layout="Et|(tt|)*30mL")
    assert comp[0].tolist() == [1, 6, 1, 0, 0]  # layer 0 dense, v8, v16, v24 MoE
    assert comp[1].tolist() == [2, 6, 0, 0, 0]  # v1 = layers 1, 2 dense
    for r in range(2, 7):
        assert comp[r].tolist() == [0, 8, 0, 0, 0]
    assert comp[7].tolist() == [0, 6, 0, 1, 1]


def test_pipeline_layout_overrides_other_split_options(preset):
    spec = preset("deepseek-v3-671b")
    plain = split(spec, 8, 4, layout="Et|(tt|)*30mL")
    other = split(spec, 8, 4, first=5, last=NO_VALUE, layout="Et|(tt|)*30mL")
    assert (plain == other).all()


def test_layout_errors(preset):
    spec = preset("deepseek-v3-671b")
    with pytest.raises(pipeline.LayoutError, match="virtual stages"):
        split(spec, 16, 4, layout="Et|(tt|)*30mL")  # 32 stages for pp·vpp = 64
    with pytest.raises(pipeline.LayoutError):
        split(spec, 8, 4, layout="Et|(tt|)*29ttt|mL")  # 32 stages but 62 layers for 61
    with pytest.raises(pipeline.LayoutError):
        split(spec, 8, 4, layout="Et|(tt|)*30L")  # no MTP layer
    with pytest.raises(pipeline.LayoutError):
        split(spec, 8, 4, layout="Et|(tt|)*30mX")  # unknown symbol
    with pytest.raises(pipeline.LayoutError, match="holds no layer"):
        split(spec, 8, 4, layout="Et||(tt|)*29ttmL")  # v1 is empty


def test_empty_virtual_stage_is_an_error(preset):
    # tiny-dense has 4 layers: pp 4 × vpp 2 = 8 virtual stages cannot all hold one.
    with pytest.raises(pipeline.LayoutError, match="holds no layer"):
        split(preset("tiny-dense"), 4, 2)


def test_microbatches_in_flight_1f1b():
    # rank r of a 1F1B pipeline holds min(pp − r, m) micro-batches (SC21 §2.2).
    ranks = np.arange(4)[None, :]
    got = pipeline.microbatches_in_flight(A([4]), A([1]), A([8.0]), ranks)
    assert got[0].tolist() == [4, 3, 2, 1]
    got = pipeline.microbatches_in_flight(A([4]), A([1]), A([2.0]), ranks)
    assert got[0].tolist() == [2, 2, 2, 1]
    # no pipeline: one micro-batch
    assert pipeline.microbatches_in_flight(A([1]), A([1]), A([8.0]), np.zeros((1, 1), int))[0, 0] == 1


def test_microbatches_in_flight_interleaved():
    # Megatron-Core interleaved schedule: warm-up (pp − r − 1)·2 + (vpp − 1)·pp chunks, +1 in steady
    # state, capped at m·vpp chunks; a chunk is 1/vpp of the stage.
    ranks = np.arange(4)[None, :]
    got = pipeline.microbatches_in_flight(A([4]), A([2]), A([8.0]), ranks)
    expected = [((4 - r - 1) * 2 + (2 - 1) * 4 + 1) / 2 for r in range(4)]
    assert expected == [5.5, 4.5, 3.5, 2.5]
    assert got[0].tolist() == pytest.approx(expected)
    # m = 2: at most m·vpp = 4 chunks = 2 stage micro-batches
    got = pipeline.microbatches_in_flight(A([4]), A([2]), A([2.0]), ranks)
    assert got[0].tolist() == pytest.approx([2.0, 2.0, 2.0, 2.0])


def test_bubble():
    # (pp − 1)/vpp micro-batch times of the slowest stage (SC21 §2.2.2)
    assert pipeline.bubble_s(A([8]), A([4]), A([2.0]))[0] == pytest.approx(7 / 4 * 2.0)


def test_pipeline_p2p_in_result(preset, round_profile):
    # docs/costmodel.md: 2·vpp transfers of T_sp·h·2 bytes per micro-batch over one link.
    # tiny-dense, pp 2 on 2 devices (neighbours 1 apart, same domain): T_sp = 512 tokens, h = 256.
    spec = preset("tiny-dense")
    one = 2 * 512 * 256 / UP + LAT_UP
    for vpp in (1, 2):
        r = evaluate(spec, round_profile, 2, TrainingConfig(pp=2, vpp=vpp, global_batch_size=4))
        m = 4
        assert r["time"]["pp_p2p_s"] == pytest.approx(m * 2 * vpp * one, rel=1e-12)
    # across domains: pp 2 on 16 devices with dp 8, neighbours 8 apart: the NIC
    r = evaluate(spec, round_profile, 16, TrainingConfig(pp=2, global_batch_size=32))
    assert r["time"]["pp_p2p_s"] == pytest.approx(4 * 2 * (2 * 512 * 256 / OUT + LAT_OUT), rel=1e-12)


def test_optimizer_step_in_result(preset, round_profile):
    # docs/costmodel.md: Adam reads and writes 30 B per local parameter at HBM bandwidth
    # (2000 GB/s · 0.8); with the distributed optimizer the local parameters are P/(dp·cp).
    spec = preset("tiny-dense")
    r = evaluate(spec, round_profile, 8, TrainingConfig(tp=2, global_batch_size=8))
    P = r["memory"]["params_gib"] * GIB / 2  # bf16 weights on this device
    assert r["time"]["optimizer_s"] == pytest.approx(30 * P / 4 / (2000e9 * 0.8), rel=1e-12)
    r = evaluate(spec, round_profile, 8, TrainingConfig(tp=2, global_batch_size=8, distributed_optimizer=False))
    assert r["time"]["optimizer_s"] == pytest.approx(30 * P / (2000e9 * 0.8), rel=1e-12)


# ================================================================================================
# memory.py


def test_model_state_bytes_distributed_optimizer():
    # bf16 weights 2 + fp32 grads 4 + Adam 12/d per parameter (d = data-parallel shard)
    params, grads, opt = memory.model_state_bytes(A([1000.0]), A([0.0]), A([4]), A([1]), A([True]))
    assert params[0] == 2000 and grads[0] == 4000 and opt[0] == 12 * 1000 / 4
    assert params[0] + grads[0] + opt[0] == (6 + 12 / 4) * 1000


def test_model_state_bytes_without_distributed_optimizer():
    params, grads, opt = memory.model_state_bytes(A([1000.0]), A([500.0]), A([4]), A([2]), A([False]))
    assert params[0] + grads[0] + opt[0] == 18 * 1500


def test_model_state_bytes_expert_shard():
    # expert weights shard their optimizer over the expert-data-parallel group, dense over dp·cp
    params, grads, opt = memory.model_state_bytes(A([1000.0]), A([800.0]), A([8]), A([2]), A([True]))
    assert opt[0] == pytest.approx(12 * 1000 / 8 + 12 * 800 / 2)
    assert params[0] == 2 * 1800 and grads[0] == 4 * 1800


def test_model_state_in_result_follows_2_4_12(preset, round_profile):
    # dense model, distributed optimizer over dp·cp = 4: grads = 2 × params, optimizer = 6/4 × params
    r = evaluate(preset("tiny-dense"), round_profile, 8,
                 TrainingConfig(tp=2, global_batch_size=8, distributed_optimizer=True))
    m = r["memory"]
    assert m["grads_gib"] == pytest.approx(2 * m["params_gib"], rel=1e-12)
    assert m["optimizer_gib"] == pytest.approx(6 / 4 * m["params_gib"], rel=1e-12)
    r = evaluate(preset("tiny-dense"), round_profile, 8,
                 TrainingConfig(tp=2, global_batch_size=8, distributed_optimizer=False))
    assert r["memory"]["optimizer_gib"] == pytest.approx(6 * r["memory"]["params_gib"], rel=1e-12)


def _shapes(spec, tp, cp=1, mbs=1, sp=True, modules=(), precision="bf16"):
    """The per-config sizes the layer formulas read, built by the model's own constructor from a
    config (so that new fields of ``Shapes`` do not break these tests)."""
    from costmodel.batch import ConfigBatch
    from costmodel.evaluate import _shapes as build

    cfg = TrainingConfig(tp=tp, cp=cp, micro_batch_size=mbs, global_batch_size=mbs, sequence_parallel=sp,
                         recompute="selective" if modules else "none",
                         recompute_modules=list(modules) or None, precision=precision,
                         moe_load_imbalance=1.0)
    s = build(spec, ConfigBatch.from_configs([cfg]), A([1]))
    # the sizes the hand-worked expectations below assume
    T = mbs * spec.seq_length / cp
    assert s.tokens[0] == T and s.tokens_sp[0] == (T / tp if sp else T)
    return s


def test_korthikanti_gpt_layer_sequence_parallel(preset):
    # Korthikanti et al. 2022 §4.2.2, with sequence parallelism every tensor is split over t:
    # 34·sbh/t + 5·a·s²b/t. Without dropout (−1 attention mask sbh, −1 MLP mask sbh) and with
    # FlashAttention (no s² score/softmax tensors; fp32 row statistics 4·s·b·a/t instead):
    s, b, h, a, t = 2048, 1, 2048, 16, 2
    sbh_t = s * b * h / t
    attention = sbh_t * (2 + 2 + 3 * 2 + 2)  # layer input, norm output, Q K V, attention output
    lse = 4 * s * b * a / t
    mlp = sbh_t * (2 + 2 + 2 * 4 + 2 * 4)  # residual, norm output, fc1 output (4h), GeLU output (4h)
    assert attention + mlp == 32 * sbh_t
    got = memory.dense_layer_activation_bytes(preset("gpt-1.3b"), _shapes(preset("gpt-1.3b"), tp=t))[0]
    assert got == pytest.approx(attention + mlp + lse, rel=1e-12)


def test_korthikanti_gpt_layer_fp8(preset):
    # memory.py: with FP8 matmuls the stored GEMM inputs (norm outputs, the fc2 input) are the 1-byte
    # FP8 casts; FlashAttention's Q, K, V and output, norm inputs and fc1 outputs stay BF16.
    s, b, h, a, t = 2048, 1, 2048, 16, 2
    sbh_t = s * b * h / t
    attention = sbh_t * (2 + 1 + 3 * 2 + 2)  # layer input, norm output (fp8), Q K V, attention output
    lse = 4 * s * b * a / t
    mlp = sbh_t * (2 + 1 + 2 * 4 + 1 * 4)  # residual, norm output (fp8), fc1 output, GeLU output (fp8)
    spec = preset("gpt-1.3b")
    got = memory.dense_layer_activation_bytes(spec, _shapes(spec, tp=t, precision="fp8"))[0]
    assert got == pytest.approx(attention + mlp + lse, rel=1e-12)


def test_korthikanti_swiglu_gqa_layer(preset):
    # tiny-dense, tp 2 with SP, mbs 2: T = 1024 tokens, 512 per rank for norms/residuals.
    # GQA: Q a·d, K and V g·d each; SwiGLU: fc1 output 2·ffn, activation output ffn.
    T, t, h, a, g, d, f = 2 * 512, 2, 256, 8, 4, 32, 1024
    norm_side = 2 * (T / t) * h * 4  # layer input, norm1 output, residual, norm2 output
    qkv = 2 * T * (a + 2 * g) * d / t
    out = 2 * T * a * d / t
    lse = 4 * T * a / t
    mlp = 2 * T * (2 * f + f) / t
    got = memory.dense_layer_activation_bytes(preset("tiny-dense"), _shapes(preset("tiny-dense"), tp=t, mbs=2))[0]
    assert got == pytest.approx(norm_side + qkv + out + lse + mlp, rel=1e-12)


def test_without_sequence_parallel_norm_tensors_are_replicated(preset):
    spec = preset("gpt-1.3b")
    s, h, t = 2048, 2048, 2
    with_sp = memory.dense_layer_activation_bytes(spec, _shapes(spec, tp=t, sp=True))[0]
    without = memory.dense_layer_activation_bytes(spec, _shapes(spec, tp=t, sp=False))[0]
    # the four norm/residual tensors (2·s·h each) are no longer split over t (Korthikanti eq. 2 vs 4)
    assert without - with_sp == pytest.approx(4 * 2 * s * h * (1 - 1 / t), rel=1e-12)


def test_full_recompute_keeps_layer_input(preset):
    spec = preset("gpt-1.3b")
    # Korthikanti §4.2: 2·s·b·h/t per layer with SP
    assert memory.full_recompute_layer_bytes(spec, _shapes(spec, tp=4))[0] == 2 * 2048 * 2048 / 4


def test_logits_bytes(preset):
    spec = preset("gpt-1.3b")
    # fp32 logits of the vocabulary-parallel cross-entropy: 4·s·b·V/t
    assert memory.logits_bytes(spec, _shapes(spec, tp=4))[0] == 4 * 2048 * 51200 / 4


def test_activations_in_result_tiny_dense(preset, round_profile):
    # tiny-dense, 2 devices, tp 2 + SP, pp 1, mbs 1, no recompute: the peak stage holds its 4 layers
    # (one micro-batch in flight) and the LM head's fp32 logits + final norm input/output.
    spec = preset("tiny-dense")
    T, t, h, a, g, d, f, V = 512, 2, 256, 8, 4, 32, 1024, 1024
    layer = 2 * (T / t) * h * 4 + 2 * T * (a + 2 * g) * d / t + 2 * T * a * d / t + 4 * T * a / t \
        + 2 * T * 3 * f / t
    head = 4 * T * V / t + 2 * 2 * (T / t) * h
    r = evaluate(spec, round_profile, 2, TrainingConfig(tp=2, global_batch_size=4))
    assert r["memory"]["activations_gib"] * GIB == pytest.approx(4 * layer + head, rel=1e-12)


RECOMPUTE_CASES = [
    ("tiny-dense", "layernorm"),
    ("tiny-dense", "mlp"),
    ("tiny-mla-moe", "layernorm"),
    ("tiny-mla-moe", "mla_up_proj"),
    ("tiny-mla-moe", "mlp"),  # layer 0 is dense
    ("tiny-moe", "moe_act"),
    ("tiny-moe", "moe"),
    ("tiny-moe", "shared_experts"),
]


@pytest.mark.parametrize("model,module", RECOMPUTE_CASES)
def test_each_recompute_module_lowers_activations(preset, round_profile, model, module):
    spec = preset(model)
    kw = dict(tp=2, ep=2 if spec.is_moe else 1, global_batch_size=8)
    none = evaluate(spec, round_profile, 4, TrainingConfig(**kw))
    sel = evaluate(spec, round_profile, 4, TrainingConfig(**kw, recompute="selective",
                                                          recompute_modules=[module]))
    assert none["feasible"] and sel["feasible"]
    assert sel["memory"]["activations_gib"] < none["memory"]["activations_gib"]
    # and it costs forward compute again (FLOPs, for the modules that recompute matmuls or attention)
    assert sel["time"]["compute_s"] > none["time"]["compute_s"]
    assert none["hfu"] == pytest.approx(none["mfu"], rel=1e-12)
    if module in ("core_attn", "mla_up_proj", "mlp", "moe", "shared_experts"):
        assert sel["hfu"] > sel["mfu"]


def test_core_attn_recompute_costs_time_but_keeps_activations(preset, round_profile):
    # docs/costmodel.md: "core_attn: nothing with FlashAttention but the time" — FlashAttention
    # stores no s² tensor, so recomputing the core saves (almost) nothing and repeats its forward.
    spec = preset("tiny-dense")
    none = evaluate(spec, round_profile, 2, TrainingConfig(tp=2, global_batch_size=2))
    sel = evaluate(spec, round_profile, 2, TrainingConfig(tp=2, global_batch_size=2, recompute="selective"))
    assert sel["memory"]["activations_gib"] == pytest.approx(none["memory"]["activations_gib"], rel=1e-12)
    assert sel["time"]["compute_s"] > none["time"]["compute_s"]
    assert sel["hfu"] > sel["mfu"]


def test_each_recompute_module_lowers_layer_bytes(preset):
    # the same at the level of the layer formulas (MLA + MoE layer of tiny-mla-moe)
    spec = preset("tiny-mla-moe")
    base = memory.moe_layer_activation_bytes(spec, _shapes(spec, tp=2))[0]
    for module in ("layernorm", "mla_up_proj", "moe_act", "moe", "shared_experts"):
        assert memory.moe_layer_activation_bytes(spec, _shapes(spec, tp=2, modules=[module]))[0] < base, module
    dense = preset("tiny-dense")
    base = memory.dense_layer_activation_bytes(dense, _shapes(dense, tp=2))[0]
    for module in ("layernorm", "mlp"):
        assert memory.dense_layer_activation_bytes(dense, _shapes(dense, tp=2, modules=[module]))[0] < base, module


# ================================================================================================
# profiles (hardware_profiles.load)


def test_profile_dict_overrides_take_effect(make_profile):
    prof = make_profile("nvidia-h100-80gb", efficiency={"attn_eff": 0.31}, facts={"memory_gib": 96.0})
    hw = Hardware.from_profile(prof)
    assert hw.attn_eff == 0.31 and hw.memory_bytes == 96 * GIB
    # untouched facts stay the base's
    import hardware_profiles

    base = hardware_profiles.raw("nvidia-h100-80gb")
    assert prof.facts["peak_bf16_tflops"].value == base["facts"]["peak_bf16_tflops"]["value"]


def test_profile_with_base_keeps_the_base_calibration():
    import hardware_profiles

    cal = hardware_profiles.calibration("ascend-910b")
    if not cal:
        pytest.skip("no calibration file for ascend-910b")
    plain = hardware_profiles.load("ascend-910b")
    derived = hardware_profiles.load({"base": "ascend-910b",
                                      "facts": {"memory_gib": {"value": 32, "source": "a 32 GB part"}}})
    for key in cal["factors"]:
        assert derived.eff(key) == plain.eff(key), key


# ================================================================================================
# expert-parallel dispatch across nodes (comm.expert_all_to_all_s)


def test_expert_a2a_two_nodes_flat_vs_hierarchical(hw):
    # EP 16 over 2 domains of 8, top-8. Flat: 8/16 of the k copies leave the node, 7 + 8 peer messages.
    # Hierarchical: a token reaches N(1-(1-1/N)^k) = 2(1 - 2^-8) distinct nodes; half of them remote,
    # so the NIC carries 2(1 - 2^-8)/2/8 of the copies; messages to 7 local peers and 1 remote node.
    k, size = 8, 16
    intra = B * 7 / 16 / UP
    flat = max(intra, B * 8 / 16 / OUT) + 7 * LAT_UP + 8 * LAT_OUT
    share = 2 * (1 - 0.5 ** 8) * (8 / 16) / k
    hier = max(intra, B * share / OUT) + 7 * LAT_UP + 1 * LAT_OUT
    got = comm.expert_all_to_all_s(A([B, B]), k, A([1, 1]), A([size, size]), A([False, True]), hw)
    assert got[0] == pytest.approx(flat, rel=1e-12)
    assert got[1] == pytest.approx(hier, rel=1e-12)
    assert got[1] < got[0] / 3  # the NIC phase shrinks ~8x; the scale-up phase now sets the pace


def test_expert_a2a_32_nodes_latency_per_peer(hw):
    # EP 256 over 32 nodes: flat pays a message latency to each of the 248 remote peers, hierarchical
    # to 31 nodes; with k = 8 of 32 nodes the dedup saves little volume (≈ 7.1 distinct nodes).
    k, size = 8, 256
    n_nodes = 32
    distinct = n_nodes * (1 - (1 - 1 / n_nodes) ** k)
    remote = (size - 8) / size
    flat = max(B * 7 / size / UP, B * remote / OUT) + 7 * LAT_UP + 248 * LAT_OUT
    hier = max(B * 7 / size / UP, B * distinct * remote / k / OUT) + 7 * LAT_UP + 31 * LAT_OUT
    got = comm.expert_all_to_all_s(A([B, B]), k, A([1, 1]), A([size, size]), A([False, True]), hw)
    assert got[0] == pytest.approx(flat, rel=1e-12)
    assert got[1] == pytest.approx(hier, rel=1e-12)
    # the same bytes over 32 nodes cost more than over 2 (more peers, more of them remote)
    two = comm.expert_all_to_all_s(A([B]), k, A([1]), A([16]), A([False]), hw)[0]
    assert got[0] > two


def test_expert_a2a_inside_one_node_same_for_both(hw):
    got = comm.expert_all_to_all_s(A([B, B]), 8, A([1, 1]), A([8, 8]), A([False, True]), hw)
    assert got[0] == got[1] == pytest.approx(B * 7 / 8 / UP + 7 * LAT_UP, rel=1e-12)


# ================================================================================================
# model-state bytes: dtypes and sharding stages


@pytest.mark.parametrize("stage, grad_bytes, opt_bytes, expected", [
    (0, 4, 12, 2 + 4 + 12),            # DDP, Megatron-LM defaults: 18 B/param
    (1, 4, 12, 2 + 4 + 12 / 8),        # distributed optimizer (ZeRO-1)
    (1, 2, 10, 2 + 2 + 10 / 8),        # NeMo distributed fused Adam: bf16 grads, param remainders
    (1, 2, 2 + 2 + 2, 2 + 2 + 6 / 8),  # bf16 remainders and bf16 moments
    (2, 4, 12, 2 + 4 / 8 + 12 / 8),    # ZeRO-2: gradients sharded too
    (3, 4, 12, (2 + 4 + 12) / 8),      # ZeRO-3 / FSDP: everything sharded
])
def test_model_state_bytes_dtypes_and_stages(stage, grad_bytes, opt_bytes, expected):
    params, grads, opt = memory.model_state_bytes(A([1000.0]), A([0.0]), A([8]), A([1]), A([stage]),
                                                  A([grad_bytes]), A([opt_bytes]))
    assert params[0] + grads[0] + opt[0] == pytest.approx(expected * 1000, rel=1e-12)


def test_state_dtype_fields_change_the_evaluation(preset, round_profile):
    spec = preset("tiny-dense")
    base = dict(tp=1, pp=1, global_batch_size=16, micro_batch_size=1)
    prof = round_profile
    default = evaluate(spec, prof, 8, TrainingConfig(**base))
    nemo = evaluate(spec, prof, 8, TrainingConfig(**base, main_grads_dtype="bf16", main_params_dtype="bf16",
                                                 exp_avg_dtype="fp32"))
    zero2 = evaluate(spec, prof, 8, TrainingConfig(**base, data_parallel_sharding_strategy="optim_grads"))
    assert nemo["memory"]["grads_gib"] == pytest.approx(default["memory"]["grads_gib"] / 2, rel=1e-9)
    assert nemo["memory"]["optimizer_gib"] == pytest.approx(default["memory"]["optimizer_gib"] * 10 / 12, rel=1e-9)
    assert zero2["memory"]["grads_gib"] == pytest.approx(default["memory"]["grads_gib"] / 8, rel=1e-9)
    # bf16 gradients halve the reduce-scatter volume
    assert nemo["time"]["dp_comm_exposed_s"] <= default["time"]["dp_comm_exposed_s"]


# ================================================================================================
# long sequences and context parallelism


def test_long_sequence_attention_runs_closer_to_peak(hw):
    # One call per layer; 16x the sequence = 16x the FLOPs per call: the fixed per-call cost shrinks
    # relative to the work, so achieved attention FLOP/s rise (FlashAttention on short tiles is slow).
    def rate(seq):
        flops = 8192.0 * seq * 32 * 256  # T · s · heads · (qk + v)
        return flops / compute.attention_core_s(A([flops]), A([flops / 512]), A([1]), hw)[0]
    assert rate(32768) > rate(2048)


def test_ulysses_all_to_all_is_exposed_ring_is_hidden(preset, round_profile):
    spec = model_presets.load({"base": "tiny-dense", "seq_length": 8192})
    base = dict(tp=1, pp=1, cp=4, global_batch_size=8, micro_batch_size=1)
    ring = evaluate(spec, round_profile, 8, TrainingConfig(**base))
    ulysses = evaluate(spec, round_profile, 8, TrainingConfig(**base, cp_comm_type="a2a"))
    hybrid = evaluate(spec, round_profile, 8, TrainingConfig(**base, cp_comm_type="a2a+p2p"))
    assert ring["time"]["cp_comm_s"] == 0.0  # K/V steps behind the attention core
    assert ulysses["time"]["cp_comm_s"] > 0.0
    assert hybrid["time"]["cp_comm_s"] == pytest.approx(ulysses["time"]["cp_comm_s"])  # cp 4 fits in a node
    # Ulysses runs attention in one call per layer instead of four ring steps
    assert ulysses["time"]["compute_s"] < ring["time"]["compute_s"]


# ================================================================================================
# grouped expert GEMMs (compute.grouped_gemm_s, compute.grouped_weight_grad_s)


def test_grouped_gemm_pays_each_experts_size(hw):
    # 4 experts × 2048 tokens, (2048×4096)·(4096×4096): per expert F = 2·2048·4096² FLOP, efficiency
    # 0.8·F/(F + 2 GFLOP) -> (F + 2e9)/(1000e12·0.8) s each; the HBM side (67 MB per expert at
    # 1.6 TB/s, 42 us) is below it. One dense GEMM of the same total size would pay the 2 GFLOP once.
    F = 2.0 * 2048 * 4096 * 4096
    per_expert = (F + 2e9) / (1000e12 * 0.8)
    assert (2048 * 4096 * 2 + 4096 * 4096) * 2 / (2000e9 * 0.8) < per_expert
    got = compute.grouped_gemm_s(A([4 * 2048.0]), 4096, 4096, A([4.0]), hw, A([False]))[0]
    assert got == pytest.approx(4 * per_expert, rel=1e-12)
    assert got > compute.gemm_s(A([4 * 2048.0]), 4096, 4096, hw, A([False]))[0]


def test_grouped_gemm_with_few_tokens_per_expert_reads_every_weight(hw):
    # 64 experts × 16 tokens: compute 64·(F + 2e9)/0.8e15 with F = 2·16·4096² (203 us) is far below
    # reading 64 weight matrices of 4096² bf16 plus the 1024 tokens in and out: 2.2 GB at 1.6 TB/s.
    m = 64 * 16.0
    expected = (m * 4096 + 64 * 4096 * 4096 + m * 4096) * 2 / (2000e9 * 0.8)
    F = 2.0 * 16 * 4096 * 4096
    assert 64 * (F + 2e9) / (1000e12 * 0.8) < expected
    got = compute.grouped_gemm_s(A([m]), 4096, 4096, A([64.0]), hw, A([False]))[0]
    assert got == pytest.approx(expected, rel=1e-12)


def test_expert_weight_gradient_rewrites_the_main_gradient(hw):
    # Weight-gradient grouped GEMM of the same 64 × 16-token experts: the inputs are read (bf16) and
    # each weight's main gradient is read and rewritten: 2·4 B per weight in fp32, 2·2 B in bf16.
    m, k, n, g = 64 * 16.0, 4096, 4096, 64.0
    def expected(accum):
        return ((m * k + m * n) * 2 + 2 * accum * g * k * n) / (2000e9 * 0.8)
    fp32 = compute.grouped_weight_grad_s(A([m]), k, n, A([g]), hw, A([False]), A([4]))[0]
    bf16 = compute.grouped_weight_grad_s(A([m]), k, n, A([g]), hw, A([False]), A([2]))[0]
    assert fp32 == pytest.approx(expected(4), rel=1e-12)
    assert bf16 == pytest.approx(expected(2), rel=1e-12)
    # with 8192 tokens per expert (about 2000 FLOPs per weight byte) the FLOPs dominate again
    big = compute.grouped_weight_grad_s(A([4 * 8192.0]), k, n, A([4.0]), hw, A([False]), A([4]))[0]
    assert big == pytest.approx(compute.grouped_gemm_s(A([4 * 8192.0]), k, n, A([4.0]), hw, A([False]))[0], rel=1e-12)


def test_fine_grained_experts_cost_more_at_equal_flops(preset, round_profile):
    # The same active FLOPs per token split into 4x more, 4x narrower experts (top-k 4x): each
    # expert's GEMM is smaller and every weight is read per micro-batch, so the step is slower.
    coarse = model_presets.load({"base": "tiny-moe"})
    fine = model_presets.load({"base": "tiny-moe", "num_experts": 4 * coarse.num_experts,
                               "moe_router_topk": 4 * coarse.moe_router_topk,
                               "moe_ffn_hidden_size": coarse.expert_ffn // 4})
    cfg = TrainingConfig(tp=1, pp=1, ep=4, global_batch_size=8, micro_batch_size=1)
    a = evaluate(coarse, round_profile, 4, cfg)
    b = evaluate(fine, round_profile, 4, cfg)
    assert b["time"]["compute_s"] > a["time"]["compute_s"]


# ================================================================================================
# the NIC shared by expert dispatch and overlapped data-parallel traffic


def test_expert_dispatch_nic_time_two_nodes(hw):
    # EP 16 over 2 nodes of 8, flat: half of the k copies (8 of 16 ranks remote) cross the NIC at
    # 50 GB/s · 0.8; hierarchical: the expected distinct remote nodes per token, 2·(1 − (1/2)^k) · 1/2,
    # over k copies. Scale-up traffic never counts.
    B, k = 64e6, 4
    nic = 50e9 * 0.8
    got = comm.expert_all_to_all_nic_s(A([B, B]), k, A([1, 1]), A([16, 16]), A([False, True]), hw)
    assert got[0] == pytest.approx(B * 8 / 16 / nic, rel=1e-12)
    assert got[1] == pytest.approx(B * 2 * (1 - 0.5**k) * 0.5 / k / nic, rel=1e-12)
    inside = comm.expert_all_to_all_nic_s(A([B]), k, A([1]), A([8]), A([False]), hw)
    assert inside[0] == 0.0


def test_overlapped_dp_traffic_shares_the_nic_with_expert_dispatch(round_profile):
    # One micro-batch per step, so the gradient reduce-scatter and parameter all-gather over dp 16
    # (two nodes) must hide behind a single backward / forward pass, in which the EP 16 dispatch holds
    # the NIC too: the flat dispatch (more NIC time) leaves DP less of the window than the
    # hierarchical one. Inside one node (EP 8) the NIC carries no dispatch: no difference.
    spec = model_presets.load({"base": "tiny-moe", "num_experts": 32, "moe_router_topk": 4})
    def dp_exposed(ep, alg, overlap=True):
        cfg = TrainingConfig(tp=1, pp=1, ep=ep, global_batch_size=16, micro_batch_size=1, moe_a2a_algorithm=alg,
                             overlap_grad_reduce=overlap, overlap_param_gather=overlap)
        return evaluate(spec, round_profile, 16, cfg)["time"]["dp_comm_exposed_s"]
    assert dp_exposed(16, "flat") > dp_exposed(16, "hierarchical")
    assert dp_exposed(8, "flat") == dp_exposed(8, "hierarchical")
    # without overlap nothing runs beside the dispatch: the sync is exposed whole either way
    assert dp_exposed(16, "flat", overlap=False) == dp_exposed(16, "hierarchical", overlap=False)

"""Attention kernels: FlashAttention's sequence fill, the unfused path that materialises the
s x s scores, unfused element-wise activations and Gemma-2's soft-capping. Every number is worked by hand
from the formula in docs/costmodel.md on the round test profile (conftest ROUND_FACTS/ROUND_EFFICIENCY:
peak 1000 TFLOP/s, attn_eff 0.5, gemm_eff_max 0.8, half-efficiency GEMM 2 GFLOP, HBM 2000 GB/s x 0.8 =
1.6e12 B/s, 3.9e12 softmax scores/s)."""

from __future__ import annotations

import numpy as np
import pytest

import model_presets
from app.formats.hf_config import to_spec_data
from app.formats.launch import launch_args
from costmodel import compute, layers, memory
from costmodel.hardware import Hardware
from costmodel.result import evaluate
from costmodel.spec import TrainingConfig

A = np.asarray
HBM = 2000e9 * 0.8


@pytest.fixture
def hw(round_profile) -> Hardware:
    return Hardware.from_profile(round_profile)


# ---- FlashAttention's sequence fill -----------------------------------------------------------------

def test_flash_fill_is_half_at_512_keys_and_three_quarters_at_1536():
    # s / (s + 512): 512/1024 = 0.5, 1536/2048 = 0.75, 32768/33280 = 0.98462
    assert compute.flash_attention_fill(A([512.0, 1536.0, 32768.0])) == pytest.approx([0.5, 0.75, 32768 / 33280])


def test_flash_core_at_1536_keys_runs_at_three_quarters_of_attn_eff(hw):
    # (F + 2e9) / (1000e12 · 0.5 · 0.75) + S / 3.9e12; the softmax part does not fill
    F, S = 5e11, 1e9
    got = compute.attention_core_s(A([F]), A([S]), A([1]), hw, A([1536.0]))[0]
    assert got == pytest.approx((F + 2e9) / (1000e12 * 0.5 * 0.75) + S / 3.9e12, rel=1e-12)
    bwd = compute.attention_core_bwd_s(A([F]), A([S]), A([1]), hw, A([1536.0]))[0]
    assert bwd == pytest.approx(2.5 * (F + 2e9) / (1000e12 * 0.5 * 0.75) + S / 3.9e12, rel=1e-12)


def test_ring_attention_fills_on_its_chunk_not_the_sequence(round_profile):
    # tiny-dense at s = 4096, cp 4: the ring (p2p) runs 4 calls of 1024 keys each, fill 1024/1536 = 2/3;
    # Ulysses (a2a) one call over all 4096 keys, fill 4096/4608 = 8/9. Forward core per layer, T = 1024
    # queries, 8 heads, qk + v = 64: F = T·s·a·64 = 2.1475e9 FLOP, S = F/128 = 1.6777e7 scores:
    # ring   (F + 4·2e9)/(1e15·0.5·2/3) + S/3.9e12
    # Ulysses (F + 2e9)/(1e15·0.5·8/9) + S/3.9e12
    spec = model_presets.load({"base": "tiny-dense", "seq_length": 4096})
    base = dict(tp=1, pp=1, cp=4, global_batch_size=2, micro_batch_size=1)
    F = 1024 * 4096 * 8 * 64.0
    S = F / 128
    ring = (F + 4 * 2e9) / (1e15 * 0.5 * 2 / 3) + S / 3.9e12
    ulysses = (F + 2e9) / (1e15 * 0.5 * 8 / 9) + S / 3.9e12
    from costmodel.batch import ConfigBatch
    from costmodel.evaluate import _layer_inputs, _shapes as build
    for kind, expected in (("p2p", ring), ("a2a", ulysses)):
        b = ConfigBatch.from_configs([TrainingConfig(**base, cp_comm_type=kind)])
        hw = Hardware.from_profile(round_profile)
        ctx, _ = _layer_inputs(spec, hw, b, build(spec, b, np.array([2])))
        fwd, _ = layers._attention_core(ctx, A([F]), A([S]), layers._cp_degrees(ctx)[1])
        assert fwd[0] == pytest.approx(expected, rel=1e-12)


# ---- unfused attention: time ------------------------------------------------------------------------

def test_unfused_attention_forward_by_hand(hw):
    # 16 problems (micro-batch x local heads) of 2048 queries x 2048 keys, head dim 128.
    # QK^T per problem: 2·2048·128·2048 = 1.0737e9 FLOP at 0.8·F/(F+2e9) = 0.2795 -> 3.84e-6 s, but its
    # HBM roofline (2048·128 + 128·2048 + 2048²)·2 B = 9,437,184 B / 1.6e12 = 5.898e-6 s binds; PV the same
    # (2048·2048 + 2048·128 + 2048·128). Both: 2 · 16 · 5.898e-6 = 1.8874e-4 s.
    # Softmax + dropout: 9 B per score · 2048² · 16 = 603,979,776 B / 1.6e12 = 3.7749e-4 s.
    gemm = 16 * 9_437_184 / HBM
    soft = 9 * 2048 * 2048 * 16 / HBM
    got = compute.unfused_attention_fwd_s(A([2048.0]), 2048, 128, 128, A([16.0]), hw)[0]
    assert got == pytest.approx(2 * gemm + soft, rel=1e-12)
    assert got == pytest.approx(5.6623e-4, rel=1e-4)
    # Backward: each GEMM twice, 11 B per score (dropout gradient 2+1+2, softmax gradient 2+2+2)
    bwd = compute.unfused_attention_bwd_s(A([2048.0]), 2048, 128, 128, A([16.0]), hw)[0]
    assert bwd == pytest.approx(4 * gemm + 11 * 2048 * 2048 * 16 / HBM, rel=1e-12)


def test_unfused_attention_costs_more_time_and_the_default_is_flash(round_profile):
    spec = model_presets.load({"base": "tiny-dense", "seq_length": 2048})
    base = dict(tp=1, pp=1, global_batch_size=8, micro_batch_size=1)
    default = evaluate(spec, round_profile, 8, TrainingConfig(**base))
    flash = evaluate(spec, round_profile, 8, TrainingConfig(**base, attention_kernel="flash"))
    unfused = evaluate(spec, round_profile, 8, TrainingConfig(**base, attention_kernel="unfused"))
    assert default == flash
    assert unfused["time"]["compute_s"] > flash["time"]["compute_s"]


# ---- unfused attention: memory ----------------------------------------------------------------------

def _shapes(unfused, modules=0, tokens=2048.0, seq=2048.0, tp=1):
    one = lambda v, dt=np.float64: np.array([v], dtype=dt)  # noqa: E731
    return memory.Shapes(tokens=one(tokens), tokens_sp=one(tokens / tp), tokens_moe=one(tokens / tp),
                         routed=one(0.0), routed_mean=one(0.0), tp=one(tp, np.int64), cp=one(1, np.int64),
                         ep=one(1, np.int64), etp=one(1, np.int64), modules=one(modules, np.int64),
                         gemm_input_bytes=one(2.0), offload=one(0, np.int64), seq_kv=seq,
                         unfused_attention=one(unfused, bool))


def test_unfused_attention_stores_korthikantis_five_bytes_per_score():
    # tiny-dense (8 heads), b = 1, s = 2048, tp 2: Korthikanti's 5·a·s²·b/t = 5 · 8 · 2048² / 2 = 83,886,080 B
    # more than FlashAttention, which instead keeps its fp32 row statistics 4 · T · a/t = 4 · 2048 · 4 = 32,768 B.
    spec = model_presets.load({"base": "tiny-dense", "seq_length": 2048})
    flash = memory.attention_activation_bytes(spec, _shapes(False, tp=2))[0]
    unfused = memory.attention_activation_bytes(spec, _shapes(True, tp=2))[0]
    assert unfused - flash == 5 * 8 * 2048 * 2048 / 2 - 4 * 2048 * 4
    # Selective recompute of core_attn drops exactly the s² tensors (Korthikanti §5)
    from costmodel.batch import MODULE_BITS
    sel = memory.attention_activation_bytes(spec, _shapes(True, MODULE_BITS["core_attn"], tp=2))[0]
    flash_sel = memory.attention_activation_bytes(spec, _shapes(False, MODULE_BITS["core_attn"], tp=2))[0]
    assert sel == flash_sel - 4 * 2048 * 4
    # ... which the recomputation rebuilds for the layer's backward: 2 B of raw scores + 5 B per score
    assert memory.unfused_transient_bytes(spec, _shapes(True, MODULE_BITS["core_attn"], tp=2))[0] == \
        7 * 8 * 2048 * 2048 / 2
    assert memory.unfused_transient_bytes(spec, _shapes(False, tp=2))[0] == 0.0


def test_unfused_attention_with_context_parallelism_is_infeasible(round_profile):
    spec = model_presets.load({"base": "tiny-dense", "seq_length": 2048})
    r = evaluate(spec, round_profile, 8, TrainingConfig(cp=2, global_batch_size=8, attention_kernel="unfused"))
    assert [x["code"] for x in r["infeasible_reasons"]] == ["unfused_attention_cp"]
    ok = evaluate(spec, round_profile, 8, TrainingConfig(cp=2, global_batch_size=8))
    assert ok["infeasible_reasons"] == []


# ---- element-wise work: activations and soft-capping ------------------------------------------------

def test_activation_bytes_fused_and_unfused():
    # per token and ffn column: fused SwiGLU reads 2 halves and writes 1 (6 B); plain fused GELU 4 B;
    # unfused GeGLU-tanh: 6 unary kernels (4 B) + 2 binary (6 B) + the gate product (6 B) = 42 B;
    # unfused SwiGLU: F.silu (4) + gate product (6) = 10 B.
    T, w = 100.0, 10.0
    swiglu = model_presets.load({"base": "tiny-dense"})
    gelu = model_presets.load({"base": "tiny-dense", "swiglu": False})
    geglu_tanh = model_presets.load({"base": "tiny-dense", "activation_func": "gelu_tanh",
                                     "bias_activation_fusion": False})
    silu_unfused = model_presets.load({"base": "tiny-dense", "bias_activation_fusion": False})
    assert layers.activation_bytes(swiglu, T, w) == 6 * T * w
    assert layers.activation_bytes(gelu, T, w) == 4 * T * w
    assert layers.activation_bytes(geglu_tanh, T, w) == 42 * T * w
    assert layers.activation_bytes(silu_unfused, T, w) == 10 * T * w
    # stating the default activation changes nothing
    assert layers.activation_bytes(model_presets.load({"base": "tiny-dense", "activation_func": "silu"}), T, w) \
        == 6 * T * w


def _compute_s(round_profile, **spec_fields):
    spec = model_presets.load({"base": "tiny-dense", **spec_fields})
    cfg = TrainingConfig(tp=1, pp=1, global_batch_size=8, micro_batch_size=1)
    return evaluate(spec, round_profile, 8, cfg)["time"]["compute_s"]


def test_unfused_geglu_tanh_step_time_by_hand(round_profile):
    # tiny-dense: 4 layers, T = 512 tokens, ffn 1024, tp 1, one micro-batch per device (8 / (1·8)).
    # Activation bytes per layer go from 6 to 42 per element: +36 · 512 · 1024 B = 18,874,368 B forward,
    # twice in the backward: 3 · 18,874,368 / 1.6e12 = 3.5389e-5 s per layer, 4 layers: 1.41558e-4 s.
    base = _compute_s(round_profile)
    slow = _compute_s(round_profile, activation_func="gelu_tanh", bias_activation_fusion=False)
    assert slow - base == pytest.approx(4 * 3 * 36 * 512 * 1024 / HBM, rel=1e-9)


def test_final_logit_softcapping_by_hand(round_profile):
    # three 4-B passes per logit, T · V/tp = 512 · 1024 logits: 12 · 524,288 B forward, twice backward:
    # 36 · 524,288 / 1.6e12 = 1.17965e-5 s
    base = _compute_s(round_profile)
    capped = _compute_s(round_profile, final_logit_softcapping=30.0)
    assert capped - base == pytest.approx(36 * 512 * 1024 / HBM, rel=1e-9)


def test_attention_softcapping_adds_one_special_function_per_score(round_profile):
    # causal scores per layer T · s/2 · a/tp = 512 · 256 · 8 = 1,048,576, one more tanh each in the forward
    # and in the backward's recomputation: 4 layers · 2 · 1,048,576 / 3.9e12 = 4.3018e-6 s
    base = _compute_s(round_profile)
    capped = _compute_s(round_profile, attn_logit_softcapping=50.0)
    assert capped - base == pytest.approx(4 * 2 * 512 * 256 * 8 / 3.9e12, rel=1e-9)


# ---- inputs and launch ------------------------------------------------------------------------------

def test_hf_config_reads_gemma2_activation_and_caps():
    hf = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
          "intermediate_size": 128, "vocab_size": 100, "hidden_activation": "gelu_pytorch_tanh",
          "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0}
    spec = to_spec_data(hf)
    assert (spec["activation_func"], spec["final_logit_softcapping"], spec["attn_logit_softcapping"]) == \
        ("gelu_tanh", 30.0, 50.0)
    assert "activation_func" not in to_spec_data({**hf, "hidden_activation": "silu"})


def test_launch_flags_of_the_attention_kernel_and_gemma2_fields():
    spec = model_presets.load({"base": "tiny-dense", "activation_func": "gelu_tanh",
                               "final_logit_softcapping": 30.0})
    flash, unfused = TrainingConfig(global_batch_size=8), TrainingConfig(global_batch_size=8, attention_kernel="unfused")
    ms = launch_args(flash, spec, "mindspeed")
    assert "--use-flash-attn" in ms and "--gelu-tanh" in ms and "--swiglu" not in ms
    assert ms[ms.index("--output-logit-softcapping") + 1] == "30"
    assert "--use-flash-attn" not in launch_args(unfused, spec, "mindspeed")
    mg = launch_args(unfused, spec, "megatron")
    assert mg[mg.index("--attention-backend") + 1] == "unfused"
    assert "--attention-backend" not in launch_args(flash, spec, "megatron")


def _mla_core_s(profile_name: str, without_pad: bool) -> float:
    """Attention-core forward time of one tiny-mla-moe layer (qk 32 + rope 16 = 48, v 32) on a profile."""
    import hardware_profiles
    from costmodel import ConfigBatch
    from costmodel.evaluate import _layer_inputs, _shapes

    spec = model_presets.load("tiny-mla-moe")
    cfg = TrainingConfig(global_batch_size=8, mla_fa_without_pad=without_pad)
    b = ConfigBatch.from_configs([cfg])
    hw = Hardware.from_profile(hardware_profiles.load(profile_name))
    ctx, _ = _layer_inputs(spec, hw, b, _shapes(spec, b, np.array([1])))
    core_flops = b.micro_batch_size * spec.seq_length * spec.seq_length * spec.num_attention_heads * (
        spec.qk_dim + spec.v_dim)
    return float((core_flops * layers._padded_v_ratio(ctx))[0]), float(core_flops[0])


def test_mindspeed_pads_the_mla_value_head_on_ascend_only():
    """MindSpeed-LLM's MLA pads V (32) to the QK head dim (48) before the Ascend flash kernel: the core
    runs (48 + 48) / (48 + 32) = 1.2 times the work; --mla-fa-without-pad and GPU profiles do not pad."""
    padded, model = _mla_core_s("ascend-910b", without_pad=False)
    assert padded == pytest.approx(model * 96 / 80)
    assert _mla_core_s("ascend-910b", without_pad=True)[0] == pytest.approx(model)
    assert _mla_core_s("nvidia-h100-80gb", without_pad=False)[0] == pytest.approx(model)


def test_padding_slows_the_step_but_not_the_model_flops():
    spec = model_presets.load("tiny-mla-moe")
    import hardware_profiles

    prof = hardware_profiles.load("ascend-910b")
    pad = evaluate(spec, prof, 8, TrainingConfig(global_batch_size=8))
    nopad = evaluate(spec, prof, 8, TrainingConfig(global_batch_size=8, mla_fa_without_pad=True))
    assert pad["step_time_s"] > nopad["step_time_s"]
    # MFU counts the model's FLOPs: per token the same, so MFU scales with tokens/s alone
    assert pad["mfu"] / nopad["mfu"] == pytest.approx(pad["tokens_per_s"] / nopad["tokens_per_s"])
    assert launch_args({"global_batch_size": 8, "mla_fa_without_pad": True}, spec, "mindspeed").count(
        "--mla-fa-without-pad") == 1

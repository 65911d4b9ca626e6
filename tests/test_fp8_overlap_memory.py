"""What FP8 and the all-to-all overlap cost, and the memory DeepSeek-V3-style runs save.

Each test works its numbers by hand from the formula in docs/costmodel.md ("FP8 and the all-to-all
overlap: their costs", "Memory that DeepSeek-V3-style runs save") and asserts the model's value.
"""

from dataclasses import replace

import numpy as np
import pytest

import hardware_profiles
import model_presets
from app.formats.launch import InexpressibleError, launch_args
from costmodel import ConfigBatch, ModelSpec, TrainingConfig, evaluate, evaluate_batch
from costmodel import layers
from costmodel.compute import FP8_QUANTISE_BYTES, fp8_half_flops, fp8_quantise_s, gemm_s
from costmodel.evaluate import _layer_inputs, _shapes
from costmodel.hardware import Hardware

H100 = "nvidia-h100-80gb"
MIB = 2.0**20

# One layer, h 1024, 8 heads of 128 (no GQA), SwiGLU ffn 4096, seq 1024: T = 1024 tokens at tp 1.
DENSE = ModelSpec(num_layers=1, hidden_size=1024, num_attention_heads=8, ffn_hidden_size=4096, vocab_size=1024,
                  seq_length=1024)


def _hw(**changes) -> Hardware:
    return replace(Hardware.from_profile(hardware_profiles.load(H100)), **changes)


def _one(spec, cfg: dict, devices=1, cluster=H100):
    return evaluate_batch(spec, hardware_profiles.load(cluster), devices,
                          ConfigBatch.from_configs([TrainingConfig(global_batch_size=1, **cfg)]))


# ---- FP8 GEMM efficiency by size -----------------------------------------------------------------

def test_fp8_gemm_keeps_the_fixed_time_per_call():
    # peak BF16 1e15, FP8 2e15 (ratio 1), eff_max 1, half size 1e9 FLOPs, HBM out of the way.
    hw = _hw(peak_bf16_flops=1e15, peak_fp8_flops=2e15, fp8_gemm_eff_ratio=1.0, gemm_eff_max=1.0,
             gemm_half_flops=1e9, hbm_bytes_per_s=1e30)
    # FP8 half size = 1e9 · 2e15 / 1e15 = 2e9 FLOPs
    assert fp8_half_flops(hw) == pytest.approx(2e9)
    # small GEMM 500×1000×1000: F = 1e9.  BF16: eff 1e9/(1e9+1e9) = 1/2 -> 1e9/(1e15/2) = 2 us.
    # FP8: eff 1e9/(1e9+2e9) = 1/3 -> 1e9/(2e15/3) = 1.5 us (was 1 us with the BF16 half size):
    # the fixed 1 us per call stays, only the 1 us of FLOPs halves.
    small = (500.0, 1000.0, 1000.0)
    assert gemm_s(*small, hw, np.array([False]))[0] == pytest.approx(2e-6)
    assert gemm_s(*small, hw, np.array([True]))[0] == pytest.approx(1.5e-6)
    # large GEMM 5000×10000×10000: F = 1e12. BF16 1e12/1e15 · (1 + 1e-3) = 1.001 ms;
    # FP8 1e12/2e15 · (1 + 2e-3) = 0.501 ms: the full rate ratio.
    large = (5000.0, 10000.0, 10000.0)
    assert gemm_s(*large, hw, np.array([False]))[0] == pytest.approx(1.001e-3)
    assert gemm_s(*large, hw, np.array([True]))[0] == pytest.approx(0.501e-3)


# ---- FP8 quantisation per GEMM operand -----------------------------------------------------------

def test_quantise_bytes_per_recipe():
    # read bf16 (2) + FP8 row-wise (1) + column-wise (1); current scaling's amax pass reads again (2)
    assert FP8_QUANTISE_BYTES == {"delayed": 4.0, "tensorwise": 6.0, "blockwise": 4.0, "mxfp8": 4.0}
    # 1e6 elements at 6 B over 1e12 B/s: 6 us
    assert fp8_quantise_s(1e6, 6.0, _hw(hbm_bytes_per_s=1e12)) == pytest.approx(6e-6)


def test_current_scaling_adds_one_read_per_cast_element():
    # T = 1024. Attention (tp 1, no GQA): QKV (T, 1024) -> 3072 and proj (T, 1024) -> 1024:
    #   forward casts T·1024 + T·1024 = 2,097,152; backward casts T·3072 + T·1024 = 4,194,304.
    # SwiGLU MLP: fc1 (T, 1024) -> 8192, fc2 (T, 4096) -> 1024:
    #   forward T·(1024 + 4096) = 5,242,880; backward T·(8192 + 1024) = 9,437,184.
    # Sum 20,971,520 elements, cast once per micro-batch (m = 1, one layer); tensorwise moves 2 B more
    # per element than delayed: 41,943,040 B over the profile's achievable HBM bandwidth.
    base = {"precision": "fp8"}
    delayed = _one(DENSE, {**base, "fp8_recipe": "delayed"})
    current = _one(DENSE, {**base, "fp8_recipe": "tensorwise"})
    mx = _one(DENSE, {**base, "fp8_recipe": "mxfp8"})
    hw = Hardware.from_profile(hardware_profiles.load(H100))
    extra = current.time["compute_s"][0] - delayed.time["compute_s"][0]
    assert extra == pytest.approx(41_943_040 / hw.hbm_bytes_per_s, rel=1e-9)
    assert mx.time["compute_s"][0] == pytest.approx(delayed.time["compute_s"][0])


def test_unstated_recipe_follows_the_export_rule():
    # layernorm recomputed in fp8: the export states tensorwise (Megatron's delayed scaling refuses it),
    # and the model prices the same recipe
    cfg = {"precision": "fp8", "recompute": "selective", "recompute_modules": ["layernorm"]}
    assert TrainingConfig(global_batch_size=1, **cfg).fp8_recipe_in_force == "tensorwise"
    assert _one(DENSE, cfg).step_time_s[0] == pytest.approx(
        _one(DENSE, {**cfg, "fp8_recipe": "tensorwise"}).step_time_s[0])
    assert TrainingConfig(global_batch_size=1, precision="fp8").fp8_recipe_in_force == "delayed"
    with pytest.raises(ValueError, match="fp8_recipe applies to precision fp8"):
        TrainingConfig(global_batch_size=1, fp8_recipe="tensorwise")


def test_bf16_pays_no_cast():
    spec, hw = DENSE, Hardware.from_profile(hardware_profiles.load(H100))
    b = ConfigBatch.from_configs([TrainingConfig(global_batch_size=1), TrainingConfig(global_batch_size=1,
                                                                                      precision="fp8")])
    ctx, _ = _layer_inputs(spec, hw, b, _shapes(spec, b, np.ones(2, dtype=np.int64)))
    assert list(ctx.fp8_quant_bytes) == [0.0, 4.0]


# ---- the delayed weight gradients under the all-to-all overlap ------------------------------------

def test_delayed_attention_wgrad_hides_no_all_to_all():
    # tiny-moe with 16 experts over ep 16 on two H100 nodes (flat dispatch), the overlap hiding all it
    # can (ep_overlap 1), no launch overhead and a slow NIC (100 MB/s): every MoE layer is bound by its
    # all-to-all, exposed = max(t·(1 − 1), t − window) = t − window.
    spec = model_presets.load("tiny-moe").model_copy(update={"num_experts": 16})
    profile = hardware_profiles.load(H100)
    hw = replace(Hardware.from_profile(profile), ep_overlap=1.0, layer_overhead_s=0.0, scale_out_bytes_per_s=1e8)
    cfg = {"ep": 16, "moe_a2a_overlap": True, "global_batch_size": 16, "moe_a2a_algorithm": "flat"}
    b = ConfigBatch.from_configs([TrainingConfig(**cfg, delay_wgrad_compute=False), TrainingConfig(**cfg)])
    assert list(b.delays_wgrad()) == [False, True]  # unstated: on with the overlap (Megatron's MoE README)
    r = evaluate_batch(spec, profile, 16, b, hw=hw)
    ctx, _ = _layer_inputs(spec, hw, b, _shapes(spec, b, np.full(2, 16)))
    moe = layers.moe_layer(ctx)
    # the delayed part is the attention projections' weight gradient: one forward GEMM time D
    assert moe.delayed_wgrad_s == pytest.approx(layers.attention_block(ctx).gemm_fwd_s)
    # window = fwd + bwd, less D when delayed; m = 16 / (1 · 16) = 1 micro-batch; 5 MoE layers and the
    # MTP layer (an MoE layer plus the MTP extras, a wider window): ep_comm = 5·(t − W) + (t − W − mtp),
    # so delaying adds 6·D.
    t = moe.ep_fwd_s + moe.ep_bwd_s
    window = moe.fwd_s + moe.bwd_s - np.array([0.0, 1.0]) * moe.delayed_wgrad_s
    mtp = layers.mtp_extra(ctx)
    mtp_window = window + mtp.fwd_s + mtp.bwd_s
    assert (t > mtp_window).all()
    assert r.time["ep_comm_s"] == pytest.approx(5 * (t - window) + (t - mtp_window), rel=1e-9)
    assert r.time["ep_comm_s"][1] - r.time["ep_comm_s"][0] == pytest.approx(6 * moe.delayed_wgrad_s[1], rel=1e-6)
    with pytest.raises(ValueError, match="delay_wgrad_compute needs moe_a2a_overlap"):
        TrainingConfig(global_batch_size=8, delay_wgrad_compute=True)


def test_delay_wgrad_export():
    spec = model_presets.load("tiny-moe")
    cfg = TrainingConfig(ep=8, pp=2, vpp=2, moe_a2a_overlap=True, global_batch_size=8)
    args = launch_args(cfg, spec, "megatron", 8)
    assert "--overlap-moe-expert-parallel-comm" in args and "--delay-wgrad-compute" in args
    off = launch_args(cfg.model_copy(update={"delay_wgrad_compute": False}), spec, "megatron", 8)
    assert "--delay-wgrad-compute" not in off
    with pytest.raises(InexpressibleError, match="delay_wgrad_compute"):
        launch_args(cfg.model_copy(update={"delay_wgrad_compute": True}), spec, "mindspeed", 8)


# ---- memory: the SwiGLU input in FP8, the EMA, the MTP head under DualPipe --------------------------

def test_activation_func_fp8_input_store_halves_the_swiglu_input():
    # the fc1 output is T × 2·ffn = 1024 × 8192 elements: 2 B -> 1 B saves 8,388,608 B = 8 MiB per
    # layer and micro-batch in flight (one here)
    on = _one(DENSE, {"activation_func_fp8_input_store": True})
    off = _one(DENSE, {})
    assert off.activations_bytes[0] - on.activations_bytes[0] == pytest.approx(8 * MIB)
    assert on.step_time_s[0] == off.step_time_s[0]  # memory only
    gelu = DENSE.model_copy(update={"swiglu": False})
    assert _one(gelu, {"activation_func_fp8_input_store": True}).broken["fp8_input_store_needs_swiglu"][0]
    with pytest.raises(InexpressibleError, match="activation_func_fp8_input_store"):  # no CLI flag
        launch_args(TrainingConfig(global_batch_size=1, activation_func_fp8_input_store=True), DENSE, "megatron", 8)


def test_routed_experts_store_their_swiglu_input_in_fp8():
    # tiny-moe: tokens 512 (tp 1), top-2: 1024 routed copies, each with a fc1 output of 2 · 256:
    # 1024 · 512 · 1 B = 512 KiB per MoE layer; shared expert (256 wide): 512 · 512 · 1 B = 256 KiB;
    # the dense first layer (ffn 1024): 512 · 2048 · 1 B = 1 MiB. 5 MoE layers + 1 dense + the MTP
    # layer (an MoE layer): 6 · (512 + 256) KiB + 1 MiB = 5.5 MiB, one micro-batch in flight.
    spec = model_presets.load("tiny-moe")
    on = _one(spec, {"activation_func_fp8_input_store": True, "moe_load_imbalance": 1.0})
    off = _one(spec, {"moe_load_imbalance": 1.0})
    assert off.activations_bytes[0] - on.activations_bytes[0] == pytest.approx(5.5 * MIB)


def test_parameter_ema_on_the_device_costs_4_bytes_per_parameter():
    none = _one(DENSE, {})
    device = _one(DENSE, {"parameter_ema": "device"})
    host = _one(DENSE, {"parameter_ema": "host"})
    # weights are 2 B per parameter on one device: the fp32 EMA is twice the weights
    assert device.optimizer_bytes[0] - none.optimizer_bytes[0] == pytest.approx(2 * none.params_bytes[0])
    assert host.peak_bytes[0] == none.peak_bytes[0]  # DeepSeek-V3 §3.2.3: in CPU memory
    with pytest.raises(InexpressibleError, match="parameter_ema"):
        launch_args(TrainingConfig(global_batch_size=1, parameter_ema="host"), DENSE, "megatron", 8)


def test_mtp_uses_the_rank_s_own_embedding_under_dualpipe():
    spec, hw = model_presets.load("tiny-moe"), Hardware.from_profile(hardware_profiles.load(H100))
    configs = [TrainingConfig(pp=2, global_batch_size=8), TrainingConfig(pp=2, pipeline_schedule="dualpipe", global_batch_size=8),
               TrainingConfig(pp=2, pipeline_schedule="dualpipev", global_batch_size=8), TrainingConfig(global_batch_size=8)]
    b = ConfigBatch.from_configs(configs)
    _, head_weights = _layer_inputs(spec, hw, b, _shapes(spec, b, np.ones(4, dtype=np.int64)))
    # 1F1B pp 2: output head + the embedding copy MTP needs on the last stage (2 matrices of V·h);
    # DualPipe(V): the first and last stages share rank 0, whose embedding MTP uses (1); pp 1: 1
    assert list(head_weights) == [2, 1, 1, 1]


def test_deepseek_v3_dualpipe_fits_with_its_memory_measures():
    # examples/deepseek-v3-2048-dualpipe.json needed 126.6 GiB of 80 before this change (93.1 with
    # the recompute); with DeepSeek-V3's own measures stated (§3.2.3 recompute of RMSNorm and the MLA
    # up-projections, SwiGLU output recomputed and its input cached in FP8, §3.3.3 BF16 moments, the EMA
    # on the host) it fits: 75.9 GiB.
    spec, profile = model_presets.load("deepseek-v3-671b"), hardware_profiles.load(H100)
    base = {"tp": 1, "pp": 16, "ep": 64, "global_batch_size": 15360, "precision": "fp8",
            "pipeline_schedule": "dualpipe", "moe_a2a_overlap": True}
    stated = {**base, "recompute": "selective", "recompute_modules": ["layernorm", "mla_up_proj", "moe_act"],
              "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16", "activation_func_fp8_input_store": True,
              "parameter_ema": "host"}
    assert evaluate(spec, profile, 2048, TrainingConfig(**base))["memory"]["peak_gib"] > 80
    r = evaluate(spec, profile, 2048, TrainingConfig(**stated))
    assert r["memory"]["peak_gib"] == pytest.approx(75.9, abs=0.1)
    assert r["feasible"]


def test_search_pins_of_the_new_fields():
    from search import build_space
    from search.space import SpaceError, validate_fixed

    spec, profile = model_presets.load("tiny-moe"), hardware_profiles.load(H100)
    # the recipe is validated beside fp8 (the search's --precision), the delay beside the overlap
    assert validate_fixed({"fp8_recipe": "tensorwise"}, 64) == {"fp8_recipe": "tensorwise"}
    with pytest.raises(SpaceError, match="fp8_recipe"):
        build_space(spec, profile, 8, 64, precision="bf16", fixed={"fp8_recipe": "tensorwise"})
    with pytest.raises(SpaceError, match="delay_wgrad_compute"):
        build_space(spec, profile, 8, 64, precision="bf16", fixed=validate_fixed({"delay_wgrad_compute": True}, 64))
    space = build_space(spec, profile, 8, 64, precision="fp8", framework="megatron",
                        fixed=validate_fixed({"fp8_recipe": "tensorwise", "parameter_ema": "none"}, 64))
    assert space.constants == {"fp8_recipe": "tensorwise", "parameter_ema": "none"}

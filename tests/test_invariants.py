"""Invariants of the evaluation that hold whatever the calibrated numbers are.

Random configs come from the seeded sampler in conftest.py; each group is scored as one batch and
read through the contract's result dict.
"""

from __future__ import annotations

import json
import math
import re
import warnings

import numpy as np
import pytest

from costmodel import ConfigBatch, evaluate, evaluate_batch, model_flops_per_token, pipeline
from costmodel.batch import NO_VALUE
from costmodel.result import evaluate_many, result_dict
from costmodel.spec import RECOMPUTE_MODULES, TrainingConfig

from conftest import load_preset, load_profile, sample_config

GROUPS = [
    ("tiny-dense", "nvidia-h100-80gb", 8),
    ("tiny-moe", "nvidia-h100-80gb", 16),
    ("tiny-mla-moe", "ascend-910b", 32),
    ("gpt-1.3b", "nvidia-a100-80gb", 64),
    ("deepseek-v3-671b", "ascend-910c-cloudmatrix384", 768),
    ("deepseek-v3-671b", "nvidia-h100-80gb", 1024),
]


def _score(spec, prof, devices, configs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # fp8 on a profile without FP8, see test_vectorised
        br = evaluate_batch(spec, prof, devices, ConfigBatch.from_configs(configs), all_stages=True)
    return [result_dict(br, i, prof, []) for i in range(len(configs))]


@pytest.fixture(scope="module")
def random_results():
    rng = np.random.default_rng(1234)
    out = []
    for model, prof_name, devices in GROUPS:
        spec, prof = load_preset(model), load_profile(prof_name)
        configs = [sample_config(rng, spec, devices, p_wild=0.1) for _ in range(250)]
        out.append((spec, prof, devices, configs, _score(spec, prof, devices, configs)))
    return out


def _valid(random_results):
    for spec, prof, devices, configs, results in random_results:
        for cfg, r in zip(configs, results):
            if r["step_time_s"] is not None:
                yield spec, prof, devices, cfg, r


def test_enough_valid_configs(random_results):
    assert sum(1 for _ in _valid(random_results)) > 800


# ---- accounting identities ----------------------------------------------------------------------


def test_time_breakdown_adds_up_to_step(random_results):
    for spec, prof, devices, cfg, r in _valid(random_results):
        assert math.fsum(r["time"].values()) == pytest.approx(r["step_time_s"], rel=1e-9), cfg
        assert all(v >= 0 for v in r["time"].values()), (cfg, r["time"])


def test_throughput_definitions(random_results):
    for spec, prof, devices, cfg, r in _valid(random_results):
        tps = cfg.global_batch_size * spec.seq_length / r["step_time_s"]
        assert r["tokens_per_s"] == pytest.approx(tps, rel=1e-9)
        assert r["tokens_per_s_per_device"] == pytest.approx(tps / devices, rel=1e-9)
        model_flops = model_flops_per_token(spec) * tps / devices
        assert r["model_tflops_per_device"] == pytest.approx(model_flops / 1e12, rel=1e-9)
        # MFU against the dense BF16 peak, whatever the precision
        assert r["mfu"] == pytest.approx(model_flops / (prof.facts["peak_bf16_tflops"].value * 1e12), rel=1e-9)


def test_hfu_adds_recompute_only(random_results):
    seen_recompute = 0
    for spec, prof, devices, cfg, r in _valid(random_results):
        if cfg.recompute == "none":
            assert r["hfu"] == pytest.approx(r["mfu"], rel=1e-9)
        else:
            assert r["hfu"] >= r["mfu"] * (1 - 1e-12)
        if cfg.recompute == "full":
            assert r["hfu"] > r["mfu"]
            seen_recompute += 1
    assert seen_recompute > 50


def test_hardware_utilisation_below_the_kernel_efficiencies(random_results):
    """Every FLOP is charged at no more than max(gemm_eff_max, attn_eff) of the BF16 peak, and the
    contract's FLOP count never exceeds the FLOPs charged: hfu cannot exceed that bound (bf16)."""
    for spec, prof, devices, cfg, r in _valid(random_results):
        if cfg.precision == "bf16":
            bound = max(prof.efficiency["gemm_eff_max"].value, prof.efficiency["attn_eff"].value)
            assert 0 < r["mfu"] <= r["hfu"] * (1 + 1e-12) <= bound, cfg


def test_step_formula(random_results):
    """docs/costmodel.md: step = m·t_stage + (pp−1)/vpp·t_stage + dp_exposed + optimizer, where the
    per-micro-batch stage time is the sum of compute, TP, CP, EP and p2p: the bubble is (pp−1)/(vpp·m)
    times those parts of the breakdown."""
    n = 0
    for spec, prof, devices, cfg, r in _valid(random_results):
        t = r["time"]
        m = cfg.global_batch_size / (cfg.micro_batch_size * devices // (cfg.tp * cfg.pp * cfg.cp))
        per_stage = t["compute_s"] + t["tp_comm_s"] + t["cp_comm_s"] + t["ep_comm_s"] + t["pp_p2p_s"]
        if cfg.schedule in ("dualpipe", "dualpipev"):
            # Table 2's / MindSpeed's bubble (pipeline.dualpipe_bubble_s) for a backward share in [0, 1] of
            # the rank's micro-batch time (DualPipe passes each micro-batch through one of its two stages)
            one = per_stage / (m * (0.5 if cfg.schedule == "dualpipe" else 1.0))
            lo, hi = ((cfg.pp / 2 - 1) / 4, (cfg.pp / 2 - 1) / 2) if cfg.schedule == "dualpipe" else \
                (max(cfg.pp / 2 - 1, 0), (cfg.pp - 1) * 0.75)
            assert lo * one * (1 - 1e-9) <= t["pp_bubble_s"] <= hi * one * (1 + 1e-9), cfg
            n += cfg.pp > 1
            continue
        assert t["pp_bubble_s"] == pytest.approx((cfg.pp - 1) / cfg.vpp / m * per_stage, rel=1e-9, abs=1e-15)
        if cfg.pp == 1:
            assert t["pp_bubble_s"] == 0 and t["pp_p2p_s"] == 0
        n += cfg.pp > 1
    assert n > 200


def test_memory_parts_add_up(random_results):
    for spec, prof, devices, cfg, r in _valid(random_results):
        m = r["memory"]
        parts = (m["params_gib"] + m["grads_gib"] + m["optimizer_gib"] + m["activations_gib"] + m["buffers_gib"]
                 + m["overhead_gib"])
        assert m["peak_gib"] == pytest.approx(parts, rel=1e-9)
        assert m["overhead_gib"] == prof.facts["framework_overhead_gib"].value and m["buffers_gib"] >= 0
        assert m["capacity_gib"] == prof.facts["memory_gib"].value
        stages = m["per_stage_peak_gib"]
        assert len(stages) == cfg.pp and max(stages) == pytest.approx(m["peak_gib"], rel=1e-12)
        assert r["feasible"] == (m["peak_gib"] <= m["capacity_gib"])


# ---- infeasible and invalid configs -------------------------------------------------------------


def test_oom_is_reported_with_stage_and_gib(preset, profile):
    # Llama-3 70B on 8 GPUs, no model parallelism: ~70e9 · (6 + 12/8) B ≈ 490 GiB of states alone.
    spec, prof = preset("llama3-70b"), profile("nvidia-h100-80gb")
    r = evaluate(spec, prof, 8, TrainingConfig(global_batch_size=8))
    assert r["feasible"] is False
    assert [x["code"] for x in r["infeasible_reasons"]] == ["oom"]
    msg = r["infeasible_reasons"][0]["message"]
    m = re.search(r"stage (\d+) needs ([\d.]+) GiB of ([\d.]+)", msg)
    assert m, msg
    assert int(m.group(1)) == 0
    assert float(m.group(2)) == pytest.approx(r["memory"]["peak_gib"], abs=0.051)
    assert float(m.group(3)) == pytest.approx(r["memory"]["capacity_gib"], abs=0.051)
    assert r["memory"]["peak_gib"] > r["memory"]["capacity_gib"]
    assert r["memory"]["params_gib"] > 100  # 2 B × 70e9 ≈ 130 GiB
    # still a full evaluation
    for key in ("step_time_s", "tokens_per_s", "tokens_per_s_per_device", "mfu", "hfu"):
        assert isinstance(r[key], float) and r[key] > 0
    assert all(isinstance(v, float) for v in r["time"].values())
    json.dumps(r, allow_nan=False)


def test_oom_names_the_stage_at_the_peak(preset, profile):
    # pp 4: the message names the stage whose peak is highest
    spec, prof = preset("llama3-70b"), profile("nvidia-h100-80gb")
    r = evaluate(spec, prof, 8, TrainingConfig(pp=4, global_batch_size=64))
    assert [x["code"] for x in r["infeasible_reasons"]] == ["oom"]
    stage = int(re.search(r"stage (\d+)", r["infeasible_reasons"][0]["message"]).group(1))
    stages = r["memory"]["per_stage_peak_gib"]
    assert stages[stage] == max(stages)


def test_oom_names_a_later_stage_when_it_is_the_peak(round_profile):
    # A huge untied vocabulary: stage 0 holds the embedding, stage 1 the LM head and its fp32 logits;
    # with one micro-batch both stages hold one in flight, so the last stage is the peak.
    import model_presets

    spec = model_presets.load({"base": "tiny-dense", "vocab_size": 4_000_000, "hidden_size": 4096})
    r = evaluate(spec, round_profile, 2, TrainingConfig(pp=2, global_batch_size=1))
    assert [x["code"] for x in r["infeasible_reasons"]] == ["oom"]
    stages = r["memory"]["per_stage_peak_gib"]
    assert stages[1] > stages[0] > r["memory"]["capacity_gib"]
    assert r["infeasible_reasons"][0]["message"].startswith("stage 1 needs")


def test_invalid_configs_have_nulls_never_nan(random_results, preset, profile):
    n = 0
    for spec, prof, devices, configs, results in random_results:
        for cfg, r in zip(configs, results):
            json.dumps(r, allow_nan=False)
            if r["infeasible_reasons"] and r["infeasible_reasons"][0]["code"] != "oom":
                n += 1
                assert r["feasible"] is False
                for key in ("step_time_s", "tokens_per_s", "tokens_per_s_per_device",
                            "model_tflops_per_device", "mfu", "hfu"):
                    assert r[key] is None
                assert all(v is None for v in r["time"].values())
                assert all(v is None for k, v in r["memory"].items() if k != "capacity_gib")
    assert n > 50
    # fp8 on a device without FP8: the internals divide by a zero peak; the result must still be clean
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        r = evaluate(preset("tiny-dense"), profile("ascend-910b"), 1,
                     TrainingConfig(global_batch_size=1, precision="fp8"))
    json.dumps(r, allow_nan=False)
    assert r["step_time_s"] is None


# ---- recompute ----------------------------------------------------------------------------------


def _min_stage_layers(spec, cfg):
    comp = pipeline.split_stages(
        spec, cfg.pp, cfg.vpp,
        NO_VALUE if cfg.first_stage_layers is None else cfg.first_stage_layers,
        NO_VALUE if cfg.last_stage_layers is None else cfg.last_stage_layers,
        cfg.account_for_embedding_in_pipeline_split, cfg.account_for_loss_in_pipeline_split,
        cfg.pipeline_layout)
    return int((comp[:, pipeline.DENSE] + comp[:, pipeline.MOE]).min())


def _recompute_variants(rng, spec, prof, devices, n):
    """Valid base configs whose every pipeline stage holds ≥ 2 decoder layers, in four recompute
    variants: none, selective (default modules), selective (random modules), full (all layers)."""
    bases = []
    while len(bases) < n:
        cfg = sample_config(rng, spec, devices, p_wild=0.0, allow_fp8=False, recompute="none")
        r = _score(spec, prof, devices, [cfg])[0]
        if r["step_time_s"] is None or _min_stage_layers(spec, cfg) < 2:
            continue
        bases.append(cfg)
    variants = []
    for cfg in bases:
        k = int(rng.integers(1, 4))
        mods = sorted(rng.choice(RECOMPUTE_MODULES, size=k, replace=False).tolist())
        variants.append([
            cfg,
            cfg.model_copy(update={"recompute": "selective", "recompute_modules": None}),
            cfg.model_copy(update={"recompute": "selective", "recompute_modules": mods}),
            cfg.model_copy(update={"recompute": "full", "recompute_num_layers": None}),
        ])
    flat = [c for v in variants for c in v]
    res = _score(spec, prof, devices, flat)
    return [res[i:i + 4] for i in range(0, len(res), 4)], variants


@pytest.mark.parametrize("model,prof_name,devices", [
    ("tiny-moe", "nvidia-h100-80gb", 16), ("tiny-mla-moe", "ascend-910b", 16),
    ("gpt-1.3b", "nvidia-a100-80gb", 32), ("deepseek-v3-671b", "nvidia-h100-80gb", 1024),
])
def test_recompute_never_raises_activation_memory(model, prof_name, devices):
    spec, prof = load_preset(model), load_profile(prof_name)
    rng = np.random.default_rng(99)
    results, variants = _recompute_variants(rng, spec, prof, devices, 40)
    for (none, sel, sel_mods, full), cfgs in zip(results, variants):
        ctx = cfgs[0].model_dump(exclude_defaults=True), cfgs[2].recompute_modules
        per = [np.array(r["memory"]["per_stage_peak_gib"]) for r in (none, sel, sel_mods, full)]
        tol = 1e-12 * per[0]
        # stage by stage: none ≥ selective (any modules), selective (default) ≥ full
        assert (per[1] <= per[0] + tol).all(), ctx
        assert (per[2] <= per[0] + tol).all(), ctx
        assert (per[3] <= per[1] + tol).all(), ctx
        # full recompute strictly lowers the activations and adds recomputed FLOPs to hfu only
        assert full["memory"]["activations_gib"] < none["memory"]["activations_gib"], ctx
        assert (per[3] < per[0]).all(), ctx
        assert full["hfu"] - full["mfu"] > none["hfu"] - none["mfu"], ctx
        assert abs(none["hfu"] - none["mfu"]) <= 1e-12 * none["mfu"]
        # recompute never makes a step faster
        for r in (sel, sel_mods, full):
            assert r["step_time_s"] >= none["step_time_s"] * (1 - 1e-12), ctx


def test_recomputing_one_layer_never_raises_memory(preset, round_profile):
    spec = preset("tiny-dense")
    none = evaluate(spec, round_profile, 1, TrainingConfig(global_batch_size=1))
    full1 = evaluate(spec, round_profile, 1, TrainingConfig(global_batch_size=1, recompute="full",
                                                            recompute_num_layers=1))
    assert full1["memory"]["activations_gib"] <= none["memory"]["activations_gib"]


def test_recompute_num_layers_interpolates(preset, profile):
    """Recomputing more layers per stage keeps fewer activations and costs more time (pp 1, m ≥ 4)."""
    spec, prof = preset("gpt-1.3b"), profile("nvidia-a100-80gb")
    base = dict(tp=2, global_batch_size=16, micro_batch_size=2)
    rs = evaluate_many(spec, prof, 8, [TrainingConfig(**base, recompute="full", recompute_num_layers=n)
                                       for n in (2, 6, 12, 24)])
    acts = [r["memory"]["activations_gib"] for r in rs]
    steps = [r["step_time_s"] for r in rs]
    assert acts == sorted(acts, reverse=True) and len(set(acts)) == 4
    assert steps == sorted(steps) and len(set(steps)) == 4
    everything = evaluate(spec, prof, 8, TrainingConfig(**base, recompute="full"))
    assert everything["memory"]["activations_gib"] == pytest.approx(acts[-1], rel=1e-12)


# ---- overlap ------------------------------------------------------------------------------------

OVERLAP_GROUPS = [
    ("tiny-moe", "nvidia-h100-80gb", 16), ("tiny-mla-moe", "ascend-910b", 32),
    ("gpt-1.3b", "nvidia-a100-80gb", 64), ("deepseek-v3-671b", "nvidia-h100-80gb", 1024),
]


@pytest.mark.parametrize("flag", ["tp_comm_overlap", "moe_a2a_overlap", "overlap_grad_reduce",
                                  "overlap_param_gather"])
def test_more_overlap_never_slows_a_step(flag):
    rng = np.random.default_rng(5)
    faster = 0
    for model, prof_name, devices in OVERLAP_GROUPS:
        spec, prof = load_preset(model), load_profile(prof_name)
        if flag == "moe_a2a_overlap" and not spec.is_moe:
            continue
        bases = [sample_config(rng, spec, devices, p_wild=0.0) for _ in range(60)]
        off = [c.model_copy(update={flag: False}) for c in bases]
        on = [c.model_copy(update={flag: True}) for c in bases]
        r_off, r_on = _score(spec, prof, devices, off), _score(spec, prof, devices, on)
        for c, a, b in zip(bases, r_off, r_on):
            if a["step_time_s"] is None:
                continue
            assert b["step_time_s"] <= a["step_time_s"] * (1 + 1e-12), (flag, model, c)
            faster += b["step_time_s"] < a["step_time_s"] * (1 - 1e-9)
            if flag == "moe_a2a_overlap":
                # combined 1F1B holds one more chunk's activations: never less memory
                # (the amount: tests/test_a2a_overlap_memory.py)
                assert b["memory"]["peak_gib"] >= a["memory"]["peak_gib"] * (1 - 1e-12)
            else:  # the other overlaps change time only, never memory
                assert b["memory"]["peak_gib"] == pytest.approx(a["memory"]["peak_gib"], rel=1e-12)
    assert faster > 10, f"{flag} never made any step faster"


# ---- scaling ------------------------------------------------------------------------------------


@pytest.mark.parametrize("model,prof_name,fixed", [
    ("gpt-1.3b", "nvidia-h100-80gb", dict(tp=2, pp=2)),
    ("gpt-1.3b", "nvidia-a100-80gb", dict(tp=1, pp=4, vpp=2)),
    ("tiny-moe", "nvidia-h100-80gb", dict(tp=2, pp=2, ep=2)),
])
def test_weak_scaling_never_gains_per_device_throughput(model, prof_name, fixed):
    """More devices at the same per-device work (dp doubles with the global batch, same micro-batch
    count) cannot raise tokens/s per device on a switched fabric when the optimizer step is not
    sharded: compute is the same, the DP ring gets longer and may leave the domain, pipeline neighbours
    drift apart. (With the distributed optimizer the sharded optimizer step shrinks with dp, and on a
    full mesh a larger in-node group gets more links, so no direction holds in general.)"""
    spec, prof = load_preset(model), load_profile(prof_name)
    mp = fixed.get("tp", 1) * fixed.get("pp", 1)
    per_device = []
    compute = []
    for dp in (1, 2, 4, 8, 16, 32, 64):
        cfg = TrainingConfig(**fixed, global_batch_size=8 * dp, distributed_optimizer=False,
                             overlap_param_gather=False)
        r = evaluate(spec, prof, mp * dp, cfg)
        assert r["step_time_s"] is not None, r["infeasible_reasons"]
        per_device.append(r["tokens_per_s_per_device"])
        compute.append(r["time"]["compute_s"])
    assert all(b <= a * (1 + 1e-12) for a, b in zip(per_device, per_device[1:])), per_device
    assert per_device[-1] < per_device[0]
    assert compute == pytest.approx([compute[0]] * len(compute), rel=1e-12)


def test_distributed_optimizer_shards_with_dp(preset, profile):
    spec, prof = preset("gpt-1.3b"), profile("nvidia-h100-80gb")
    rs = [evaluate(spec, prof, 2 * dp, TrainingConfig(tp=2, global_batch_size=8 * dp)) for dp in (1, 2, 4, 8)]
    opt = [r["memory"]["optimizer_gib"] for r in rs]
    assert opt == pytest.approx([opt[0] / dp for dp in (1, 2, 4, 8)], rel=1e-12)
    t_opt = [r["time"]["optimizer_s"] for r in rs]
    assert t_opt == sorted(t_opt, reverse=True)


# ---- MoE load imbalance -------------------------------------------------------------------------


@pytest.mark.parametrize("model,prof_name,devices,cfg", [
    ("tiny-moe", "nvidia-h100-80gb", 8, dict(tp=2, ep=4)),
    ("tiny-mla-moe", "ascend-910b", 16, dict(ep=16, moe_a2a_overlap=True)),
    ("deepseek-v3-671b", "nvidia-h100-80gb", 256, dict(tp=2, ep=64, etp=2)),
])
def test_load_imbalance_slows_the_step(model, prof_name, devices, cfg):
    spec, prof = load_preset(model), load_profile(prof_name)
    dp = devices // cfg.get("tp", 1)
    rs = [evaluate(spec, prof, devices, TrainingConfig(**cfg, global_batch_size=dp * 2, moe_load_imbalance=x))
          for x in (1.0, 1.2, 2.0, 4.0)]
    steps = [r["step_time_s"] for r in rs]
    assert all(b > a for a, b in zip(steps, steps[1:])), steps
    eps = [r["time"]["ep_comm_s"] for r in rs]
    assert all(b >= a for a, b in zip(eps, eps[1:])), eps


def test_load_imbalance_never_speeds_up_random_configs():
    rng = np.random.default_rng(11)
    for model, prof_name, devices in OVERLAP_GROUPS:
        spec, prof = load_preset(model), load_profile(prof_name)
        if not spec.is_moe:
            continue
        bases = [sample_config(rng, spec, devices, p_wild=0.0) for _ in range(60)]
        rs = [_score(spec, prof, devices, [c.model_copy(update={"moe_load_imbalance": x}) for c in bases])
              for x in (1.0, 1.5, 3.0)]
        for i, c in enumerate(bases):
            steps = [r[i]["step_time_s"] for r in rs]
            if steps[0] is None:
                continue
            assert steps[0] <= steps[1] * (1 + 1e-12) and steps[1] <= steps[2] * (1 + 1e-12), (c, steps)


def test_default_load_imbalance_is_documented_value(preset, profile):
    from costmodel import DEFAULT_MOE_LOAD_IMBALANCE

    spec, prof = preset("tiny-moe"), profile("nvidia-h100-80gb")
    a = evaluate(spec, prof, 8, TrainingConfig(ep=4, global_batch_size=8))
    b = evaluate(spec, prof, 8, TrainingConfig(ep=4, global_batch_size=8,
                                               moe_load_imbalance=DEFAULT_MOE_LOAD_IMBALANCE))
    assert a["step_time_s"] == b["step_time_s"]
    assert DEFAULT_MOE_LOAD_IMBALANCE >= 1.0

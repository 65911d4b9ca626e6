"""The RL step: decode and KV for an MLA model hand-worked, generation waves, expert
parallelism inside the engine, the phases adding up, co-located memory phase by phase, the
disaggregated split against a full sweep, and the CLI's input errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from costmodel import comm, inference, rl
from costmodel.flops import total_params
from costmodel.hardware import GIB, Hardware
from costmodel.result import evaluate
from costmodel.spec import TrainingConfig
from search.rl import RLRequest, best_disaggregated, rollout_configs, run_rl_search, split_sweep

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def hw(round_profile) -> Hardware:
    return Hardware.from_profile(round_profile)


def test_mla_decode_step_hand_worked(preset, hw):
    """DeepSeek-V3 on one 8-device instance, batch 1, 4,096 tokens of context: memory-bound."""
    spec = preset("deepseek-v3-671b")
    n_moe = 58  # 3 dense layers then 58 MoE layers (moe_layer_freq)
    expert = 2 * 3 * 7168 * 2048  # bf16 SwiGLU expert
    held = inference.weight_bytes_per_device(spec, 8)
    read_w = held - n_moe * (256 - 8) * expert / 8  # one token touches its top-8 experts per layer
    kv = 61 * (512 + 64) * 2  # MLA latent + RoPE key, whole on every rank
    read = read_w + 4096 * kv
    # two all-reduces per layer of 1 token · 7168 · 2 B over 8 ranks inside the 8-device domain:
    # 2·7/8 of the buffer at 400 GB/s · 0.75, a tree's 2·log2(8) = 6 steps of 5 us
    ar = 2 * 7 / 8 * 7168 * 2 / (400e9 * 0.75) + 6 * 5e-6
    expected = read / (2000e9 * 0.8) + 61 * 50e-6 + 2 * 61 * ar
    assert inference.decode_step_s(spec, hw, 8, 1, 4096) == pytest.approx(expected, rel=1e-9)


def test_expert_parallel_decode_swaps_the_moe_all_reduce_for_all_to_alls(preset, hw):
    spec = preset("deepseek-v3-671b")
    tokens = 64
    ar = inference.small_all_reduce_s(2.0 * 7168 * tokens, np.array(8), hw)
    # each rank dispatches its 64/8 tokens as 8 top-k copies of 7168 bf16 values, and combines them back
    a2a = comm.all_to_all_s(2.0 * 7168 * 8 * tokens / 8, 1, np.array(8), hw)
    tp_only = inference._tp_comm_s(spec, hw, 8, tokens, 1)
    with_ep = inference._tp_comm_s(spec, hw, 8, tokens, 8)
    assert tp_only == pytest.approx(2 * 61 * ar, rel=1e-12)
    assert with_ep == pytest.approx((2 * 61 - 58) * ar + 2 * 58 * a2a, rel=1e-12)


def test_decode_sum_is_the_segment_midpoints(preset, hw):
    spec = preset("llama3-70b")
    got = rl.decode_s(spec, hw, 8, 1, 16, 1000, 800)
    steps = [inference.decode_step_s(spec, hw, 8, 16, 1000 + (k + 0.5) * 100) for k in range(8)]
    assert got == pytest.approx(100 * sum(steps), rel=1e-12)
    # memory-bound at batch 16: the KV read grows linearly, so the midpoint sum is exact against step-by-step
    exact = sum(inference.decode_step_s(spec, hw, 8, 16, 1000 + t) for t in range(1, 801))
    assert got == pytest.approx(exact, rel=2e-3)


def test_generation_runs_in_waves_when_the_share_does_not_fit(preset, hw):
    spec = preset("llama3-70b")  # tp 8: 40 KiB of KV per token per device
    wl = rl.Workload(64, 16, 4096, 4096)  # 1,024 samples of 8,192 tokens
    room = 80 * GIB * 0.9 - 2.0 * total_params(spec) / 8 - 4 * GIB
    cap = np.floor(room / (40960 * 8192))
    g = rl.generation(spec, hw, np.array([8]), np.array([1]), np.array([2]), wl)
    assert g["max_batch"][0] == cap
    assert g["waves"][0] == np.ceil(512 / cap) > 1
    reserved = rl.generation(spec, hw, np.array([8]), np.array([1]), np.array([2]), wl, reserved_bytes=10 * GIB)
    assert reserved["max_batch"][0] == np.floor((room - 10 * GIB) / (40960 * 8192))


@pytest.fixture(scope="module")
def small(preset, round_profile):
    """tiny-moe trained on 8 devices of the round profile, the step's batch and sequence."""
    spec = preset("tiny-moe")
    wl = rl.Workload(8, 8, 256, 768)
    train_spec = spec.model_copy(update={"seq_length": wl.seq_length})
    cfg = TrainingConfig(tp=1, pp=1, cp=1, ep=4, micro_batch_size=1, global_batch_size=wl.samples)
    return spec, wl, evaluate(train_spec, round_profile, 8, cfg)


def test_forward_pass_is_the_forward_share_of_the_step(small, round_profile):
    spec, wl, ev = small
    t = ev["time"]
    # no recompute: the forward is 2 of the 6 FLOPs per parameter and token (the two are computed in a
    # different order, so equal to the last bit or two)
    assert ev["hfu"] == pytest.approx(ev["mfu"], rel=1e-12)
    work = ev["step_time_s"] - t["optimizer_s"] - t["dp_comm_exposed_s"]
    assert rl.forward_pass_s(ev) == pytest.approx(work / 3, rel=1e-12)
    # full recompute repeats the forward in the backward: 8 FLOPs of work per 2 of forward
    train_spec = spec.model_copy(update={"seq_length": wl.seq_length})
    full = evaluate(train_spec, round_profile, 8, TrainingConfig(tp=1, pp=1, cp=1, ep=4, micro_batch_size=1,
                                                                  global_batch_size=wl.samples, recompute="full"))
    assert full["hfu"] / full["mfu"] == pytest.approx(8 / 6, rel=0.05)
    work = full["step_time_s"] - full["time"]["optimizer_s"] - full["time"]["dp_comm_exposed_s"]
    assert rl.forward_pass_s(full) == pytest.approx(work * full["mfu"] / (3 * full["hfu"]), rel=1e-12)
    assert rl.forward_pass_s(full) < 0.8 * work / 3  # a quarter of the work is the repeated forward


def test_colocated_phases_add_up_and_memory_per_phase(small, hw):
    spec, wl, ev = small
    tp, ep, off = np.array([1, 2, 2]), np.array([1, 1, 2]), np.array([False, True, False])
    s = rl.colocated_step(spec, hw, 8, ev, wl, tp, ep, off)
    total = sum(s["time"].values())
    np.testing.assert_allclose(total, s["step_time_s"], rtol=1e-12)
    states = (ev["memory"]["params_gib"] + ev["memory"]["grads_gib"] + ev["memory"]["optimizer_gib"]) * GIB
    kv = s["generation"]["batch"] * 1024 * inference.kv_bytes_per_token(spec, tp)
    rollout = inference.weight_bytes_per_device(spec, tp) + kv + np.where(off, 0.0, states) + 4 * GIB
    np.testing.assert_allclose(s["memory"]["rollout"], rollout, rtol=1e-12)
    # the offloading plan pays the states out and back over the host link, the others do not
    ref_load = ev["memory"]["params_gib"] * GIB / hw.host_bytes_per_s  # GRPO: the reference comes from the host
    # the refit gathers every full bf16 tensor on each of the 8 devices (one domain: a ring all-gather,
    # 7/8 of the model at 400 GB/s · 0.75, 7 steps of 5 us); the sleeping engine's tp-2 shard goes to
    # the host and back
    reshard = 7 / 8 * 2.0 * total_params(spec) / (400e9 * 0.75) + 7 * 5e-6 + rl.refit_tensors_s(spec)
    sleep = 2 * inference.weight_bytes_per_device(spec, 2) / hw.host_bytes_per_s
    assert s["phases"]["switch_s"][2] == pytest.approx(reshard + sleep + ref_load, rel=1e-9)
    assert s["phases"]["switch_s"][1] == pytest.approx(reshard + sleep + ref_load + 2 * states / hw.host_bytes_per_s,
                                                       rel=1e-9)
    assert s["memory"]["train"][0] == pytest.approx(ev["memory"]["peak_gib"] * GIB)
    assert s["memory"]["logprob"][1] < s["memory"]["logprob"][0]  # offloaded: no grads or optimizer states


def test_colocated_kept_states_that_crowd_out_the_kv_cache_make_the_plan_infeasible(make_profile, small, hw):
    spec, wl, ev = small
    # a device holding the rollout weights, the overhead, one full-length sequence's KV cache and half the
    # trainer's states (at vLLM's 0.9 memory fraction): kept states leave no room, offloaded they do
    states = (ev["memory"]["params_gib"] + ev["memory"]["grads_gib"] + ev["memory"]["optimizer_gib"]) * GIB
    one_seq = 1024 * inference.kv_bytes_per_token(spec, 1)
    memory = (inference.weight_bytes_per_device(spec, 1) + hw.framework_overhead_bytes + one_seq + states / 2) / 0.9
    hw_tight = Hardware.from_profile(make_profile("nvidia-h100-80gb", facts={
        "memory_gib": float(memory / GIB), "framework_overhead_gib": hw.framework_overhead_bytes / GIB}))
    s = rl.colocated_step(spec, hw_tight, 8, ev, wl, np.array([1, 1]), np.array([1, 1]), np.array([False, True]))
    assert s["generation"]["max_batch"][0] == 0 and not s["feasible"][0]
    assert s["generation"]["max_batch"][1] == np.floor((one_seq + states / 2) / one_seq) >= 1


def test_disaggregated_phases_add_up_with_and_without_staleness(small, hw):
    spec, _, ev = small
    for stale in (False, True):
        wl = rl.Workload(8, 8, 256, 768, stale_sync=stale)
        s = rl.disaggregated_step(spec, hw, 8, 8, ev, wl, np.array([1, 2]), np.array([1, 1]))
        np.testing.assert_allclose(sum(s["time"].values()), s["step_time_s"], rtol=1e-12)
        roll = s["phases"]["prefill_s"] + s["phases"]["decode_s"]
        train = sum(s["phases"][k] for k in ("actor_logprob_s", "reference_logprob_s", "critic_value_s",
                                              "actor_train_s", "critic_train_s"))
        combined = np.maximum(roll, train) if stale else roll + train
        np.testing.assert_allclose(s["step_time_s"], combined + s["phases"]["weight_sync_s"], rtol=1e-12)


def test_weight_sync_hand_worked(preset, hw):
    spec = preset("llama3-70b")
    full = 2.0 * total_params(spec)
    # the 8 training devices (one domain) all-gather every full tensor: 7/8 of the model at 400 GB/s · 0.75
    # and 7 steps of 5 us; then one of them broadcasts it whole to the 16 devices of both pools, two
    # domains: the domain's 8 NICs together (8 · 50 GB/s · 0.8 = 320) or scale-up (300), the lesser, and
    # 15 hops of the scale-out latency, 10 us. Each rollout device receives the whole model, not its shard.
    gather = 7 / 8 * full / 300e9 + 7 * 5e-6
    broadcast = full / 300e9 + 15 * 10e-6
    tensors = 723 * 0.17e-3  # 80 layers x (q, k, v, o, 2 norms, gate, up, down) + embedding, norm, head
    got = rl.weight_sync_s(spec, hw, np.array([8]), 8, 8)[0]
    assert got == pytest.approx(gather + broadcast + tensors, rel=1e-9)
    assert got - tensors > 1.8 * full / 300e9  # not the 1/8 shard a tp-8 instance keeps


def test_hf_tensor_count_hand_worked(preset):
    # Llama-3 70B's checkpoint: 80 x 9 per layer + embed_tokens, norm, lm_head = 723 tensors
    assert inference.hf_tensor_count(preset("llama3-70b")) == 723
    # DeepSeek-V3: 61 layers x (7 MLA + 2 norms), 3 dense MLPs x 3, 58 MoE layers x (router + 256 x 3
    # experts + 3 shared), embedding, norm, head; NeMo-RL's vLLM ranks load 45,395 (the router's bias too)
    assert inference.hf_tensor_count(preset("deepseek-v3-671b")) == 61 * 9 + 3 * 3 + 58 * (1 + 768 + 3) + 3 == 45337


def test_full_weight_refit_against_nemo_rl_measured(preset):
    """DeepSeek-V3, Megatron TP1/PP16/EP16 on 256 H100 -> vLLM TP32 on 256 more: NeMo-RL measured 14.21 s
    for its default NCCL full-tensor refit (docs/guides/checkpoint-engine-refit.md, "DeepSeek-V3 Benchmark",
    NCCL column). The transfers at the job's bus bandwidth plus the per-tensor host cost, which was set
    from the other row of that table (NIXL, sharded), not from this one."""
    from app.formats.inputs import load_cluster

    h100 = Hardware.from_profile(load_cluster("nvidia-h100-80gb"))
    spec = preset("deepseek-v3-671b")
    full = 2.0 * total_params(spec)
    bw = min(h100.scale_up_bytes_per_s, 8 * h100.scale_out_bytes_per_s)  # 32+ nodes: a node's 8 NICs together
    gather = 255 / 256 * full / bw + 255 * h100.scale_out_latency_s
    broadcast = full / bw + 511 * h100.scale_out_latency_s
    got = rl.weight_sync_s(spec, h100, np.array([32]), 256, 256)[0]
    assert got == pytest.approx(gather + broadcast + 45337 * rl.REFIT_S_PER_TENSOR, rel=1e-9)
    assert got == pytest.approx(14.21, rel=0.10)


@pytest.mark.parametrize("stale", [False, True])
def test_disaggregated_split_equals_the_best_of_a_full_sweep(preset, round_profile, stale):
    spec = preset("tiny-moe")
    wl = rl.Workload(16, 8, 256, 768, stale_sync=stale)
    req = RLRequest(spec=spec, profile=round_profile, devices=32, workload=wl, training_top_k=2)
    best, rows = best_disaggregated(req)
    sweep = [p for p in split_sweep(req) if p is not None]
    truth = min(sweep, key=lambda p: p["step_time_s"])
    assert best["rollout_devices"] == truth["rollout_devices"]
    assert best["step_time_s"] == pytest.approx(truth["step_time_s"], rel=1e-12)
    for row, plan in zip(rows, split_sweep(req)):  # every bound is a bound
        if plan is not None:
            assert row["lower_bound_s"] <= plan["step_time_s"] * (1 + 1e-12)


def test_rollout_configs_divide_the_pool_and_the_heads(preset, hw):
    spec = preset("tiny-moe")
    tp, ep, off = rollout_configs(spec, hw, 8, colocated=True)
    assert set(tp) <= {1, 2, 4, 8} and all(8 % t == 0 and spec.num_attention_heads % t == 0 for t in tp)
    assert all(e in (1, t) for e, t in zip(ep, tp)) and off.any() and (~off).any()


def _run(*args):
    return subprocess.run([sys.executable, "-m", "app.cli", "rl", *args], capture_output=True, text=True, cwd=ROOT)


BASE = ("--model", "tiny-moe", "--cluster", "nvidia-h100-80gb", "--devices", "16")


@pytest.mark.parametrize("extra,field", [
    (("--prompts-per-step", "0"), "prompts_per_step"),
    (("--response-length", "-3"), "response_length"),
    (("--algorithm", "dpo"), "algorithm"),
    (("--responses-per-prompt", "1"), "responses_per_prompt"),
    (("--algorithm", "ppo", "--no-critic"), "critic"),
    (("--prompt-length", "200000000"), "prompt_length"),
    (("--response-length", "500", "--max-response-length", "400"), "max_response_length"),
    (("--fix", "tp=two"), "fix.tp"), (("--fix", "nope=1"), "fix.nope"),
])
def test_bad_rl_inputs_exit_2_naming_the_field(extra, field):
    r = _run(*BASE, *extra)
    assert r.returncode == 2 and r.stderr.startswith(f"error: {field}: "), r.stderr


def test_rl_json_has_both_modes():
    r = _run(*BASE, "--prompts-per-step", "8", "--responses-per-prompt", "4", "--prompt-length", "128",
             "--response-length", "384", "--algorithm", "ppo", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["colocated"]["mode"] == "colocated" and out["disaggregated"]["mode"] == "disaggregated"
    for plan in (out["colocated"], out["disaggregated"]):
        assert sum(plan["time"].values()) == pytest.approx(plan["step_time_s"], rel=1e-9)
        assert plan["phases_s"]["critic_train_s"] > 0  # ppo trains the critic
        assert plan["trained_tokens_per_s"] == pytest.approx(32 * 512 / plan["step_time_s"], rel=1e-9)


def test_synchronous_waves_last_as_long_as_the_longest_response(preset, hw):
    spec = preset("llama3-70b")
    inst = (np.array([8]), np.array([1]), np.array([4]))
    sync = rl.generation(spec, hw, *inst, rl.Workload(16, 4, 512, 1000, max_response_length=2000))
    stale = rl.generation(spec, hw, *inst, rl.Workload(16, 4, 512, 1000, max_response_length=2000, stale_sync=True))
    assert sync["batch"][0] == 16
    # 2,000 steps at a live batch of 16 · 1000 / 2000 = 8; asynchronous: 1,000 steps at 16
    assert sync["decode_s"][0] == pytest.approx(rl.decode_s(spec, hw, 8, 1, 8, 512, 2000), rel=1e-12)
    assert stale["decode_s"][0] == pytest.approx(rl.decode_s(spec, hw, 8, 1, 16, 512, 1000), rel=1e-12)
    assert sync["kv_bytes"][0] == 16 * 2512 * inference.kv_bytes_per_token(spec, 8)


def test_a_sampled_rl_search_repeats_and_stops_when_checked(preset, round_profile):
    # TPE (not the enumeration) on every training search: the request's seed makes the plan repeat, and
    # check() raising inside a training search stops the whole RL search (a cancelled job's worker).
    req = RLRequest(spec=preset("tiny-moe"), profile=round_profile, devices=16, workload=rl.Workload(8, 4, 128, 256),
                    sampler="tpe", training_top_k=1, seed=3)
    first, again = run_rl_search(req), run_rl_search(req)
    assert first["best"] is not None
    for mode in ("colocated", "disaggregated"):
        assert first[mode]["training"]["config"] == again[mode]["training"]["config"]
        assert first[mode]["step_time_s"] == again[mode]["step_time_s"]

    class Stop(Exception):
        pass

    calls = []

    def check():
        calls.append(1)
        if len(calls) > 2:
            raise Stop

    with pytest.raises(Stop):
        run_rl_search(req, check=check)


def test_pins_a_split_pool_cannot_take_leave_that_split_without_a_plan(preset, round_profile):
    # cp 16 fits the 16-device co-located pool but no 8-device split pool: that split has no plan, the
    # search goes on (it used to die with the space's SpaceError)
    req = RLRequest(spec=preset("tiny-moe"), profile=round_profile, devices=16, workload=rl.Workload(8, 4, 128, 256),
                    training_top_k=1, fixed={"cp": 16})
    out = run_rl_search(req)
    assert out["disaggregated"] is None and all(row["step_time_s"] is None for row in out["splits"])

"""DualPipe and DualPipeV: bubble, memory and placement against DeepSeek-V3's Table 2 and
MindSpeed's DualPipeV, their validity rules, the search and the export."""

import json
import subprocess
import sys

import numpy as np
import pytest

import hardware_profiles
import model_presets
from app.formats.launch import InexpressibleError, launch_args
from costmodel import ConfigBatch, TrainingConfig, evaluate_batch
from costmodel.batch import DUALPIPE, DUALPIPEV
from costmodel.pipeline import dualpipe_bubble_s, split_chunks
from search import build_space
from search.frameworks import refusals

GPT = "gpt-1.3b"  # 24 dense layers: pp 4 gives 1F1B 6 layers a rank, DualPipe stages of 6, DualPipeV chunks of 3
PP, DEVICES, GBS = 4, 32, 64  # dp 8, m = 8 micro-batches


def _score(model, devices, configs):
    spec, prof = model_presets.load(model), hardware_profiles.load("nvidia-h100-80gb")
    return spec, evaluate_batch(spec, prof, devices, ConfigBatch.from_configs(
        [TrainingConfig.model_validate(c) for c in configs]), all_stages=True)


def _schedules():
    base = {"pp": PP, "global_batch_size": GBS, "micro_batch_size": 1}
    return _score(GPT, DEVICES, [base, {**base, "pipeline_schedule": "dualpipe"},
                                 {**base, "pipeline_schedule": "dualpipev"}])


def test_bubble_formulas_hand_worked():
    """Chunk times F = 1, B = 2, W = 1, F&B = 3 (t = 6 for the rank's two chunks, backward share 2/3):
    DualPipe on pp 8 (Table 2): (8/2 − 1)(3 + 2 − 3·1) = 6; MindSpeed's DualPipeV on pp 4:
    (4 − 1)(3 + 2 − 1) − 1 = 11."""
    t, share = np.array([6.0]), np.array([2.0 / 3.0])
    assert dualpipe_bubble_s(np.array([8]), np.array([DUALPIPE]), t, share)[0] == pytest.approx(6.0)
    assert dualpipe_bubble_s(np.array([4]), np.array([DUALPIPEV]), t, share)[0] == pytest.approx(11.0)


def test_placement_two_chunks_per_rank():
    """DualPipe: rank r holds stages r and pp−1−r (two copies of the model); DualPipeV: chunks r and
    2pp−1−r, so the embedding and the LM head both sit on rank 0."""
    spec = model_presets.load(GPT)
    dual = split_chunks(spec, PP, 1, -1, -1, False, False, None, DUALPIPE)
    v = split_chunks(spec, PP, 1, -1, -1, False, False, None, DUALPIPEV)
    assert dual.shape == v.shape == (PP, 2, 5)
    assert (dual[:, :, 0] == 6).all() and dual[:, :, 0].sum() == 2 * spec.num_layers
    assert (v[:, :, 0] == 3).all() and v[:, :, 0].sum() == spec.num_layers
    # embedding (column 2) and head (column 3)
    assert dual[0, 0, 2] == 1 and dual[0, 1, 3] == 1 and dual[PP - 1, 0, 3] == 1  # the head twice
    assert v[0, 0, 2] == 1 and v[0, 1, 3] == 1 and v[1:, :, 2:4].sum() == 0


def test_memory_follows_table_2():
    """Activations held on every rank, in layers of one micro-batch (hand-worked, one dense layer's bytes
    a): 1F1B rank 0 holds pp = 4 micro-batches of 6 layers, 24a; DualPipe PP + 1 = 5 stages of 6 layers,
    30a on every rank; DualPipeV 2·pp + 1 = 9 chunks of 3 layers, 27a on every rank. Parameters: DualPipe
    twice 1F1B's on a middle rank, DualPipeV the same."""
    _, r = _schedules()
    assert r.valid.all()
    held = r.stage_peak_bytes - r.stage_states_bytes - r.stage_fixed_bytes  # (N, K) activations in flight
    a = r.layer_act_bytes[0]
    rank0 = lambda i: int(np.flatnonzero(r.stage_rank[i] == 0)[0])  # noqa: E731
    assert held[0, rank0(0)] == pytest.approx(24 * a[0], rel=1e-12)
    assert np.allclose(held[1], 30 * a[1], rtol=1e-12)
    assert np.allclose(held[2], 27 * a[2], rtol=1e-12)
    middle = lambda i: int(np.flatnonzero(r.stage_rank[i] == 1)[0])  # noqa: E731
    states = r.stage_states_bytes
    assert states[1, middle(1)] == pytest.approx(2 * states[0, middle(0)], rel=1e-12)
    assert states[2, middle(2)] == pytest.approx(states[0, middle(0)], rel=1e-12)


def test_step_adds_up_and_dualpipe_halves_the_passes():
    """The breakdown adds up; DualPipe sends each micro-batch through one of a rank's two stages, so its
    compute per step is m/2 passes of twice the layers, and its bubble is
    Table 2's, under 1F1B's (pp − 1)·t."""
    _, r = _schedules()
    parts = sum(r.time[k] for k in r.time)
    assert np.allclose(parts, r.step_time_s, rtol=1e-12)
    # the pairs (0, 3) and (1, 2) even out the LM head that makes 1F1B's last rank the slowest: less than
    # 1F1B's m passes of 6 layers and the head, more than m passes of 6 layers and half of it
    assert 0.8 * r.time["compute_s"][0] < r.time["compute_s"][1] < r.time["compute_s"][0]
    # bubble / t lies inside the formula's range for a backward share in (0, 1)
    for i, sched, lo, hi in ((1, DUALPIPE, (PP / 2 - 1) / 4, (PP / 2 - 1) / 2),
                             (2, DUALPIPEV, (PP - 1) / 2 - 0.5, (PP - 1) * 0.75)):
        passes = r.microbatches[i] * (0.5 if sched == DUALPIPE else 1.0)
        t = (r.step_time_s[i] - r.time["pp_bubble_s"][i] - r.time["dp_comm_exposed_s"][i]
             - r.time["optimizer_s"][i] - r.time["straggler_s"][i]) / passes
        assert lo * t < r.time["pp_bubble_s"][i] < hi * t, (sched, r.time["pp_bubble_s"][i] / t)
    one_f_one_b_ratio = r.time["pp_bubble_s"][0] / (r.step_time_s[0] - r.time["pp_bubble_s"][0])
    assert r.time["pp_bubble_s"][1] / r.step_time_s[1] < one_f_one_b_ratio


@pytest.mark.parametrize("cfg,code", [
    ({"pp": 1, "pipeline_schedule": "dualpipe"}, "dualpipe_needs_pp"),
    ({"pp": 2, "pipeline_schedule": "dualpipe", "global_batch_size": 16}, "dualpipe_microbatches"),  # m 1
    ({"pp": 8, "pipeline_schedule": "dualpipev", "global_batch_size": 64}, "dualpipev_layers"),  # 16 > 6 layers
])
def test_validity_rules(cfg, code):
    spec, r = _score("tiny-moe", 16 * cfg["pp"], [{"global_batch_size": 256, **cfg}])
    broken = {rule.code for rule in r.rules if rule.broken[0]}
    assert code in broken and not r.valid[0]


def test_dualpipe_needs_an_even_pp():
    spec, r = _score(GPT, 24, [{"pp": 3, "pipeline_schedule": "dualpipe", "global_batch_size": 48}])
    assert [rule.code for rule in r.rules if rule.broken[0]] == ["dualpipe_even_pp"]


@pytest.mark.parametrize("cfg", [{"pp": 2, "vpp": 2, "pipeline_schedule": "dualpipev"},
                                 {"pp": 2, "vpp": 2, "pipeline_schedule": "1f1b"},
                                 {"pp": 2, "pipeline_schedule": "interleaved"}])
def test_schedule_against_vpp_is_exit_2_naming_the_field(tmp_path, cfg):
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"global_batch_size": 64, **cfg}))
    out = subprocess.run([sys.executable, "-m", "app.cli.main", "evaluate", "--model", "tiny-dense", "--cluster",
                          "nvidia-h100-80gb", "--devices", "16", "--config", str(path)],
                         capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    assert "pipeline_schedule" in out.stderr and "Traceback" not in out.stderr


def test_exports():
    """MindSpeed launches DualPipeV with its flags and refuses what its DualpipeVFeature refuses; Megatron-LM
    has no DualPipe; DeepSeek's bidirectional DualPipe has no flag in either."""
    spec = model_presets.load("deepseek-v3-671b")
    # MindSpeed's own example (docs/zh/features/dualpipev.md): DeepSeek-V3, PP8 TP2 EP32
    base = {"tp": 2, "pp": 8, "ep": 32, "global_batch_size": 4096, "pipeline_schedule": "dualpipev",
            "overlap_grad_reduce": False, "overlap_param_gather": False, "moe_a2a_overlap": True,
            "moe_a2a_algorithm": "flat"}
    args = launch_args(base, spec, "mindspeed", 8)
    assert args[args.index("--schedules-method") + 1] == "dualpipev"
    assert "--moe-fb-overlap" in args and "--moe-alltoall-overlap-comm" not in args
    assert int(args[args.index("--num-layers") + 1]) % 16 == 0  # 61 layers padded to 2·pp chunks
    for fw, cfg, field in (("megatron", base, "pipeline_schedule"),
                           ("mindspeed", {**base, "pipeline_schedule": "dualpipe"}, "pipeline_schedule"),
                           ("mindspeed", {**base, "overlap_grad_reduce": True}, "overlap_grad_reduce"),
                           ("mindspeed", {**base, "cp": 2}, "cp"),
                           ("mindspeed", {**base, "etp": 2}, "moe_a2a_overlap")):
        with pytest.raises(InexpressibleError) as exc:
            launch_args(cfg, spec, fw, 8)
        assert field in {r.field for r in exc.value.refusals}, (fw, cfg)


def test_the_search_offers_what_each_framework_runs():
    """Without a framework both schedules are offered; MindSpeed's space offers DualPipeV (with the gradient
    overlap off, as it requires) and never DualPipe; Megatron's neither."""
    spec, prof = model_presets.load("tiny-moe"), hardware_profiles.load("ascend-910b")

    def schedules(framework):
        space = build_space(spec, prof, 16, 64, framework=framework)
        rows, opts = np.nonzero(space._option_mask())
        configs = [space.config(int(r), int(o)) for r, o in zip(rows, opts)]
        for c in configs:
            if framework:
                assert not refusals(TrainingConfig.model_validate(c), spec, framework, 8), c
        return {c.get("pipeline_schedule") for c in configs}, configs

    assert schedules(None)[0] == {None, "dualpipe", "dualpipev"}
    names, configs = schedules("mindspeed")
    assert names == {None, "dualpipev"}
    assert all(not c["overlap_grad_reduce"] for c in configs if c.get("pipeline_schedule"))
    assert schedules("megatron")[0] == {None}


def test_combined_1f1b_needs_interleaving_on_megatron_only():
    """Megatron-Core's combined 1F1B with pp > 1 needs vpp > 1 (refused naming the field);
    MindSpeed's --moe-alltoall-overlap-comm runs that layout, and DualPipeV pairs the passes itself."""
    spec = model_presets.load("tiny-moe")
    cfg = TrainingConfig(pp=2, ep=2, global_batch_size=64, moe_a2a_overlap=True)
    assert [r.field for r in refusals(cfg, spec, "megatron", 8)] == ["moe_a2a_overlap"]
    assert refusals(cfg.model_copy(update={"vpp": 2}), spec, "megatron", 8) == []
    assert refusals(cfg, spec, "mindspeed", 8) == []

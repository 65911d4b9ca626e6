"""Activation offload: ``offload_modules`` moves each named module's saved input to
host memory. Hand-worked on tiny-dense (4 layers, h 256, seq 512) on one device with pp 1, where one
micro-batch is in flight: the layer input (``attn_norm``) is 2 B · 512 · 256 = 262,144 B per layer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

import hardware_profiles
from costmodel.result import evaluate
from costmodel.spec import HOST_FACTS, ClusterProfile, TrainingConfig
from app.service.core.config import Settings
from conftest import ROUND_EFFICIENCY, ROUND_FACTS
from app.service.main import create_app

ROOT = Path(__file__).resolve().parents[1]
GIB = 2.0**30
LAYER_INPUT_BYTES = 2 * 512 * 256  # bf16 · tokens · hidden: what attn_norm offloads per layer
LAYERS = 4


def cfg(**kw) -> TrainingConfig:
    return TrainingConfig(**{"global_batch_size": 4, **kw})


def codes(r) -> list[str]:
    return [x["code"] for x in r["infeasible_reasons"]]


def test_offloading_the_layer_input_moves_it_to_the_host(preset, round_profile):
    spec = preset("tiny-dense")
    base = evaluate(spec, round_profile, 1, cfg())
    off = evaluate(spec, round_profile, 1, cfg(offload_modules=["attn_norm"]))
    assert off["feasible"] and codes(off) == []
    # stored activations lose the 4 layer inputs; the layer in flight holds one while it is copied
    assert (base["memory"]["activations_gib"] - off["memory"]["activations_gib"]) * GIB == pytest.approx(
        LAYERS * LAYER_INPUT_BYTES, rel=1e-12)
    assert (off["memory"]["buffers_gib"] - base["memory"]["buffers_gib"]) * GIB == pytest.approx(
        LAYER_INPUT_BYTES, rel=1e-12)
    assert (base["memory"]["peak_gib"] - off["memory"]["peak_gib"]) * GIB == pytest.approx(
        (LAYERS - 1) * LAYER_INPUT_BYTES, rel=1e-12)
    assert off["memory"]["offloaded_gib"] * GIB == pytest.approx(LAYERS * LAYER_INPUT_BYTES, rel=1e-12)
    assert off["memory"]["per_stage_offloaded_gib"] == [off["memory"]["offloaded_gib"]]
    # one device of the node is used: the node's host holds that device's share
    assert off["memory"]["host_per_node_gib"] * GIB == pytest.approx(LAYERS * LAYER_INPUT_BYTES, rel=1e-12)
    # the copy (8.2 us at 32 GB/s: 64 GB/s over 2 devices) hides behind a layer's compute
    assert off["time"]["offload_s"] == 0.0
    assert off["step_time_s"] == pytest.approx(base["step_time_s"], rel=1e-12)
    assert "offload_s" not in base["time"] and "offloaded_gib" not in base["memory"]  # unchanged without


def test_a_slow_host_link_exposes_what_the_next_layer_cannot_hide(preset, make_profile):
    spec = preset("tiny-dense")
    slow = make_profile(efficiency=ROUND_EFFICIENCY, facts={**ROUND_FACTS, "host_link_bandwidth_gbps": 0.001,
                                                            "host_link_devices": 1})
    base = evaluate(spec, slow, 1, cfg())
    off = evaluate(spec, slow, 1, cfg(offload_modules=["attn_norm"]))
    copy_s = LAYER_INPUT_BYTES / 1e6  # 0.262 s each way per layer at 1 MB/s
    m = 4  # micro-batches: 4 / (1 · 1)
    full = m * LAYERS * 2 * copy_s  # what the copies take without any overlap
    # exposed = copy − the layer's forward (backward) compute: a layer of tiny-dense takes < 1 ms a pass
    assert full - m * LAYERS * 2e-3 < off["time"]["offload_s"] < full
    assert off["step_time_s"] - base["step_time_s"] == pytest.approx(off["time"]["offload_s"], rel=1e-9)
    assert sum(off["time"].values()) == pytest.approx(off["step_time_s"], rel=1e-12)


def test_host_memory_per_node_is_a_limit(preset, make_profile):
    spec = preset("tiny-dense")
    small = make_profile(efficiency=ROUND_EFFICIENCY, facts={**ROUND_FACTS, "host_memory_gib": 0.5 / 1024})
    r = evaluate(spec, small, 1, cfg(offload_modules=["attn_norm"]))  # 1 MiB offloaded, 0.5 MiB of host
    assert codes(r) == ["host_oom"] and r["feasible"] is False
    assert "host memory" in r["infeasible_reasons"][0]["message"] and r["step_time_s"] > 0
    fits = evaluate(spec, small, 1, cfg(offload_modules=["core_attn"]))  # Q, K, V and row stats: more
    assert codes(fits) == ["host_oom"]
    assert evaluate(spec, small, 1, cfg())["feasible"]  # nothing offloaded: host memory does not bind


def _without_host_link(profile: ClusterProfile) -> ClusterProfile:
    data = profile.model_dump()
    data["facts"] = {k: v for k, v in data["facts"].items() if k not in HOST_FACTS}
    return ClusterProfile(**data)


def test_offload_needs_a_host_link(preset, round_profile):
    spec = preset("tiny-dense")
    bare = _without_host_link(round_profile)
    assert not bare.has_host_link
    r = evaluate(spec, bare, 1, cfg(offload_modules=["attn_norm"]))
    assert codes(r) == ["offload_needs_host_link"] and r["step_time_s"] is None
    assert "host_link_bandwidth_gbps" in r["infeasible_reasons"][0]["message"]
    assert evaluate(spec, bare, 1, cfg())["feasible"]  # without offload the profile scores as before


def test_offload_with_full_recompute_is_refused(preset, round_profile):
    spec = preset("tiny-dense")
    r = evaluate(spec, round_profile, 1, cfg(recompute="full", offload_modules=["core_attn", "attn_proj"]))
    assert codes(r) == ["offload_full_recompute"] and "recompute full" in r["infeasible_reasons"][0]["message"]
    ok = evaluate(spec, round_profile, 1, cfg(recompute="selective", offload_modules=["core_attn", "attn_proj"]))
    assert ok["feasible"]


def test_expert_offload_needs_experts(preset, round_profile):
    r = evaluate(preset("tiny-dense"), round_profile, 1, cfg(offload_modules=["mlp_norm", "moe_act"]))
    assert codes(r) == ["offload_needs_moe"] and "moe_act" in r["infeasible_reasons"][0]["message"]
    moe = evaluate(preset("tiny-moe"), round_profile, 1, cfg(offload_modules=["mlp_norm", "moe_act"]))
    assert codes(moe) in ([], ["oom"]) and moe["memory"]["offloaded_gib"] > 0


def test_expert_offload_drops_expert_activations(preset, round_profile):
    spec = preset("tiny-moe")
    base = evaluate(spec, round_profile, 1, cfg())
    for mods in (["expert_fc1"], ["moe_act"]):
        off = evaluate(spec, round_profile, 1, cfg(offload_modules=mods))
        assert off["memory"]["activations_gib"] < base["memory"]["activations_gib"], mods
        assert off["memory"]["activations_gib"] + off["memory"]["offloaded_gib"] == pytest.approx(
            base["memory"]["activations_gib"], rel=1e-12)


@pytest.mark.parametrize("bad, words", [(["mlp"], "unknown offload module"),
                                        (["attn_norm", "attn_norm"], "named twice"),
                                        (["attn_proj"], "only with core_attn"),  # Megatron-Core refuses it
                                        ("attn_norm", "list")])
def test_bad_offload_modules_name_the_field(bad, words):
    with pytest.raises(ValidationError) as exc:
        TrainingConfig(global_batch_size=1, offload_modules=bad)
    assert exc.value.errors()[0]["loc"][0] == "offload_modules"
    assert words in str(exc.value)


def test_cli_exit_2_and_api_422_name_offload_modules(tmp_path):
    bad = {"global_batch_size": 4, "offload_modules": ["mlp"]}
    proc = subprocess.run([sys.executable, "-m", "app.cli", "evaluate", "--model", "tiny-dense", "--cluster",
                           "nvidia-h100-80gb", "--devices", "8", "--config", json.dumps(bad)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and "offload_modules" in proc.stderr and "Traceback" not in proc.stderr
    with TestClient(create_app(Settings(database_url=f"sqlite:///{tmp_path / 'api.db'}"))) as client:
        r = client.post("/v1/evaluate", json={"model": "tiny-dense", "cluster": "nvidia-h100-80gb", "devices": 8,
                                              "config": bad})
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == ["body", "config", "offload_modules"]
        ok = client.post("/v1/evaluate", json={"model": "tiny-dense", "cluster": "nvidia-h100-80gb", "devices": 8,
                                               "config": {"global_batch_size": 8, "offload_modules": ["attn_norm"]}})
        assert ok.status_code == 200 and ok.json()["time"]["offload_s"] == 0.0


@pytest.mark.parametrize("fact", HOST_FACTS)
def test_host_facts_must_be_positive(fact):
    with pytest.raises(ValidationError) as exc:
        hardware_profiles.load({"base": "nvidia-h100-80gb", "facts": {fact: {"value": 0, "source": "test"}}})
    assert f"facts.{fact} must be a positive number" in str(exc.value)


@pytest.mark.parametrize("name", hardware_profiles.names() if hasattr(hardware_profiles, "names") else
                         [p.stem for p in (ROOT / "hardware_profiles").glob("*.yaml")])
def test_every_profile_states_its_host_link_with_a_source(name):
    prof = hardware_profiles.load(name)
    assert prof.has_host_link
    for fact in HOST_FACTS:
        assert prof.facts[fact].value > 0 and len(prof.facts[fact].source) > 20


def test_pangu_selective_recompute_and_swap_saves_70_percent_of_activations(preset, profile):
    """Huawei's "Selective R/S" for Pangu Ultra MoE (> 70 % activation memory saved): the published
    layout with its selective recompute and MindSpeed's default swap modules, against the same layout
    with neither."""
    spec, prof = preset("pangu-ultra-moe-718b"), profile("ascend-910b")
    rs_cfg = json.loads((ROOT / "examples" / "pangu-ultra-moe-6144-rs.json").read_text())
    published = json.loads((ROOT / "examples" / "pangu-ultra-moe-6144.json").read_text())
    assert {k: v for k, v in rs_cfg.items() if k != "offload_modules"} == published  # the same layout
    bare = {**{k: v for k, v in published.items() if k != "recompute_modules"}, "recompute": "none"}
    rs = evaluate(spec, prof, 6144, TrainingConfig(**rs_cfg))
    none = evaluate(spec, prof, 6144, TrainingConfig(**bare))
    assert rs["feasible"] and codes(rs) == [] and codes(none) == ["oom"]
    saved = 1 - rs["memory"]["activations_gib"] / none["memory"]["activations_gib"]
    assert saved >= 0.70, saved
    # offload alone keeps the step (its copies hide behind the layers' compute here): the time is the
    # selective recompute's
    assert rs["time"]["offload_s"] == 0.0
    rec = evaluate(spec, prof, 6144, TrainingConfig(**published))
    assert rs["step_time_s"] == pytest.approx(rec["step_time_s"], rel=1e-12)
    assert rs["memory"]["per_stage_peak_without_offload_gib"] == pytest.approx(rec["memory"]["per_stage_peak_gib"])
    assert rs["memory"]["host_per_node_gib"] < rs["memory"]["host_capacity_gib"]


# ---- the search weighs offload against recompute -------------------------------------------------------
# tiny-dense on one device, tp = pp = cp = micro-batch 1 (4 micro-batches), with the device memory set
# below the no-recompute peak, so that the search must save memory. Offloading attn_norm and mlp_norm moves
# the two norm inputs of each layer (2 · 262,144 B) to the host; the layer in flight holds its own while
# it is copied, so the peak drops by 3 layers' worth: 1,572,864 B.
NORMS = ["attn_norm", "mlp_norm"]
NORMS_SAVED_BYTES = (LAYERS - 1) * 2 * LAYER_INPUT_BYTES
PINNED = {"tp": 1, "pp": 1, "cp": 1, "micro_batch_size": 1}


def _host_link(gbps: float) -> dict:
    return {**ROUND_FACTS, "host_link_bandwidth_gbps": gbps, "host_link_devices": 1}


def _memory_bound_profile(spec, make_profile, host_gbps: float) -> tuple[ClusterProfile, dict]:
    """(a profile whose capacity is halfway into the norms' saving, the no-recompute no-offload
    evaluation): no recompute and no offload does not fit, the norms' offload does."""
    bare = evaluate(spec, make_profile(efficiency=ROUND_EFFICIENCY, facts=_host_link(host_gbps)), 1, cfg(**PINNED))
    capacity_gib = bare["memory"]["peak_gib"] - NORMS_SAVED_BYTES / 2 / GIB
    return make_profile(efficiency=ROUND_EFFICIENCY, facts={**_host_link(host_gbps), "memory_gib": capacity_gib}), bare


def _memory_bound_search(spec, make_profile, host_gbps: float) -> tuple[dict, dict]:
    """(the search's result, the no-recompute no-offload evaluation) on ``_memory_bound_profile``."""
    from search import SearchRequest, run_search

    tight, bare = _memory_bound_profile(spec, make_profile, host_gbps)
    res = run_search(SearchRequest(spec=spec, profile=tight, devices=1, global_batch_size=4, sampler="exhaustive",
                                   top_k=50, fixed=PINNED, memory_margin_gib=0.0))
    assert not evaluate(spec, tight, 1, cfg(**PINNED))["feasible"]  # memory binds
    return res, bare


def test_search_offloads_where_the_copy_hides_and_recompute_costs_time(preset, make_profile):
    spec = preset("tiny-dense")
    res, bare = _memory_bound_search(spec, make_profile, host_gbps=64.0)
    best = res["best"]
    # the copy of one layer's norm inputs, 524,288 B at 64 GB/s = 8.2 us, hides behind a layer's pass
    # (> 0.1 ms): the offload costs nothing, every recompute plan costs its recomputed forward
    assert best["config"]["offload_modules"] and best["config"]["recompute"] == "none"
    assert best["evaluation"]["time"]["offload_s"] == 0.0
    assert best["evaluation"]["step_time_s"] == pytest.approx(bare["step_time_s"], rel=1e-12)
    # (FlashAttention's tensors hide too and save more; at equal time the smaller peak ranks first)
    norms = next(e for e in res["top"] if e["config"].get("offload_modules") == NORMS)
    assert norms["evaluation"]["step_time_s"] == best["evaluation"]["step_time_s"]
    assert (bare["memory"]["peak_gib"] - norms["evaluation"]["memory"]["peak_gib"]) * GIB == pytest.approx(
        NORMS_SAVED_BYTES, rel=1e-9)
    recomputing = [e for e in res["top"] if not e["config"].get("offload_modules")]
    assert recomputing and all(e["config"]["recompute"] != "none" for e in recomputing)
    assert all(e["evaluation"]["step_time_s"] > bare["step_time_s"] for e in recomputing)


def test_search_recomputes_where_the_copy_is_exposed(preset, make_profile):
    spec = preset("tiny-dense")
    res, bare = _memory_bound_search(spec, make_profile, host_gbps=0.05)
    best = res["best"]
    assert not best["config"].get("offload_modules") and best["config"]["recompute"] != "none"
    recompute_cost_s = best["evaluation"]["step_time_s"] - bare["step_time_s"]
    # offloading the norms instead exposes, per micro-batch (4), layer (4) and direction (2), the copy of
    # 524,288 B at 50 MB/s (10.5 ms) less the layer's pass it overlaps (< 1 ms)
    slow = make_profile(efficiency=ROUND_EFFICIENCY, facts=_host_link(0.05))
    norms = evaluate(spec, slow, 1, cfg(**PINNED, offload_modules=NORMS))
    copy_s = 2 * LAYER_INPUT_BYTES / 0.05e9
    assert 4 * 4 * 2 * (copy_s - 1e-3) < norms["time"]["offload_s"] < 4 * 4 * 2 * copy_s
    assert recompute_cost_s < norms["time"]["offload_s"]
    offloading = [e for e in res["top"] if e["config"].get("offload_modules")]
    assert offloading and all(e["evaluation"]["step_time_s"] > best["evaluation"]["step_time_s"] for e in offloading)


@pytest.mark.parametrize("host_gbps", [64.0, 0.05])
def test_skipping_offload_plans_whose_counterpart_fits_keeps_every_layouts_best(preset, make_profile, host_gbps):
    """scored_groups scores an offload plan only where its counterpart without offload fails: each
    layout's best (and its throughput) is the one that scoring every choice gives."""
    import optuna

    from search import SearchRequest, run_search
    from search.samplers import _best_index, _score, expand, scored_groups, trial_layout
    from search.space import build_space

    spec = preset("tiny-moe")
    bare = evaluate(spec, make_profile(efficiency=ROUND_EFFICIENCY, facts=_host_link(host_gbps)), 8,
                    cfg(global_batch_size=64, ep=2))
    tight = make_profile(efficiency=ROUND_EFFICIENCY,
                         facts={**_host_link(host_gbps), "memory_gib": bare["memory"]["peak_gib"] - 0.001})
    space = build_space(spec, tight, 8, 64)
    storage = optuna.storages.InMemoryStorage()  # the layouts a random search visits
    run_search(SearchRequest(spec=spec, profile=tight, devices=8, global_batch_size=64, sampler="random", n_trials=40,
                             seed=3, storage=storage, study_name="s", memory_margin_gib=0.0))
    layouts = [trial_layout(space, t) for t in optuna.load_study(study_name="s", storage=storage).trials]
    groups, scores = scored_groups(space, layouts, margin_gib=0.0)
    skipped, start = 0, 0
    for lay, kept in zip(layouts, groups):
        full = expand(space, lay)
        _, ok, tok, _, room, _ = _score(space, full)
        sl = slice(start, start + len(kept))
        start += len(kept)
        skipped += len(full) - len(kept)
        j, k = _best_index(ok, tok, room, 0.0), _best_index(scores[1][sl], scores[2][sl], scores[4][sl], 0.0)
        assert (j is None) == (k is None)
        if j is not None:
            assert full[j] == kept[k] and tok[j] == scores[2][sl][k]
    assert skipped > 0  # some offload plans were not needed ...
    base_of = space.offload_counterpart
    assert any(base_of[c["option"]] != c["option"] for g in groups for c in g)  # ... and some were


def test_exhaustive_ranks_no_offload_plan_whose_counterpart_fits(preset, make_profile):
    """Where memory is roomy an offload plan only repeats its counterpart at equal or lower throughput:
    the exhaustive engine ranks the same configs as the samplers, which never score such a plan, so its
    top K are K distinct plans without offload (they had filled half the list, one copy each)."""
    from search import SearchRequest, run_search

    spec = preset("tiny-dense")
    roomy = make_profile(efficiency=ROUND_EFFICIENCY, facts=_host_link(64.0))
    res = run_search(SearchRequest(spec=spec, profile=roomy, devices=8, global_batch_size=32, sampler="exhaustive",
                                   top_k=10, memory_margin_gib=0.0))
    assert len(res["top"]) == 10
    assert not any(e["config"].get("offload_modules") for e in res["top"]), [e["config"] for e in res["top"]]
    keys = [json.dumps(e["config"], sort_keys=True) for e in res["top"]]
    assert len(set(keys)) == 10
    # and where memory binds, an offload plan whose counterpart does not fit is still ranked
    tight, _ = _memory_bound_profile(spec, make_profile, host_gbps=64.0)
    res, _ = _memory_bound_search(spec, make_profile, host_gbps=64.0)
    offloading = [e["config"] for e in res["top"] if e["config"].get("offload_modules")]
    assert offloading
    for c in offloading:
        assert not evaluate(spec, tight, 1, TrainingConfig(**{**c, "offload_modules": None}))["feasible"], c


def test_a_search_that_pins_offload_ranks_the_plans_that_offload(preset):
    """With offload_modules pinned every plan offloads, so none has a counterpart without offload: each is
    its own and none may be dropped as its repeat (they all were, and the search found nothing to fit)."""
    from search import SearchRequest, run_search

    spec, profile = preset("tiny-moe"), hardware_profiles.load("nvidia-h100-80gb")
    res = run_search(SearchRequest(spec=spec, profile=profile, devices=8, global_batch_size=64, sampler="exhaustive",
                                   top_k=5, fixed={"offload_modules": ["core_attn"]}))
    assert res["best"] is not None and len(res["top"]) == 5
    assert all(e["config"]["offload_modules"] == ["core_attn"] for e in res["top"])

"""Expert load from a routing distribution and its placement on EP ranks."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

import hardware_profiles
import model_presets
from app.service.core.config import Settings
from app.service.main import create_app
from costmodel import TrainingConfig, evaluate
from costmodel.routing import copies, expert_shares, placement, rank_imbalance

ROOT = Path(__file__).resolve().parents[1]
SKEWED = json.loads((ROOT / "examples" / "pangu-ultra-moe-6144-skewed.json").read_text())


def test_hand_worked_placement():
    """8 experts with loads 4,3,2,1,1,1,1,1 on 2 EP ranks of 4 experts each. Contiguous: ranks get
    4+3+2+1 = 10 and 4, mean 7, max/mean 10/7. Balanced (hottest first on the least loaded rank with a
    free slot): 4 -> r0, 3 -> r1, 2 -> r1 (5), 1 -> r0 (5), 1 -> r0 (6, the tie goes to r0), 1 -> r1
    (6), 1 -> r0 (7, full), 1 -> r1 (7): max/mean 1."""
    shares = np.array([4, 3, 2, 1, 1, 1, 1, 1]) / 14
    assert rank_imbalance(shares, 2, "contiguous") == pytest.approx(10 / 7)
    assert rank_imbalance(shares, 2, "balanced") == pytest.approx(1.0)
    assert placement(shares, 2, "balanced").tolist() == [0, 1, 1, 0, 0, 1, 0, 1]
    assert np.bincount(placement(shares, 2, "balanced")).tolist() == [4, 4]  # E / ep experts per rank


def test_skew_model_shares():
    spec = model_presets.load("pangu-ultra-moe-718b")
    shares = expert_shares(spec, TrainingConfig.model_validate({"global_batch_size": 8, "moe_expert_skew": 0.5}))
    assert shares.sum() == pytest.approx(1.0) and len(shares) == spec.num_experts
    ranked = np.sort(shares)[::-1]
    assert ranked[0] / ranked[-1] == pytest.approx(spec.num_experts ** 0.5)  # Zipf: (k+1)^-s
    uniform = expert_shares(spec, TrainingConfig.model_validate({"global_batch_size": 8, "moe_expert_skew": 0.0}))
    assert np.allclose(uniform, 1 / spec.num_experts)


def _score(cfg: dict) -> dict:
    spec, profile = model_presets.load("pangu-ultra-moe-718b"), hardware_profiles.load("ascend-910b")
    return evaluate(spec, profile, 6144, TrainingConfig.model_validate(cfg))


def test_balanced_placement_of_skewed_pangu_routing_is_less_imbalanced_and_faster():
    """Pangu's 256 experts over EP 32 with a Zipf-0.5 router: the result reports both placements, the
    times use the config's, and they equal a config that states that imbalance directly."""
    contiguous = _score(SKEWED)
    balanced = _score({**SKEWED, "expert_placement": "balanced"})
    r_c, r_b = contiguous["moe_routing"], balanced["moe_routing"]
    spec = model_presets.load("pangu-ultra-moe-718b")
    shares = expert_shares(spec, TrainingConfig.model_validate(SKEWED))
    assert r_c["imbalance"] == pytest.approx(rank_imbalance(shares, 32, "contiguous"))
    assert r_b["imbalance"] == pytest.approx(rank_imbalance(shares, 32, "balanced"))
    assert r_b["imbalance"] < r_c["imbalance"]
    assert r_c["imbalance_balanced"] == r_b["imbalance_balanced"]
    assert balanced["step_time_s"] < contiguous["step_time_s"]
    stated = {k: v for k, v in SKEWED.items() if k not in ("moe_expert_skew", "expert_placement")}
    direct = _score({**stated, "moe_load_imbalance": r_b["imbalance"]})
    assert direct["step_time_s"] == pytest.approx(balanced["step_time_s"], rel=1e-12)
    assert "moe_routing" not in direct


def test_uniform_routing_scores_the_same_either_way():
    uniform = {**SKEWED, "moe_expert_skew": 0.0}
    a, b = _score(uniform), _score({**uniform, "expert_placement": "balanced"})
    assert a["moe_routing"]["imbalance"] == pytest.approx(1.0) == b["moe_routing"]["imbalance"]
    assert a["step_time_s"] == pytest.approx(b["step_time_s"], rel=1e-12)


def run(*args):
    return subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, cwd=ROOT)


EVAL = ("evaluate", "--model", "tiny-moe", "--cluster", "nvidia-h100-80gb", "--devices", "8")


@pytest.mark.parametrize("cfg,field", [
    ({"moe_expert_load": [1, 2, 3]}, "config.moe_expert_load"),  # tiny-moe has 8 experts
    ({"moe_expert_load": [1, -1, 1, 1, 1, 1, 1, 1]}, "config.moe_expert_load"),
    ({"moe_expert_skew": -1}, "config.moe_expert_skew"),
    ({"moe_expert_skew": 0.5, "moe_load_imbalance": 1.2}, "config.moe_expert_skew"),
    ({"moe_expert_load": [1] * 8, "moe_expert_skew": 0.5}, "config.moe_expert_skew"),
    ({"expert_placement": "random"}, "config.expert_placement"),
])
def test_bad_routing_fields_exit_2_naming_the_field(cfg, field):
    proc = run(*EVAL, "--config", json.dumps({"global_batch_size": 16, "ep": 2, **cfg}))
    assert proc.returncode == 2, proc.stdout
    assert field in proc.stderr


def test_dense_model_routing_is_refused_by_the_cli():
    proc = run("evaluate", "--model", "tiny-dense", "--cluster", "nvidia-h100-80gb", "--devices", "8",
               "--config", json.dumps({"global_batch_size": 16, "moe_expert_skew": 0.5}))
    assert proc.returncode == 2 and "config.moe_expert_skew" in proc.stderr


def test_api_reports_routing_and_names_bad_fields(tmp_path):
    with TestClient(create_app(Settings(database_url=f"sqlite:///{tmp_path / 'api.db'}"))) as client:
        body = {"model": "tiny-moe", "cluster": "nvidia-h100-80gb", "devices": 8,
                "config": {"global_batch_size": 16, "ep": 2, "moe_expert_load": [4, 3, 2, 1, 1, 1, 1, 1]}}
        r = client.post("/v1/evaluate", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["moe_routing"]["imbalance"] == pytest.approx(10 / 7)
        body["config"]["moe_expert_load"] = [1, 2]
        r = client.post("/v1/evaluate", json=body)
        assert r.status_code == 422
        assert ["body", "config", "moe_expert_load"] in [d["loc"] for d in r.json()["detail"]]


# ---- searching with a routing distribution -------------------------------------------------------------
SEARCH = ("search", "--model", "tiny-moe", "--cluster", "nvidia-h100-80gb", "--devices", "16",
          "--global-batch-size", "64")


def test_a_search_scores_each_ep_with_the_imbalance_its_placement_gives():
    """The distribution is pinned (--fix); the imbalance then differs per ep: one rank holds every expert
    at ep 1 (1.0), each expert has its own rank at ep 8 (max share × 8). Every ranked config states the
    distribution, not an imbalance, and scores as evaluate scores it."""
    from search import SearchRequest, run_search

    spec, profile = model_presets.load("tiny-moe"), hardware_profiles.load("nvidia-h100-80gb")
    res = run_search(SearchRequest(spec=spec, profile=profile, devices=16, global_batch_size=64, sampler="exhaustive",
                                   top_k=40, fixed={"moe_expert_skew": 0.8}))
    shares = expert_shares(spec, TrainingConfig.model_validate({"global_batch_size": 1, "moe_expert_skew": 0.8}))
    seen = {}
    for e in res["top"] + res["layouts"]:
        cfg = e["config"]
        assert cfg["moe_expert_skew"] == 0.8 and "moe_load_imbalance" not in cfg
        routed = e["evaluation"]["moe_routing"]
        assert routed["imbalance"] == pytest.approx(rank_imbalance(shares, cfg["ep"], "contiguous"), rel=1e-12)
        seen[cfg["ep"]] = routed["imbalance"]
        again = evaluate(spec, profile, 16, TrainingConfig.model_validate(cfg))
        assert again["tokens_per_s"] == pytest.approx(e["evaluation"]["tokens_per_s"], rel=1e-12)
    assert len(seen) > 1, seen  # several ep values ranked, each with its own imbalance
    if 1 in seen:
        assert seen[1] == pytest.approx(1.0)
    if 8 in seen:
        assert seen[8] == pytest.approx(8 * shares.max())
    # the same search at a stated imbalance of 1.0 ranks faster configs: the skew costs time
    flat = run_search(SearchRequest(spec=spec, profile=profile, devices=16, global_batch_size=64, sampler="exhaustive",
                                    top_k=1, moe_load_imbalance=1.0))
    assert flat["best"]["evaluation"]["tokens_per_s"] > res["best"]["evaluation"]["tokens_per_s"]


@pytest.mark.parametrize("args,field,why", [
    (("--fix", "moe_expert_skew=0.5", "--moe-load-imbalance", "1.2"), "fix.moe_expert_skew", "not both"),
    (("--fix", "moe_expert_load=[1,2]"), "fix.moe_expert_load", "2 shares for num_experts=8"),
    (("--fix", "moe_expert_skew=-1"), "fix.moe_expert_skew", "greater than or equal"),
    (("--fix", "moe_expert_skew=0.5", "--fix", "expert_placement=balanced"), "fix.expert_placement",
     "cannot launch a balanced placement"),
])
def test_bad_search_routing_exits_2_naming_the_field(args, field, why):
    proc = run(*SEARCH, *args)
    assert proc.returncode == 2, proc.stdout[-500:]
    assert field in proc.stderr and why in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_a_dense_search_refuses_a_routing_distribution():
    proc = run("search", "--model", "tiny-dense", "--cluster", "nvidia-h100-80gb", "--devices", "8",
               "--global-batch-size", "64", "--fix", "moe_expert_skew=0.5")
    assert proc.returncode == 2 and "fix.moe_expert_skew" in proc.stderr and "dense" in proc.stderr, proc.stderr


def test_api_job_with_bad_routing_is_a_422_naming_the_field(tmp_path):
    job = {"model": "tiny-moe", "cluster": "nvidia-h100-80gb", "devices": 16, "global_batch_size": 64,
           "search": {"sampler": "exhaustive", "fixed": {"moe_expert_load": [1, 2]}}}
    with TestClient(create_app(Settings(database_url=f"sqlite:///{tmp_path / 'api.db'}"))) as client:
        r = client.post("/v1/jobs", json=job)
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == ["body", "search", "fixed", "moe_expert_load"]
        assert "num_experts=8" in r.json()["detail"][0]["msg"]
        job["search"]["fixed"] = {"moe_expert_skew": 0.5, "expert_placement": "balanced"}
        r = client.post("/v1/jobs", json=job)
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == ["body", "search", "fixed", "expert_placement"]
        job["search"]["fixed"] = {"moe_expert_skew": 0.5}
        assert client.post("/v1/jobs", json=job).status_code == 202  # accepted: the worker ranks with it


# ---- replicas of hot experts -------------------------------------------------------------------------
def test_hand_worked_replicas():
    """Loads 8,1,1,1,1,1,1,1 on 2 EP ranks. Balanced, no copies: 8 -> r0, four 1s fill r1 (4 slots),
    three more on r0: 11 and 4 of a mean 7.5, max/mean 11/7.5. One extra slot per rank (2 copies in all):
    expert 0 gets a second copy (4 tokens each), then expert 1 (8 / 2 = 4 is capped at ep = 2 copies):
    slots 4,4,1,1,1,1,1,1,0.5,0.5 packed greedily give 7.5 and 7.5."""
    shares = np.array([8, 1, 1, 1, 1, 1, 1, 1]) / 15
    assert copies(shares, 2, 1).tolist() == [2, 2, 1, 1, 1, 1, 1, 1]
    assert rank_imbalance(shares, 2, "balanced") == pytest.approx(11 / 7.5)
    assert rank_imbalance(shares, 2, "balanced", replicas=1) == pytest.approx(1.0)
    assert rank_imbalance(shares, 2, "contiguous", replicas=1) == rank_imbalance(shares, 2, "contiguous")
    assert copies(shares, 2, 8).max() == 2  # never more copies of an expert than ranks


def test_replicas_cost_one_expert_of_memory_per_slot_and_pay_for_themselves_on_pangu():
    spec = model_presets.load("pangu-ultra-moe-718b")
    balanced = _score({**SKEWED, "expert_placement": "balanced"})
    replicated = _score({**SKEWED, "expert_placement": "balanced", "moe_expert_replicas": 1})
    assert replicated["moe_routing"]["imbalance"] < balanced["moe_routing"]["imbalance"]
    assert replicated["step_time_s"] < balanced["step_time_s"]
    # the weights of one more expert per MoE block of the (one) stage, in bf16 (etp 1), on every rank: the
    # five MoE layers and the MTP layer, whose block is an MoE block too (DeepSeek-V3 §2.2)
    tiny = model_presets.load("tiny-moe")
    profile = hardware_profiles.load("nvidia-h100-80gb")
    cfg = {"global_batch_size": 64, "ep": 2, "moe_expert_load": [8, 1, 1, 1, 1, 1, 1, 1], "expert_placement": "balanced"}
    p0, p1 = (evaluate(tiny, profile, 8, TrainingConfig.model_validate({**cfg, "moe_expert_replicas": r}))
              for r in (0, 1))
    expert_bytes = 3 * tiny.hidden_size * tiny.expert_ffn * 2 * (sum(tiny.moe_layer_pattern())
                                                                      + tiny.mtp_num_layers)  # SwiGLU: 3 matrices
    assert (p1["memory"]["params_gib"] - p0["memory"]["params_gib"]) * 2**30 == pytest.approx(expert_bytes, rel=1e-9)
    assert p1["moe_routing"]["tokens_per_rank_balanced"] == pytest.approx([1.0, 1.0])
    assert p1["time"]["dp_comm_exposed_s"] >= p0["time"]["dp_comm_exposed_s"]  # the copies' gradients are summed
    assert spec.num_experts == 256


@pytest.mark.parametrize("cfg,why", [
    ({"moe_expert_replicas": 1, "moe_expert_skew": 0.5}, "expert_placement=balanced"),
    ({"moe_expert_replicas": 1, "expert_placement": "balanced"}, "give the routing"),
    ({"moe_expert_replicas": -1}, "greater than or equal"),
])
def test_bad_replicas_exit_2_naming_the_field(cfg, why):
    proc = run(*EVAL, "--config", json.dumps({"global_batch_size": 16, "ep": 2, **cfg}))
    assert proc.returncode == 2 and "config.moe_expert_replicas" in proc.stderr and why in proc.stderr, proc.stderr


def test_pangu_skewed_imbalance_by_an_independent_hand_computation():
    """The example's numbers recomputed here without costmodel.routing: Zipf-0.5 shares of Pangu's 256
    experts, heat ranks spread by numpy's default_rng(0) permutation (the documented skew model), 8 experts
    per rank over EP 32. Contiguous: the sum of each block of 8 ids. Balanced: longest processing time
    with a heap of (load, rank) and 8 slots per rank."""
    import heapq

    heat = (np.arange(256) + 1.0) ** -0.5
    shares = np.empty(256)
    shares[np.random.default_rng(0).permutation(256)] = heat / heat.sum()
    contiguous = shares.reshape(32, 8).sum(axis=1)
    heap, loads, slots = [(0.0, r) for r in range(32)], np.zeros(32), np.zeros(32, dtype=int)
    for share in sorted(shares, reverse=True):
        load, r = heapq.heappop(heap)
        loads[r], slots[r] = load + share, slots[r] + 1
        if slots[r] < 8:
            heapq.heappush(heap, (loads[r], r))
    mean = 1 / 32
    c, b = _score(SKEWED), _score({**SKEWED, "expert_placement": "balanced"})
    assert c["moe_routing"]["imbalance"] == pytest.approx(contiguous.max() / mean, rel=1e-9)
    assert b["moe_routing"]["imbalance"] == pytest.approx(loads.max() / mean, rel=1e-9)
    assert c["moe_routing"]["imbalance"] == pytest.approx(2.56, abs=0.005)  # the README's figures
    assert b["moe_routing"]["imbalance"] == pytest.approx(1.51, abs=0.005)
    assert b["step_time_s"] < c["step_time_s"]

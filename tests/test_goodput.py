"""Failures, checkpoints and goodput (costmodel/resilience.py; docs/guides/goodput.md): the formulas worked by hand, the
goodput block on real evaluations, plans and searches that price it, and bad options refused naming the field."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import hardware_profiles
import model_presets
from costmodel import TrainingConfig, evaluate
from costmodel import resilience as r
from search.capacity import PlanRequest, run_plan

ROOT = Path(__file__).resolve().parents[1]
H100 = hardware_profiles.load("nvidia-h100-80gb")
A100 = hardware_profiles.load("nvidia-a100-80gb")


def test_young_daly_optimum_by_hand():
    # a 10 s checkpoint against a 20,000 s MTBF: sqrt(2 · 10 · 20,000) = sqrt(400,000) = 632.46 s
    assert float(r.young_daly_interval_s(10.0, 20_000.0)) == pytest.approx(632.456, abs=1e-3)
    # taken in whole steps of 4 s: 632.46 / 4 = 158.1 -> 159 steps = 636 s
    interval, steps = r.checkpoint_interval_s(None, np.array([10.0]), np.array([0.0]), 20_000.0, np.array([4.0]))
    assert steps[0] == 159 and interval[0] == pytest.approx(636.0)
    # an asynchronous write of 900 s must finish before the next checkpoint: the interval waits for it
    interval, _ = r.checkpoint_interval_s(None, np.array([10.0]), np.array([900.0]), 20_000.0, np.array([4.0]))
    assert interval[0] == pytest.approx(900.0)
    # a given interval is kept (in whole steps)
    interval, steps = r.checkpoint_interval_s(1_000.0, np.array([10.0]), np.array([0.0]), 20_000.0, np.array([3.0]))
    assert steps[0] == 334 and interval[0] == pytest.approx(1_002.0)


def test_async_checkpoint_stalls_only_for_the_device_to_host_copy():
    # a rank holds 6 GB of optimizer shard and 8 GB of weights replicated on 4 data-parallel ranks: it writes
    # 6 + 8/4 = 8 GB. Its node's 8 ranks write 64 GB at 10 GB/s = 6.4 s; 1,024 devices write 8.192 TB through
    # 2 TB/s of storage = 4.1 s: the node binds. The copy to host memory at 32 GB/s takes 0.25 s.
    per_rank = float(r.checkpoint_bytes_per_rank(8e9, 6e9, 4))
    assert per_rank == pytest.approx(8e9)
    write = float(r.storage_transfer_s(per_rank, 8, 1024, 10.0, 2000.0))
    assert write == pytest.approx(6.4)
    assert float(r.storage_transfer_s(per_rank, 8, 1024, 100.0, 2000.0)) == pytest.approx(8e9 * 1024 / 2e12)
    d2h = float(r.device_to_host_s(per_rank, 32e9))
    assert d2h == pytest.approx(0.25)
    assert float(r.checkpoint_stall_s("sync", write, d2h)) == pytest.approx(6.4)
    assert float(r.checkpoint_stall_s("async", write, d2h)) == pytest.approx(0.25)
    assert float(r.checkpoint_background_s("async", write, 1.0)) == pytest.approx(6.4)
    assert float(r.checkpoint_background_s("sync", write, 1.0)) == 0.0
    assert float(r.checkpoint_background_s("in_memory", write, 1.0)) == pytest.approx(1.0)


def test_lost_work_expectation_by_hand_and_by_simulation():
    # interval 600 s, the newest checkpoint safe 30 s after it is taken: 600/2 + 30 = 330 s
    assert float(r.lost_work_per_failure_s(600.0, 30.0)) == pytest.approx(330.0)
    # the same by drawing failures uniformly over an interval: before the newest checkpoint is safe the one
    # before it is the restart point (x + interval lost), after it x
    x = np.random.default_rng(7).uniform(0.0, 600.0, 400_000)
    simulated = np.where(x < 30.0, x + 600.0, x).mean()
    assert simulated == pytest.approx(330.0, rel=0.01)


def test_goodput_fraction_by_hand():
    # 1 failure per 10,000 s costing 500 s (lost + down), a 10 s stall per 990 s of training:
    # (1 - 500/10,000) · 990 / 1,000 = 0.95 · 0.99
    g = float(r.goodput_fraction(1e-4, 0.0, 200.0, 300.0, 0.0, 990.0, 10.0))
    assert g == pytest.approx(0.95 * 0.99)
    assert float(r.goodput_fraction(1e-2, 0.0, 200.0, 300.0, 0.0, 990.0, 10.0)) == 0.0  # never recovers


LLAMA = model_presets.load("llama3-405b")
LLAMA_CFG = dict(tp=8, pp=16, vpp=1, micro_batch_size=1, recompute="full", sequence_parallel=True)


def _llama(devices: int, **opts) -> dict:
    dp = devices // 128
    cfg = TrainingConfig(**LLAMA_CFG, global_batch_size=dp * 16)
    return evaluate(LLAMA, H100, devices, cfg, r.ResilienceOptions(**opts) if opts else None)


def test_a_16k_device_job_loses_more_of_its_time_than_a_1k_one():
    small, large = _llama(1024)["goodput"], _llama(16384)["goodput"]
    assert large["interruptions_per_day"] == pytest.approx(16 * small["interruptions_per_day"])
    assert large["goodput_fraction"] < small["goodput_fraction"] - 0.02
    # restarts grow with the rate (16x), the lost work as sqrt(rate) (Young's interval shrinks as 1/sqrt(rate))
    assert large["lost_fraction"] + large["restart_fraction"] > 5 * (small["lost_fraction"] + small["restart_fraction"])
    # the figures hang together: the fractions the block reports make up the goodput
    g = large
    assert g["goodput_fraction"] == pytest.approx((1 - g["lost_fraction"] - g["restart_fraction"])
                                                  * (1 - g["checkpoint_overhead"]))
    assert g["effective_tokens_per_s"] == pytest.approx(_llama(16384)["tokens_per_s"] * g["goodput_fraction"])


def test_a_16k_device_plan_loses_more_of_its_time_than_a_1k_one():
    """Llama 3 70B, 15T tokens on H100: the planner's best config at 1,024 and at 16,384 GPUs. The larger job is
    interrupted 16 times as often per day; over its (shorter) run it still meets more interruptions, and a larger
    share of its wall-clock time goes to them, so its device-hours grow once failures are priced."""
    plan = run_plan(PlanRequest(spec=model_presets.load("llama3-70b"), profile=H100, tokens=15e12, devices_min=1024,
                                devices_max=16384, devices_step=15360, framework="megatron"))
    small, large = plan["points"]
    assert (small["devices"], large["devices"]) == (1024, 16384) and small["feasible"] and large["feasible"]
    lost_small, lost_large = 1 - small["goodput_fraction"], 1 - large["goodput_fraction"]
    assert lost_large > 5 * lost_small
    assert large["interruptions"] > small["interruptions"]
    assert large["effective_days"] - large["days"] > 0 and small["effective_days"] - small["days"] > 0
    grow = lambda p: p["effective_device_hours"] / p["device_hours"]  # noqa: E731
    assert grow(large) > grow(small)
    assert grow(large) == pytest.approx(1 / large["goodput_fraction"])


def test_options_change_the_goodput_block_and_nothing_else():
    base, asy = _llama(16384), _llama(16384, checkpoint_mode="async")
    spare = _llama(16384, hot_spare_nodes=4)
    for other in (asy, spare):
        assert {k: v for k, v in other.items() if k != "goodput"} == {k: v for k, v in base.items() if k != "goodput"}
    assert asy["goodput"]["checkpoint_stall_s"] < base["goodput"]["checkpoint_stall_s"]
    assert asy["goodput"]["checkpoint_background_s"] == pytest.approx(base["goodput"]["checkpoint_write_s"])
    # a hot spare cuts the downtime (swap instead of reschedule) and is paid for
    assert spare["goodput"]["downtime_per_failure_s"] < base["goodput"]["downtime_per_failure_s"]
    assert spare["goodput"]["paid_devices"] == 16384 + 4 * 8


def test_distributed_optimizer_shrinks_what_a_rank_writes():
    cfg = dict(LLAMA_CFG, global_batch_size=8 * 16)
    sharded = evaluate(LLAMA, H100, 1024, TrainingConfig(**cfg))["goodput"]
    whole = evaluate(LLAMA, H100, 1024, TrainingConfig(**cfg, distributed_optimizer=False))["goodput"]
    assert whole["checkpoint_gib_per_rank"] > 3 * sharded["checkpoint_gib_per_rank"]


def test_a_profile_without_reliability_facts_takes_the_documented_defaults():
    data = hardware_profiles.load_data("nvidia-h100-80gb")
    data.pop("reliability")
    bare = hardware_profiles.load(data) if not isinstance(data, str) else None
    assert r.unexpected_rate_per_device_hour(bare) == pytest.approx(419 / (16384 * 54 * 24))
    with pytest.raises(ValueError, match="reliability.checkpoint_write_gbps_per_node"):
        hardware_profiles.load({"base": "nvidia-h100-80gb",
                                "reliability": {"checkpoint_write_gbps_per_node": {"value": -1, "source": "x"}}})


def test_deadline_plan_needs_more_devices_once_failures_are_priced():
    """gpt-1.3b on A100 with a failure rate 1,000 times the profile's: the deadline set just above one count's
    raw days is missed once its time is priced with failures, so a larger count is chosen."""
    spec = model_presets.load("gpt-1.3b")
    data = hardware_profiles.load_data("nvidia-a100-80gb")
    for k in list(data["reliability"]):
        if k.startswith("failure_rate_"):
            data["reliability"][k]["value"] *= 1000
    fragile = hardware_profiles.load(data)
    req = dict(spec=spec, profile=fragile, tokens=26e9, devices_min=8, devices_max=32, devices_step=8,
               framework="megatron")
    first = run_plan(PlanRequest(**req))
    p16 = next(p for p in first["points"] if p["devices"] == 16)
    assert p16["effective_days"] > p16["days"] and p16["interruptions"] > 0
    plan = run_plan(PlanRequest(**req, deadline_days=p16["days"] * 1.0001))
    assert plan["chosen_without_failures"] == 16
    assert plan["chosen"] is None or plan["chosen"] > 16
    assert "effective" in plan["chosen_reason"]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.parametrize("args,field", [
    (["--checkpoint-interval-s", "0"], "checkpoint_interval_s"),
    (["--checkpoint-write-gbps", "-5"], "checkpoint_write_gbps_per_node"),
    (["--checkpoint-read-gbps", "0"], "checkpoint_read_gbps_per_node"),
    (["--hot-spare-nodes", "-1"], "hot_spare_nodes"),
])
@pytest.mark.parametrize("command", ["plan", "search"])
def test_cli_bad_resilience_values_exit_2_naming_the_field(command, args, field):
    common = (["--tokens", "1T"] if command == "plan" else ["--devices", "8", "--global-batch-size", "8"])
    res = _cli(command, "--model", "gpt-1.3b", "--cluster", "nvidia-a100-80gb", *common, *args)
    assert res.returncode == 2 and res.stderr.startswith(f"error: {field}:"), res.stderr
    assert "Traceback" not in res.stderr


def test_search_objective_goodput_ranks_by_effective_throughput():
    res = _cli("search", "--model", "gpt-1.3b", "--cluster", "nvidia-a100-80gb", "--devices", "16",
               "--global-batch-size", "64", "--sampler", "exhaustive", "--top", "10", "--objective", "goodput",
               "--checkpoint-mode", "sync", "--checkpoint-write-gbps", "0.05", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["objective"] == "goodput"
    top = [e for e in out["top"] if e.get("keeps_margin") is not False]
    eff = [e["evaluation"]["goodput"]["effective_tokens_per_s"] for e in top]
    assert eff == sorted(eff, reverse=True) and len(eff) > 1
    plain = json.loads(_cli("search", "--model", "gpt-1.3b", "--cluster", "nvidia-a100-80gb", "--devices", "16",
                            "--global-batch-size", "64", "--sampler", "exhaustive", "--top", "10",
                            "--checkpoint-write-gbps", "0.05", "--json").stdout)
    assert plain["objective"] == "throughput" and all("goodput" in e["evaluation"] for e in plain["top"])
    # a slow storage makes the checkpoint's size matter: the goodput ranking's best has the better goodput
    assert (out["best"]["evaluation"]["goodput"]["effective_tokens_per_s"]
            >= plain["best"]["evaluation"]["goodput"]["effective_tokens_per_s"])
    assert math.isfinite(out["best"]["evaluation"]["goodput"]["checkpoint_interval_s"])


# ---- the service: the same options on a job (real SQLite file, in-process app, the embedded worker's code) ----
JOB = {"model": "tiny-moe", "cluster": "nvidia-h100-80gb", "devices": 16, "global_batch_size": 64,
       "search": {"sampler": "exhaustive", "top_k": 4}}


@pytest.mark.parametrize("resilience,field", [
    ({"checkpoint_interval_s": 0}, "checkpoint_interval_s"),
    ({"checkpoint_write_gbps_per_node": -3}, "checkpoint_write_gbps_per_node"),
    ({"checkpoint_mode": "sometimes"}, "checkpoint_mode"),
    ({"hot_spare_nodes": -1}, "hot_spare_nodes"),
])
def test_a_bad_job_resilience_value_is_422_naming_the_field(tmp_path, resilience, field):
    from fastapi.testclient import TestClient

    from app.service.core.config import Settings
    from app.service.main import create_app

    settings = Settings(database_url=f"sqlite:///{tmp_path / 'g.db'}", embedded_worker=False)
    with TestClient(create_app(settings)) as client:
        res = client.post("/v1/jobs", json={**JOB, "search": {**JOB["search"], "resilience": resilience}})
        assert res.status_code == 422, res.text
        assert res.json()["detail"][0]["loc"] == ["body", "search", "resilience", field]
        assert client.get("/v1/jobs").json()["total"] == 0


def test_a_goodput_job_ranks_by_goodput_and_every_config_has_the_block(tmp_path):
    from fastapi.testclient import TestClient

    from app.service.core.config import Settings
    from app.service.main import create_app
    from app.service.worker import Worker

    settings = Settings(database_url=f"sqlite:///{tmp_path / 'g.db'}", embedded_worker=False)
    body = {**JOB, "search": {**JOB["search"], "objective": "goodput",
                              "resilience": {"checkpoint_mode": "async", "hot_spare_nodes": 1}}}
    with TestClient(create_app(settings)) as client:
        job = client.post("/v1/jobs", json=body).json()
        assert job["inputs"]["search"]["objective"] == "goodput"
        assert Worker(settings).run_until_idle() == 1
        items = client.get(f"/v1/jobs/{job['id']}/configs").json()["items"]
    assert items and all(i["evaluation"]["goodput"]["checkpoint_mode"] == "async" for i in items)
    assert all(i["evaluation"]["goodput"]["paid_devices"] == 16 + 8 for i in items)


def test_submit_checks_the_checkpoint_options_before_sending():
    # no server listens on port 9: a bad option must be refused before any request
    res = _cli("submit", "--server", "http://127.0.0.1:9", "--model", "gpt-1.3b", "--cluster", "nvidia-a100-80gb",
               "--devices", "8", "--global-batch-size", "8", "--checkpoint-interval-s", "0")
    assert res.returncode == 2 and "checkpoint_interval_s" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


def test_the_flags_offer_what_the_model_and_the_search_take():
    from app.cli import resilience_flags
    from search.objective import OBJECTIVES

    assert resilience_flags.CHECKPOINT_MODES == r.CHECKPOINT_MODES
    assert resilience_flags.OBJECTIVES == OBJECTIVES

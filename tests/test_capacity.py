"""The capacity planner (search/capacity.py) and ``paraplan plan``: hand-checkable on gpt-1.3b / A100."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import hardware_profiles
import model_presets
from search import SearchRequest, SpaceError, run_search
from search.capacity import (PlanError, PlanRequest, choose, device_counts, global_batch_size, pareto_devices,
                             planning_fixed, run_plan)

ROOT = Path(__file__).resolve().parents[1]
SPEC = model_presets.load("gpt-1.3b")
A100 = hardware_profiles.load("nvidia-a100-80gb")
TOKENS = 26e9


@pytest.fixture(scope="module")
def plan():
    return run_plan(PlanRequest(spec=SPEC, profile=A100, tokens=TOKENS, devices_min=8, devices_max=32, devices_step=8,
                                deadline_days=1.5, price_per_device_hour=2.0, framework="megatron"))


def test_days_and_device_hours_follow_from_tokens_per_s(plan):
    for p in plan["points"]:
        assert p["feasible"]
        tps = p["evaluation"]["tokens_per_s"]
        assert p["tokens_per_s"] == tps
        assert p["days"] == pytest.approx(TOKENS / tps / 86400)
        assert p["device_hours"] == pytest.approx(p["devices"] * TOKENS / tps / 3600)
        assert p["cost"] == pytest.approx(p["device_hours"] * 2.0)


def test_best_per_count_is_the_exhaustive_search_with_the_same_pins(plan):
    for p in plan["points"][:2]:
        res = run_search(SearchRequest(spec=SPEC, profile=A100, devices=p["devices"],
                                       global_batch_size=p["global_batch_size"], sampler="exhaustive", top_k=1,
                                       fixed=planning_fixed(SPEC), framework="megatron"))
        assert res["best"]["config"] == p["config"]
        assert res["best"]["evaluation"]["tokens_per_s"] == p["tokens_per_s"]


def test_caller_pins_go_over_the_planning_pins(plan):
    # tp pinned to 2 at every count (gpt-1.3b's unpinned best is tp 1): each point is the exhaustive
    # search with tp=2 added to the planning pins, and the plan reports the merged pins.
    pinned = run_plan(PlanRequest(spec=SPEC, profile=A100, tokens=TOKENS, devices_min=8, devices_max=16, devices_step=8,
                                  framework="megatron", fixed={"tp": 2, "cp_comm_type": "p2p"}))
    assert pinned["planning_fixed"] == {**planning_fixed(SPEC), "tp": 2, "cp_comm_type": "p2p"}
    for p, free in zip(pinned["points"], plan["points"]):
        assert p["config"]["tp"] == 2 and free["config"]["tp"] != 2
        res = run_search(SearchRequest(spec=SPEC, profile=A100, devices=p["devices"],
                                       global_batch_size=p["global_batch_size"], sampler="exhaustive", top_k=1,
                                       fixed=pinned["planning_fixed"], framework="megatron"))
        assert res["best"]["config"] == p["config"]
    with pytest.raises(SpaceError) as exc:
        PlanRequest(spec=SPEC, profile=A100, tokens=TOKENS, fixed={"tpp": 2}).resolved()
    assert exc.value.field == "fix.tpp"


def test_pareto_front_by_hand():
    pts = [{"devices": 8, "feasible": True, "days": 4.0, "device_hours": 768},
           {"devices": 16, "feasible": True, "days": 2.0, "device_hours": 768},   # beats 8: as cheap, faster
           {"devices": 24, "feasible": True, "days": 1.5, "device_hours": 864},
           {"devices": 32, "feasible": True, "days": 1.6, "device_hours": 1229},  # beaten by 24 on both
           {"devices": 40, "feasible": False, "days": None, "device_hours": None}]
    assert pareto_devices(pts) == [16, 24]
    assert choose(pts, 2.0)[0] == 16
    assert choose(pts, 1.0) == (None, choose(pts, 1.0)[1]) and "no count meets" in choose(pts, 1.0)[1]
    assert choose(pts, None)[0] == 8  # the fewest device-hours, the smaller count at a tie


def test_plan_marks_pareto_and_deadline(plan):
    assert plan["pareto"] == pareto_devices(plan["points"])
    assert [p["devices"] for p in plan["points"] if p["pareto"]] == plan["pareto"]
    meeting = [p["devices"] for p in plan["points"] if p["days"] <= 1.5]
    assert plan["chosen"] == min(meeting)
    assert all(p["meets_deadline"] == (p["days"] <= 1.5) for p in plan["points"])


def test_no_count_meets_the_deadline():
    res = run_plan(PlanRequest(spec=SPEC, profile=A100, tokens=TOKENS, devices_min=8, devices_max=16, devices_step=8,
                               deadline_days=0.01, framework="megatron"))
    assert res["chosen"] is None and "no count meets the 0.01-day deadline" in res["chosen_reason"]


def test_infeasible_count_is_reported_with_its_smallest_peak():
    res = run_plan(PlanRequest(spec=model_presets.load("llama3-70b"), profile=A100, tokens=1e12, devices_min=8,
                               devices_max=8, framework="megatron"))
    (p,) = res["points"]
    assert not p["feasible"] and p["config"] is None and p["smallest_peak_gib"] > 80
    assert p["reason"].startswith("no config fits in 80 GiB: the smallest peak is")
    assert res["chosen"] is None and res["pareto"] == []


def test_counts_batch_and_errors():
    assert device_counts(1024, 16384, 512, 8) == list(range(1024, 16385, 512))
    assert device_counts(4, 30, 4, 8) == [8, 16, 24]  # whole nodes only
    # 7,680 sequences of 8K: 3,584 = 7·512 NPUs round to a multiple of 448 (the largest divisor ≤ 480)
    assert global_batch_size(7680 * 8192, 8192, 3584) == 17 * 448
    assert global_batch_size(7680 * 8192, 8192, 1024) == 7680
    for kwargs, field in (({"tokens": -1.0}, "tokens"), ({"devices_min": 64, "devices_max": 8}, "devices_max"),
                          ({"devices_min": 9, "devices_max": 15}, "devices_min"),
                          ({"global_batch_tokens": 100.0}, "global_batch_tokens")):
        with pytest.raises(PlanError) as exc:
            run_plan(PlanRequest(**{"spec": SPEC, "profile": A100, "tokens": 1e9, **kwargs}))
        assert exc.value.field == field


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "app.cli", "plan", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_cli_json_shape_and_equals_the_library(plan):
    r = _cli("--model", "gpt-1.3b", "--cluster", "nvidia-a100-80gb", "--tokens", "26B", "--devices-min", "8",
             "--devices-max", "32", "--devices-step", "8", "--deadline-days", "1.5", "--price-per-device-hour", "2",
             "--framework", "megatron", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert {"inputs", "points", "pareto", "chosen", "chosen_reason", "plan_time_s"} <= set(out)
    assert out["inputs"]["tokens"] == TOKENS and out["inputs"]["devices_step"] == 8
    for got, want in zip(out["points"], plan["points"]):
        assert {"devices", "feasible", "config", "evaluation", "tokens_per_s", "days", "device_hours", "cost",
                "pareto"} <= set(got)
        assert got["config"] == want["config"] and got["days"] == pytest.approx(want["days"])
    assert out["chosen"] == plan["chosen"] and out["pareto"] == plan["pareto"]


@pytest.mark.parametrize("args,field", [
    (["--tokens", "-5"], "tokens"), (["--tokens", "lots"], "tokens"),
    (["--tokens", "1T", "--devices-min", "64", "--devices-max", "8"], "devices_max"),
    (["--tokens", "1T", "--devices-min", "9", "--devices-max", "15"], "devices_min"),
    (["--tokens", "1T", "--deadline-days", "-1"], "deadline_days"),
    (["--tokens", "1T", "--fix", "tp=two"], "fix.tp"), (["--tokens", "1T", "--fix", "tp"], "fix"),
])
def test_cli_bad_input_exits_2_naming_the_field(args, field):
    r = _cli("--model", "gpt-1.3b", "--cluster", "nvidia-a100-80gb", *args)
    assert r.returncode == 2 and r.stderr.startswith(f"error: {field}:"), r.stderr
    assert "Traceback" not in r.stderr


def test_cli_unknown_model_and_cluster():
    for args, field in ((["--model", "nope", "--cluster", "nvidia-a100-80gb"], "model"),
                        (["--model", "gpt-1.3b", "--cluster", "nope"], "cluster")):
        r = _cli(*args, "--tokens", "1T")
        assert r.returncode == 2 and r.stderr.startswith(f"error: {field}:"), r.stderr


def test_cli_table():
    r = _cli("--model", "gpt-1.3b", "--cluster", "nvidia-a100-80gb", "--tokens", "26B", "--devices-min", "8",
             "--devices-max", "16", "--devices-step", "8", "--framework", "megatron")
    assert r.returncode == 0, r.stderr
    assert "tp/pp/vpp/cp/ep/dp/mbs" in r.stdout and "chosen: 8 devices" in r.stdout


def test_plan_report_in_headless_chromium(plan, tmp_path):
    """``paraplan report PLAN.json`` draws days and device-hours, the Pareto points and the chosen count."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import report_screenshot as shot
    from service_util import require_chromium

    sys.path.pop(0)
    require_chromium(shot.chromium)
    src = tmp_path / "plan.json"
    src.write_text(json.dumps({"inputs": {"tokens": TOKENS, "cluster": "nvidia-a100-80gb"}, **plan}))
    out = tmp_path / "plan.html"
    proc = subprocess.run([sys.executable, "-m", "app.cli", "report", str(src), "-o", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    dom = shot.rendered_dom(out)
    import html as html_mod
    import re

    drawn = json.loads(html_mod.unescape(re.search(r'data-drawn="([^"]*)"', dom).group(1)))
    names = [t["name"] for t in drawn]
    assert names[:3] == ["days", "device-hours", "Pareto (days vs device-hours)"]
    assert drawn[0]["x"] == [p["devices"] for p in plan["points"]]
    assert drawn[2]["x"] == plan["pareto"]
    chosen = [t for t in drawn if t["name"].startswith("chosen")]
    assert len(chosen) == 2 and all(t["x"] == [plan["chosen"]] for t in chosen)
    assert dom.count('class="main-svg"') >= 1 and 'id="plan-table"' in dom and 'class="chosen"' in dom

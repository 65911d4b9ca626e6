"""Plan jobs over real HTTP (``"kind": "plan"``): the job's plan equals ``paraplan plan --json``, progress counts
device counts, the report route renders the plan page, bad plan bodies are 422 naming the field."""

from __future__ import annotations

import json

import pytest

from service_util import run_cli, running_server, wait_for

PLAN_JOB = {"kind": "plan", "model": "gpt-1.3b", "cluster": "nvidia-a100-80gb", "tokens": 26e9, "devices_min": 8,
            "devices_max": 24, "devices_step": 8, "deadline_days": 1.5, "price_per_device_hour": 2.0,
            "search": {"framework": "megatron"}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory, "serve") as srv:
        yield srv


def _without_times(plan: dict) -> dict:
    plan = json.loads(json.dumps(plan))
    plan.pop("plan_time_s")
    for p in plan["points"]:
        p.pop("search_time_s")
    return plan


def test_plan_job_equals_the_cli_plan_and_has_a_report(server):
    with server.client() as c:
        r = c.post("/v1/jobs", json=PLAN_JOB)
        assert r.status_code == 202, r.text
        job = wait_for(c, r.json()["id"], timeout=120)
        assert job["status"] == "succeeded", job
        assert job["kind"] == "plan" and job["progress"] == {"trials_done": 3, "trials_total": 3}
        report = c.get(f"/v1/jobs/{job['id']}/report")
        assert report.status_code == 200 and 'id="plot-plan"' in report.text
    cli = run_cli("plan", "--model", "gpt-1.3b", "--cluster", "nvidia-a100-80gb", "--tokens", "26B", "--devices-min",
                  "8", "--devices-max", "24", "--devices-step", "8", "--deadline-days", "1.5",
                  "--price-per-device-hour", "2", "--framework", "megatron", "--json")
    assert cli.returncode == 0, cli.stderr
    assert _without_times(job["plan"]) == _without_times(json.loads(cli.stdout))


def test_a_plan_job_pins_search_fixed_at_every_count_as_plan_fix_does(server):
    body = {**PLAN_JOB, "devices_max": 16, "search": {"framework": "megatron", "fixed": {"tp": 2}}}
    with server.client() as c:
        r = c.post("/v1/jobs", json=body)
        assert r.status_code == 202, r.text
        job = wait_for(c, r.json()["id"], timeout=120)
    assert job["status"] == "succeeded", job
    assert [p["config"]["tp"] for p in job["plan"]["points"]] == [2, 2]
    cli = run_cli("plan", "--model", "gpt-1.3b", "--cluster", "nvidia-a100-80gb", "--tokens", "26B", "--devices-min",
                  "8", "--devices-max", "16", "--devices-step", "8", "--deadline-days", "1.5",
                  "--price-per-device-hour", "2", "--framework", "megatron", "--fix", "tp=2", "--json")
    assert cli.returncode == 0, cli.stderr
    assert _without_times(job["plan"]) == _without_times(json.loads(cli.stdout))


@pytest.mark.parametrize("patch,loc", [
    ({"tokens": -1}, ["body", "tokens"]),
    ({"tokens": None}, ["body", "tokens"]),
    ({"devices_min": 64, "devices_max": 8}, ["body", "devices_max"]),
    ({"devices_min": 9, "devices_max": 15}, ["body", "devices_min"]),
    ({"deadline_days": 0}, ["body", "deadline_days"]),
    ({"global_batch_tokens": 100}, ["body", "global_batch_tokens"]),
    ({"model": "nope"}, ["body", "model"]),
    ({"search": {"framework": "megatron", "fixed": {"tp": "two"}}}, ["body", "search", "fixed", "tp"]),
    ({"search": {"framework": "megatron", "fixed": {"no_such_field": 1}}}, ["body", "search", "fixed", "no_such_field"]),
    ({"search": {"framework": "megatron", "n_trials": 50}}, ["body", "search", "n_trials"]),  # plans enumerate
    ({"search": {"framework": "megatron", "seed": 1}}, ["body", "search", "seed"]),
])
def test_bad_plan_bodies_are_422_naming_the_field(server, patch, loc):
    body = {k: v for k, v in {**PLAN_JOB, **patch}.items() if v is not None}
    with server.client() as c:
        r = c.post("/v1/jobs", json=body)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"][:len(loc)] == loc, r.text


def test_a_search_body_without_devices_is_still_422(server):
    with server.client() as c:
        r = c.post("/v1/jobs", json={"model": "tiny-dense", "cluster": "nvidia-h100-80gb", "global_batch_size": 8})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "devices"], r.text

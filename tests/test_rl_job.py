"""RL jobs over real HTTP (``"kind": "rl"``): the job's result equals ``run_rl_search`` called directly (as
``paraplan rl --json`` prints it), progress counts training searches, the report route renders the RL page,
``paraplan export --server --job`` prints the RL plan's arguments, and bad RL bodies (or a field of another
kind) are 422 naming the field."""

from __future__ import annotations

import json

import pytest

import hardware_profiles
import model_presets
from app.formats.rl import DEFAULTS, workload
from search.rl import RLRequest, run_rl_search
from service_util import run_cli, running_server, wait_for

WORKLOAD = {"prompts_per_step": 16, "responses_per_prompt": 4, "prompt_length": 256, "response_length": 256}
RL_JOB = {"kind": "rl", "model": "tiny-moe", "cluster": "nvidia-h100-80gb", "devices": 16, **WORKLOAD}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory, "rl-jobs") as srv:
        yield srv


@pytest.fixture(scope="module")
def job(server):
    with server.client() as c:
        r = c.post("/v1/jobs", json=RL_JOB)
        assert r.status_code == 202, r.text
        return wait_for(c, r.json()["id"], timeout=120)


def _direct() -> dict:
    req = RLRequest(spec=model_presets.load("tiny-moe"), profile=hardware_profiles.load("nvidia-h100-80gb"),
                    devices=16, workload=workload(**WORKLOAD))
    return json.loads(json.dumps(run_rl_search(req)))


def _without_time(result: dict) -> dict:
    return {k: v for k, v in result.items() if k not in ("search_time_s", "inputs")}


def test_rl_job_equals_run_rl_search(job):
    assert job["status"] == "succeeded", job
    assert job["kind"] == "rl" and job["plan"] is None and job["best"] is None
    direct = _direct()
    assert _without_time(job["rl"]) == _without_time(direct)
    assert job["rl"]["best"] is not None and job["rl"]["best"]["mode"] in ("colocated", "disaggregated")
    inputs = job["rl"]["inputs"]
    assert inputs["model"] == "tiny-moe" and inputs["cluster"] == "nvidia-h100-80gb" and inputs["devices"] == 16
    assert inputs["workload"] == {**WORKLOAD, "algorithm": "grpo", "reference": True, "critic": False,
                                  "stale_sync": False, "max_response_length": None, "samples": 64}
    assert inputs["model_spec"]["name"] == "tiny-moe"


def test_an_rl_job_pins_the_training_side_as_paraplan_rl_fix_does(server):
    body = {**RL_JOB, "search": {"fixed": {"tp": 2}, "seed": 5}}
    with server.client() as c:
        r = c.post("/v1/jobs", json=body)
        assert r.status_code == 202, r.text
        job = wait_for(c, r.json()["id"], timeout=120)
    assert job["status"] == "succeeded", job
    got = job["rl"]
    assert got["inputs"]["fixed"] == {"tp": 2} and got["inputs"]["seed"] == 5 and got["best"] is not None
    for mode in ("colocated", "disaggregated"):
        if got[mode] is not None:
            assert got[mode]["training"]["config"]["tp"] == 2
    cli = run_cli("rl", "--model", "tiny-moe", "--cluster", "nvidia-h100-80gb", "--devices", "16",
                  *[a for k, v in WORKLOAD.items() for a in (f"--{k.replace('_', '-')}", str(v))],
                  "--fix", "tp=2", "--seed", "5", "--json")
    assert cli.returncode == 0, cli.stderr
    assert _without_time(got) == _without_time(json.loads(cli.stdout))
    assert json.loads(cli.stdout)["inputs"]["fixed"] == {"tp": 2}


def test_rl_job_progress_counts_training_searches(job):
    settled = 1 + len(job["rl"]["splits"])  # the co-located search and one per split (searched or bounded out)
    assert job["progress"] == {"trials_done": settled, "trials_total": settled}
    assert job["summary"]["engine"] == "rl" and job["summary"]["trials"] == job["rl"]["training_searches"]
    assert job["inputs"]["global_batch_size"] == 64 and job["inputs"]["search"]["kind"] == "rl"


def test_rl_job_report_and_export(server, job, tmp_path):
    with server.client() as c:
        report = c.get(f"/v1/jobs/{job['id']}/report")
    assert report.status_code == 200 and 'id="plot-rl-time"' in report.text and 'id="rl-table"' in report.text
    src = tmp_path / "rl.json"
    src.write_text(json.dumps(job["rl"]))
    for mode in ("colocated", "disaggregated"):
        remote = run_cli("export", "--format", "megatron", "--mode", mode, "--server", server.url, "--job", job["id"])
        local = run_cli("export", "--format", "megatron", "--mode", mode, str(src))
        assert remote.returncode == 0 and local.returncode == 0, (remote.stderr, local.stderr)
        assert remote.stdout == local.stdout and "--tensor-parallel-size" in remote.stdout


def test_rl_job_defaults_are_the_cli_defaults(server):
    with server.client() as c:
        r = c.post("/v1/jobs", json={"kind": "rl", "model": "tiny-moe", "cluster": "nvidia-h100-80gb", "devices": 16})
        assert r.status_code == 202, r.text
        c.post(f"/v1/jobs/{r.json()['id']}/cancel")  # the default workload (12,288 samples) is not run here
    stored = r.json()["inputs"]["search"]["rl"]["workload"]
    assert {k: stored[k] for k in DEFAULTS} == DEFAULTS
    assert stored["reference"] is True and stored["critic"] is False and stored["stale_sync"] is False


@pytest.mark.parametrize("patch,loc", [
    ({"responses_per_prompt": 1}, ["body", "responses_per_prompt"]),  # GRPO's group needs two
    ({"algorithm": "ppo", "critic": False}, ["body", "critic"]),
    ({"max_response_length": 100}, ["body", "max_response_length"]),  # below the mean
    ({"prompts_per_step": 100_000, "responses_per_prompt": 10_000}, ["body", "responses_per_prompt"]),
    ({"prompt_length": 100_000_000}, ["body", "response_length"]),  # prompt + response beyond any run
    ({"prompt_length": 0}, ["body", "prompt_length"]),
    ({"prompts_per_step": "16"}, ["body", "prompts_per_step"]),
    ({"stale_sync": 1}, ["body", "stale_sync"]),
    ({"algorithm": "dpo"}, ["body", "algorithm"]),
    ({"devices": None}, ["body", "devices"]),
    ({"global_batch_size": 64}, ["body", "global_batch_size"]),  # a search field
    ({"tokens": 1e9}, ["body", "tokens"]),  # a plan field
    ({"precision": "fp8"}, ["body", "precision"]),
    ({"model": "nope"}, ["body", "model"]),
    ({"search": {"memory_margin_gib": 80.0}}, ["body", "search", "memory_margin_gib"]),
    ({"search": {"fixed": {"tp": "two"}}}, ["body", "search", "fixed", "tp"]),
    ({"search": {"fixed": {"no_such_field": 1}}}, ["body", "search", "fixed", "no_such_field"]),
    ({"search": {"sampler": "tpe"}}, ["body", "search", "sampler"]),  # a search job's option, not read here
    ({"search": {"fixed": {"ep": 16}}}, ["body", "search", "fixed"]),  # tiny-moe has 8 experts: no config takes it
])
def test_bad_rl_bodies_are_422_naming_the_field(server, patch, loc):
    body = {k: v for k, v in {**RL_JOB, **patch}.items() if v is not None}
    with server.client() as c:
        r = c.post("/v1/jobs", json=body)
    assert r.status_code == 422, r.text
    assert [d["loc"] for d in r.json()["detail"]] == [loc], r.text


@pytest.mark.parametrize("body,loc", [
    ({"model": "tiny-moe", "cluster": "nvidia-h100-80gb", "devices": 8, "global_batch_size": 64,
      "prompts_per_step": 16}, ["body", "prompts_per_step"]),
    ({"kind": "plan", "model": "gpt-1.3b", "cluster": "nvidia-a100-80gb", "tokens": 26e9, "stale_sync": True},
     ["body", "stale_sync"]),
    ({"kind": "plan", "model": "gpt-1.3b", "cluster": "nvidia-a100-80gb", "tokens": 26e9, "devices": 8},
     ["body", "devices"]),
    ({"model": "tiny-moe", "cluster": "nvidia-h100-80gb", "devices": 8, "global_batch_size": 64, "tokens": 1e9},
     ["body", "tokens"]),
])
def test_job_kinds_do_not_take_each_others_fields(server, body, loc):
    """A field of another kind is a 422 naming it, never ignored (a search job used to ignore plan fields)."""
    with server.client() as c:
        r = c.post("/v1/jobs", json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert [d["loc"] for d in detail] == [loc] and "jobs do not take this field" in detail[0]["msg"], r.text


@pytest.mark.parametrize("kind", [{}, ["rl"], 1, None, "evaluate"])
def test_a_kind_that_is_no_kind_is_422_naming_it(server, kind):
    with server.client() as c:
        r = c.post("/v1/jobs", json={**RL_JOB, "kind": kind})
    assert r.status_code == 422, r.text
    assert [d["loc"] for d in r.json()["detail"]] == [["body", "kind"]], r.text

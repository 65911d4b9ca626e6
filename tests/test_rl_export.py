"""``paraplan export`` of an RL plan (``app/formats/rl_export.py``): the training block is ``launch_args`` of the
plan's training config on prompt + response tokens, the rollout block carries vLLM's option names with the
plan's tp, expert parallelism, dp, batch, memory fraction and longest sequence; ``--mode`` picks the plan;
bad input exits 2 naming the field. (From a server job: tests/test_rl_job.py.)"""

from __future__ import annotations

import copy
import json
import math

import pytest
from click.testing import CliRunner

import hardware_profiles
import model_presets
from app.cli.main import main
from app.formats.launch import flags, format_args, launch_args
from app.formats.rl import rl_inputs, workload
from search.rl import RLRequest, evaluate_plan
from service_util import run_cli

WORKLOAD = {"prompts_per_step": 16, "responses_per_prompt": 4, "prompt_length": 256, "response_length": 256}
RL_ARGS = ["--model", "tiny-moe", "--cluster", "nvidia-h100-80gb", "--devices", "16",
           *(x for k, v in WORKLOAD.items() for x in (f"--{k.replace('_', '-')}", str(v)))]


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> tuple[dict, str]:
    """``paraplan rl --json`` of a small workload, and its file."""
    proc = run_cli("rl", *RL_ARGS, "--max-response-length", "384", "--json")
    assert proc.returncode == 0, proc.stderr
    path = tmp_path_factory.mktemp("rl") / "rl.json"
    path.write_text(proc.stdout)
    return json.loads(proc.stdout), str(path)


def _export(*args: str):
    return CliRunner().invoke(main, ["export", *args])


def _blocks(text: str) -> tuple[list[str], dict[str, list[str]]]:
    """The training block's tokens and the rollout block's flags of an RL export."""
    train, rollout = text.split("\n\n")
    return [_tokens(train), flags(_tokens(rollout))]


def _tokens(block: str) -> list[str]:
    lines = [ln.removesuffix(" \\") for ln in block.splitlines() if not ln.startswith("#")]
    return [t.strip('"') for ln in lines for t in ln.split(" ", 1)]


def _training_spec(prompt: int, response: int):
    return model_presets.load("tiny-moe").model_copy(update={"seq_length": prompt + response})


def _ceil3(x: float) -> float:
    return math.ceil(x * 1000 - 1e-9) / 1000


@pytest.mark.parametrize("mode", [None, "colocated", "disaggregated"])
def test_export_prints_the_plans_training_and_rollout_arguments(result, mode):
    data, path = result
    res = _export("--format", "megatron", *(["--mode", mode] if mode else []), path)
    assert res.exit_code == 0, res.output
    plan = data[mode or data["best"]["mode"]]
    train, rollout = _blocks(res.stdout)
    cfg = plan["training"]["config"]
    assert format_args(train) == format_args(launch_args(cfg, _training_spec(256, 256), "megatron", 8))
    r = plan["rollout"]
    assert rollout["--tensor-parallel-size"] == [str(r["tp"])] and rollout["--data-parallel-size"] == [str(r["dp"])]
    assert rollout["--max-num-seqs"] == [str(r["batch"])]
    assert rollout["--max-model-len"] == ["640"]  # 256-token prompts, responses up to 384
    assert ("--enable-expert-parallel" in rollout) == (r["ep"] > 1)
    mem = plan["memory"]
    m = plan["training"]["evaluation"]["memory"]
    kept = (m["params_gib"] + m["grads_gib"] + m["optimizer_gib"]) if plan["mode"] == "colocated" and \
        not r["offload_training_state"] else 0.0
    fraction = float(rollout["--gpu-memory-utilization"][0])
    assert fraction == pytest.approx(_ceil3((mem["rollout_peak_gib"] - kept) / mem["capacity_gib"]), abs=1e-12)
    assert f"# rollout ({plan['mode']})" in res.stdout and f"# training ({plan['mode']})" in res.stdout


def _plan_result(algorithm: str, tp: int, ep: int, offload: bool) -> dict:
    """A co-located RL result with one given plan (``search.rl.evaluate_plan``: scored, not searched)."""
    spec, profile = model_presets.load("tiny-moe"), hardware_profiles.load("nvidia-h100-80gb")
    wl = workload(algorithm, **WORKLOAD)
    req = RLRequest(spec=spec, profile=profile, devices=16, workload=wl)
    config = {"tp": 2, "pp": 1, "ep": 4, "micro_batch_size": 1}
    plan = evaluate_plan(req, "colocated", config, tp, ep, offload)
    assert plan["feasible"], plan["infeasible_reasons"]
    return {"inputs": rl_inputs(spec, profile, 16, wl, "tiny-moe"), "colocated": plan, "disaggregated": None,
            "best": plan, "splits": [], "training_searches": 0, "search_time_s": 0.0}


@pytest.mark.parametrize("algorithm,offload,trained", [("grpo", False, 1), ("ppo", False, 2), ("ppo", True, 0)])
def test_memory_fraction_leaves_out_the_trainers_states_kept_on_the_device(tmp_path, algorithm, offload, trained):
    """Co-located without offload the trainer's states (PPO: actor and critic) stay on the device beside the
    engine: the engine's fraction is the rollout peak less them; with offload, the whole peak."""
    data = _plan_result(algorithm, 4, 4, offload)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    res = _export("--format", "megatron", str(path))
    assert res.exit_code == 0, res.output
    _, rollout = _blocks(res.stdout)
    plan = data["colocated"]
    m, mem = plan["training"]["evaluation"]["memory"], plan["memory"]
    states = trained * (m["params_gib"] + m["grads_gib"] + m["optimizer_gib"])
    expected = _ceil3((mem["rollout_peak_gib"] - states) / mem["capacity_gib"])
    assert float(rollout["--gpu-memory-utilization"][0]) == pytest.approx(expected, abs=1e-12)
    assert rollout["--tensor-parallel-size"] == ["4"] and rollout["--enable-expert-parallel"] == []
    assert rollout["--data-parallel-size"] == ["4"]


def _broken(data: dict, edit) -> dict:
    data = copy.deepcopy(data)
    edit(data)
    return data


BAD = {
    "no-best": (lambda d: d.update(best=None), [], "best"),
    "mode-missing": (lambda d: d.update(disaggregated=None), ["--mode", "disaggregated"], "disaggregated"),
    "rollout": (lambda d: d[d["best"]["mode"]].pop("rollout"), [], "{mode}.rollout"),
    "tp": (lambda d: d[d["best"]["mode"]]["rollout"].update(tp=0), [], "{mode}.rollout.tp"),
    "capacity": (lambda d: d[d["best"]["mode"]]["memory"].pop("capacity_gib"), [], "{mode}.memory.capacity_gib"),
    "workload": (lambda d: d["inputs"].pop("workload"), [], "inputs.workload"),
    "config": (lambda d: d[d["best"]["mode"]]["training"]["config"].update(tp=3), [], "{mode}.training.config"),
    "rank": (lambda d: None, ["--rank", "2"], "rank"),  # a search's option: an RL plan is chosen with --mode
}


@pytest.mark.parametrize("name", BAD)
def test_bad_rl_plans_exit_2_naming_the_field(result, tmp_path, name):
    data, _ = result
    edit, extra, field = BAD[name]
    broken = _broken(data, edit)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(broken))
    res = _export("--format", "megatron", *extra, str(path))
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith(f"error: {field.format(mode=data['best']['mode'])}"), res.stderr
    assert res.stdout == ""


def test_mode_is_only_for_rl_plans(tmp_path):
    path = tmp_path / "search.json"
    path.write_text(json.dumps({"inputs": {"model": {}}, "top": []}))
    res = _export("--format", "megatron", "--mode", "colocated", str(path))
    assert res.exit_code == 2 and res.stderr.startswith("error: mode:"), res.output
    res = _export("--format", "megatron", "--mode", "sideways", str(path))
    assert res.exit_code == 2 and "sideways" in res.output


def test_a_result_without_model_spec_resolves_the_model_name(result, tmp_path):
    """Files from before ``inputs.model_spec``: the preset name in ``inputs.model`` is loaded instead."""
    data, path = result
    old = _broken(data, lambda d: d["inputs"].pop("model_spec"))
    old_path = tmp_path / "old.json"
    old_path.write_text(json.dumps(old))
    new, prev = _export("--format", "mindspeed", path), _export("--format", "mindspeed", str(old_path))
    assert new.exit_code == prev.exit_code == 0 and new.stdout == prev.stdout, (new.output, prev.output)

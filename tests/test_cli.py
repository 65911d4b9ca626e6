"""`paraplan evaluate` and `paraplan validate` as a user runs them: outputs, exit codes, error messages."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, cwd=cwd)


EVAL = ("evaluate", "--model", "tiny-dense", "--cluster", "nvidia-h100-80gb", "--devices", "8")


def test_evaluate_json_is_the_contract_shape():
    proc = run(*EVAL, "--config", '{"tp": 2, "global_batch_size": 64}', "--json")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert set(r) == {"feasible", "infeasible_reasons", "warnings", "step_time_s", "tokens_per_s",
                      "tokens_per_s_per_device", "model_tflops_per_device", "mfu", "hfu", "time", "memory",
                      "versions", "goodput"}
    assert set(r["time"]) == {"compute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s", "pp_bubble_s", "pp_p2p_s",
                              "dp_comm_exposed_s", "optimizer_s", "straggler_s"}
    assert sum(r["time"].values()) == pytest.approx(r["step_time_s"], rel=1e-9)
    assert r["tokens_per_s"] == pytest.approx(64 * 512 / r["step_time_s"])


def test_evaluate_reads_config_and_model_files(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("tp: 2\nglobal_batch_size: 64\n")
    model = tmp_path / "model.json"
    model.write_text(json.dumps({"base": "tiny-dense", "seq_length": 1024}))
    proc = run("evaluate", "--model", str(model), "--cluster", "nvidia-h100-80gb", "--devices", "8",
               "--config", str(cfg), "--json")
    assert proc.returncode == 0, proc.stderr
    base = json.loads(run(*EVAL, "--config", str(cfg), "--json").stdout)
    assert json.loads(proc.stdout)["tokens_per_s"] != base["tokens_per_s"]  # seq_length override took effect


def test_evaluate_table_output():
    proc = run(*EVAL, "--config", '{"tp": 2, "global_batch_size": 64}')
    assert proc.returncode == 0
    assert "time per step" in proc.stdout and "per-stage peak GiB" in proc.stdout


def test_infeasible_config_is_a_result_not_an_error():
    proc = run(*EVAL, "--config", '{"tp": 3, "global_batch_size": 64}', "--json")
    assert proc.returncode == 0
    r = json.loads(proc.stdout)
    assert r["feasible"] is False and r["infeasible_reasons"][0]["code"] == "tp_divides_heads"
    assert r["step_time_s"] is None


@pytest.mark.parametrize("args,field", [
    (("--config", '{"tp": 0, "global_batch_size": 64}'), "config.tp"),
    (("--config", '{"global_batch_size": 64, "recompute": "sometimes"}'), "config.recompute"),
    (("--config", '{"global_batch_size": 64, "tpp": 2}'), "config.tpp"),
    (("--config", '{"tp": 2}'), "config.global_batch_size"),
    (("--config", "{not json"), "config"),
    (("--config", "[1, 2]"), "config"),
])
def test_bad_config_exits_2_naming_the_field(args, field):
    proc = run(*EVAL, *args)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: {field}") and "Traceback" not in proc.stderr


def test_unknown_preset_and_profile():
    proc = run("evaluate", "--model", "gpt-9", "--cluster", "nvidia-h100-80gb", "--devices", "8",
               "--config", '{"global_batch_size": 8}')
    assert proc.returncode == 2 and "model" in proc.stderr and "tiny-dense" in proc.stderr
    proc = run("evaluate", "--model", "tiny-dense", "--cluster", "tpu-v9", "--devices", "8",
               "--config", '{"global_batch_size": 8}')
    assert proc.returncode == 2 and "cluster" in proc.stderr and "ascend-910b" in proc.stderr


def test_bad_devices_and_model_values():
    assert run(*EVAL[:-1], "0", "--config", '{"global_batch_size": 8}').returncode == 2
    proc = run("evaluate", "--model", '{"base": "tiny-dense", "hidden_size": -1}', "--cluster",
               "nvidia-h100-80gb", "--devices", "8", "--config", '{"global_batch_size": 8}')
    assert proc.returncode == 2 and proc.stderr.startswith("error: model.hidden_size")


def test_validate_rejects_bad_files(tmp_path):
    missing = run("validate", str(tmp_path / "nope.json"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('[{"name": "x", "cluster": "nvidia-h100-80gb", "devices": 8, "model": "tiny-dense", '
                   '"config": {"global_batch_size": 8}, "reported": {"tokens_per_s_per_device": -3}}]')
    proc = run("validate", str(bad))
    assert proc.returncode == 2 and "runs[0].reported.tokens_per_s_per_device" in proc.stderr


def test_validate_scores_an_unscorable_run_as_error_one(tmp_path):
    runs = tmp_path / "runs.json"
    runs.write_text(json.dumps([
        {"name": "ok", "cluster": "nvidia-h100-80gb", "devices": 8, "model": "tiny-dense",
         "config": {"tp": 2, "global_batch_size": 64}, "reported": {"tokens_per_s_per_device": 1000.0}},
        {"name": "unknown-profile", "cluster": "tpu-v9", "devices": 8, "model": "tiny-dense",
         "config": {"global_batch_size": 64}, "reported": {"tokens_per_s_per_device": 1000.0}},
    ]))
    proc = run("validate", str(runs), "--json")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["count"] == 2 and r["runs"][1]["error"] is None and r["runs"][1]["predicted"] is None
    first = abs(r["runs"][0]["error"])
    assert r["mape"] == pytest.approx((first + 1.0) / 2)
    assert r["infeasible"] == 1
    table = run("validate", str(runs))
    assert table.returncode == 0 and "unknown-profile" in table.stdout and "MAPE" in table.stdout


def test_an_input_error_with_brackets_prints_them(capsys):
    """A field or value in brackets (``runs[3]``, a module list) is the message, not console markup."""
    from app.cli.common import fail
    from app.formats.inputs import InputError

    with pytest.raises(SystemExit) as exit_:
        fail(InputError("config.recompute_modules", "[layernorm] is not a module of this model; [b]mlp[/b]"))
    assert exit_.value.code == 2
    assert "config.recompute_modules: [layernorm] is not a module of this model; [b]mlp[/b]" in capsys.readouterr().err

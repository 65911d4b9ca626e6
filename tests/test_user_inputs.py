"""What a new user hits on the command line and the API: long inline JSON, missing files, a device count
that is no whole number of nodes, and the warnings of the best config under the search table."""

import json
import subprocess
import sys
from pathlib import Path

from fastapi.testclient import TestClient

from app.formats.report import render_report
from app.service.core.config import Settings
from app.service.main import create_app

ROOT = Path(__file__).resolve().parents[1]


def run(*args):
    return subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, cwd=ROOT)


EVAL = ("evaluate", "--model", "tiny-dense", "--cluster", "nvidia-h100-80gb", "--devices", "8")
SEARCH = ("search", "--model", "tiny-moe", "--cluster", "ascend-910c-cloudmatrix384", "--devices", "4096",
          "--global-batch-size", "8192", "--trials", "40", "--seed", "1")


def test_inline_json_longer_than_a_file_name_is_evaluated():
    cfg = {"tp": 2, "pp": 1, "cp": 1, "global_batch_size": 64, "micro_batch_size": 1, "recompute": "selective",
           "recompute_modules": ["core_attn", "layernorm"], "distributed_optimizer": True,
           "overlap_grad_reduce": True, "overlap_param_gather": True, "sequence_parallel": True,
           "tp_comm_overlap": False, "precision": "bf16", "main_grads_dtype": "fp32", "main_params_dtype": "fp32",
           "exp_avg_dtype": "fp32", "exp_avg_sq_dtype": "fp32"}
    text = json.dumps(cfg, indent=1)
    assert len(text) > 300  # beyond the usual 255-byte file-name limit
    proc = run(*EVAL, "--config", text, "--json")
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res["feasible"] is True and res["step_time_s"] > 0
    short = json.loads(run(*EVAL, "--config", json.dumps({"tp": 2, "global_batch_size": 64}), "--json").stdout)
    assert res["memory"]["peak_gib"] < short["memory"]["peak_gib"]  # its selective recompute took effect


def test_missing_files_are_named_as_missing(tmp_path):
    missing = tmp_path / "nope.yaml"
    proc = run(*EVAL, "--config", str(missing))
    assert proc.returncode == 2
    assert "config" in proc.stderr and "does not exist" in proc.stderr and "JSON/YAML" not in proc.stderr
    proc = run("evaluate", "--model", str(tmp_path / "model.json"), "--cluster", "nvidia-h100-80gb",
               "--devices", "8", "--config", '{"global_batch_size": 64}')
    assert proc.returncode == 2
    assert "model" in proc.stderr and "does not exist" in proc.stderr and "unknown" not in proc.stderr
    proc = run(*EVAL[:4], str(tmp_path / "profile.yaml"), "--devices", "8", "--config", '{"global_batch_size": 64}')
    assert proc.returncode == 2 and "cluster" in proc.stderr and "does not exist" in proc.stderr
    bad = run(*EVAL, "--config", '{"tp": 2,')  # inline JSON that does not parse says so
    assert bad.returncode == 2 and "not valid JSON" in bad.stderr


def test_devices_not_a_whole_number_of_nodes_names_devices():
    proc = run("search", "--model", "tiny-dense", "--cluster", "ascend-910b", "--devices", "6143",
               "--global-batch-size", "7680", "--trials", "10")
    assert proc.returncode == 2
    assert "devices" in proc.stderr and "6143 devices are not a whole number of 8-device nodes" in proc.stderr
    assert "global_batch_size" not in proc.stderr


def test_api_names_devices_for_a_device_count_off_the_nodes(tmp_path):
    with TestClient(create_app(Settings(database_url=f"sqlite:///{tmp_path / 'api.db'}"))) as client:
        r = client.post("/v1/jobs", json={"model": "tiny-dense", "cluster": "ascend-910b", "devices": 6143,
                                          "global_batch_size": 7680})
    assert r.status_code == 422, r.text
    locs = [tuple(d["loc"]) for d in r.json()["detail"]]
    assert ("body", "devices") in locs


def test_search_table_shows_every_warning_of_the_best_config():
    as_json = run(*SEARCH, "--json")
    assert as_json.returncode == 0, as_json.stderr
    result = json.loads(as_json.stdout)
    warnings = result["best"]["evaluation"]["warnings"]
    assert warnings  # 4,096 devices is far beyond the profile's calibration runs
    table = run(*SEARCH)
    assert table.returncode == 0, table.stderr
    flat = " ".join(table.stdout.split())  # the console wraps long lines
    for w in warnings:
        assert " ".join(w.split()) in flat
    html = render_report(result)
    start = html.index('id="warnings"')
    section = html[start:html.index("</ul>", start)]
    for w in warnings:
        assert w in section

"""The edges a new user finds: one set of bounds for CLI, API and files (huge numbers exit 2 at
once naming the field), tests that never change the machine, and outputs that say what they do (no Optuna
log on stderr, the applied MoE load imbalance in the report, --trials on an exhaustive job, a closed pipe,
80-column tables, reasons that need an undefined dp, the virtual-stages flag with pp 1).

Real CLI subprocesses throughout, and a real `paraplan serve` (uvicorn) over HTTP for the API and submit."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import httpx
import pytest

from app.formats.bounds import MAX_DEVICES, MAX_GLOBAL_BATCH_SIZE, MAX_TRIALS
from service_util import CI_ENV, ROOT, read_pty, require_chromium, run_cli, running_server

HUGE = "99999999999999999999"  # beyond int64: the OverflowError of the issue
SMALL = ["--model", "tiny-moe", "--cluster", "nvidia-h100-80gb", "--devices", "8"]
EXHAUSTIVE_SMALL = [*SMALL, "--global-batch-size", "64"]


@pytest.fixture(scope="module")
def startup_s() -> float:
    """How long the CLI takes to start and exit doing nothing (imports), on this machine, now."""
    best = float("inf")
    for _ in range(2):
        t = time.monotonic()
        assert run_cli("--version").returncode == 0
        best = min(best, time.monotonic() - t)
    return best


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory, "edges") as srv:
        yield srv


def _timed(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    t = time.monotonic()
    proc = run_cli(*args, timeout=60)
    return proc, time.monotonic() - t


# ---- bounds ----------------------------------------------------------------------------------------------
def _config_file(tmp_path: Path, **fields) -> str:
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"tp": 2, "global_batch_size": 64, **fields}))
    return str(path)


@pytest.mark.parametrize("case", [
    "search --devices huge", "search --devices 1e10", "search --global-batch-size huge",
    "search --global-batch-size 1e14", "search --fix tp=huge", "evaluate --devices 1e10", "evaluate config file",
    "evaluate inline config", "submit --devices huge", "submit --global-batch-size huge", "submit --trials",
])
@pytest.mark.serial
def test_huge_numbers_exit_2_at_once_naming_the_field(case, tmp_path, startup_s):
    pangu = ["--model", "pangu-ultra-moe-718b", "--cluster", "ascend-910b"]
    srv = ["--server", "http://127.0.0.1:9"]  # nothing listens: the bounds are checked before any request
    args, field = {
        "search --devices huge": (["search", *pangu, "--devices", HUGE, "--global-batch-size", "7680"], "devices"),
        "search --devices 1e10": (["search", *pangu, "--devices", "10000000000", "--global-batch-size", "7680"],
                                  "devices"),
        "search --global-batch-size huge": (["search", *pangu, "--devices", "6144", "--global-batch-size", HUGE],
                                            "global_batch_size"),
        "search --global-batch-size 1e14": (["search", *pangu, "--devices", "6144", "--global-batch-size",
                                             "100000000000000"], "global_batch_size"),
        "search --fix tp=huge": (["search", *pangu, "--devices", "6144", "--global-batch-size", "7680", "--fix",
                                  f"tp={HUGE}"], "fix.tp"),
        "evaluate --devices 1e10": (["evaluate", *pangu, "--devices", "10000000000", "--config",
                                     str(ROOT / "examples" / "pangu-ultra-moe-6144.json")], "devices"),
        "evaluate config file": (["evaluate", *SMALL, "--config", _config_file(tmp_path, global_batch_size=int(HUGE))],
                                 "config.global_batch_size"),
        "evaluate inline config": (["evaluate", *SMALL, "--config", json.dumps({"global_batch_size": int(HUGE)})],
                                   "config.global_batch_size"),
        "submit --devices huge": (["submit", *srv, *pangu, "--devices", HUGE, "--global-batch-size", "7680"],
                                  "devices"),
        "submit --global-batch-size huge": (["submit", *srv, *pangu, "--devices", "6144", "--global-batch-size",
                                             HUGE], "global_batch_size"),
        "submit --trials": (["submit", *srv, *pangu, "--devices", "6144", "--global-batch-size", "7680", "--trials",
                             str(MAX_TRIALS + 1)], "trials"),
    }[case]
    proc, took = _timed(*args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert re.match(rf"error: {re.escape(field)}: ", proc.stderr), proc.stderr
    assert "at most" in proc.stderr and "Traceback" not in proc.stderr and proc.stdout == ""
    assert took < startup_s + 1.0, f"{took:.2f} s (start-up alone {startup_s:.2f} s)"


def test_one_set_of_bounds_for_cli_api_and_files(server, tmp_path):
    """At the bound: accepted everywhere; one above: exit 2 / 422 naming the field, with the same number."""
    over = MAX_GLOBAL_BATCH_SIZE + 1
    body = {"model": "tiny-moe", "cluster": "nvidia-h100-80gb", "devices": 8,
            "config": {"tp": 2, "global_batch_size": MAX_GLOBAL_BATCH_SIZE}}
    with server.client() as c:
        ok = c.post("/v1/evaluate", json=body)
        assert ok.status_code == 200, ok.text
        bad = c.post("/v1/evaluate", json={**body, "config": {"tp": 2, "global_batch_size": over}})
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "config", "global_batch_size"]
        api_msg = bad.json()["detail"][0]["msg"]
        job = {"model": "tiny-moe", "cluster": "nvidia-h100-80gb", "devices": 8, "global_batch_size": over}
        r = c.post("/v1/jobs", json=job)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "global_batch_size"]
        assert str(MAX_GLOBAL_BATCH_SIZE) in r.text  # pydantic's words, the same number
        r = c.post("/v1/jobs", json={**job, "devices": MAX_DEVICES + 1, "global_batch_size": 64})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "devices"]
    # the CLI: a file at the bound is scored, one above is refused with the API's words
    at = run_cli("evaluate", *SMALL, "--config", _config_file(tmp_path, global_batch_size=MAX_GLOBAL_BATCH_SIZE),
                 "--json")
    assert at.returncode == 0, at.stderr
    above = run_cli("evaluate", *SMALL, "--config", json.dumps({"tp": 2, "global_batch_size": over}))
    assert above.returncode == 2 and api_msg in above.stderr, (above.stderr, api_msg)
    s = run_cli("search", *SMALL, "--global-batch-size", str(over))
    assert s.returncode == 2 and f"{MAX_GLOBAL_BATCH_SIZE:,}" in s.stderr
    s = run_cli("search", *SMALL[:-1], str(MAX_DEVICES + 1), "--global-batch-size", "64")
    assert s.returncode == 2 and f"{MAX_DEVICES:,}" in s.stderr


# ---- tests never change the machine --------------------------------------------------------------------
def test_missing_browser_skips_naming_the_package_and_fails_under_ci(monkeypatch):
    calls = []
    real_run, real_popen = subprocess.run, subprocess.Popen
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: calls.append(a) or real_run(*a, **k))
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: calls.append(a) or real_popen(*a, **k))
    monkeypatch.setattr(os, "system", lambda *a: calls.append(a) or 0)
    monkeypatch.setattr(os, "geteuid", lambda: 0)  # even as root
    monkeypatch.delenv(CI_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="chromium package"):
        require_chromium(lambda: None)
    monkeypatch.setenv(CI_ENV, "true")
    with pytest.raises(pytest.fail.Exception, match="chromium package"):
        require_chromium(lambda: None)
    assert calls == []  # nothing was run, let alone apt-get
    assert require_chromium(lambda: "/usr/bin/chromium") == "/usr/bin/chromium"


def test_no_test_runs_apt_get_and_ci_sets_what_the_tests_read():
    for path in sorted((ROOT / "tests").glob("*.py")):
        text = path.read_text()
        assert not re.search(r"""\[\s*["'](sudo["']\s*,\s*["'])?apt(-get)?["']""", text), path.name
        assert not re.search(r"""os\.system\(\s*f?["'][^"']*apt""", text), path.name
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(rf"^export {CI_ENV}=", ci, re.M), "'.ci/run' must export the variable the tests read"
    proc = subprocess.run(["bash", "-c", f"set -euo pipefail; unset {CI_ENV}; "
                                         + "".join(line + "\n" for line in ci.splitlines()
                                                   if line.startswith(f"export {CI_ENV}=")) + f"echo ${CI_ENV}"],
                          capture_output=True, text=True)
    assert proc.stdout.strip(), proc.stderr


# ---- quiet outputs -------------------------------------------------------------------------------------
def test_search_stderr_carries_no_optuna_log_line():
    proc = run_cli("search", *EXHAUSTIVE_SMALL, "--sampler", "tpe", "--trials", "4", "--seed", "3", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["engine"] == "tpe"
    assert "A new study created" not in proc.stderr and not re.search(r"^\[I ", proc.stderr, re.M), proc.stderr


def _report_header(result_path: Path, tmp_path: Path) -> str:
    out = tmp_path / f"{result_path.stem}.html"
    proc = run_cli("report", str(result_path), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    page = out.read_text()
    m = re.search(r"<th>MoE load imbalance</th><td>([^<]*)</td>", page)
    assert m, "no MoE load imbalance row"
    return m.group(1)


def test_report_shows_the_applied_moe_load_imbalance(tmp_path):
    default = run_cli("search", *EXHAUSTIVE_SMALL, "--top", "3", "--json")
    assert default.returncode == 0, default.stderr
    result = json.loads(default.stdout)
    assert result["inputs"]["moe_load_imbalance"] is None  # as the jobs store it
    applied = result["top"][0]["config"]["moe_load_imbalance"]
    (tmp_path / "default.json").write_text(default.stdout)
    assert _report_header(tmp_path / "default.json", tmp_path) == f"{applied:g} (default)"
    given = run_cli("search", *EXHAUSTIVE_SMALL, "--top", "3", "--moe-load-imbalance", "1.3", "--json")
    (tmp_path / "given.json").write_text(given.stdout)
    assert _report_header(tmp_path / "given.json", tmp_path) == "1.3"
    dense = run_cli("search", "--model", "tiny-dense", *SMALL[2:], "--global-batch-size", "64", "--top", "3", "--json")
    (tmp_path / "dense.json").write_text(dense.stdout)
    assert "dense" in _report_header(tmp_path / "dense.json", tmp_path)


def _pty_run(argv: list[str], cols: int = 80, timeout: float = 180) -> tuple[int, str, str]:
    """``argv`` with stdout on a terminal ``cols`` wide (stderr piped); its exit code, stdout and stderr."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, cols, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=slave, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env)
    os.close(slave)
    output = read_pty(master)
    err = proc.stderr.read().decode()
    proc.wait(timeout=timeout)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", output.decode()).replace("\r", "")
    return proc.returncode, text, err


def _words(text: str) -> list[str]:
    """The words of a config description (what a table must never break): split at spaces, '(', '+', ')'."""
    return [w for w in re.split(r"[\s()+]+", text) if w]


def _assert_unbroken(table: str, descriptions: list[str], cols: int) -> None:
    lines = table.splitlines()
    assert all(len(line.rstrip()) <= cols for line in lines), max(lines, key=len)
    cells = re.findall(r"[^│┃]+", table)
    found = [w for cell in cells for w in _words(cell)]
    for desc in descriptions:
        for w in _words(desc):
            assert found.count(w) >= sum(_words(d).count(w) for d in descriptions), (w, table)


def test_search_table_on_80_columns_never_breaks_a_config_word():
    from app.formats.describe import layout_brief, variant_brief

    args = ["--model", "pangu-ultra-moe-718b", "--cluster", "ascend-910b", "--devices", "6144",
            "--global-batch-size", "7680", "--fix", "pp=4", "--fix", "cp=8", "--top", "4"]
    result = json.loads(run_cli("search", *args, "--json", timeout=300).stdout)
    rc, table, err = _pty_run([sys.executable, "-m", "app.cli", "search", *args])
    assert rc == 0, err
    descriptions = [layout_brief(lay["config"]) + " " + variant_brief(lay["config"]) for lay in result["layouts"]]
    assert any("(" in d for d in descriptions)  # a selective recompute with modules, the case of the issue
    _assert_unbroken(table, descriptions, 80)
    for lay in result["layouts"]:
        assert re.search(rf"^\s*{lay['best_rank']} │", table, re.M), table


def test_submit_trials_on_an_exhaustive_space_says_it_scored_configs(server):
    from app.cli.commands.submit import _brief

    rc, table, err = _pty_run([sys.executable, "-m", "app.cli", "submit", "--server", server.url, *EXHAUSTIVE_SMALL,
                               "--trials", "100", "--top", "5", "--wait", "--poll", "0.2"])
    assert rc == 0, err
    assert "--trials 100 was not used" in err and "configs scored, not trials" in err, err
    assert re.search(r"\b[\d,]+\s+configs\s+scored\b", table), table
    job_id = re.search(r"job (\S+) ", table).group(1)
    with server.client() as c:
        job = c.get(f"/v1/jobs/{job_id}").json()
        configs = c.get(f"/v1/jobs/{job_id}/configs", params={"limit": 5}).json()["items"]
    assert job["inputs"]["search"]["engine"] == "exhaustive" and job["inputs"]["search"]["n_trials"] == 100
    assert job["summary"]["trials"] == job["inputs"]["search"]["space_size"]  # configs, not the 100 asked for
    assert f"{job['summary']['trials']:,}" in table
    _assert_unbroken(table.split("best config:")[0], [_brief(e["config"]) for e in configs], 80)
    # a sampler job says nothing of the kind
    proc = run_cli("submit", "--server", server.url, *EXHAUSTIVE_SMALL, "--sampler", "random", "--trials", "5",
                   "--wait", "--poll", "0.2")
    assert proc.returncode == 0 and "was not used" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("as_json", [False, True])
def test_a_closed_pipe_is_not_an_error(as_json):
    args = [sys.executable, "-m", "app.cli", "evaluate", "--model", "pangu-ultra-moe-718b", "--cluster",
            "ascend-910b", "--devices", "6144", "--config", str(ROOT / "examples" / "pangu-ultra-moe-6144.json")]
    args += ["--json"] if as_json else []
    # the reader is gone before the first write
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0 and err == "", err
    # and as the user typed it
    shell = subprocess.run(["bash", "-c", "set -o pipefail; " + " ".join(f"'{a}'" for a in args) + " | head -1"],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert shell.returncode == 0 and len(shell.stdout.splitlines()) == 1 and shell.stderr == "", shell.stderr


def test_reasons_that_need_dp_are_left_out_when_dp_is_undefined(server):
    cfg = {"tp": 8, "ep": 8, "micro_batch_size": 1, "global_batch_size": 63}  # tp*pp*cp = 8; 12 devices: no dp
    undefined = run_cli("evaluate", *SMALL[:-1], "12", "--config", json.dumps(cfg), "--json")
    res = json.loads(undefined.stdout)
    codes = [r["code"] for r in res["infeasible_reasons"]]
    assert undefined.returncode == 0 and "devices_divisible" in codes
    assert not {"ep_etp_divides", "global_batch_divisible", "dp_mismatch"} & set(codes), codes
    assert "dp=" not in " ".join(r["message"] for r in res["infeasible_reasons"])
    # with dp defined (16 devices: dp 2) the same config still reports the rules that need dp
    defined = json.loads(run_cli("evaluate", *SMALL[:-1], "16", "--config", json.dumps(cfg), "--json").stdout)
    assert "global_batch_divisible" in [r["code"] for r in defined["infeasible_reasons"]]
    with server.client() as c:
        r = c.post("/v1/evaluate", json={"model": "tiny-moe", "cluster": "nvidia-h100-80gb", "devices": 12,
                                         "config": cfg})
    assert r.status_code == 200 and r.json()["infeasible_reasons"] == res["infeasible_reasons"]
    table = run_cli("evaluate", *SMALL[:-1], "12", "--config", json.dumps(cfg))
    assert "is not divisible by tp*pp*cp" in table.stdout and "micro_batch_size*dp" not in table.stdout


def test_megatron_export_states_virtual_stages_only_with_pipeline_parallelism(tmp_path):
    def export(*fix: str) -> tuple[dict, list[str]]:
        proc = run_cli("search", *EXHAUSTIVE_SMALL, "--framework", "megatron", "--top", "1", "--json",
                       *[a for f in fix for a in ("--fix", f)])
        assert proc.returncode == 0, proc.stderr
        path = tmp_path / "result.json"
        path.write_text(proc.stdout)
        out = run_cli("export", "--format", "megatron", str(path))
        assert out.returncode == 0, out.stderr
        return json.loads(proc.stdout)["best"]["config"], out.stdout.split()

    cfg, args = export("pp=1")
    assert cfg["pp"] == 1 and "--num-virtual-stages-per-pipeline-rank" not in args
    assert args[args.index("--pipeline-model-parallel-size") + 1] == "1"
    cfg, args = export("pp=2", "vpp=1")
    assert cfg["pp"] == 2 and cfg["vpp"] == 1
    if "--pipeline-model-parallel-layout" not in args:  # a layout string states the chunks itself
        assert args[args.index("--num-virtual-stages-per-pipeline-rank") + 1] == "1"

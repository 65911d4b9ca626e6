"""What a newcomer reads: token budgets as they are quoted, a plan without a deadline said so, counts in the
singular, a calibration scatter drawn over its data, a work tree left clean by `paraplan serve`, NaN named
as not a number, a broken YAML file named, validator messages without pydantic's prefix, each error listed
once, the RL planner saying it runs, and the line under the search tables on what to do next. Degenerate
profiles are refused before the cost model's arithmetic overflows."""

from __future__ import annotations

import fcntl
import json
import math
import os
import pty
import re
import shutil
import signal
import struct
import subprocess
import sys
import termios
import time
import warnings
from pathlib import Path

import pytest

from service_util import ROOT, free_port, read_pty, require_chromium, run_cli, wait_for

sys.path.insert(0, str(ROOT / "scripts"))
import report_screenshot as shot  # noqa: E402

sys.path.pop(0)

SMALL = ("--model", "tiny-dense", "--cluster", "nvidia-h100-80gb", "--devices", "8")


def _figure(page: str, plot_id: str) -> dict:
    m = re.search(r'<script id="paraplan-figures" type="application/json">(.*?)</script>', page, re.S)
    return json.loads(m.group(1))[plot_id]


# ---- capacity plan: "19T tokens", "no deadline" ----------------------------------------------------------
@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    d = tmp_path_factory.mktemp("plan")
    args = ("plan", "--model", "tiny-dense", "--cluster", "nvidia-h100-80gb", "--tokens", "19T", "--devices-min",
            "8", "--devices-max", "16")
    table = run_cli(*args)
    assert table.returncode == 0, table.stderr
    proc = run_cli(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    (d / "plan.json").write_text(proc.stdout)
    rep = run_cli("report", str(d / "plan.json"), "-o", str(d / "plan.html"))
    assert rep.returncode == 0, rep.stderr
    return table.stdout, (d / "plan.html").read_text()


def test_plan_quotes_tokens_as_given(plan):
    table, page = plan
    assert "capacity plan: 19T tokens on nvidia-h100-80gb" in table, table[:300]
    text = re.sub(r"<script.*?</script>", "", page, flags=re.S)  # what the page shows, not its data
    assert "19T tokens" in text and "e+13" not in text and "e+13" not in table


def test_plan_report_without_a_deadline_says_so(plan):
    _, page = plan
    assert "no deadline" in page and "none days" not in page


def test_token_counts_read_as_budgets_are_quoted():
    from app.formats.plan import parse_tokens, tokens_text

    for text in ("19T", "500B", "12.5T", "800", "3M", "1.5K"):
        assert tokens_text(parse_tokens(text)) == text


# ---- rl: "1 wave", progress -------------------------------------------------------------------------------
def test_counts_are_singular_for_one():
    from app.formats.describe import count_text

    assert (count_text(1, "wave"), count_text(4, "wave"), count_text(0, "wave")) == ("1 wave", "4 waves", "0 waves")


RL = ("rl", "--model", "tiny-moe", "--cluster", "nvidia-h100-80gb", "--devices", "16")


def _stderr_on_a_terminal(argv: list[str], timeout: float = 600) -> tuple[int, str]:
    """``argv`` with stderr on a terminal (stdout piped): its exit code and what the terminal showed."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 120, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=slave, stdin=subprocess.DEVNULL,
                            env=env)
    os.close(slave)
    output = read_pty(master)
    proc.wait(timeout=timeout)
    return proc.returncode, re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", output.decode(errors="replace"))


def test_rl_says_it_runs_and_names_waves_in_the_singular():
    proc = run_cli(*RL, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("planning RL post-training of tiny-moe on 16 devices"), proc.stderr
    waves = [int(w) for w in re.findall(r"(\d+) waves?\b", proc.stdout)]
    assert waves, proc.stdout
    assert "1 waves" not in proc.stdout and all(f"{w} wave{'' if w == 1 else 's'}" in proc.stdout for w in waves)


def test_rl_shows_a_progress_bar_on_a_terminal():
    rc, shown = _stderr_on_a_terminal([sys.executable, "-m", "app.cli", *RL, "--json"])
    assert rc == 0, shown
    assert re.search(r"training searches .*\d+/\d+", shown), shown[-500:]
    assert "planning RL post-training" not in shown  # the bar, not the log line


# ---- calibration report: the scatter's axes span its data -------------------------------------------------
def test_calibration_scatter_axes_span_the_data_in_chromium(tmp_path):
    from app.formats.calibration_report import PLOT_ID, render_calibration_report

    require_chromium(shot.chromium)
    runs = [{"name": f"run-{i}", "reported": m, "before": b, "after": a} for i, (m, b, a) in
            enumerate([(420.0, 0.35, 0.04), (1300.0, -0.2, -0.03), (2650.0, 0.1, 0.02), (4800.0, -0.15, 0.05)])]
    report = {"name": "ours", "cluster": "ascend-910b", "run_errors": runs, "mape_before": 0.2, "mape_after": 0.035,
              "factors": {}, "published": None}
    page = tmp_path / "cal.html"
    page.write_text(render_calibration_report(report))
    lo, hi = _figure(page.read_text(), PLOT_ID)["layout"]["xaxis"]["range"]
    dom = shot.rendered_dom(page)
    plot = dom[dom.index(f'id="{PLOT_ID}"'):]
    ticks = [t.replace("\u2212", "-").replace(",", "") for t in re.findall(r'class="xtick"[^>]*>.*?>([^<]+)</text>',
                                                                             plot)]
    values = [float(t[:-1]) * 1000 if t.endswith("k") else float(t) for t in ticks]
    assert values, plot[:2000]
    assert all(lo <= v <= hi for v in values), (lo, hi, ticks)  # drawn over the data, not -8K..14K


# ---- serve: the work tree stays clean ---------------------------------------------------------------------
def test_serve_leaves_no_untracked_file_in_a_work_tree(tmp_path):
    """`paraplan serve` with the default database (./paraplan.db) in a git work tree that has the project's
    .gitignore, a sampler job run to its end (it takes the study's trial lock): `git status` stays empty."""
    import httpx

    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    tree = tmp_path / "tree"
    tree.mkdir()
    shutil.copy(ROOT / ".gitignore", tree / ".gitignore")
    subprocess.run(["git", "init", "-q"], cwd=tree, check=True)
    subprocess.run(["git", "add", ".gitignore"], cwd=tree, check=True)
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    port = free_port()
    with open(tmp_path / "serve.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--no-access-log"],
                                cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            time.sleep(0.05)
        with httpx.Client(base_url=url, timeout=30) as c:
            job = c.post("/v1/jobs", json={"model": "tiny-dense", "cluster": "nvidia-h100-80gb", "devices": 8,
                                           "global_batch_size": 64, "search": {"sampler": "tpe", "n_trials": 8}})
            assert job.status_code == 202, job.text
            assert wait_for(c, job.json()["id"], timeout=120)["status"] == "succeeded"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    made = {p.name for p in tree.iterdir()}
    assert {"paraplan.db", "paraplan.db.trials-lock"} <= made, made  # the files a sampler job leaves
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=tree, capture_output=True,
                            text=True, check=True).stdout
    assert [line for line in status.splitlines() if line.startswith("??")] == [], status


# ---- input errors -----------------------------------------------------------------------------------------
def test_nan_is_named_not_a_finite_number_on_the_cli_and_the_api(tmp_path):
    from fastapi.testclient import TestClient

    from app.service.core.config import Settings
    from app.service.main import create_app

    proc = run_cli("search", *SMALL, "--global-batch-size", "64", "--moe-load-imbalance", "nan")
    assert proc.returncode == 2 and "error: moe_load_imbalance: must be a finite number" in proc.stderr, proc.stderr
    proc = run_cli("evaluate", *SMALL, "--config", '{"global_batch_size": 64, "moe_load_imbalance": NaN}')
    assert proc.returncode == 2 and "error: config.moe_load_imbalance: must be a finite number" in proc.stderr, \
        proc.stderr
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        client = TestClient(create_app(Settings(database_url=f"sqlite:///{tmp_path / 'a.db'}", embedded_worker=False)))
    with client as c:
        for path, body in (("/v1/jobs", '{"model": "tiny-moe", "cluster": "nvidia-h100-80gb", "devices": 8, '
                                        '"global_batch_size": 64, "moe_load_imbalance": NaN}'),
                           ("/v1/evaluate", '{"model": "tiny-moe", "cluster": "nvidia-h100-80gb", "devices": 8, '
                                            '"config": {"global_batch_size": 64, "moe_load_imbalance": NaN}}')):
            r = c.post(path, content=body, headers={"content-type": "application/json"})
            assert r.status_code == 422, r.text
            (detail,) = r.json()["detail"]
            assert detail["loc"][-1] == "moe_load_imbalance" and detail["msg"].startswith("must be a finite number"), \
                detail
            assert "less than or equal" not in detail["msg"]


def test_a_broken_yaml_file_is_named(tmp_path):
    bad = tmp_path / "broken-model.yaml"
    bad.write_text("base: tiny-dense\nnum_layers: [1\n")
    for args, field in ((("--model", str(bad), "--cluster", "nvidia-h100-80gb"), "model"),
                        (("--model", "tiny-dense", "--cluster", str(bad)), "cluster")):
        proc = run_cli("evaluate", *args, "--devices", "8", "--config", '{"global_batch_size": 64}')
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith(f"error: {field}: '{bad}' is not valid YAML"), proc.stderr
        assert "<unicode string>" not in proc.stderr and "line 3" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_validator_messages_have_no_pydantic_prefix_and_errors_are_listed_once(tmp_path):
    from fastapi.testclient import TestClient

    from app.service.core.config import Settings
    from app.service.main import create_app

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        client = TestClient(create_app(Settings(database_url=f"sqlite:///{tmp_path / 'a.db'}", embedded_worker=False)))
    with client as c:
        r = c.post("/v1/evaluate", json={"model": "tiny-moe", "cluster": "nvidia-h100-80gb", "devices": 8, "config": {
            "global_batch_size": 64, "recompute": "selective", "recompute_modules": ["foo"]}})
    assert r.status_code == 422 and r.json()["detail"][0]["msg"].startswith("unknown recompute module"), r.text
    proc = run_cli("evaluate", *SMALL, "--config",
                   '{"global_batch_size": 64, "recompute": "selective", "recompute_modules": ["foo"]}')
    assert proc.returncode == 2 and proc.stderr.startswith("error: config.recompute_modules: unknown recompute"), \
        proc.stderr
    assert "Value error" not in proc.stderr
    proc = run_cli("evaluate", *SMALL, "--config", '{"global_batch_size": 64, "tp": "x", "pp": "y"}')
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("config.tp") == 1 and proc.stderr.count("config.pp") == 1, proc.stderr
    assert "(and 1 more: config.pp: " in proc.stderr, proc.stderr


# ---- degenerate profiles: refused before any arithmetic ---------------------------------------------------
DEGENERATE = {"base": "nvidia-h100-80gb", "facts": {"peak_bf16_tflops": {"value": 1e-308, "source": "test"}}}


def test_a_degenerate_profile_is_refused_before_the_cost_model_runs(tmp_path):
    from fastapi.testclient import TestClient

    from app.formats.inputs import InputError, load_cluster
    from app.service.core.config import Settings
    from app.service.main import create_app

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # an overflow in the cost model fails the test
        with pytest.raises(InputError) as err:
            load_cluster(DEGENERATE)
        assert err.value.field == "cluster.facts.peak_bf16_tflops" and "1e-308" in err.value.reason
        warnings.simplefilter("ignore", DeprecationWarning)
        with TestClient(create_app(Settings(database_url=f"sqlite:///{tmp_path / 'a.db'}",
                                            embedded_worker=False))) as c:
            r = c.post("/v1/evaluate", json={"model": "tiny-moe", "cluster": DEGENERATE, "devices": 8,
                                             "config": {"global_batch_size": 64}})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "cluster", "facts", "peak_bf16_tflops"]


# ---- what next --------------------------------------------------------------------------------------------
def test_search_ends_with_what_to_do_next_and_those_commands_work(tmp_path):
    proc = run_cli("search", *SMALL, "--global-batch-size", "64")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.rstrip().splitlines()
    at = max(i for i, line in enumerate(lines) if line.startswith("next: "))
    last = " ".join(lines[at:])  # the closing paragraph, wrapped to the terminal's width
    assert last.startswith("next: add --json > result.json"), last
    commands = re.findall(r"`(paraplan [^`]+)`", last)
    assert [c.split()[1] for c in commands] == ["report", "export", "compare"], last
    proc = run_cli("search", *SMALL, "--global-batch-size", "64", "--json")
    (tmp_path / "result.json").write_text(proc.stdout)
    for command in commands:  # as printed, run where result.json is
        done = subprocess.run([sys.executable, "-m", "app.cli", *command.split()[1:]], cwd=tmp_path,
                              capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert done.returncode == 0, (command, done.stderr)
    assert (tmp_path / "report.html").exists()
    proc = run_cli("search", *SMALL, "--global-batch-size", "64", "--json")
    assert "next:" not in proc.stdout and math.isfinite(json.loads(proc.stdout)["best"]["evaluation"]["mfu"])

"""The optimisation history agrees with the ranking: every trial is plotted at the tokens/s of the config
the ranking puts first in its layout (the value the sampler was told), a config that fits only inside the
memory margin is marked as such, and the best-so-far line ends at the ranked best, in ``paraplan search
--json`` + ``paraplan report`` and in a real server's job report (history read back from the Optuna study)
alike, trial for trial.

The search is one where the margin matters: Llama-3 70B on 32 H100s with a 16 GiB margin, where several
layouts' fastest fitting configs fall short of the margin and run faster than the ranked best."""

from __future__ import annotations

import json
import re

import pytest

from service_util import Server, run_cli, wait_for

SEARCH = dict(model="llama3-70b", cluster="nvidia-h100-80gb", devices=32, gbs=64, trials=40, seed=3, margin=16)
JOB = {"model": SEARCH["model"], "cluster": SEARCH["cluster"], "devices": SEARCH["devices"],
       "global_batch_size": SEARCH["gbs"],
       "search": {"sampler": "tpe", "n_trials": SEARCH["trials"], "seed": SEARCH["seed"],
                  "memory_margin_gib": SEARCH["margin"]}}


def _figures(page: str) -> dict:
    m = re.search(r'<script id="paraplan-figures" type="application/json">(.*?)</script>', page, re.S)
    return json.loads(m.group(1))


def _traces(page: str) -> dict:
    return {t["name"]: t for t in _figures(page)["plot-history"]["data"]}


def _points(traces: dict) -> dict[int, tuple[str, float]]:
    """trial -> (which series it is drawn in, its tokens/s) over the history plot's marker series."""
    out = {}
    for name, t in traces.items():
        if name != "best so far":
            out.update({x: (name, y) for x, y in zip(t["x"], t["y"])})
    return out


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    d = tmp_path_factory.mktemp("history")
    proc = run_cli("search", "--model", SEARCH["model"], "--cluster", SEARCH["cluster"], "--devices",
                   str(SEARCH["devices"]), "--global-batch-size", str(SEARCH["gbs"]), "--sampler", "tpe", "--trials",
                   str(SEARCH["trials"]), "--seed", str(SEARCH["seed"]), "--memory-margin-gib", str(SEARCH["margin"]),
                   "--json")
    assert proc.returncode == 0, proc.stderr
    (d / "r.json").write_text(proc.stdout)
    rep = run_cli("report", str(d / "r.json"), "-o", str(d / "r.html"))
    assert rep.returncode == 0, rep.stderr
    return json.loads(proc.stdout), (d / "r.html").read_text()


def test_the_search_premise_a_short_config_beats_the_ranked_best(cli):
    result, _ = cli
    best = result["best"]
    assert best["keeps_margin"] is True
    short = [h for h in result["history"] if h.get("keeps_margin") is False]
    assert short and max(h["tokens_per_s"] for h in short) > best["evaluation"]["tokens_per_s"]


def test_cli_history_agrees_with_the_ranking(cli):
    result, page = cli
    best_tps = result["best"]["evaluation"]["tokens_per_s"]
    history = result["history"]
    assert len(history) == SEARCH["trials"]
    kept = [h["tokens_per_s"] for h in history if h["feasible"] and h["keeps_margin"]]
    assert max(kept) == pytest.approx(best_tps, rel=1e-9)  # the best is a history point, none above it
    ranked = {json.dumps(e["config"], sort_keys=True): e for e in result["top"]}
    assert all(e["evaluation"]["tokens_per_s"] <= best_tps * (1 + 1e-9) for e in ranked.values())
    line = _traces(page)["best so far"]["y"]
    assert line == sorted(line) and line[-1] == pytest.approx(best_tps, rel=1e-9)


def test_service_history_is_the_cli_history(cli, tmp_path):
    result, cli_page = cli
    srv = Server(tmp_path / "srv.db", tmp_path / "serve.log").start()
    try:
        with srv.client() as c:
            job = c.post("/v1/jobs", json=JOB)
            assert job.status_code == 202, job.text
            job = wait_for(c, job.json()["id"], timeout=120)
            assert job["status"] == "succeeded", job
            best = c.get(f"/v1/jobs/{job['id']}/configs").json()["items"][0]
            page = c.get(f"/v1/jobs/{job['id']}/report").text
    finally:
        srv.stop()
    assert best["config"] == result["best"]["config"]
    traces = _traces(page)
    assert traces["best so far"]["y"][-1] == pytest.approx(best["evaluation"]["tokens_per_s"], rel=1e-9)
    theirs, ours = _points(traces), _points(_traces(cli_page))
    assert theirs.keys() == ours.keys()
    for trial, (series, tps) in ours.items():
        assert theirs[trial][0] == series, trial
        assert theirs[trial][1] == pytest.approx(tps, rel=1e-9), trial

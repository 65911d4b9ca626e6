"""The memory margin and the distinct layouts of a search, against an independent scoring of the space.

Margin: every result states ``memory.headroom_gib`` = capacity − peak; configs whose headroom is below the
margin are still ranked, after every config that keeps it, and flagged (``keeps_margin: false`` and a
``margin_warning``); ``best`` keeps the margin whenever some config does; a bad margin is exit 2 / 422
naming ``memory_margin_gib``. Layouts: one group per distinct (tp, pp, cp, ep, etp), each with the best
config of that layout, its exact rank among all ranked configs and how many of its configs fit; ``top``
is what it was. Margins are chosen from the headrooms the cost model gives (never hard-coded), so the
tests hold whatever the calibration.
"""

from __future__ import annotations

import functools
import json
import warnings
from collections import defaultdict

import numpy as np
import pytest

warnings.filterwarnings("ignore", message=".*httpx2.*")

from fastapi.testclient import TestClient  # noqa: E402

import hardware_profiles  # noqa: E402
import model_presets  # noqa: E402
from app.service.core.config import Settings  # noqa: E402
from app.service.main import create_app  # noqa: E402
from app.formats.report import render_report  # noqa: E402
from app.service.worker import Worker  # noqa: E402
from costmodel import evaluate_batch  # noqa: E402
from search import SearchRequest, build_space, run_search  # noqa: E402
from search.exhaustive import LAYOUT_FIELDS  # noqa: E402
from service_util import run_cli  # noqa: E402

GIB = 2**30
CASES = {"tiny-dense": ("nvidia-a100-80gb", 8, 32), "tiny-moe": ("nvidia-h100-80gb", 16, 64),
         "tiny-mla-moe": ("nvidia-h100-80gb", 16, 64)}


def _request(model: str, **kw) -> SearchRequest:
    cluster, devices, gbs = CASES[model]
    return SearchRequest(spec=model_presets.load(model), profile=hardware_profiles.load(cluster), devices=devices,
                         global_batch_size=gbs, **kw)


def _independent(model: str, margin: float) -> list[dict]:
    """Every feasible config of the space, scored in one batch and ranked here, best first: those that keep
    ``margin`` first, then by tokens/s, those that offload nothing, the smaller peak, enumeration order.
    An offload plan whose counterpart without offload (same layout, micro-batch and other options) keeps
    the margin is left out: it only repeats it, slower or as fast, and the engines do not score it."""
    feasible, base = _feasible(model)
    out = [{**c, "keeps": bool(c["room"] >= margin)} for c in feasible]
    keeping = {c["at"] for c in out if c["keeps"]}
    out = [c for c in out if base[c["at"][1]] == c["at"][1] or (c["at"][0], base[c["at"][1]]) not in keeping]
    out.sort(key=lambda c: (not c["keeps"], -c["tokens"], bool(c["config"].get("offload_modules")), c["peak"], c["i"]))
    return out


@functools.cache
def _feasible(model: str) -> tuple[tuple[dict, ...], tuple[int, ...]]:
    """Every feasible config of ``model``'s space scored one batch at a time, in enumeration order, and each
    option's counterpart without offload: the part of ``_independent`` that does not depend on the margin,
    worked out once per model for the ten rankings these tests ask of it (their configs are only read)."""
    req = _request(model)
    space = build_space(req.spec, req.profile, req.devices, req.global_batch_size)
    rows, opts = np.nonzero(space._option_mask())
    br = evaluate_batch(req.spec, req.profile, req.devices, space.make_batch(rows, opts))
    feasible = tuple({"i": int(i), "tokens": float(br.tokens_per_s[i]), "peak": float(br.peak_bytes[i]),
                      "room": (br.capacity_bytes - br.peak_bytes[i]) / GIB,
                      "config": space.config(int(rows[i]), int(opts[i])), "at": (int(rows[i]), int(opts[i]))}
                     for i in np.flatnonzero(br.feasible))
    return feasible, tuple(space.offload_counterpart)


def _layout(cfg: dict) -> tuple:
    return tuple(cfg[k] for k in LAYOUT_FIELDS)


def _splitting_margin(model: str) -> float:
    """A margin that the unmargined best config does not keep but a few others do: the largest headroom of
    any feasible config (so at least one keeps it), provided it beats the best's."""
    ranked = _independent(model, 0.0)
    margin = max(c["room"] for c in ranked)
    assert margin > ranked[0]["room"], "every config has the same headroom: no margin can split them"
    return margin


# ---- headroom -----------------------------------------------------------------------------------------
def test_every_result_states_its_headroom_as_capacity_minus_peak():
    proc = run_cli("evaluate", "--model", "tiny-dense", "--cluster", "nvidia-h100-80gb", "--devices", "8",
                   "--config", '{"tp": 2, "global_batch_size": 64}', "--json")
    assert proc.returncode == 0, proc.stderr
    mem = json.loads(proc.stdout)["memory"]
    assert mem["headroom_gib"] == pytest.approx(mem["capacity_gib"] - mem["peak_gib"], rel=1e-12)
    res = run_search(_request("tiny-moe", sampler="exhaustive", top_k=5))
    for e in res["top"] + res["layouts"]:
        mem = e["evaluation"]["memory"]
        assert mem["headroom_gib"] == pytest.approx(mem["capacity_gib"] - mem["peak_gib"], rel=1e-12)


def test_an_invalid_config_has_a_null_headroom():
    proc = run_cli("evaluate", "--model", "tiny-dense", "--cluster", "nvidia-h100-80gb", "--devices", "8",
                   "--config", '{"tp": 3, "global_batch_size": 64}', "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["memory"]["headroom_gib"] is None


# ---- the margin in the ranking --------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["tiny-dense", "tiny-moe"])
def test_configs_inside_the_margin_rank_after_those_outside_and_are_flagged(model):
    margin = _splitting_margin(model)
    plain = run_search(_request(model, sampler="exhaustive", top_k=1, memory_margin_gib=0.0))
    expected = _independent(model, margin)
    k = sum(c["keeps"] for c in expected) + 3  # the configs that keep it, then a few that do not
    res = run_search(_request(model, sampler="exhaustive", top_k=k, memory_margin_gib=margin))
    assert [e["config"] for e in res["top"]] == [c["config"] for c in expected[:k]]
    flags = [e["keeps_margin"] for e in res["top"]]
    assert flags == sorted(flags, reverse=True) and True in flags and False in flags  # keepers first
    for e in res["top"]:
        assert e["keeps_margin"] == (e["evaluation"]["memory"]["headroom_gib"] >= margin)
        assert e["evaluation"]["feasible"]  # inside the margin is still a config that fits
        if not e["keeps_margin"]:
            assert f"below the {margin:g} GiB memory margin" in e["margin_warning"]
            assert "safe" not in e["margin_warning"]
        else:
            assert "margin_warning" not in e
    # the unmargined best does not keep the margin: it is flagged and no longer first
    moved = next(e for e in res["top"] if e["config"] == plain["best"]["config"])
    assert moved["keeps_margin"] is False and moved["rank"] > 1
    assert res["best"]["keeps_margin"] is True and res["best"]["config"] == expected[0]["config"]


def _median_margin(model: str) -> float:
    """A margin about half the configs keep, and the unmargined best does not: the median headroom of
    the configs with more headroom than the best."""
    ranked = _independent(model, 0.0)
    rooms = np.array([c["room"] for c in ranked])
    return float(np.median(rooms[rooms > ranked[0]["room"]]))


def test_best_keeps_the_margin_with_a_sampler_too():
    margin = _median_margin("tiny-moe")
    plain = run_search(_request("tiny-moe", sampler="tpe", n_trials=200, seed=0, top_k=1, memory_margin_gib=0.0))
    res = run_search(_request("tiny-moe", sampler="tpe", n_trials=200, seed=0, top_k=100_000,
                              memory_margin_gib=margin))  # every distinct feasible config the trials scored
    flags = [e["keeps_margin"] for e in res["top"]]
    assert flags == sorted(flags, reverse=True) and True in flags and False in flags
    assert res["best"]["keeps_margin"] is True
    assert plain["best"]["evaluation"]["memory"]["headroom_gib"] < margin  # so the margin changed the best
    assert res["best"]["config"] != plain["best"]["config"]
    for group in (True, False):  # inside each group: by throughput
        tps = [e["evaluation"]["tokens_per_s"] for e in res["top"] if e["keeps_margin"] is group]
        assert tps == sorted(tps, reverse=True)
    for e in res["top"]:
        assert e["keeps_margin"] == (e["evaluation"]["memory"]["headroom_gib"] >= margin)


def test_when_no_config_keeps_the_margin_the_best_that_fits_is_returned_flagged(tmp_path):
    ranked = _independent("tiny-moe", 0.0)
    margin = max(c["room"] for c in ranked) + 0.5  # below the capacity, above every headroom
    proc = run_cli("search", "--model", "tiny-moe", "--cluster", "nvidia-h100-80gb", "--devices", "16",
                   "--global-batch-size", "64", "--top", "3", "--memory-margin-gib", f"{margin}", "--json")
    assert proc.returncode == 0, proc.stderr  # a config fits: not the "nothing fits" exit 3
    out = json.loads(proc.stdout)
    assert out["inputs"]["memory_margin_gib"] == pytest.approx(margin)
    assert out["best"]["config"] == ranked[0]["config"] and out["best"]["keeps_margin"] is False
    assert all(e["keeps_margin"] is False for e in out["top"] + out["layouts"])
    assert "no config keeps the" in proc.stderr
    table = run_cli("search", "--model", "tiny-moe", "--cluster", "nvidia-h100-80gb", "--devices", "16",
                    "--global-batch-size", "64", "--top", "3", "--memory-margin-gib", f"{margin}")
    assert table.returncode == 0 and "SHORT" in table.stdout and "headroom GiB" in table.stdout
    page = render_report(out)
    assert 'class="short"' in page and "No config keeps the" in page


@pytest.mark.parametrize("value,why", [("-1", "at least 0"), ("nan", "finite"), ("inf", "finite"),
                                       ("5000", "at most"), ("80", "below the device memory")])
def test_a_bad_margin_is_exit_2_naming_the_field(value, why):
    proc = run_cli("search", "--model", "tiny-moe", "--cluster", "nvidia-h100-80gb", "--devices", "16",
                   "--global-batch-size", "64", "--memory-margin-gib", value)
    assert proc.returncode == 2 and "memory_margin_gib" in proc.stderr and why in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


# ---- distinct layouts ------------------------------------------------------------------------------------
@pytest.mark.parametrize("model", list(CASES))
def test_layouts_are_distinct_exact_and_their_variants_add_up(model):
    margin = _splitting_margin(model)
    expected = _independent(model, margin)
    groups: dict[tuple, list[int]] = defaultdict(list)  # layout -> ranks of its configs (1-based)
    for rank, c in enumerate(expected, 1):
        groups[_layout(c["config"])].append(rank)
    k = len(groups)  # ask for every layout: then the variants add up to every config that fits
    res = run_search(_request(model, sampler="exhaustive", top_k=k, memory_margin_gib=margin))
    layouts = res["layouts"]
    keys = [_layout(g["config"]) for g in layouts]
    assert len(keys) == len(set(keys)) == k == res["feasible_layouts"]  # no two groups share a layout
    assert all(tuple(g["layout"][f] for f in LAYOUT_FIELDS) == key for g, key in zip(layouts, keys))
    # variants: the feasible configs scored, which leaves out the offload plans that only repeat their
    # counterpart (not ranked, so not scored either)
    assert sum(g["variants"] for g in layouts) == res["feasible_trials"] == len(expected)
    ranks = [g["best_rank"] for g in layouts]
    assert ranks == sorted(ranks) and ranks[0] == 1 and layouts[0]["config"] == res["best"]["config"]
    for g, key in zip(layouts, keys):
        assert g["best_rank"] == groups[key][0]  # the exact rank of the layout's best config
        assert g["variants"] == len(groups[key])
        assert g["config"] == expected[g["best_rank"] - 1]["config"]
        if g["best_rank"] <= len(res["top"]):
            assert res["top"][g["best_rank"] - 1]["config"] == g["config"]
            assert res["top"][g["best_rank"] - 1]["evaluation"] == g["evaluation"]
        assert g["keeps_margin"] == (g["evaluation"]["memory"]["headroom_gib"] >= margin)


def test_top_k_layouts_are_the_first_k_and_top_is_unchanged():
    full = run_search(_request("tiny-moe", sampler="exhaustive", top_k=40))
    cut = run_search(_request("tiny-moe", sampler="exhaustive", top_k=4))
    assert [g["layout"] for g in cut["layouts"]] == [g["layout"] for g in full["layouts"][:4]]
    assert [(g["best_rank"], g["variants"]) for g in cut["layouts"]] == \
        [(g["best_rank"], g["variants"]) for g in full["layouts"][:4]]
    assert [e["config"] for e in cut["top"]] == [e["config"] for e in full["top"][:4]]  # top: the top K configs
    assert [e["rank"] for e in cut["top"]] == [1, 2, 3, 4] and cut["best"] == cut["top"][0]
    assert all({"rank", "config", "evaluation"} <= set(e) for e in cut["top"])
    expected = _independent("tiny-moe", 4.0)  # the default margin
    assert [e["config"] for e in full["top"]] == [c["config"] for c in expected[:40]]


def test_sampler_layouts_group_the_configs_its_trials_scored():
    res = run_search(_request("tiny-mla-moe", sampler="tpe", n_trials=60, seed=4, top_k=100_000))
    by_layout: dict[tuple, list[int]] = defaultdict(list)
    for e in res["top"]:  # top_k above the configs scored: every distinct feasible config is ranked
        by_layout[_layout(e["config"])].append(e["rank"])
    assert len(res["layouts"]) == len(by_layout) == res["feasible_layouts"]
    for g in res["layouts"]:
        ranks = by_layout[_layout(g["config"])]
        assert g["best_rank"] == ranks[0] and g["variants"] == len(ranks)
    assert sum(g["variants"] for g in res["layouts"]) == len(res["top"])


def test_cli_table_lists_layouts_with_their_best_variant():
    proc = run_cli("search", "--model", "tiny-moe", "--cluster", "nvidia-h100-80gb", "--devices", "16",
                   "--global-batch-size", "64", "--top", "4")
    assert proc.returncode == 0, proc.stderr
    assert "top 4 layouts" in proc.stdout and "best variant" in proc.stdout and "variants" in proc.stdout
    js = json.loads(run_cli("search", "--model", "tiny-moe", "--cluster", "nvidia-h100-80gb", "--devices", "16",
                            "--global-batch-size", "64", "--top", "4", "--json").stdout)
    for g in js["layouts"]:
        assert f"mbs={g['config']['micro_batch_size']} recompute={g['config']['recompute']}" in proc.stdout


def test_report_lists_layouts_and_groups_old_results_itself():
    res = run_search(_request("tiny-moe", sampler="exhaustive", top_k=6))
    result = {"inputs": {"cluster": "nvidia-h100-80gb", "devices": 16, "memory_margin_gib": 4.0}, **res}
    page = render_report(result)
    assert "Top 6 layouts" in page and "best variant" in page
    old = {k: v for k, v in result.items() if k not in ("layouts", "feasible_layouts")}
    old["top"] = [{k: e[k] for k in ("rank", "config", "evaluation")} for e in old["top"]]
    page = render_report(old)  # a result from before layouts: grouped from top
    distinct = {_layout(e["config"]) for e in old["top"]}
    assert f"Top {len(distinct)} layouts" in page and "grouped from the top configs" in page


# ---- the service --------------------------------------------------------------------------------------
JOB = {"model": "tiny-moe", "cluster": "nvidia-h100-80gb", "devices": 16, "global_batch_size": 64,
       "search": {"sampler": "exhaustive", "top_k": 6}}


@pytest.mark.parametrize("value", [-1, 5000, 80, 80.5, "lots"])
def test_a_bad_job_margin_is_422_naming_the_field(tmp_path, value):
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'm.db'}", embedded_worker=False)
    with TestClient(create_app(settings)) as client:
        r = client.post("/v1/jobs", json={**JOB, "search": {**JOB["search"], "memory_margin_gib": value}})
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == ["body", "search", "memory_margin_gib"]
        assert client.get("/v1/jobs").json()["total"] == 0


def test_a_job_stores_its_margin_flags_its_configs_and_serves_its_layouts(tmp_path, same_result):
    margin = _splitting_margin("tiny-moe")
    body = {**JOB, "search": {**JOB["search"], "memory_margin_gib": margin}}
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'm.db'}", embedded_worker=False)
    with TestClient(create_app(settings)) as client:
        job = client.post("/v1/jobs", json=body).json()
        assert job["inputs"]["search"]["memory_margin_gib"] == pytest.approx(margin)
        empty = client.get(f"/v1/jobs/{job['id']}/layouts").json()
        assert empty["items"] == [] and empty["total"] == 0  # nothing until it has succeeded
        assert client.get("/v1/jobs/0b5c8c52-3c2e-4a53-9f43-3f3f7f2a8f10/layouts").status_code == 404
        assert Worker(settings).run_until_idle() == 1
        done = client.get(f"/v1/jobs/{job['id']}").json()
        items = client.get(f"/v1/jobs/{job['id']}/configs").json()["items"]
        layouts = client.get(f"/v1/jobs/{job['id']}/layouts").json()
        assert "layouts" not in done["summary"]  # on its own route, not in every job view
        direct = run_search(_request("tiny-moe", sampler="exhaustive", top_k=6, memory_margin_gib=margin,
                                     framework=job["inputs"]["search"]["framework"]))  # the job's (the GPU default)
        assert [e["keeps_margin"] for e in items] == [e["keeps_margin"] for e in direct["top"]]
        assert [e.get("margin_warning") for e in items] == [e.get("margin_warning") for e in direct["top"]]
        assert done["best"]["keeps_margin"] is True and done["best"] == items[0]
        assert layouts["total"] == len(direct["layouts"]) == 6
        keys = ("layout", "best_rank", "config", "evaluation", "variants", "keeps_margin")
        same_result([{k: g[k] for k in keys} for g in direct["layouts"]],
                    [{k: g[k] for k in keys} for g in layouts["items"]])
        page = client.get(f"/v1/jobs/{job['id']}/layouts", params={"limit": 2, "offset": 1}).json()
        assert [g["best_rank"] for g in page["items"]] == [g["best_rank"] for g in layouts["items"][1:3]]
        report = client.get(f"/v1/jobs/{job['id']}/report").text
        assert "Top 6 layouts" in report and f"{margin:g} GiB" in report


def test_submit_sends_the_margin_and_a_bad_one_is_exit_2_naming_it(tmp_path):
    from service_util import Server

    srv = Server(tmp_path / "srv.db", tmp_path / "serve.log").start()
    try:
        base = ("submit", "--server", srv.url, "--model", "tiny-moe", "--cluster", "nvidia-h100-80gb",
                "--devices", "16", "--global-batch-size", "64", "--sampler", "exhaustive", "--top", "3")
        bad = run_cli(*base, "--memory-margin-gib", "-1", "--wait")
        assert bad.returncode == 2 and "memory_margin_gib" in bad.stderr, bad.stderr
        margin = _median_margin("tiny-moe")
        proc = run_cli(*base, "--memory-margin-gib", f"{margin}", "--wait", "--json")
        assert proc.returncode == 0, proc.stderr
        job = json.loads(proc.stdout)
        assert job["inputs"]["search"]["memory_margin_gib"] == pytest.approx(margin)
        assert all(e["keeps_margin"] for e in job["top"])  # about half the space keeps it: the top 3 do
        table = run_cli(*base, "--memory-margin-gib", f"{margin}", "--wait")
        assert table.returncode == 0 and "margin" in table.stdout and " ok " in table.stdout
    finally:
        srv.stop()

"""The job report (``app/formats/report.py``): from real small searches, self-contained (no http(s) script or
stylesheet), four plots that Plotly really draws in headless Chromium with no network; ``paraplan
report`` (file and ``--server``) and ``GET /v1/jobs/{id}/report`` (history read back from the Optuna
study, whose name the service guide documents)."""

from __future__ import annotations

import json
import re
import sys
import warnings

import pytest

warnings.filterwarnings("ignore", message=".*httpx2.*")

from fastapi.testclient import TestClient  # noqa: E402

from app.service.core.config import Settings  # noqa: E402
from app.service.main import create_app  # noqa: E402
from app.formats.report import PLOT_IDS, ROUTING_PLOT_ID, ReportError, render_report  # noqa: E402
from app.service.services.studies import optuna_storage  # noqa: E402
from app.service.worker import Worker  # noqa: E402
from service_util import ROOT, require_chromium, run_cli  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts"))
import report_screenshot as shot  # noqa: E402

sys.path.pop(0)

SMALL = dict(model="tiny-moe", cluster="nvidia-h100-80gb", devices=16, gbs=64, trials=60, seed=3)
SMALL_JOB = {"model": "tiny-moe", "cluster": "nvidia-h100-80gb", "devices": 16, "global_batch_size": 64,
             "search": {"sampler": "tpe", "n_trials": 60, "seed": 3}}
EXTERNAL = re.compile(r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)\s*=\s*[\"']?\s*(?:https?:)?//", re.I)


@pytest.fixture(scope="module")
def results():
    return {s: shot.search_result(SMALL["model"], SMALL["cluster"], SMALL["devices"], SMALL["gbs"], s,
                                  SMALL["trials"], SMALL["seed"]) for s in ("tpe", "nsga2", "exhaustive")}


@pytest.fixture(scope="module")
def pages(results, tmp_path_factory):
    d = tmp_path_factory.mktemp("reports")
    out = {}
    for sampler, result in results.items():
        out[sampler] = d / f"{sampler}.html"
        out[sampler].write_text(render_report(result), encoding="utf-8")
    return out


@pytest.fixture(scope="module")
def chromium():
    return require_chromium(shot.chromium)


def _figures(page: str) -> dict:
    m = re.search(r'<script id="paraplan-figures" type="application/json">(.*?)</script>', page, re.S)
    return json.loads(m.group(1))


def _title(fig: dict) -> str:
    """A figure's title as one line (long titles wrap between words with <br>)."""
    return fig["layout"]["title"]["text"].replace("<br>", " ")


def test_search_results_carry_what_the_report_plots(results):
    for sampler, r in results.items():
        assert r["top"], sampler
        for e in r["top"]:
            mem = e["evaluation"]["memory"]
            assert mem["per_stage_peak_gib"] and mem["capacity_gib"] > 0, sampler
            assert set(e["evaluation"]["time"]) >= {"compute_s", "tp_comm_s", "pp_bubble_s"}
    assert len(results["tpe"]["history"]) == SMALL["trials"]
    assert results["nsga2"]["pareto"]
    assert "history" not in results["exhaustive"]


def test_report_is_self_contained_with_four_plots(pages):
    for sampler, path in pages.items():
        page = path.read_text()
        assert not EXTERNAL.search(page), sampler
        assert "cdn" not in "".join(re.findall(r"<script\b[^>]*>", page)).lower()
        for pid in PLOT_IDS:
            assert f'<div id="{pid}" class="plot">' in page, (sampler, pid)
        assert 3_000_000 < len(page) < 8_000_000  # plotly.min.js inlined, and not much else
        figs = _figures(page)
        assert set(figs) == set(PLOT_IDS)
        parts = {t["name"] for t in figs["plot-time"]["data"]}
        assert "compute_s" in parts and all(p.endswith("_s") for p in parts)
        mem = figs["plot-memory"]["data"]
        assert any(t["name"].startswith("capacity") for t in mem) and any(t["name"] == "#1" for t in mem)
        assert "tiny-moe" in page and "nvidia-h100-80gb" in page and "Top 10 configs" in page
    tpe, nsga, exh = (_figures(pages[s].read_text()) for s in ("tpe", "nsga2", "exhaustive"))
    assert _title(tpe["plot-history"]).startswith(f"Optimisation history: {SMALL['trials']} trials")
    assert "NSGA-II" in _title(nsga["plot-pareto"])
    assert "top configs" in _title(tpe["plot-pareto"])
    assert "No trial history (exhaustive" in _title(exh["plot-history"])
    best = [t for t in tpe["plot-history"]["data"] if t["name"] == "best so far"][0]["y"]
    assert best == sorted(best)  # best so far never falls


def test_pareto_front_of_the_top_configs():
    from app.formats.report import pareto_front

    pts = [(100.0, 50.0, 0), (90.0, 40.0, 1), (95.0, 60.0, 2), (80.0, 40.0, 3), (120.0, 70.0, 4)]
    assert pareto_front(pts) == [1, 0, 4]


def test_plotly_renders_four_plots_in_headless_chromium_with_no_network(chromium, pages, tmp_path):
    for sampler in ("tpe", "nsga2"):
        dom = shot.rendered_dom(pages[sampler])
        assert dom.count('class="main-svg"') >= 4, sampler
        for pid, nxt in zip(PLOT_IDS, PLOT_IDS[1:] + ("</body>",)):
            chunk = dom[dom.index(f'id="{pid}"'):]
            chunk = chunk[:chunk.index(nxt)] if nxt in chunk else chunk
            assert 'class="main-svg"' in chunk, (sampler, pid)  # this plot was drawn
        assert "Optimisation history" in dom and "Step time by part" in dom
    png = shot.screenshot(pages["nsga2"], tmp_path / "report.png")
    width, height, rows = shot.read_png(png)
    assert (width, height) == shot.WINDOW
    assert len(set(rows)) > 200  # not blank


def test_report_command_writes_the_html_and_names_bad_fields(results, tmp_path):
    src = tmp_path / "result.json"
    src.write_text(json.dumps(results["tpe"]))
    out = tmp_path / "r.html"
    proc = run_cli("report", str(src), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert all(f'id="{pid}"' in out.read_text() for pid in PLOT_IDS)

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"top": [{"rank": 1, "config": {}, "evaluation": {"time": {}}}]}))
    proc = run_cli("report", str(bad), "-o", str(tmp_path / "x.html"))
    assert proc.returncode == 2 and "top[0].evaluation.feasible" in proc.stderr
    bad.write_text("{}")
    proc = run_cli("report", str(bad), "-o", str(tmp_path / "x.html"))
    assert proc.returncode == 2 and "top:" in proc.stderr
    bad.write_text("not json")
    proc = run_cli("report", str(bad), "-o", str(tmp_path / "x.html"))
    assert proc.returncode == 2 and "RESULT.json" in proc.stderr
    proc = run_cli("report", "-o", str(tmp_path / "x.html"))
    assert proc.returncode == 2
    with pytest.raises(ReportError) as exc:
        render_report({"top": "x"})
    assert exc.value.field == "top"


def test_service_report_404_409_and_history_from_the_study(tmp_path):
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'report.db'}", embedded_worker=False)
    with TestClient(create_app(settings)) as client:
        assert client.get("/v1/jobs/0b5c8c52-3c2e-4a53-9f43-3f3f7f2a8f10/report").status_code == 404
        assert client.get("/v1/jobs/not-a-uuid/report").status_code == 404
        job = client.post("/v1/jobs", json=SMALL_JOB).json()
        exh = client.post("/v1/jobs", json={**SMALL_JOB, "devices": 8, "search": {"sampler": "exhaustive"}}).json()
        r = client.get(f"/v1/jobs/{job['id']}/report")
        assert r.status_code == 409 and r.json()["detail"][0]["loc"] == ["path", "job_id"]
        assert Worker(settings).run_until_idle() == 2

        r = client.get(f"/v1/jobs/{job['id']}/report")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        page = r.text
        assert not EXTERNAL.search(page) and all(f'id="{pid}"' in page for pid in PLOT_IDS)
        figs = _figures(page)
        title = _title(figs["plot-history"])
        assert title.startswith(f"Optimisation history: {SMALL_JOB['search']['n_trials']} trials"), title
        assert job["id"] in page
        ranks = client.get(f"/v1/jobs/{job['id']}/configs").json()["items"]
        assert figs["plot-time"]["data"][0]["x"] == [f"#{c['rank']}" for c in ranks[:10]]

        page = client.get(f"/v1/jobs/{exh['id']}/report").text
        assert "No trial history (exhaustive" in _title(_figures(page)["plot-history"])
        assert "/v1/jobs/{job_id}/report" in client.get("/openapi.json").json()["paths"]

        # the service guide's Optuna dashboard section: the study is `paraplan-job-<job id>` in DATABASE_URL
        import optuna

        guide = (ROOT / "docs" / "guides" / "service.md").read_text()
        assert "`paraplan-job-<job id>`" in guide and "optuna-dashboard $DATABASE_URL" in guide
        names = optuna.get_all_study_names(optuna_storage(settings.database_url))
        assert f"paraplan-job-{job['id']}" in names

        # a study that is gone: the report still renders and says why there is no history
        optuna.delete_study(study_name=f"paraplan-job-{job['id']}", storage=optuna_storage(settings.database_url))
        title = _title(_figures(client.get(f"/v1/jobs/{job['id']}/report").text)["plot-history"])
        assert "study is not in the database" in title


def test_report_command_from_a_server(tmp_path):
    from service_util import Server, wait_for

    srv = Server(tmp_path / "srv.db", tmp_path / "serve.log").start()
    try:
        with srv.client() as c:
            job = c.post("/v1/jobs", json={**SMALL_JOB, "devices": 8, "search": {"sampler": "exhaustive"}}).json()
            wait_for(c, job["id"], timeout=60)
        out = tmp_path / "job.html"
        proc = run_cli("report", "--server", srv.url, "--job", job["id"], "-o", str(out))
        assert proc.returncode == 0, proc.stderr
        assert all(f'id="{pid}"' in out.read_text() for pid in PLOT_IDS)
        proc = run_cli("report", "--server", srv.url, "--job", "0b5c8c52-3c2e-4a53-9f43-3f3f7f2a8f10", "-o",
                       str(tmp_path / "x.html"))
        assert proc.returncode == 2 and "job" in proc.stderr and "404" in proc.stderr
    finally:
        srv.stop()



# ---- what the report looks like in Chromium: the best config visible, integer stage ticks,
# titles inside their panels and clear of the mode bar --------------------------------------------------
# Injected into a copy of the page: once Plotly has drawn, it writes each plot's panel, title and mode-bar
# boxes, its x tick labels and, per trace, the drawing order and which probes of each marker hit the trace
# itself (document.elementFromPoint: the topmost element there; the drag and hover layers, which cover
# everything to catch the mouse, are taken out of hit testing).
GEOMETRY_JS = """
(function () {
  function box(el) { if (!el) return null; var r = el.getBoundingClientRect();
    return {left: r.left, right: r.right, top: r.top, bottom: r.bottom, width: r.width, height: r.height}; }
  function measure() {
    var css = document.createElement("style");
    css.textContent = ".draglayer, .draglayer *, .hoverlayer, .hoverlayer *, .modebar-container, .modebar-container * "
      + "{pointer-events: none !important} .scatterlayer .trace, .scatterlayer .trace * "
      + "{pointer-events: visiblePainted !important}";
    document.head.appendChild(css);
    var out = {};
    PLOT_IDS.forEach(function (id) {
      var div = document.getElementById(id);
      var g = {panel: box(div), title: box(div.querySelector(".gtitle")), modebar: box(div.querySelector(".modebar")),
               plotarea: box(div.querySelector(".nsewdrag")),
               xticks: Array.prototype.map.call(div.querySelectorAll(".xtick text"), function (t) { return t.textContent; }),
               traces: []};
      (div._fullData || []).forEach(function (tr) {
        var el = div.querySelector(".scatterlayer .trace" + tr.uid);
        if (!el) return;
        var pts = Array.prototype.map.call(el.querySelectorAll("path.point"), function (p) {
          var b = box(p), cx = (b.left + b.right) / 2, cy = (b.top + b.bottom) / 2, r = 0.9 * b.width / 2;
          var probes = [[cx, cy], [cx + r, cy], [cx - r, cy], [cx, cy + r], [cx, cy - r]].map(function (q) {
            var hit = document.elementFromPoint(q[0], q[1]);
            return !!(hit && hit.closest && hit.closest(".trace") === el);
          });
          return {box: b, center: probes[0], ring: probes.slice(1)};
        });
        g.traces.push({name: tr.name, order: Array.prototype.indexOf.call(el.parentNode.children, el), points: pts});
      });
      out[id] = g;
    });
    var pre = document.createElement("pre");
    pre.id = "geometry";
    pre.textContent = JSON.stringify(out);
    document.body.appendChild(pre);
  }
  window.addEventListener("load", function () { setTimeout(measure, 1500); });
})();
"""


def _geometry(page_html: str, path, ids=PLOT_IDS) -> dict:
    import html as html_mod

    js = GEOMETRY_JS.replace("PLOT_IDS", json.dumps(list(ids)))
    path.write_text(page_html.replace("</body>", f"<script>{js}</script></body>"), encoding="utf-8")
    dom = shot.rendered_dom(path)
    m = re.search(r'<pre id="geometry">(.*?)</pre>', dom, re.S)
    assert m, dom[-2000:]
    return json.loads(html_mod.unescape(m.group(1)))


def _inside(inner: dict, outer: dict) -> bool:
    return (inner["left"] >= outer["left"] and inner["right"] <= outer["right"] and inner["top"] >= outer["top"]
            and inner["bottom"] <= outer["bottom"])


def _overlap(a: dict, b: dict) -> bool:
    return a["left"] < b["right"] and b["left"] < a["right"] and a["top"] < b["bottom"] and b["top"] < a["bottom"]


@pytest.fixture(scope="module")
def pp1_result():
    """A search whose best two configs are pp 1 (one point each, at stage 0) among pp 2 configs (global batch
    64: at 32 the calibrated A100 ranks two pp 2 configs first)."""
    r = shot.search_result("tiny-dense", "nvidia-a100-80gb", 8, 64, "exhaustive", 60, 3)
    pps = [e["config"]["pp"] for e in r["top"]]
    assert pps[:2] == [1, 1] and max(pps) > 1, pps
    return r


def test_report_in_chromium_shows_the_best_config_and_fits_its_titles(chromium, pp1_result, results, tmp_path):
    no_history = {**results["tpe"], "history": None,
                  "history_note": "the job's Optuna study is not in the database"}  # the longest title
    pages = {"pp1": pp1_result, "nsga2": results["nsga2"], "tpe-no-history": no_history}
    for name, result in pages.items():
        geo = _geometry(render_report(result), tmp_path / f"{name}.html")
        for pid in PLOT_IDS:
            g = geo[pid]
            assert g["title"] and g["title"]["width"] > 0, (name, pid)
            assert _inside(g["title"], g["panel"]), (name, pid, g["title"], g["panel"])
            assert g["modebar"] and not _overlap(g["title"], g["modebar"]), (name, pid, g["title"], g["modebar"])
        mem = geo["plot-memory"]
        # one integer tick per stage of the longest pipeline: 0 … pp-1, each once
        stages = max(len(e["evaluation"]["memory"]["per_stage_peak_gib"]) for e in result["top"][:10])
        assert mem["xticks"] == [str(i) for i in range(stages)], (name, mem["xticks"])
        traces = {t["name"]: t for t in mem["traces"]}
        best = traces["#1"]
        assert best["order"] == max(t["order"] for t in mem["traces"]), name  # drawn last: on top
        for p in best["points"]:
            assert p["box"]["width"] >= 12 and _inside(p["box"], mem["plotarea"]), (name, p)
            assert all(p["ring"]), (name, p)  # nothing drawn over the best config's marker
        if name == "pp1":  # the second best, at the same stage and about the same peak, shows inside the ring
            assert len(best["points"]) == 1 and all(pt["center"] for pt in traces["#2"]["points"]), traces["#2"]


def test_memory_plot_ticks_one_integer_per_stage():
    from app.formats.report import memory_figure

    top = [{"rank": 1, "config": {"pp": 16}, "evaluation": {"memory": {"per_stage_peak_gib": [10.0] * 16,
                                                                        "capacity_gib": 64.0}}},
           {"rank": 2, "config": {"pp": 1}, "evaluation": {"memory": {"per_stage_peak_gib": [20.0],
                                                                       "capacity_gib": 64.0}}}]
    x = memory_figure(top, 4.0)["layout"]["xaxis"]
    assert x["tickvals"] == list(range(16)) and x["ticktext"] == [str(i) for i in range(16)]
    assert x["range"] == [-0.5, 15.5]
    x = memory_figure(top[1:], 4.0)["layout"]["xaxis"]
    assert x["tickvals"] == [0] and x["range"] == [-0.5, 0.5]  # one stage: one tick, the point mid-plot


# ---- routing and offload ---------------------------------------------------------------------------------
# A real search whose best config offloads (pinned) and states the router's loads (hand-worked in
# tests/test_routing.py: 4,3,2,1,1,1,1,1 on ep 2 gives ranks 10 and 4 of a mean 7 placed contiguously,
# 7 and 7 balanced).
ROUTED = ("search", "--model", "tiny-moe", "--cluster", "nvidia-h100-80gb", "--devices", "8", "--global-batch-size",
          "64", "--fix", "ep=2", "--fix", "moe_expert_load=[4,3,2,1,1,1,1,1]", "--fix", 'offload_modules=["core_attn"]',
          "--json")


@pytest.fixture(scope="module")
def routed_result():
    proc = run_cli(*ROUTED)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_report_shows_tokens_per_ep_rank_before_and_after_placement(routed_result, results):
    figs = _figures(render_report(routed_result))
    assert set(figs) == {*PLOT_IDS, ROUTING_PLOT_ID}
    bars = {t["name"]: t["y"] for t in figs[ROUTING_PLOT_ID]["data"] if t["type"] == "bar"}
    assert bars == {"contiguous (max/mean 1.43)": pytest.approx([10 / 7, 4 / 7]),
                    "balanced (max/mean 1.00)": pytest.approx([1.0, 1.0])}
    assert "contiguous used" in _title(figs[ROUTING_PLOT_ID])
    assert set(_figures(render_report(results["tpe"]))) == set(PLOT_IDS)  # no routing stated: four plots


def test_report_shows_memory_per_stage_with_and_without_offload(routed_result, results):
    best = routed_result["top"][0]
    assert best["config"]["offload_modules"] == ["core_attn"]
    mem = best["evaluation"]["memory"]
    page = render_report(routed_result)
    traces = {t["name"]: t for t in _figures(page)["plot-memory"]["data"]}
    assert traces["#1"]["y"] == mem["per_stage_peak_gib"]
    assert traces["#1 without offload"]["y"] == mem["per_stage_peak_without_offload_gib"]
    assert all(b > a for a, b in zip(traces["#1"]["y"], traces["#1 without offload"]["y"]))
    names = [t["name"] for t in _figures(page)["plot-memory"]["data"]]
    assert names.index("#1 without offload") == len(names) - 2  # drawn just under the best
    note = re.search(r'<span class="offload-note" id="offload-note">(.*?)</span>', page).group(1)
    assert note.startswith("Offloads core_attn to host memory: peak "
                           f"{max(mem['per_stage_peak_gib']):.2f} GiB against "
                           f"{max(mem['per_stage_peak_without_offload_gib']):.2f} GiB without offload")
    assert f"{best['evaluation']['time']['offload_s']:.3f} s per step" in note
    plain = render_report(results["tpe"])  # nothing offloaded: no dashed trace, no note
    assert "without offload" not in json.dumps(_figures(plain)) and "offload-note" not in plain


def test_time_plot_stacks_every_part_of_the_breakdown():
    from costmodel.evaluate import TIME_KEYS

    from app.formats.report import TIME_PARTS

    assert TIME_PARTS == TIME_KEYS  # offload_s and straggler_s included: the bars add up to the step


def test_routing_and_offload_plots_fit_their_titles_in_chromium(chromium, routed_result, tmp_path):
    ids = (*PLOT_IDS, ROUTING_PLOT_ID)
    geo = _geometry(render_report(routed_result), tmp_path / "routed.html", ids)
    for pid in ids:
        g = geo[pid]
        assert g["title"] and g["title"]["width"] > 0 and _inside(g["title"], g["panel"]), (pid, g)
        assert g["modebar"] and not _overlap(g["title"], g["modebar"]), pid
    mem = {t["name"]: t for t in geo["plot-memory"]["traces"]}
    assert mem["#1"]["order"] > mem["#1 without offload"]["order"]  # the best on top
    assert all(all(p["ring"]) for p in mem["#1"]["points"])  # and nothing drawn over its marker

"""The RL report (``app/formats/rl_report.py``) from ``paraplan report RL.json``, drawn by Plotly in headless
Chromium with no network: one horizontal bar per mode whose drawn segments are the plan's phases, laid end to
end from 0 to the step time, and the per-phase peak memory of each mode; a bad result exits 2 naming the field."""

from __future__ import annotations

import html as html_mod
import json
import re
import subprocess
import sys

import pytest

import hardware_profiles
import model_presets
from app.formats.rl import rl_result, workload
from app.formats.rl_report import MEMORY_PHASES, MODES, phases
from search.rl import RLRequest
from service_util import ROOT, require_chromium

sys.path.insert(0, str(ROOT / "scripts"))
import report_screenshot as shot  # noqa: E402

sys.path.pop(0)

# PPO (a critic: every phase there is) with stale sync (the disaggregated plan hides its shorter pool: zeros)
WORKLOAD = dict(algorithm="ppo", prompts_per_step=16, responses_per_prompt=4, prompt_length=256, response_length=256,
                stale_sync=True)

# After Plotly has drawn: each bar segment of the timeline plot as data coordinates (its pixel box mapped through
# the x axis' range and the plot area), with the trace's name and point index (= the mode), and the drawn data.
GEOMETRY_JS = """
(function () {
  function measure() {
    var out = {};
    ["plot-rl-time", "plot-rl-memory"].forEach(function (id) {
      var div = document.getElementById(id), area = div.querySelector(".nsewdrag").getBoundingClientRect();
      var range = div._fullLayout.xaxis.range, scale = (range[1] - range[0]) / area.width;
      var segments = [];
      div.querySelectorAll(".barlayer .trace").forEach(function (el, t) {
        el.querySelectorAll(".point path").forEach(function (p, i) {
          var b = p.getBoundingClientRect();
          segments.push({trace: t, point: i, width_px: b.width, left: range[0] + (b.left - area.left) * scale,
                         right: range[0] + (b.right - area.left) * scale});
        });
      });
      out[id] = {segments: segments, px: scale, svg: div.querySelectorAll(".main-svg").length,
                 data: div.data.map(function (tr) { return {name: tr.name, x: tr.x, y: tr.y}; })};
    });
    var pre = document.createElement("pre");
    pre.id = "rl-geometry";
    pre.textContent = JSON.stringify(out);
    document.body.appendChild(pre);
  }
  window.addEventListener("load", function () { setTimeout(measure, 1500); });
})();
"""


@pytest.fixture(scope="module")
def result() -> dict:
    req = RLRequest(spec=model_presets.load("tiny-moe"), profile=hardware_profiles.load("nvidia-h100-80gb"),
                    devices=16, workload=workload(**WORKLOAD))
    out = json.loads(json.dumps(rl_result(req, "tiny-moe")))
    assert out["colocated"] and out["disaggregated"], out
    return out


def _report(src, out) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", "report", str(src), "-o", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_rl_report_draws_each_modes_phases_end_to_end_in_chromium(result, tmp_path):
    require_chromium(shot.chromium)
    src, page = tmp_path / "rl.json", tmp_path / "rl.html"
    src.write_text(json.dumps(result))
    proc = _report(src, page)
    assert proc.returncode == 0, proc.stderr
    page.write_text(page.read_text().replace("</body>", f"<script>{GEOMETRY_JS}</script></body>"))
    dom = shot.rendered_dom(page)
    geo = json.loads(html_mod.unescape(re.search(r'<pre id="rl-geometry">(.*?)</pre>', dom, re.S).group(1)))
    time = geo["plot-rl-time"]
    plans = {m: result[m] for m in MODES}
    keys = phases(plans)
    assert [t["name"] for t in time["data"]] == [k.removesuffix("_s") for k in keys]
    assert time["data"][0]["y"] == list(MODES.values())
    for i, plan in enumerate(plans.values()):
        drawn = [t["x"][i] for t in time["data"]]
        assert sum(drawn) == pytest.approx(plan["step_time_s"], rel=1e-12)  # the segments add up to the step
        assert sum(plan["time"].values()) == pytest.approx(plan["step_time_s"], rel=1e-9)
        bar = sorted((s for s in time["segments"] if s["point"] == i and s["width_px"] > 0), key=lambda s: s["left"])
        assert len(bar) == sum(plan["time"].get(k, 0) > 0 for k in keys)  # every phase of the plan, zeros not drawn
        tol = 1.5 * time["px"]  # a pixel and a half, in seconds
        assert bar[0]["left"] == pytest.approx(0.0, abs=tol)
        for a, b in zip(bar, bar[1:]):
            assert b["left"] == pytest.approx(a["right"], abs=tol)  # end to end: a timeline
        assert bar[-1]["right"] == pytest.approx(plan["step_time_s"], abs=tol)
    memory = geo["plot-rl-memory"]
    assert [t["name"] for t in memory["data"]][:2] == list(MODES.values())
    for trace, plan in zip(memory["data"], plans.values()):
        assert trace["y"] == [plan["memory"][k] for k in MEMORY_PHASES]
    assert memory["data"][2]["name"].startswith("capacity") and memory["svg"] >= 1
    assert 'id="rl-table"' in dom and 'id="best-mode"' in dom


def test_a_bad_rl_result_exits_2_naming_the_field(result, tmp_path):
    bad = json.loads(json.dumps(result))
    bad["colocated"]["time"]["decode_s"] = -1
    src = tmp_path / "bad.json"
    src.write_text(json.dumps(bad))
    proc = _report(src, tmp_path / "bad.html")
    assert proc.returncode == 2 and proc.stderr.startswith("error: colocated.time.decode_s"), proc.stderr

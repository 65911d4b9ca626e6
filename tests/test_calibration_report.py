"""The calibration report (``paraplan calibrate --report``, app/formats/calibration_report.py): a
self-contained page whose predicted-vs-measured scatter Plotly really draws in headless Chromium, one
point per run before and one after the fit, beside the y = x line; the factors and the published figures
in the page; a bad refit report names its field."""

from __future__ import annotations

import json
import re
import sys

import pytest

import calibration_util
from app.formats.calibration_report import PLOT_ID, TRACE_AFTER, TRACE_BEFORE, render_calibration_report
from app.formats.report import ReportError
from service_util import ROOT, require_chromium, run_cli

sys.path.insert(0, str(ROOT / "scripts"))
import report_screenshot as shot  # noqa: E402

sys.path.pop(0)

RUNS_USED = 4  # of calibration_util.RUNS: a quick fit (the recovery is test_calibrate_cli's)
EXTERNAL = re.compile(r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)\s*=\s*[\"']?\s*(?:https?:)?//", re.I)


def scatter_of(page: str) -> dict:
    """The scatter figure as the page hands it to Plotly."""
    m = re.search(r'<script id="paraplan-figures" type="application/json">(.*?)</script>', page, re.S)
    return json.loads(m.group(1))[PLOT_ID]


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    d = tmp_path_factory.mktemp("calreport")
    (d / "runs.json").write_text(json.dumps(calibration_util.measured_runs()[:RUNS_USED]))
    proc = run_cli("calibrate", str(d / "runs.json"), "--cluster", "ascend-910b", "-o", str(d / "ours.yaml"),
                   "--max-evals", "60", "--report", str(d / "cal.html"), "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), d / "cal.html"


def test_the_page_is_self_contained_with_the_scatter_factors_and_published_figures(calibrated):
    report, page_file = calibrated
    page = page_file.read_text()
    assert not EXTERNAL.search(page)
    before, after, diagonal = scatter_of(page)["data"]
    assert (before["name"], after["name"]) == (TRACE_BEFORE, TRACE_AFTER)
    measured = [e["reported"] for e in report["run_errors"]]
    assert before["x"] == after["x"] == pytest.approx(measured) and len(measured) == RUNS_USED
    assert before["y"] == pytest.approx([m * (1 + e["before"]) for m, e in zip(measured, report["run_errors"])])
    assert after["y"] == pytest.approx([m * (1 + e["after"]) for m, e in zip(measured, report["run_errors"])])
    assert diagonal["x"] == diagonal["y"] and diagonal["mode"] == "lines"
    assert diagonal["x"][0] <= min(measured + before["y"] + after["y"])
    assert diagonal["x"][1] >= max(measured + before["y"] + after["y"])
    table = page[page.index('id="factors"'):]
    for key, change in report["factors"].items():
        assert f"<td>{key}</td><td>{change['before']:.4g}</td><td>{change['after']:.4g}</td>" in table, key
    if report["published"]:
        assert f"({report['published']['runs']}): MAPE {report['published']['mape_before']:.3f} before" in page


def test_plotly_draws_one_point_per_run_before_and_after_in_headless_chromium(calibrated):
    require_chromium(shot.chromium)
    _, page_file = calibrated
    dom = shot.rendered_dom(page_file)
    plot = dom[dom.index(f'id="{PLOT_ID}"'):]
    assert 'class="main-svg"' in plot  # Plotly drew it, offline
    traces = plot.split('class="trace scatter')[1:]
    points = [t.split("</g></g>")[0].count('class="point"') for t in traces]
    assert sorted(points) == [0, RUNS_USED, RUNS_USED], points  # y = x draws a line, no points
    assert TRACE_BEFORE in plot and TRACE_AFTER in plot


def test_a_bad_report_names_its_field():
    with pytest.raises(ReportError, match="run_errors"):
        render_calibration_report({"cluster": "c", "name": "n", "factors": {}, "mape_before": 0, "mape_after": 0})
    with pytest.raises(ReportError, match=r"run_errors\[0\].reported"):
        render_calibration_report({"cluster": "c", "name": "n", "factors": {}, "mape_before": 0, "mape_after": 0,
                                   "run_errors": [{"name": "x", "before": 0, "after": 0}]})


def test_an_unwritable_report_file_exits_2_naming_it(tmp_path):
    (tmp_path / "runs.json").write_text(json.dumps(calibration_util.measured_runs()[:1]))
    proc = run_cli("calibrate", str(tmp_path / "runs.json"), "--cluster", "ascend-910b", "-o",
                   str(tmp_path / "ours.yaml"), "--max-evals", "10", "--report", str(tmp_path / "no" / "cal.html"))
    assert proc.returncode == 2 and proc.stderr.startswith("error: --report:"), proc.stderr
    assert "Traceback" not in proc.stderr

"""The calibration report: one self-contained HTML page from a refit (``paraplan calibrate --report``,
``GET /v1/clusters/{name}/versions/{n}/report``).

The input is ``app.formats.calibration.refit``'s report (what ``paraplan calibrate --json`` prints):
each run's measured tokens/s per device and its relative error before and after the fit, the factors
before and after, the published set's MAPE before and after. The page shows the predicted-vs-measured
scatter (``plot-calibration``: one trace of the runs under the starting profile, one under the fitted
profile, and the y = x line), the factors table and the published-set figures, with Plotly inlined as
in the job report (``app/formats/report.py``: no network needed).
"""

from __future__ import annotations

import html

from .report import COLOURS, ReportError, _fmt, _layout, html_page

PLOT_ID = "plot-calibration"
TRACE_BEFORE = "before the fit"
TRACE_AFTER = "after the fit"


def check_fit(report: dict) -> None:
    """ReportError naming the first field a refit report lacks."""
    if not isinstance(report, dict):
        raise ReportError("report", "must be an object (paraplan calibrate --json's output)")
    for key in ("cluster", "name", "run_errors", "factors", "mape_before", "mape_after"):
        if key not in report:
            raise ReportError(key, "field required")
    for i, r in enumerate(report["run_errors"]):
        for key in ("name", "reported", "before", "after"):
            if not isinstance(r, dict) or key not in r:
                raise ReportError(f"run_errors[{i}].{key}", "field required")


def scatter_figure(report: dict) -> dict:
    """Predicted against measured tokens/s per device, before and after the fit, with y = x."""
    runs = report["run_errors"]
    measured = [float(r["reported"]) for r in runs]
    names = [str(r["name"]) for r in runs]

    def trace(key: str, label: str, colour: str) -> dict:
        return {"type": "scatter", "mode": "markers", "name": label, "x": measured,
                "y": [m * (1.0 + float(r[key])) for m, r in zip(measured, runs)], "text": names,
                "marker": {"color": colour, "size": 9, "symbol": "circle" if key == "before" else "diamond"},
                "hovertemplate": "%{text}<br>measured %{x:,.1f}<br>predicted %{y:,.1f}<extra>" + label + "</extra>"}

    points = [v for t in (trace("before", "", ""), trace("after", "", "")) for v in t["y"]] + measured
    lo, hi = min(points) * 0.95, max(points) * 1.05
    diagonal = {"type": "scatter", "mode": "lines", "name": "y = x (exact)", "x": [lo, hi], "y": [lo, hi],
                "line": {"color": "#888", "dash": "dash"}, "hoverinfo": "skip"}
    title = (f"Predicted vs measured tokens/s per device on {len(runs)} runs: MAPE "
             f"{_fmt(report['mape_before'], '.3f')} before, {_fmt(report['mape_after'], '.3f')} after")
    return {"data": [trace("before", TRACE_BEFORE, COLOURS[1]), trace("after", TRACE_AFTER, COLOURS[0]), diagonal],
            "layout": _layout(title, "measured tokens/s per device", "predicted tokens/s per device",
                              # one scale on both axes (y = x at 45 degrees): the panel shrinks to a square
                              # ("constrain": "domain"), where Plotly would otherwise widen the x range past the
                              # data (on a wide panel, 0-5K of runs drawn from -8K to 14K)
                              xaxis={"title": {"text": "measured tokens/s per device"}, "range": [lo, hi],
                                     "constrain": "domain"},
                              yaxis={"title": {"text": "predicted tokens/s per device"}, "range": [lo, hi],
                                     "scaleanchor": "x", "constrain": "domain"})}


def _factors_table(report: dict) -> str:
    rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{_fmt(v.get('before'), '.4g')}</td>"
                   f"<td>{_fmt(v.get('after'), '.4g')}</td><td>{_change(v)}</td></tr>"
                   for k, v in report["factors"].items())
    return ('<table class="factors" id="factors"><tr><th>factor</th><th>before</th><th>after</th><th>change</th>'
            f"</tr>{rows}</table>")


def _change(v: dict) -> str:
    before, after = v.get("before"), v.get("after")
    if not before or after is None:
        return "—"
    return f"{after / before - 1:+.1%}"


def _published(report: dict) -> str:
    pub = report.get("published")
    if not pub:
        return '<p id="published">No published runs of this cluster to check the refit against.</p>'
    worse = report.get("published_worse")
    verdict = ('<b class="short-note">The refit makes the published set worse</b>: the measured cluster differs '
               "from the published ones, or the runs pull factors they do not constrain." if worse else
               "The published set stays within 0.05 of its MAPE.")
    return (f'<p id="published">Published {html.escape(str(report["cluster"]))} runs ({pub["runs"]}): MAPE '
            f'{_fmt(pub["mape_before"], ".3f")} before, {_fmt(pub["mape_after"], ".3f")} after. {verdict}</p>')


def render_calibration_report(report: dict) -> str:
    """The HTML page (a str) for a refit report; :class:`ReportError` names what a bad report lacks."""
    check_fit(report)
    title = f"ParaPlan calibration: {report['name']} fitted from {report['cluster']}"
    body = f"""<p>{len(report['run_errors'])} measured runs: MAPE <b>{_fmt(report['mape_before'], '.3f')}</b> with the
starting profile, <b>{_fmt(report['mape_after'], '.3f')}</b> with the fitted one.</p>
{_published(report)}
<div id="{PLOT_ID}" class="plot"></div>
<h2>Factors</h2>
{_factors_table(report)}
<p class="note">Fitted by the project's calibration (hardware_profiles/calibrate.py), pulled towards the starting
profile's factors; plots by Plotly (inlined, no network needed).</p>
"""
    return html_page(title, body, {PLOT_ID: scatter_figure(report)})

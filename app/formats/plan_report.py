"""The HTML page of a capacity plan (``paraplan report PLAN.json``, ``GET /v1/jobs/{id}/report`` of a
``plan`` job): days and device-hours against devices (two y axes), the Pareto points ringed, the chosen
count marked, and the table. Plotly inlined as in the search report (``app.formats.report``)."""

from __future__ import annotations

import html
import json

from .plan import tokens_text
from .report import CSS, ReportError, _layout, plotly_js

PLOT_ID = "plot-plan"
DAYS_COLOUR, HOURS_COLOUR = "#4c78a8", "#f58518"  # the search report's first two colours


def check_plan(plan) -> None:
    """Raise :class:`ReportError` naming the first field a plan report needs and ``plan`` lacks."""
    if not isinstance(plan, dict) or not isinstance(plan.get("points"), list):
        raise ReportError("points", "missing or not a list of device counts (what `paraplan plan --json` prints)")
    for i, p in enumerate(plan["points"]):
        for key in ("devices", "feasible"):
            if not isinstance(p, dict) or key not in p:
                raise ReportError(f"points[{i}].{key}", "missing")
        if p["feasible"] and not all(isinstance(p.get(k), (int, float)) for k in ("days", "device_hours")):
            raise ReportError(f"points[{i}].days", "a feasible point needs days and device_hours")


def plan_figure(plan: dict) -> dict:
    """Traces: days (left axis), device-hours (right axis), the Pareto points ringed on the days line,
    and the chosen count as a star on both."""
    ok = [p for p in plan["points"] if p["feasible"]]
    xs = [p["devices"] for p in ok]
    front = [p for p in ok if p.get("pareto")]
    data = [
        {"type": "scatter", "mode": "lines+markers", "name": "days", "x": xs, "y": [p["days"] for p in ok],
         "line": {"color": DAYS_COLOUR}, "yaxis": "y"},
        {"type": "scatter", "mode": "lines+markers", "name": "device-hours", "x": xs,
         "y": [p["device_hours"] for p in ok], "line": {"color": HOURS_COLOUR, "dash": "dot"}, "yaxis": "y2"},
        {"type": "scatter", "mode": "markers", "name": "Pareto (days vs device-hours)", "x": [p["devices"] for p in front],
         "y": [p["days"] for p in front], "yaxis": "y",
         "marker": {"size": 13, "symbol": "circle-open", "color": "#222", "line": {"width": 2}}},
    ]
    chosen = next((p for p in ok if p["devices"] == plan.get("chosen")), None)
    if chosen is not None:
        for axis, key in (("y", "days"), ("y2", "device_hours")):
            data.append({"type": "scatter", "mode": "markers+text", "name": f"chosen: {chosen['devices']:,} devices",
                         "x": [chosen["devices"]], "y": [chosen[key]], "yaxis": axis, "text": ["chosen"],
                         "textposition": "top center", "showlegend": axis == "y",
                         "marker": {"size": 18, "symbol": "star", "color": "#e45756"}})
    eff = [p for p in ok if p.get("effective_days") is not None]
    if eff:  # with failures, checkpoints and restarts priced (docs/guides/goodput.md)
        data.append({"type": "scatter", "mode": "lines+markers", "name": "effective days (failures priced)",
                     "x": [p["devices"] for p in eff], "y": [p["effective_days"] for p in eff],
                     "line": {"color": DAYS_COLOUR, "dash": "dash"}, "marker": {"symbol": "diamond"}, "yaxis": "y"})
        data.append({"type": "scatter", "mode": "lines+markers", "name": "effective device-hours",
                     "x": [p["devices"] for p in eff], "y": [p["effective_device_hours"] for p in eff],
                     "line": {"color": HOURS_COLOUR, "dash": "dash"}, "marker": {"symbol": "diamond"}, "yaxis": "y2"})
    layout = _layout("Days to train and device-hours against devices", "devices", "days",
                     yaxis2={"title": {"text": "device-hours"}, "overlaying": "y", "side": "right"})
    layout["margin"]["r"] = 80  # room for the right axis' numbers and title
    return {"data": data, "layout": layout}


def _table(plan: dict) -> str:
    head = ("devices", "tp/pp/vpp/cp/ep/dp/mbs", "tokens/s", "MFU", "days", "device-hours", "cost", "Pareto",
            "deadline", "effective days", "effective device-hours", "goodput", "interruptions", "checkpoint every")
    rows = []
    for p in plan["points"]:
        cls = ' class="chosen"' if p["devices"] == plan.get("chosen") else ""
        if not p["feasible"]:
            rows.append(f'<tr class="short"><td>{p["devices"]:,}</td><td colspan="13">'
                        f'{html.escape(str(p.get("reason") or "nothing fits"))}</td></tr>')
            continue
        cfg, ev = p.get("config") or {}, p.get("evaluation") or {}
        lay = "/".join(str(cfg.get(k, 1)) for k in ("tp", "pp", "vpp", "cp", "ep", "dp", "micro_batch_size"))
        mfu = ev.get("mfu")
        deadline = p.get("meets_deadline")
        cells = [f"{p['devices']:,}", lay, f"{p.get('tokens_per_s') or 0:,.0f}", "—" if mfu is None else f"{mfu:.3f}",
                 f"{p['days']:.1f}", f"{p['device_hours']:,.0f}", "—" if p.get("cost") is None else f"{p['cost']:,.0f}",
                 "✓" if p.get("pareto") else "", "" if deadline is None else ("✓" if deadline else "✗")]
        e = p.get("effective_days")
        cells += (["—"] * 5 if e is None else
                  [f"{e:.1f}", f"{p['effective_device_hours']:,.0f}", f"{p['goodput_fraction']:.3f}",
                   f"{p['interruptions']:,.{1 if p['interruptions'] < 10 else 0}f}",
                   f"{p['checkpoint_interval_s'] / 60:.1f} min"])
        rows.append(f"<tr{cls}>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    return (f'<table class="top" id="plan-table"><thead><tr>{"".join(f"<th>{h}</th>" for h in head)}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table>")


def _deadline_text(deadline) -> str:
    """The plan's deadline in words: "deadline 90 days", or "no deadline" when the plan has none."""
    if deadline is None:
        return "no deadline"
    return f"deadline {deadline:g} days" if isinstance(deadline, (int, float)) else f"deadline {deadline} days"


def render_plan_report(plan: dict) -> str:
    """The HTML page (a str) of a plan; :class:`ReportError` names what a bad plan lacks."""
    check_plan(plan)
    inputs = plan.get("inputs") or {}
    model = inputs.get("model")
    name = model.get("name", "model") if isinstance(model, dict) else (model or "model")
    title = f"ParaPlan capacity plan: {name} on {inputs.get('cluster', '?')}"
    payload = json.dumps({PLOT_ID: plan_figure(plan)}, allow_nan=False, separators=(",", ":")).replace("</", "<\\/")
    tokens = inputs.get("tokens")
    chosen = plan.get("chosen")
    deadline = inputs.get("deadline_days")
    summary = (f"{'—' if not isinstance(tokens, (int, float)) else tokens_text(tokens)} tokens · devices "
               f"{inputs.get('devices_min', '?')}–{inputs.get('devices_max', '?')} step {inputs.get('devices_step', '?')}"
               f" · {_deadline_text(deadline)} · plan time "
               f"{plan.get('plan_time_s') or 0:.1f} s")
    chosen_line = (f"Chosen: <b id=\"chosen\">{chosen:,}</b> devices" if chosen is not None
                   else "Chosen: <b id=\"chosen\">none</b>") + f" — {html.escape(str(plan.get('chosen_reason', '')))}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><style>{CSS} tr.chosen td{{background:#fde8e8;font-weight:600}}</style>
<script>{plotly_js()}</script></head>
<body><h1>{html.escape(title)}</h1>
<p>{html.escape(summary)}</p>
<p>{chosen_line}</p>
<div id="{PLOT_ID}" class="plot"></div>
<h2>Device counts</h2>
<p class="note">Pareto: no other count is as fast and as cheap in device-hours. Planning pins:
{html.escape(json.dumps(plan.get("planning_fixed") or {}))}.</p>
{_table(plan)}
<script id="paraplan-figures" type="application/json">{payload}</script>
<script>
(function () {{
  var figs = JSON.parse(document.getElementById("paraplan-figures").textContent);
  Object.keys(figs).forEach(function (id) {{
    Plotly.newPlot(id, figs[id].data, figs[id].layout, {{responsive: true, displaylogo: false, displayModeBar: "hover"}})
      .then(function (gd) {{  // what was drawn, for checks: each trace's name and x values
        gd.setAttribute("data-drawn", JSON.stringify(gd.data.map(function (t) {{ return {{name: t.name, x: t.x}}; }})));
      }});
  }});
}})();
</script></body></html>
"""

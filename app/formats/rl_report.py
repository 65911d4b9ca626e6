"""The HTML page of an RL plan (``paraplan report RL.json``, ``GET /v1/jobs/{id}/report`` of an ``rl`` job).

Two Plotly plots (inlined, as in the search report, ``app.formats.report``):

* ``plot-rl-time``: one horizontal bar per mode, stacked from left to right by the plan's ``time`` phases
  (prefill, decode, switch, log-probs, training, weight sync: the exposed seconds, which add up to the step
  time), so each bar reads as the step's timeline and its length is the step time.
* ``plot-rl-memory``: the peak memory per device of each phase (rollout, log-prob, train) per mode, against
  the device capacity.

Then a table of the two plans (throughputs, rollout engine, training config).
"""

from __future__ import annotations

import html

from .describe import config_brief, count_text
from .report import COLOURS, ReportError, _layout, html_page

TIME_PLOT_ID, MEMORY_PLOT_ID = "plot-rl-time", "plot-rl-memory"
MODES = {"colocated": "co-located", "disaggregated": "disaggregated"}
# The phases in the order a step runs them (the timeline's left to right); a phase not listed goes last.
PHASE_ORDER = ("prefill_s", "decode_s", "switch_s", "actor_logprob_s", "reference_logprob_s", "critic_value_s",
               "actor_train_s", "critic_train_s", "weight_sync_s")
MEMORY_PHASES = {"rollout_peak_gib": "rollout", "logprob_peak_gib": "log-prob", "train_peak_gib": "train"}


def check_rl(result) -> None:
    """Raise :class:`ReportError` naming the first field an RL report needs and ``result`` lacks."""
    if not isinstance(result, dict) or not all(m in result for m in MODES):
        raise ReportError("colocated", "missing: not a `paraplan rl --json` result")
    for mode in MODES:
        plan = result[mode]
        if plan is None:
            continue
        if not isinstance(plan, dict):
            raise ReportError(mode, "must be a plan object or null")
        if not isinstance(plan.get("step_time_s"), (int, float)):
            raise ReportError(f"{mode}.step_time_s", "missing or not a number")
        for key in ("time", "memory", "rollout"):
            if not isinstance(plan.get(key), dict):
                raise ReportError(f"{mode}.{key}", "missing or not an object")
        for name, value in plan["time"].items():
            if not isinstance(value, (int, float)) or value < 0:
                raise ReportError(f"{mode}.time.{name}", "must be a non-negative number of seconds")


def _plans(result: dict) -> dict:
    """The modes that have a plan, in MODES order: ``{mode: plan}``."""
    return {m: result[m] for m in MODES if result.get(m) is not None}


def phases(plans: dict) -> list[str]:
    """The ``time`` keys of ``plans`` in step order, those that are zero in every plan left out."""
    keys = {k for p in plans.values() for k, v in p["time"].items() if v > 0}
    return sorted(keys, key=lambda k: (PHASE_ORDER.index(k) if k in PHASE_ORDER else len(PHASE_ORDER), k))


def time_figure(result: dict) -> dict:
    """One horizontal bar per mode (y), one trace per phase: its exposed seconds (x), stacked in step order."""
    plans = _plans(result)
    modes = [MODES[m] for m in plans]
    data = [{"type": "bar", "orientation": "h", "name": k.removesuffix("_s"), "y": modes,
             "x": [float(p["time"].get(k, 0.0)) for p in plans.values()],
             "marker": {"color": COLOURS[j % len(COLOURS)]},
             "hovertemplate": f"{k.removesuffix('_s')}: %{{x:.3f}} s<extra>%{{y}}</extra>"}
            for j, k in enumerate(phases(plans))]
    title = "RL step timeline: exposed seconds per phase (a bar's length is the step time)" if plans else \
        "RL step timeline: no plan fits"
    layout = _layout(title, "seconds per step", "", barmode="stack",
                     yaxis={"type": "category", "autorange": "reversed"},  # the modes name themselves, top down
                     legend={"orientation": "h", "y": -0.28, "traceorder": "normal"})  # in step order, below the axis
    layout["margin"]["l"] = 110  # room for "disaggregated"
    return {"data": data, "layout": layout}


def memory_figure(result: dict) -> dict:
    """Per-phase peak memory per device (GiB), one group of bars per phase, one trace per mode, and the
    device capacity as a dashed line."""
    plans = _plans(result)
    x = list(MEMORY_PHASES.values())
    data = [{"type": "bar", "name": MODES[m], "x": x, "y": [p["memory"].get(k) for k in MEMORY_PHASES],
             "marker": {"color": COLOURS[i]}, "hovertemplate": "%{x}: %{y:.1f} GiB<extra>" + MODES[m] + "</extra>"}
            for i, (m, p) in enumerate(plans.items())]
    capacity = next((p["memory"].get("capacity_gib") for p in plans.values()), None)
    if capacity is not None:
        data.append({"type": "scatter", "mode": "lines", "name": f"capacity {capacity:g} GiB", "x": x,
                     "y": [capacity] * len(x), "line": {"color": "#222", "dash": "dash"}})
    return {"data": data, "layout": _layout("Peak memory per device, phase by phase", "phase", "GiB per device",
                                            barmode="group")}


def _row(mode: str, plan: dict | None) -> str:
    if plan is None:
        return f'<tr><td>{MODES[mode]}</td><td colspan="6">no plan fits</td></tr>'
    r, cfg = plan["rollout"], (plan.get("training") or {}).get("config") or {}
    rollout = (f"{plan.get('rollout_devices', '?')} devices: {r.get('dp', '?')} × (tp {r.get('tp', '?')}, ep "
               f"{r.get('ep', '?')}), batch {r.get('batch', '?')}, {count_text(r.get('waves'), 'wave')}"
               + (", states offloaded" if r.get("offload_training_state") else ""))
    cells = [MODES[mode], f"{plan['step_time_s']:,.2f}", f"{plan.get('generated_tokens_per_s') or 0:,.0f}",
             f"{plan.get('trained_tokens_per_s') or 0:,.0f}", rollout,
             f"{config_brief(cfg) if cfg else '?'} on {plan.get('train_devices', '?')}",
             f"{max((v for k, v in plan['memory'].items() if k in MEMORY_PHASES), default=0):.1f}"]
    return "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"


def render_rl_report(result: dict) -> str:
    """The HTML page (a str) of an RL result; :class:`ReportError` names what a bad result lacks."""
    check_rl(result)
    inputs = result.get("inputs") or {}
    wl = inputs.get("workload") or {}
    title = f"ParaPlan RL plan: {inputs.get('model', 'model')} on {inputs.get('devices', '?')} × " \
            f"{inputs.get('cluster', '?')}"
    best = result.get("best")
    summary = (f"{wl.get('algorithm', '?')}: {wl.get('prompts_per_step', '?')} prompts × "
               f"{wl.get('responses_per_prompt', '?')} responses, {wl.get('prompt_length', '?')} + "
               f"{wl.get('response_length', '?')} tokens · {result.get('training_searches', '?')} training searches "
               f"in {result.get('search_time_s') or 0:.1f} s")
    best_line = (f"Best: <b id=\"best-mode\">{MODES.get(best.get('mode'), '?')}</b>, step "
                 f"{best['step_time_s']:,.2f} s" if isinstance(best, dict) else "<b id=\"best-mode\">No plan fits.</b>")
    head = ("mode", "step s", "generated tokens/s", "trained tokens/s", "rollout", "training", "peak GiB")
    table = (f'<table class="top" id="rl-table"><thead><tr>{"".join(f"<th>{h}</th>" for h in head)}</tr></thead>'
             f"<tbody>{''.join(_row(m, result.get(m)) for m in MODES)}</tbody></table>")
    figures = {TIME_PLOT_ID: time_figure(result), MEMORY_PLOT_ID: memory_figure(result)}
    divs = "".join(f'<div id="{pid}" class="plot"></div>' for pid in figures)
    body = f"""<p>{html.escape(summary)}</p>
<p>{best_line}</p>
<div class="grid">{divs}</div>
<h2>Plans</h2>
<p class="note">Phases are the exposed seconds of a step (they add up to its time); with stale sync a disaggregated
plan's shorter pool is hidden behind the longer one. Peak GiB: the largest of the phases' peaks.</p>
{table}
"""
    return html_page(title, body, figures)

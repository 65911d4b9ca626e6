"""The job report: one self-contained HTML file from a search result.

The input is the dict that ``paraplan search --json`` prints (or the service's equivalent, built by
``app/service/services/report.py``): ``inputs``, ``top`` (ranked configs with their full evaluations), and when
present ``history`` (samplers), ``pareto`` (NSGA-II) and ``layouts`` (the best config of each of the top K
distinct parallel layouts). The page carries a header with the inputs, four Plotly plots, a table of the
top layouts (each with its best variant and how many variants stand behind it; grouped from ``top`` for
results without ``layouts``) and a table of the top configs. Configs whose memory headroom is below the
search's memory margin are marked ``SHORT`` in both tables. Plotly's JavaScript (``plotly.min.js`` from the ``plotly``
package) is inlined: the file opens on a closed network, with no CDN.

Plots (their ``div`` ids are stable; tests look for them):

* ``plot-time``: the top configs' step time, stacked by part (``compute_s``, ``tp_comm_s``, ...).
* ``plot-memory``: per-stage peak memory of the top configs against the device capacity.
* ``plot-pareto``: tokens/s against peak memory, with the Pareto front (NSGA-II's own front when the
  result has one; otherwise the non-dominated configs among the top: more tokens/s, less memory).
* ``plot-history``: tokens/s per trial and the best so far; without a history (exhaustive search, or a
  service job whose study is gone), the ranked top K, and the title says so.
* ``plot-routing`` (only when the best config states a routing distribution, ``moe_routing``): its tokens
  per EP rank relative to the mean, with experts placed contiguously and balanced.

Where the best config offloads activations, the memory plot also draws its per-stage peaks without
offload (dashed), and the best line says how much the offload moves to the host and what it costs.
"""

from __future__ import annotations

import html
import json
import math
from functools import lru_cache

from costmodel.evaluate import TIME_KEYS

from .describe import config_brief, distinct_briefs, layout_brief, margin_mark, variant_brief

PLOT_IDS = ("plot-time", "plot-memory", "plot-pareto", "plot-history")
ROUTING_PLOT_ID = "plot-routing"  # a fifth plot, only where the best config states a routing distribution
TIME_PARTS = TIME_KEYS  # the breakdown's parts, in the cost model's order (they add up to the step time)
MAX_PLOTTED = 10  # the time and memory plots show at most this many of the top configs
COLOURS = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2", "#ff9da6",
           "#9d755d", "#bab0ac")


class ReportError(ValueError):
    """The result cannot be reported: ``field`` names what is missing or malformed."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@lru_cache(maxsize=1)
def plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


# ---- checking the input ---------------------------------------------------------------------------
def check_result(result) -> None:
    """Raise :class:`ReportError` naming the first field that a report needs and the result lacks."""
    if not isinstance(result, dict):
        raise ReportError("result", "must be a JSON object (what `paraplan search --json` prints)")
    if not isinstance(result.get("top"), list):
        raise ReportError("top", "missing or not a list of ranked configs")
    for i, entry in enumerate(result["top"]):
        where = f"top[{i}]"
        if not isinstance(entry, dict):
            raise ReportError(where, "must be an object with rank, config and evaluation")
        for key, kind in (("rank", int), ("config", dict), ("evaluation", dict)):
            if not isinstance(entry.get(key), kind):
                raise ReportError(f"{where}.{key}", "missing or of the wrong type")
        ev = entry["evaluation"]
        if not isinstance(ev.get("feasible"), bool):
            raise ReportError(f"{where}.evaluation.feasible", "missing or not a boolean")
        for key in ("time", "memory"):
            if ev.get(key) is not None and not isinstance(ev[key], dict):
                raise ReportError(f"{where}.evaluation.{key}", "must be an object")
    for key in ("history", "pareto"):
        if result.get(key) is not None and not isinstance(result[key], list):
            raise ReportError(key, "must be a list")
    for i, h in enumerate(result.get("history") or []):
        if not isinstance(h, dict) or "tokens_per_s" not in h:
            raise ReportError(f"history[{i}]", "must be an object with trial, tokens_per_s and feasible")
        if h.get("keeps_margin") is not None and not isinstance(h["keeps_margin"], bool):
            raise ReportError(f"history[{i}].keeps_margin", "must be true or false")
    if result.get("inputs") is not None and not isinstance(result["inputs"], dict):
        raise ReportError("inputs", "must be an object")
    if result.get("layouts") is not None and not isinstance(result["layouts"], list):
        raise ReportError("layouts", "must be a list")
    for i, lay in enumerate(result.get("layouts") or []):
        for key, kind in (("best_rank", int), ("config", dict), ("evaluation", dict), ("variants", int)):
            if not isinstance(lay, dict) or not isinstance(lay.get(key), kind):
                raise ReportError(f"layouts[{i}].{key}", "missing or of the wrong type")


# ---- helpers ----------------------------------------------------------------------------------------
def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def _fmt(x, spec: str) -> str:
    v = _num(x)
    return "—" if v is None else format(v, spec)


def _capacity(top: list[dict]) -> float | None:
    for e in top:
        cap = _num((e["evaluation"].get("memory") or {}).get("capacity_gib"))
        if cap is not None:
            return cap
    return None


def _peak(ev: dict) -> float | None:
    return _num((ev.get("memory") or {}).get("peak_gib"))


PLOT_HEIGHT = 440  # px, every plot
TITLE_CHARS = 60  # a title line wraps (between words) beyond this: ~420 px at TITLE_SIZE, inside a half-page panel
TITLE_SIZE = 15  # px
TITLE_TOP = 44  # px from the panel's top to the title's: below Plotly's mode bar (the tool icons, ~26 px tall)
TITLE_LINE = 20  # px per title line


def wrap_title(text: str, width: int = TITLE_CHARS) -> list[str]:
    """``text`` in lines of at most ``width`` characters, broken between words only."""
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines or [""]


def _layout(title: str, xtitle: str, ytitle: str, **extra) -> dict:
    # The title starts below the mode bar's band (it would sit under the tool icons at the top right) and
    # wraps to the panel's width; the top margin grows with its lines.
    lines = wrap_title(title)
    return {"title": {"text": "<br>".join(html.escape(line, quote=False) for line in lines), "x": 0.01,
                      "xanchor": "left", "xref": "container", "yref": "container", "yanchor": "top",
                      "y": 1 - TITLE_TOP / PLOT_HEIGHT, "font": {"size": TITLE_SIZE}},
            "xaxis": {"title": {"text": xtitle}}, "yaxis": {"title": {"text": ytitle}},
            "margin": {"l": 70, "r": 20, "t": TITLE_TOP + TITLE_LINE * len(lines) + 14, "b": 60},
            "height": PLOT_HEIGHT, "legend": {"orientation": "h", "y": -0.2}, **extra}


def pareto_front(points: list[tuple[float, float, int]]) -> list[int]:
    """Indices of the non-dominated (tokens/s up, peak memory down) points, by rising memory."""
    front, best_tokens = [], -math.inf
    for tokens, peak, i in sorted(points, key=lambda p: (p[1], -p[0])):
        if tokens > best_tokens:
            front.append(i)
            best_tokens = tokens
    return front


# ---- the four figures -------------------------------------------------------------------------------
def time_figure(top: list[dict]) -> dict:
    shown = [e for e in top if e["evaluation"].get("time")][:MAX_PLOTTED]
    x = [f"#{e['rank']}" for e in shown]
    data = []
    for j, part in enumerate(TIME_PARTS):
        ys = [_num(e["evaluation"]["time"].get(part)) or 0.0 for e in shown]
        if any(ys):
            data.append({"type": "bar", "name": part, "x": x, "y": ys, "marker": {"color": COLOURS[j % len(COLOURS)]},
                         "hovertemplate": f"{part}: %{{y:.3f}} s<extra>%{{x}}</extra>"})
    title = f"Step time by part, top {len(shown)} configs" if shown else "Step time by part: no config to show"
    return {"data": data, "layout": _layout(title, "rank", "seconds per step", barmode="stack",
                                            xaxis={"title": {"text": "rank"}, "type": "category"})}


MAX_STAGE_TICKS = 32  # one tick per stage up to this many stages, else every k-th stage


def memory_figure(top: list[dict], margin: float | None = None) -> dict:
    """Per-stage peaks of the top configs. The best config is drawn last (on top of the others) as a
    large open ring, so that it stays visible where configs coincide, e.g. pp 1 configs, which are one
    point each at stage 0; the x axis has one integer tick per stage and half a stage of room each side."""
    configs, cap = [], _capacity(top)
    stages_max = 0
    for k, e in enumerate(top[:MAX_PLOTTED]):
        stages = [_num(v) for v in ((e["evaluation"].get("memory") or {}).get("per_stage_peak_gib") or [])]
        if not stages:
            continue
        stages_max = max(stages_max, len(stages))
        colour, best = COLOURS[k % len(COLOURS)], not configs
        marker = ({"size": 15, "symbol": "circle-open", "color": colour, "line": {"width": 3, "color": colour}}
                  if best else {"size": 7, "color": colour})
        configs.append({"type": "scatter", "mode": "lines+markers" if len(stages) <= 64 or best else "lines",
                        "name": f"#{e['rank']}", "x": list(range(len(stages))),
                        "y": stages, "marker": marker,
                        "hovertemplate": f"#{e['rank']} {config_brief(e['config'])}<br>stage %{{x}}: %{{y:.1f}} GiB"
                                         "<extra></extra>",
                        "line": {"color": colour, "width": 3 if best else 1.5}})
    data = []
    span = [-0.5, max(stages_max, 1) - 0.5]
    if cap is not None:
        data.append({"type": "scatter", "mode": "lines", "name": f"capacity {cap:g} GiB",
                     "x": span, "y": [cap, cap], "hoverinfo": "skip",
                     "line": {"color": "#d62728", "dash": "dash", "width": 2}})
        if margin:  # where the memory margin starts: a peak above it is SHORT
            data.append({"type": "scatter", "mode": "lines", "name": f"capacity − margin ({margin:g} GiB)",
                         "x": span, "y": [cap - margin, cap - margin], "hoverinfo": "skip",
                         "line": {"color": "#ff7f0e", "dash": "dot", "width": 2}})
    data += configs[::-1]  # Plotly draws later traces on top: the best last; the legend lists it first
    bare = _without_offload(top[0]) if configs else None
    if bare:  # drawn just under the best: what its offload saves, per stage
        data.insert(len(data) - 1, {
            "type": "scatter", "mode": "lines+markers", "name": f"#{top[0]['rank']} without offload",
            "x": list(range(len(bare))), "y": bare, "marker": {"size": 7, "symbol": "diamond-open", "color": COLOURS[0]},
            "line": {"color": COLOURS[0], "width": 2, "dash": "dash"},
            "hovertemplate": f"#{top[0]['rank']} without offload<br>stage %{{x}}: %{{y:.1f}} GiB<extra></extra>"})
    step = max(1, math.ceil(max(stages_max, 1) / MAX_STAGE_TICKS))
    # An explicit range with room below zero: "tozero" clips at 0, so a small model's peak (3 GiB of an
    # 80 GiB axis) drew the best config's ring half under the axis; the ring is ~4 % of the plot's height.
    peaks = [y for c in configs for y in c["y"] if y is not None] + [y for y in bare or [] if y is not None]
    y_top = 1.06 * max([cap or 0.0, *peaks, 1.0])
    title = "Peak memory per pipeline stage" if stages_max else \
        "Peak memory per pipeline stage: no per-stage figures in this result"
    return {"data": data, "layout": _layout(title, "pipeline stage", "GiB", yaxis={
        "title": {"text": "GiB"}, "range": [-0.06 * y_top, y_top], "zeroline": True}, xaxis={
        "title": {"text": "pipeline stage (lines: ranks; ring: the best config)"}, "range": span,
        "tickmode": "array", "tickvals": list(range(0, max(stages_max, 1), step)),
        "ticktext": [str(i) for i in range(0, max(stages_max, 1), step)], "zeroline": False},
        # anchored by its top: Plotly's default anchors a legend below the plot by its bottom, so its rows
        # grew upwards over the axis title
        legend={"orientation": "h", "y": -0.3, "yanchor": "top", "traceorder": "reversed"})}


def _without_offload(entry: dict) -> list[float] | None:
    """Per-stage peaks of a config that offloads activations, had it kept them on the device (GiB)."""
    if not (entry.get("config") or {}).get("offload_modules"):
        return None
    bare = (entry["evaluation"].get("memory") or {}).get("per_stage_peak_without_offload_gib")
    return [_num(v) for v in bare] if bare else None


def _max(xs: list) -> float | None:
    return max((x for x in xs if x is not None), default=None)


def _offload_note(entry: dict) -> str | None:
    """What the config's activation offload moves to the host and what it costs, in one sentence."""
    bare = _without_offload(entry)
    if not bare:
        return None
    ev = entry["evaluation"]
    peaks = [_num(v) for v in (ev.get("memory") or {}).get("per_stage_peak_gib") or []]
    moved = [_num(v) for v in (ev.get("memory") or {}).get("per_stage_offloaded_gib") or []]
    return (f"Offloads {', '.join(entry['config']['offload_modules'])} to host memory: peak "
            f"{_fmt(_max(peaks), '.2f')} GiB against {_fmt(_max(bare), '.2f')} "
            f"GiB without offload, up to {_fmt(_max(moved), '.2f')} GiB per device on the host, "
            f"{_fmt((ev.get('time') or {}).get('offload_s'), '.3f')} s per step of copy not hidden behind compute.")


def routing_figure(entry: dict) -> dict | None:
    """Tokens per EP rank of a config that states a routing distribution, relative to the mean, with
    experts placed contiguously (before) and balanced (after): the max over ranks is the imbalance
    that slows the expert GEMMs and the all-to-all. None without a distribution."""
    r = entry["evaluation"].get("moe_routing") or {}
    if not r.get("tokens_per_rank_contiguous"):
        return None
    copies = r.get("moe_expert_replicas") or 0
    label = {"contiguous": "contiguous",
             "balanced": f"balanced + {copies} hot-expert cop{'y' if copies == 1 else 'ies'} per rank" if copies else "balanced"}
    data = [{"type": "bar", "name": f"{label[how]} (max/mean {_fmt(r.get(f'imbalance_{how}'), '.2f')})",
             "x": list(range(len(r[f"tokens_per_rank_{how}"]))), "y": r[f"tokens_per_rank_{how}"],
             "marker": {"color": colour},
             "hovertemplate": f"{how}: EP rank %{{x}}: %{{y:.2f}} × mean<extra></extra>"}
            for how, colour in (("contiguous", COLOURS[1]), ("balanced", COLOURS[0])) if r.get(f"tokens_per_rank_{how}")]
    n = len(data[0]["x"])
    data.append({"type": "scatter", "mode": "lines", "name": "mean", "x": [-0.5, n - 0.5], "y": [1.0, 1.0],
                 "hoverinfo": "skip", "line": {"color": "#444", "dash": "dot", "width": 1.5}})
    title = (f"Tokens per EP rank of #{entry['rank']}, before and after placement "
             f"({r.get('expert_placement', 'contiguous')} used)")
    return {"data": data, "layout": _layout(title, "EP rank", "tokens ÷ mean over ranks", barmode="group",
                                            xaxis={"title": {"text": "EP rank"}, "range": [-0.5, n - 0.5],
                                                   "tickmode": "linear", "tick0": 0,
                                                   "dtick": max(1, math.ceil(n / MAX_STAGE_TICKS))},
                                            legend={"orientation": "h", "y": -0.2})}


def pareto_figure(result: dict) -> dict:
    top, cap = result["top"], _capacity(result["top"])
    pts = [(_num(e["evaluation"].get("tokens_per_s")), _peak(e["evaluation"]), e) for e in top]
    pts = [(t, p, e) for t, p, e in pts if t is not None and p is not None]
    data = [{"type": "scatter", "mode": "markers", "name": "top configs",
             "x": [p for _, p, _ in pts], "y": [t for t, _, _ in pts],
             "text": [f"#{e['rank']} {config_brief(e['config'])}" for _, _, e in pts],
             "marker": {"size": 9, "color": "#4c78a8"},
             "hovertemplate": "%{text}<br>%{y:,.0f} tokens/s<br>%{x:.1f} GiB<extra></extra>"}]
    nsga = result.get("pareto")
    if nsga and cap is not None:
        front = sorted(((cap - _num(p.get("memory_headroom_gib")), _num(p.get("tokens_per_s")), p) for p in nsga
                        if _num(p.get("memory_headroom_gib")) is not None and _num(p.get("tokens_per_s")) is not None),
                       key=lambda q: q[0])
        label, title = "Pareto front (NSGA-II)", "Throughput vs peak memory: NSGA-II's Pareto front"
        fx, fy = [q[0] for q in front], [q[1] for q in front]
        ftext = [f"trial {q[2].get('trial')}: {config_brief(q[2].get('config') or {})}" for q in front]
    else:
        idx = pareto_front([(t, p, i) for i, (t, p, _) in enumerate(pts)])
        label, title = "Pareto front of the top configs", "Throughput vs peak memory: Pareto front of the top configs"
        fx, fy = [pts[i][1] for i in idx], [pts[i][0] for i in idx]
        ftext = [f"#{pts[i][2]['rank']} {config_brief(pts[i][2]['config'])}" for i in idx]
    data.append({"type": "scatter", "mode": "lines+markers", "name": label, "x": fx, "y": fy, "text": ftext,
                 "line": {"color": "#f58518", "shape": "hv"}, "marker": {"size": 11, "symbol": "diamond"},
                 "hovertemplate": "%{text}<br>%{y:,.0f} tokens/s<br>%{x:.1f} GiB<extra></extra>"})
    shapes = []
    if cap is not None:
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": cap, "x1": cap, "y0": 0, "y1": 1,
                       "line": {"color": "#d62728", "dash": "dash"}})
    return {"data": data, "layout": _layout(title, "peak memory (GiB; dashed: capacity)", "tokens/s", shapes=shapes)}


def _history_points(history: list[dict]) -> tuple[dict[str, list], list, list]:
    """The trials split as the ranking sees them (feasible and keeping the memory margin; feasible but short
    of it; nothing fits) as {name: ([trials], [tokens/s])}, and the best-so-far line. The line follows the
    ranking, which puts every config that keeps the margin before any that does not: where a trial keeps
    the margin the line counts only such trials, so it never falls and ends at the ranked best (an entry
    without ``keeps_margin``, from an older result, counts as keeping it)."""
    points = {"keeps": ([], []), "short": ([], []), "none": ([], [])}
    for h in history:
        t = _num(h.get("tokens_per_s"))
        kind = "none" if t is None or not h.get("feasible", True) or t <= 0 else (
            "short" if h.get("keeps_margin") is False else "keeps")
        points[kind][0].append(h.get("trial"))
        points[kind][1].append(0 if kind == "none" else t)
    counted = ("keeps",) if points["keeps"][0] else ("keeps", "short")  # what the ranked best is drawn from
    bx, by, best = [], [], None
    for h in history:
        t = _num(h.get("tokens_per_s"))
        kind = "short" if h.get("keeps_margin") is False else "keeps"
        if t is not None and h.get("feasible", True) and t > 0 and kind in counted:
            best = t if best is None else max(best, t)
        if best is not None:
            bx.append(h.get("trial"))
            by.append(best)
    return points, bx, by


def history_figure(result: dict) -> dict:
    history = result.get("history")
    if history:
        points, bx, by = _history_points(history)
        data = [{"type": "scatter", "mode": "markers", "name": "feasible trial", "x": points["keeps"][0],
                 "y": points["keeps"][1], "marker": {"size": 6, "color": "#4c78a8", "opacity": 0.7}},
                {"type": "scatter", "mode": "lines", "name": "best so far", "x": bx, "y": by,
                 "line": {"color": "#f58518", "width": 3, "shape": "hv"}}]
        if points["short"][0]:
            margin = _num((result.get("inputs") or {}).get("memory_margin_gib"))
            data.insert(1, {"type": "scatter", "mode": "markers", "x": points["short"][0], "y": points["short"][1],
                            "name": "fits, short of the " + (f"{margin:g} GiB " if margin is not None else "")
                                    + "memory margin (ranked after)",
                            "marker": {"size": 6, "color": "#b279a2", "symbol": "triangle-down", "opacity": 0.7}})
        if points["none"][0]:
            data.append({"type": "scatter", "mode": "markers", "name": "no config fits (shown at 0)",
                         "x": points["none"][0], "y": points["none"][1],
                         "marker": {"size": 5, "color": "#e45756", "symbol": "x"}})
        feasible = len(points["keeps"][0]) + len(points["short"][0])
        title = f"Optimisation history: {len(history)} trials, {feasible} feasible"
        return {"data": data, "layout": _layout(title, "trial", "tokens/s")}
    top = result["top"]
    why = result.get("history_note") or (
        "exhaustive search, the whole space was scored" if result.get("engine") == "exhaustive"
        else "the result has no history")
    data = [{"type": "bar", "name": "tokens/s", "x": [f"#{e['rank']}" for e in top],
             "y": [_num(e["evaluation"].get("tokens_per_s")) for e in top], "marker": {"color": "#4c78a8"}}]
    return {"data": data, "layout": _layout(f"No trial history ({why}): the ranked top {len(top)} instead", "rank",
                                            "tokens/s", xaxis={"title": {"text": "rank"}, "type": "category"})}


# ---- the page ---------------------------------------------------------------------------------------
def _header(result: dict) -> str:
    inputs = result.get("inputs") or {}
    model = inputs.get("model")
    model_name = model.get("name", "(spec)") if isinstance(model, dict) else model
    rows = [("model", model_name), ("cluster", inputs.get("cluster")), ("devices", _fmt(inputs.get("devices"), ",.0f")),
            ("global batch size", _fmt(inputs.get("global_batch_size"), ",.0f")),
            ("precision", inputs.get("precision")), ("MoE load imbalance", _imbalance(result)),
            ("memory margin", None if _margin(result) is None else f"{_margin(result):g} GiB"),
            ("engine", result.get("engine")), ("space size", _fmt(result.get("space_size"), ",.0f")),
            *_decided_rows(result),
            ("search time", f"{_fmt(result.get('search_time_s'), '.1f')} s")]
    if result.get("job_id"):
        rows.insert(0, ("job", result["job_id"]))
    if result.get("seed") is not None:
        rows.append(("seed", result["seed"]))
    cells = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape('—' if v is None else str(v))}</td></tr>"
                    for k, v in rows)
    return f'<table class="inputs">{cells}</table>'


def _warnings(result: dict) -> str:
    """The best config's warnings (calibration coverage, extrapolation beyond the calibration runs)."""
    warnings = ((result.get("best") or {}).get("evaluation") or {}).get("warnings") or []
    if not warnings:
        return ""
    items = "".join(f"<li>{html.escape(str(w))}</li>" for w in warnings)
    return f'<ul class="warnings" id="warnings">{items}</ul>'


def _decided_rows(result: dict) -> list[tuple[str, str | None]]:
    """How the trials were decided: scored, or (exhaustive engine) decided unscored by the bound or by an
    offload plan's counterpart; the feasible count is among the scored."""
    if not result.get("configs_pruned"):
        return [("trials scored", _fmt(result.get("trials"), ",.0f")),
                ("feasible trials", _fmt(result.get("feasible_trials"), ",.0f"))]
    return [("configs decided", _fmt(result.get("trials"), ",.0f")),
            ("scored", _fmt(result.get("configs_scored"), ",.0f")),
            ("bounded out (cannot reach the top)", _fmt(result.get("configs_pruned"), ",.0f")),
            ("dominated (offload plans)", _fmt(result.get("configs_dominated"), ",.0f")),
            ("feasible among the scored", _fmt(result.get("feasible_trials"), ",.0f"))]


def _imbalance(result: dict) -> str:
    """The MoE load imbalance the scores were computed with: the input, the routing distribution the
    configs state (the imbalance then follows from each config's ep and placement), or the default the
    configs record (the inputs keep null when none was given); dense models apply none."""
    inputs = result.get("inputs") or {}
    model = inputs.get("model")
    if isinstance(model, dict) and not model.get("num_experts"):
        return "— (dense model)"
    routed = next((e["evaluation"]["moe_routing"] for e in result.get("top") or []
                   if (e.get("evaluation") or {}).get("moe_routing")), None)
    if routed is not None:
        cfg = result["top"][0].get("config") or {}
        source = "moe_expert_load" if cfg.get("moe_expert_load") is not None else "moe_expert_skew"
        if source == "moe_expert_skew" and cfg.get("moe_expert_skew") is not None:
            source += f" {cfg['moe_expert_skew']:g}"
        return (f"from the routing ({source}, {routed.get('expert_placement', 'contiguous')} placement): "
                f"{_fmt(routed.get('imbalance'), '.3f')} for #1")
    given = _num(inputs.get("moe_load_imbalance"))
    if given is not None:
        return f"{given:g}"
    applied = next((v for e in result.get("top") or [] if (v := _num((e.get("config") or {}).get(
        "moe_load_imbalance"))) is not None), None)
    if applied is None:
        from costmodel.batch import DEFAULT_MOE_LOAD_IMBALANCE

        applied = DEFAULT_MOE_LOAD_IMBALANCE
    return f"{applied:g} (default)"


def _margin(result: dict) -> float | None:
    """The search's memory margin (GiB), None for results from before margins."""
    return _num((result.get("inputs") or {}).get("memory_margin_gib"))


def layout_groups(result: dict) -> tuple[list[dict], str]:
    """The top layouts (``result["layouts"]``) and a note on where they come from; results without them
    are grouped here from ``top`` (variants then count only the ranked configs)."""
    if result.get("layouts") is not None:
        total = result.get("feasible_layouts")
        return result["layouts"], (f"of {total:,} layouts with a config that fits" if isinstance(total, int) else "")
    groups: dict[tuple, dict] = {}
    for e in result["top"]:
        key = tuple(e["config"].get(k) for k in ("tp", "pp", "cp", "ep", "etp"))
        if key in groups:
            groups[key]["variants"] += 1
        else:
            groups[key] = {**e, "best_rank": e["rank"], "variants": 1}
    return list(groups.values()), "grouped from the top configs (this result has no layouts list)"


def _layouts_table(layouts: list[dict]) -> str:
    cols = ("rank", "layout", "best variant", "variants", "tokens/s/device", "MFU", "step s", "peak GiB",
            "headroom GiB", "margin")
    head = "".join(f"<th>{c}</th>" for c in cols)
    body = []
    for lay in layouts:
        ev, cfg = lay["evaluation"], lay["config"]
        cells = (str(lay["best_rank"]), layout_brief(cfg), variant_brief(cfg), f"{lay['variants']:,}",
                 _fmt(ev.get("tokens_per_s_per_device"), ",.1f"), _fmt(ev.get("mfu"), ".3f"),
                 _fmt(ev.get("step_time_s"), ".3f"), _fmt(_peak(ev), ".1f"), _fmt(_headroom(ev), ".1f"),
                 margin_mark(lay))
        full = html.escape(json.dumps(cfg, sort_keys=True), quote=True)
        body.append(f'<tr class="{_row_class(lay)}">' + "".join(
            f'<td title="{full}">{html.escape(c)}</td>' if i in (1, 2) else f"<td>{html.escape(c)}</td>"
            for i, c in enumerate(cells)) + "</tr>")
    return f'<table class="top layouts"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


def _headroom(ev: dict) -> float | None:
    mem = ev.get("memory") or {}
    room = _num(mem.get("headroom_gib"))
    if room is None and _num(mem.get("capacity_gib")) is not None and _peak(ev) is not None:
        room = _num(mem["capacity_gib"]) - _peak(ev)
    return room


def _row_class(entry: dict) -> str:
    return "short" if entry.get("keeps_margin") is False else ""


def _top_table(top: list[dict]) -> str:
    cols = ("rank", "config", "tokens/s", "tokens/s/device", "MFU", "HFU", "step s", "peak GiB", "fits", "margin")
    head = "".join(f"<th>{c}</th>" for c in cols)
    body = []
    for e, brief in zip(top, distinct_briefs([e["config"] for e in top])):
        ev = e["evaluation"]
        cells = (str(e["rank"]), brief, _fmt(ev.get("tokens_per_s"), ",.0f"),
                 _fmt(ev.get("tokens_per_s_per_device"), ",.1f"), _fmt(ev.get("mfu"), ".3f"), _fmt(ev.get("hfu"), ".3f"),
                 _fmt(ev.get("step_time_s"), ".3f"), _fmt(_peak(ev), ".1f"), "yes" if ev["feasible"] else "no",
                 margin_mark(e))
        full = html.escape(json.dumps(e["config"], sort_keys=True), quote=True)
        body.append(f'<tr class="{_row_class(e)}">' + "".join(f'<td title="{full}">{html.escape(c)}</td>' if i == 1 else
                                     f"<td>{html.escape(c)}</td>" for i, c in enumerate(cells)) + "</tr>")
    return f'<table class="top"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 12px} h2{font-size:17px;margin:24px 0 8px}
table{border-collapse:collapse;font-size:13px} th,td{border:1px solid #ddd;padding:3px 8px;text-align:left}
table.inputs th{background:#f4f4f4;font-weight:600} table.top td:not(:nth-child(2)){text-align:right}
table.top thead th{background:#f4f4f4} .grid{display:grid;grid-template-columns:1fr 1fr;gap:12px}
.plot{border:1px solid #eee;min-height:440px} .note{color:#666;font-size:12px} .warnings{color:#8a5a00}
tr.short td{background:#fff4e5} tr.short td:last-child{color:#b34700;font-weight:600} .short-note{color:#b34700}
"""


def _version(result: dict) -> str:
    if result.get("paraplan_version"):
        return result["paraplan_version"]
    for e in result["top"]:
        v = (e["evaluation"].get("versions") or {}).get("paraplan")
        if v:
            return v
    return ""


def _margin_note(margin: float | None) -> str:
    if margin is None:
        return ""
    return (f" SHORT: headroom below the {margin:g} GiB memory margin; such configs are ranked after every "
            "config that keeps it.")


def _from_launch(result: dict) -> str:
    """``search --from-launch``: the team's config beside the best (app/formats/compare.py), when present."""
    cmp = (result.get("from_launch") or {}).get("comparison")
    if not isinstance(cmp, dict):
        return ""
    from .compare import comparison_html

    return comparison_html(cmp)


def render_report(result: dict) -> str:
    """The HTML page (a str) for a search result; :class:`ReportError` names what a bad result lacks."""
    check_result(result)
    top = result["top"]
    margin = _margin(result)
    figures = {"plot-time": time_figure(top), "plot-memory": memory_figure(top, margin),
               "plot-pareto": pareto_figure(result),
               "plot-history": history_figure(result)}
    if top and (routed := routing_figure(top[0])) is not None:
        figures[ROUTING_PLOT_ID] = routed
    inputs = result.get("inputs") or {}
    model = inputs.get("model")
    name = model.get("name", "model") if isinstance(model, dict) else (model or "model")
    title = f"ParaPlan report: {name} on {inputs.get('devices', '?')} × {inputs.get('cluster', '?')}"
    best = top[0] if top else None
    best_line = (f"Best: <b>{html.escape(config_brief(best['config']))}</b> — "
                 f"{_fmt(best['evaluation'].get('tokens_per_s_per_device'), ',.1f')} tokens/s/device, "
                 f"MFU {_fmt(best['evaluation'].get('mfu'), '.3f')}, "
                 f"headroom {_fmt(_headroom(best['evaluation']), '.1f')} GiB" if best else
                 "<b>No config fits.</b>")
    if best and (note := _offload_note(best)):
        best_line += f'<br><span class="offload-note" id="offload-note">{html.escape(note)}</span>'
    if best and best.get("keeps_margin") is False:
        best_line += (f'<br><span class="short-note"><b>No config keeps the {margin:g} GiB memory margin</b>: '
                      "this one fits in the model but leaves less room than the margin for allocator fragmentation "
                      "and communication buffers, and may not fit in practice.</span>")
    layouts, layouts_note = layout_groups(result)
    divs = "".join(f'<div id="{pid}" class="plot"></div>' for pid in figures)
    body = f"""{_header(result)}
<p>{best_line}</p>
{_warnings(result)}
<div class="grid">{divs}</div>
<h2>Top {len(layouts)} layouts</h2>
<p class="note">Distinct parallel layouts (tp, pp, cp, ep, etp), each with its best variant (vpp, micro-batch,
recompute, pipeline split) and how many variants fit; rank: of that variant among all ranked configs;
{html.escape(layouts_note)}.{_margin_note(margin)}</p>
{_layouts_table(layouts)}
<h2>Top {len(top)} configs</h2>
{_top_table(top)}
{_from_launch(result)}
<p class="note">Generated by ParaPlan {html.escape(str(_version(result)))}; plots by Plotly
(inlined, no network needed). Hover a config for its full JSON.</p>
"""
    return html_page(title, body, figures)


def html_page(title: str, body: str, figures: dict) -> str:
    """A self-contained page: ``body`` (HTML) under an ``<h1>`` title, then Plotly (inlined) drawing each
    figure of ``figures`` into the ``div`` of its id (the figures also stay readable as JSON in
    ``#paraplan-figures``)."""
    payload = json.dumps(figures, allow_nan=False, separators=(",", ":")).replace("</", "<\\/")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><style>{CSS}</style>
<script>{plotly_js()}</script></head>
<body><h1>{html.escape(title)}</h1>
{body}<script id="paraplan-figures" type="application/json">{payload}</script>
<script>
(function () {{
  var figs = JSON.parse(document.getElementById("paraplan-figures").textContent);
  Object.keys(figs).forEach(function (id) {{
    Plotly.newPlot(id, figs[id].data, figs[id].layout, {{responsive: true, displaylogo: false, displayModeBar: "hover"}});
  }});
}})();
</script></body></html>
"""

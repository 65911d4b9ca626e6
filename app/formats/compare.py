"""Two evaluations side by side, part by part, each difference with its cause in the cost model's terms.

``compare(a, b)`` takes two ``Side``s (a label, the model, the config, the devices, the evaluation) and
returns the contract's JSON: the headline figures of each, every time part (``time.*_s``) and memory part
(``memory.*_gib`` at the peak stage) of each with the difference B − A, and for each part that differs the
settings that drive it in the cost model and changed between A and B, in words ("tp 8 → 1: the GEMMs are
wider, compute −5.6 s"), ordered by size. The drivers are read from the model's own breakdown: which
settings enter each part's formula (costmodel/layers.py, comm.py, memory.py, pipeline.py), never a
hand-written story of one comparison.
"""

from __future__ import annotations

from dataclasses import dataclass

from costmodel import ModelSpec, TrainingConfig

TIME_PARTS = ("compute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s", "pp_bubble_s", "pp_p2p_s", "dp_comm_exposed_s",
              "optimizer_s", "straggler_s")
MEMORY_PARTS = ("params_gib", "grads_gib", "optimizer_gib", "activations_gib", "buffers_gib", "overhead_gib")
HEADLINE = ("step_time_s", "tokens_per_s_per_device", "mfu", "hfu")


@dataclass
class Side:
    label: str
    spec: ModelSpec
    config: TrainingConfig
    devices: int
    evaluation: dict
    scale_up_domain: int | None = None
    profile: object = None  # the cluster profile (ClusterProfile) it was evaluated on


def _dp(s: Side) -> int:
    c = s.config
    return c.dp or max(s.devices // (c.tp * c.pp * c.cp), 1)


def _micro_batches(s: Side) -> int:
    return max(s.config.global_batch_size // (s.config.micro_batch_size * _dp(s)), 1)


def _ep_domains(s: Side) -> int | None:
    """Scale-up domains the expert-parallel group spans (ranks etp apart, Megatron-Core's order)."""
    if s.scale_up_domain is None or not s.spec.is_moe:
        return None
    return max(-(-s.config.ep * s.config.etp // s.scale_up_domain), 1)


def _show(v) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    if v is None:
        return "default"
    if isinstance(v, (list, tuple)):
        return ",".join(map(str, v)) or "none"
    return str(v)


# Each driver: a name, how to read it off a side, and what its change does in the cost model, per part.
# (part, phrase when the driver grows, phrase when it shrinks); a phrase of None: the change is named only.
def _drivers():
    def cfg(name):
        return lambda s: getattr(s.config, name)

    return [
        ("tp", cfg("tp"), {"compute_s": ("the GEMMs are split narrower", "the GEMMs are wider"),
                           "tp_comm_s": ("more tensor-parallel collectives", "fewer tensor-parallel collectives"),
                           "params_gib": ("weights split over more ranks", "weights split over fewer ranks"),
                           "activations_gib": ("activations split over more ranks", "activations split over fewer ranks"),
                          "pp_p2p_s": ("smaller stage-boundary messages (sequence parallel)",
                                       "larger stage-boundary messages (sequence parallel)")}),
        ("sp", lambda s: s.config.sp, {"tp_comm_s": (None, None), "activations_gib": (None, None)}),
        ("tp_comm_overlap", cfg("tp_comm_overlap"), {"tp_comm_s": ("TP communication hidden under the GEMMs",
                                                                   "TP communication exposed")}),
        ("pp", cfg("pp"), {"pp_bubble_s": ("more pipeline stages to fill", "fewer pipeline stages to fill"),
                           "pp_p2p_s": ("more stage boundaries", "fewer stage boundaries"),
                           "params_gib": ("layers spread over more stages", "more layers per stage"),
                           "activations_gib": ("more micro-batches in flight", "fewer micro-batches in flight")}),
        ("vpp", cfg("vpp"), {"pp_bubble_s": ("the bubble shrinks by interleaving", "less interleaving, a larger bubble"),
                             "pp_p2p_s": ("more chunk boundaries", "fewer chunk boundaries"),
                             "activations_gib": (None, None)}),
        ("pipeline split", lambda s: _split(s), {"pp_bubble_s": (None, None), "params_gib": (None, None),
                                                 "activations_gib": (None, None), "compute_s": (None, None)}),
        ("schedule", lambda s: s.config.schedule, {"pp_bubble_s": (None, None), "activations_gib": (None, None),
                                                   "params_gib": (None, None)}),
        ("micro-batches per step", _micro_batches, {"pp_bubble_s": ("more micro-batches amortise the bubble",
                                                                    "fewer micro-batches to amortise the bubble")}),
        ("micro_batch_size", cfg("micro_batch_size"), {"compute_s": ("larger GEMMs per pass", "smaller GEMMs per pass"),
                                                       "activations_gib": ("more tokens per micro-batch",
                                                                           "fewer tokens per micro-batch"),
                                                       "pp_p2p_s": (None, None)}),
        ("cp", cfg("cp"), {"cp_comm_s": ("attention spread over more ranks", "attention over fewer ranks"),
                           "activations_gib": ("the sequence split over more ranks", "the sequence split over fewer ranks"),
                           "compute_s": (None, None)}),
        ("cp_comm_type", cfg("cp_comm_type"), {"cp_comm_s": (None, None)}),
        ("ep", cfg("ep"), {"ep_comm_s": ("experts spread wider, more all-to-all peers",
                                         "experts on fewer ranks, fewer all-to-all peers"),
                           "params_gib": ("experts split over more ranks", "experts split over fewer ranks"),
                           "compute_s": (None, None)}),
        ("EP scale-up domains", _ep_domains, {"ep_comm_s": ("the dispatch leaves the scale-up domain more",
                                                            "more of the dispatch stays inside the scale-up domain")}),
        ("etp", cfg("etp"), {"ep_comm_s": (None, None), "params_gib": (None, None), "compute_s": (None, None)}),
        ("moe_a2a_algorithm", lambda s: s.config.moe_a2a_algorithm if s.spec.is_moe else None,
         {"ep_comm_s": (None, None), "compute_s": (None, None)}),
        ("moe_token_dispatcher_type", cfg("moe_token_dispatcher_type"), {"ep_comm_s": (None, None),
                                                                         "compute_s": (None, None)}),
        ("moe_a2a_overlap", lambda s: s.config.moe_a2a_overlap if s.spec.is_moe else None,
         {"ep_comm_s": ("the dispatch hidden under computation", "the dispatch exposed"),
          "activations_gib": (None, None), "buffers_gib": (None, None)}),
        ("dp", _dp, {"dp_comm_exposed_s": ("gradients reduced over more ranks", "gradients reduced over fewer ranks"),
                     "optimizer_gib": ("optimizer states sharded wider", "optimizer states sharded narrower"),
                     "straggler_s": ("more replicas to wait for", "fewer replicas to wait for"),
                     "pp_bubble_s": (None, None)}),
        ("sharding", lambda s: s.config.sharding, {"optimizer_gib": (None, None), "grads_gib": (None, None),
                                                   "params_gib": (None, None), "dp_comm_exposed_s": (None, None)}),
        ("overlap_grad_reduce", cfg("overlap_grad_reduce"), {"dp_comm_exposed_s": ("gradient reduction hidden",
                                                                                   "gradient reduction exposed")}),
        ("overlap_param_gather", cfg("overlap_param_gather"), {"dp_comm_exposed_s": ("parameter gather hidden",
                                                                                     "parameter gather exposed")}),
        ("recompute", cfg("recompute"), {"compute_s": (None, None), "activations_gib": (None, None)}),
        ("recompute_modules", lambda s: sorted(s.config.recompute_modules or []) if s.config.recompute == "selective"
         else None, {"compute_s": (None, None), "activations_gib": (None, None)}),
        ("recompute_num_layers", cfg("recompute_num_layers"), {"compute_s": (None, None), "activations_gib": (None, None)}),
        ("offload_modules", lambda s: sorted(s.config.offload_modules or []), {"activations_gib": (None, None),
                                                                              "compute_s": (None, None)}),
        ("precision", cfg("precision"), {"compute_s": (None, None), "activations_gib": (None, None)}),
        ("attention_kernel", cfg("attention_kernel"), {"compute_s": (None, None), "activations_gib": (None, None)}),
        ("main_params_dtype", cfg("main_params_dtype"), {"optimizer_gib": (None, None), "params_gib": (None, None)}),
        ("exp_avg_dtype", cfg("exp_avg_dtype"), {"optimizer_gib": (None, None)}),
        ("main_grads_dtype", cfg("main_grads_dtype"), {"grads_gib": (None, None)}),
        ("devices", lambda s: s.devices, {"straggler_s": (None, None)}),
    ]


def _split(s: Side) -> str:
    """The split in short: virtual stages, and what the first and last hold (E embedding, t layer, m MTP, L loss)."""
    from search.frameworks import stage_tokens

    try:
        tokens = stage_tokens(s.config, s.spec)
    except ValueError:
        return "?"
    return f"{len(tokens)} stages, first {tokens[0]}, last {tokens[-1]}"


def _cause_words(name: str, va, vb, phrases: tuple) -> str:
    words = f"{name} {_show(va)} → {_show(vb)}"
    try:
        grew = vb > va
    except TypeError:
        grew = None
    phrase = phrases[0] if grew else phrases[1] if grew is False else None
    return f"{words}: {phrase}" if phrase else words


def causes(a: Side, b: Side, part: str) -> list[str]:
    """The settings that enter ``part`` in the cost model and differ between A and B, in words."""
    out = []
    for name, read, effects in _drivers():
        if part not in effects:
            continue
        va, vb = read(a), read(b)
        if va != vb:
            out.append(_cause_words(name, va, vb, effects[part]))
    return out


# The settings moved together when one change is tried alone (a change of tp takes its sequence parallelism
# and TP overlap with it; the split fields go with pp and vpp; the dispatch settings with ep).
GROUPS = {
    "tp": ("tp", "sequence_parallel", "tp_comm_overlap"),
    "pipeline": ("pp", "vpp", "pipeline_layout", "first_stage_layers", "last_stage_layers",
                 "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split", "pipeline_schedule"),
    "cp": ("cp", "cp_comm_type"),
    "ep": ("ep", "etp", "moe_a2a_algorithm", "moe_token_dispatcher_type", "moe_a2a_overlap", "delay_wgrad_compute"),
    "micro_batch_size": ("micro_batch_size",),
    "recompute": ("recompute", "recompute_modules", "recompute_num_layers"),
    "offload": ("offload_modules",),
    "data parallel": ("distributed_optimizer", "data_parallel_sharding_strategy", "overlap_grad_reduce",
                      "overlap_param_gather", "main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"),
    "precision": ("precision", "fp8_recipe", "attention_kernel", "mla_fa_without_pad"),
}


PATH_ORDER = ("pipeline", "tp", "cp", "ep", "micro_batch_size", "recompute", "offload", "data parallel", "precision")


def attribution(a: Side, b: Side) -> list[tuple[tuple[str, ...], dict[str, float]]]:
    """The way from A to B one group of settings at a time (``PATH_ORDER``), each step scored by the cost
    model: the change of every part that step makes. The steps add up to B − A exactly. A step whose
    config is not a valid one (a tp whose data-parallel size no longer divides the batch) goes together
    with the next; tp and cp go together when their product stays (the same ranks per replica, split by
    width or by sequence)."""
    from .results import evaluate

    da, db = a.config.model_dump(), b.config.model_dump()
    changed = [g for g in PATH_ORDER if any(da[f] != db[f] for f in GROUPS[g])]
    if {"tp", "cp"} <= set(changed) and da["tp"] * da["cp"] == db["tp"] * db["cp"]:
        changed.remove("cp")
        changed.insert(changed.index("tp") + 1, "cp")
    steps: list[tuple[tuple[str, ...], dict[str, float]]] = []
    here, prev, pending = dict(da), _parts(a.evaluation), []
    for i, group in enumerate(changed):
        pending.append(group)
        nxt = {**here, "dp": None, **{f: db[f] for f in GROUPS[group]}}
        together_tp_cp = group == "tp" and "cp" in changed[i + 1:i + 2] and da["tp"] * da["cp"] == db["tp"] * db["cp"]
        last = i == len(changed) - 1
        here = nxt
        if together_tp_cp and not last:
            continue
        if last:
            parts = _parts(b.evaluation)
        else:
            try:
                parts = _parts(evaluate(a.spec, a.profile, a.devices, TrainingConfig.model_validate(nxt)))
            except (ValueError, TypeError):
                parts = {}
            if not parts:
                continue  # not a config the model scores: merged with the next step
        steps.append((tuple(pending), {p: parts[p] - prev[p] for p in parts
                                       if parts.get(p) is not None and prev.get(p) is not None}))
        prev, pending = parts, []
    return steps


def _parts(ev: dict) -> dict[str, float | None]:
    if ev.get("step_time_s") is None:
        return {}
    time, mem = ev.get("time") or {}, ev.get("memory") or {}
    return {**{p: time.get(p) for p in TIME_PARTS}, **{p: mem.get(p) for p in MEMORY_PARTS}}


def _steps_words(a: Side, b: Side, groups: tuple[str, ...]) -> str:
    return "; ".join(_group_words(a, b, g) for g in groups)


def _group_words(a: Side, b: Side, group: str) -> str:
    """A group's change in words: its settings that differ, A → B."""
    da, db = a.config.model_dump(), b.config.model_dump()
    changed = [f for f in GROUPS[group] if da[f] != db[f]]
    if group == "pipeline":
        parts = [f"{f} {_show(da[f])} → {_show(db[f])}" for f in ("pp", "vpp", "pipeline_schedule") if f in changed]
        sa, sb = _split(a), _split(b)
        if sa != sb:
            parts.append(f"split ({sa} → {sb})")
        return ", ".join(parts) or "the pipeline split"
    return ", ".join(f"{f} {_show(da[f])} → {_show(db[f])}" for f in changed)


def _unit(part: str) -> str:
    return "s" if part.endswith("_s") else "GiB"


def compare(a: Side, b: Side) -> dict:
    """The two evaluations side by side, the differences, and their causes ordered by size."""
    ea, eb = a.evaluation, b.evaluation
    rows = []
    for kind, parts, get in (("time", TIME_PARTS, lambda e, p: (e.get("time") or {}).get(p)),
                             ("memory", MEMORY_PARTS, lambda e, p: (e.get("memory") or {}).get(p))):
        for p in parts:
            x, y = get(ea, p), get(eb, p)
            delta = None if x is None or y is None else y - x
            rows.append({"kind": kind, "part": p, "a": x, "b": y, "delta": delta,
                         "causes": causes(a, b, p) if delta else []})
    differences = sorted((r for r in rows if r["delta"] and abs(r["delta"]) >= 5e-4),
                         key=lambda r: (r["kind"] != "time", -abs(r["delta"])))
    steps = attribution(a, b) if a.profile is not None else []
    explained = [_explain(r, a, b, steps) for r in differences]
    head = {k: {"a": ea.get(k), "b": eb.get(k)} for k in HEADLINE}
    head["peak_gib"] = {"a": (ea.get("memory") or {}).get("peak_gib"), "b": (eb.get("memory") or {}).get("peak_gib")}
    head["feasible"] = {"a": ea.get("feasible"), "b": eb.get("feasible")}
    gain = None
    if ea.get("tokens_per_s_per_device") and eb.get("tokens_per_s_per_device"):
        gain = eb["tokens_per_s_per_device"] / ea["tokens_per_s_per_device"] - 1.0
    return {"a": _side_json(a), "b": _side_json(b), "headline": head, "gain": gain, "parts": rows,
            "differences": explained, "settings": _settings(a, b),
            "steps": [{"settings": _steps_words(a, b, g), "groups": list(g), "deltas": d} for g, d in steps]}


def _explain(r: dict, a: Side, b: Side, steps: list) -> dict:
    """One part's difference split over the steps from A to B that move it, largest first, each with the
    settings it changes, the model's reason for them, and its own amount."""
    part, unit = r["part"], _unit(r["part"])
    name = part.removesuffix("_s").removesuffix("_gib")
    effects = []
    for groups, deltas in steps:
        d = deltas.get(part)
        if d is None or abs(d) < 5e-3:
            continue
        fields = {f for g in groups for f in GROUPS[g]} | ({"sp"} if "tp" in groups else set())
        why = [c.split(": ", 1)[1] for c in r["causes"] if ": " in c and c.split(" ", 1)[0] in fields]
        effects.append({"settings": _steps_words(a, b, groups), "delta": d, "why": why})
    effects.sort(key=lambda e: -abs(e["delta"]))
    pieces = [e["settings"] + (f" ({'; '.join(e['why'])})" if e["why"] else "") + f": {_num(e['delta'], unit)}"
              for e in effects] or ["; ".join(r["causes"]) or "a knock-on of the other changes"]
    text = f"{name} {_num(r['delta'], unit)} = " + " | ".join(pieces)
    return {"kind": r["kind"], "part": part, "delta": r["delta"], "causes": r["causes"], "effects": effects,
            "text": text}


def _num(x: float, unit: str) -> str:
    return f"{x:+.2f} {unit}".replace("-", "−")


def _side_json(s: Side) -> dict:
    return {"label": s.label, "devices": s.devices, "config": s.config.model_dump(mode="json", exclude_defaults=True)}


def _settings(a: Side, b: Side) -> list[dict]:
    """Every driver that differs between A and B (the config's changes, in one list)."""
    out = []
    for name, read, _ in _drivers():
        va, vb = read(a), read(b)
        if va != vb:
            out.append({"setting": name, "a": _show(va), "b": _show(vb)})
    return out


def side(label: str, spec: ModelSpec, config: TrainingConfig, devices: int, profile) -> Side:
    """One side of a comparison: the config evaluated on ``profile`` (the CLI's and the API's evaluation)."""
    from .results import evaluate

    return Side(label, spec, config, devices, evaluate(spec, profile, devices, config),
                int(profile.fact("scale_up_domain")), profile)


def load_side(ref: str, cluster: str | None, model: str | None, devices: int | None, framework: str | None = None,
              field: str = "A"):
    """A side from the command line: ``RESULT.json#RANK`` (a search result's ranked config, with its model,
    cluster and devices), a config file (JSON/YAML; needs the model and devices), or anything else as a
    launch script (its model and devices; ``InputError`` naming ``field`` when it cannot be read).
    Returns (label, spec, config, devices, cluster name)."""
    import json
    import os

    from .errors import InputError
    from .inputs import load_config, load_model

    path, sep, rank = ref.partition("#")
    if sep:
        try:
            result = json.load(open(path, encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InputError(field, f"cannot read {path!r} as a search result ({exc})") from None
        inputs = result.get("inputs") if isinstance(result, dict) else None
        if not isinstance(inputs, dict) or not isinstance(inputs.get("model"), dict):
            raise InputError(field, f"{path!r} is not a `paraplan search --json` result (no inputs.model)")
        entries = {e.get("rank"): e for e in result.get("top") or [] if isinstance(e, dict)}
        if not rank.isdigit() or int(rank) not in entries:
            raise InputError(field, f"rank {rank!r} is not among the result's ranks ({len(entries)} configs)")
        return (f"{os.path.basename(path)}#{rank}", load_model(inputs["model"]), load_config(entries[int(rank)]["config"]),
                devices or inputs.get("devices"), cluster or inputs.get("cluster"))
    if not os.path.exists(ref) and ref != "-":
        raise InputError(field, f"{ref!r}: no such file")
    if ref.endswith((".json", ".yaml", ".yml")):
        if model is None:
            raise InputError("model", f"{ref} is a config: give --model (or compare with a result or a script)")
        return os.path.basename(ref), load_model(model), load_config(ref), devices, cluster
    from .launch_import import read_launch_file

    try:
        imp = read_launch_file(ref, framework)
    except InputError as exc:
        raise InputError(f"{field}.{exc.field}", exc.reason) from None
    return os.path.basename(ref), imp.spec, imp.config, devices or imp.devices, cluster


def comparison_html(cmp: dict, title: str = "Your launch and the search's best") -> str:
    """The comparison as an HTML section (the report's): the parts side by side, then the causes by size."""
    import html

    def f(x, spec=".3f"):
        return "—" if x is None else format(x, spec)

    a, b = html.escape(cmp["a"]["label"]), html.escape(cmp["b"]["label"])
    head = cmp["headline"]
    rows = [f"<tr><td>{k.replace('_', ' ')}</td><td>{f(head[k]['a'])}</td><td>{f(head[k]['b'])}</td>"
            f"<td>{f(None if head[k]['a'] is None or head[k]['b'] is None else head[k]['b'] - head[k]['a'], '+.3f')}"
            "</td></tr>" for k in ("step_time_s", "tokens_per_s_per_device", "mfu", "peak_gib")]
    rows += [f"<tr><td>{r['kind']} {html.escape(r['part'])}</td><td>{f(r['a'])}</td><td>{f(r['b'])}</td>"
             f"<td>{f(r['delta'], '+.3f')}</td></tr>" for r in cmp["parts"]]
    gain = "" if cmp["gain"] is None else f"<p>B over A: <b>{cmp['gain']:+.1%}</b> tokens/s per device.</p>"
    causes = "".join(f"<li>{html.escape(d['text'])}</li>" for d in cmp["differences"])
    return f"""<h2 id="comparison">{html.escape(title)}</h2>
<p class="note">A = {a}, B = {b}. Every time part (s per step) and memory part (GiB at the peak stage);
each difference split over the steps from A to B that make it, each step scored by the cost model
(docs/guides/import-compare.md).</p>
{gain}
<table class="comparison"><thead><tr><th>part</th><th>A</th><th>B</th><th>B − A</th></tr></thead>
<tbody>{''.join(rows)}</tbody></table>
<ul class="causes">{causes}</ul>
"""

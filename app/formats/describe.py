"""Short human-readable descriptions shared by the CLI tables and the HTML report."""


def _algorithm_marks(cfg: dict) -> list[str]:
    """The searched communication algorithms where they differ from the config defaults (hierarchical
    dispatch, the p2p ring): two ranked configs may differ only there."""
    marks = []
    if cfg.get("ep", 1) > 1 and cfg.get("moe_a2a_algorithm") == "flat":
        marks.append("flat-dispatch")
    if cfg.get("cp", 1) > 1 and cfg.get("cp_comm_type", "p2p") != "p2p":
        marks.append(f"cp_comm={cfg['cp_comm_type']}")
    return marks


def _memory_marks(cfg: dict) -> list[str]:
    """What a config does with its activations beyond recompute: the modules it offloads (swaps) to host
    memory. Two ranked configs may differ only there, and a config that swaps reads ``recompute=none``."""
    mods = cfg.get("offload_modules")
    return [f"offload({'+'.join(mods)})"] if mods else []


def _pipeline_marks(cfg: dict) -> list[str]:
    """The pipeline choices beside pp and vpp: the embedding and loss layer slots, a stage-by-stage layer
    layout (the search's balanced split), the DualPipe schedules, and the gradient reduction's overlap
    turned off (which DualPipeV needs)."""
    marks = []
    emb, loss = cfg.get("account_for_embedding_in_pipeline_split"), cfg.get("account_for_loss_in_pipeline_split")
    if emb or loss:
        marks.append("emb/loss-slots" if emb and loss else ("emb-slot" if emb else "loss-slot"))
    marks += [f"{k.split('_')[0]}={cfg[k]}" for k in ("first_stage_layers", "last_stage_layers")
              if cfg.get(k) is not None]
    if cfg.get("pipeline_layout"):
        marks.append("layer-layout")
    if cfg.get("pipeline_schedule") in ("dualpipe", "dualpipev"):
        marks.append(cfg["pipeline_schedule"])
    if cfg.get("overlap_grad_reduce") is False:
        marks.append("no-grad-overlap")
    return marks


def _recompute_text(cfg: dict) -> str:
    text = f"recompute={cfg.get('recompute', 'none')}"
    if cfg.get("recompute") == "selective":
        text += f"({'+'.join(cfg.get('recompute_modules') or ['core_attn'])})"
    if cfg.get("recompute") == "full" and cfg.get("recompute_num_layers"):
        text += f"({cfg['recompute_num_layers']} layers)"
    return text


def config_brief(cfg: dict) -> str:
    """One line naming a config's layout, recompute, offload and the flags that differ from the defaults."""
    keys = ("tp", "pp", "vpp", "cp", "ep", "etp", "dp", "micro_batch_size")
    text = " ".join(f"{k.replace('micro_batch_size', 'mbs')}={cfg[k]}" for k in keys if k in cfg)
    if "recompute" in cfg or cfg.get("offload_modules"):
        text += " " + _recompute_text(cfg)
    flags = _memory_marks(cfg) + [f for f in ("tp_comm_overlap", "moe_a2a_overlap") if cfg.get(f)]
    flags += _algorithm_marks(cfg)
    if not cfg.get("distributed_optimizer", True):
        flags.append("no-distopt")
    flags += _pipeline_marks(cfg)
    return text + (" " + " ".join(flags) if flags else "")


def distinct_briefs(configs: list[dict], brief=config_brief) -> list[str]:
    """``brief`` of each config, where two configs that differ but would read the same also name the
    fields they differ in (``key=value``): no two rows of a table of ranked configs look identical."""
    texts = [brief(c) for c in configs]
    extra: set[str] = set()
    for i, a in enumerate(configs):
        for j in range(i + 1, len(configs)):
            if texts[i] == texts[j] and a != configs[j]:
                extra |= {k for k in a.keys() | configs[j].keys() if a.get(k) != configs[j].get(k)}
    return [t + "".join(f" {k}={_value(c.get(k))}" for k in sorted(extra)) for t, c in zip(texts, configs)]


def _value(v) -> str:
    if isinstance(v, list):
        return "+".join(map(str, v)) or "[]"
    return "—" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


LAYOUT_KEYS = ("tp", "pp", "cp", "ep", "etp", "dp")


def layout_brief(cfg: dict) -> str:
    """The parallel layout of a config (the sizes that make two configs the same layout, and dp)."""
    return " ".join(f"{k}={cfg[k]}" for k in LAYOUT_KEYS if k in cfg)


def variant_brief(cfg: dict) -> str:
    """What a config chooses inside its layout: vpp, micro-batch, recompute, offload, the overlaps and the
    pipeline split."""
    text = f"vpp={cfg.get('vpp', 1)} mbs={cfg.get('micro_batch_size')} {_recompute_text(cfg)}"
    marks = _memory_marks(cfg) + [f for f in ("tp_comm_overlap", "moe_a2a_overlap") if cfg.get(f)]
    if not cfg.get("distributed_optimizer", True):
        marks.append("no-distopt")
    return text + "".join(f" {m}" for m in marks + _pipeline_marks(cfg) + _algorithm_marks(cfg))


def count_text(n, noun: str) -> str:
    """``n`` and its noun, singular for exactly one ("1 wave", "4 waves"); a missing count reads "?"."""
    return f"{n} {noun}" if n == 1 else f"{'?' if n is None else n} {noun}s"


def margin_mark(entry: dict) -> str:
    """The margin column of a ranked entry: ``ok``, ``SHORT`` (headroom below the margin), or ``—``
    when the result carries no margin (older results)."""
    keeps = entry.get("keeps_margin")
    return "—" if keeps is None else ("ok" if keeps else "SHORT")

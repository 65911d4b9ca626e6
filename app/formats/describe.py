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


def config_brief(cfg: dict) -> str:
    """One line naming a config's layout, recompute and the flags that differ from the defaults."""
    keys = ("tp", "pp", "vpp", "cp", "ep", "etp", "dp", "micro_batch_size", "recompute")
    text = " ".join(f"{k.replace('micro_batch_size', 'mbs')}={cfg[k]}" for k in keys if k in cfg)
    if cfg.get("recompute") == "selective":
        text += f"({'+'.join(cfg.get('recompute_modules') or ['core_attn'])})"
    if cfg.get("recompute") == "full" and cfg.get("recompute_num_layers"):
        text += f"({cfg['recompute_num_layers']} layers)"
    flags = [f for f in ("tp_comm_overlap", "moe_a2a_overlap") if cfg.get(f)] + _algorithm_marks(cfg)
    if not cfg.get("distributed_optimizer", True):
        flags.append("no-distopt")
    split = [k for k in ("first_stage_layers", "last_stage_layers") if k in cfg]
    if cfg.get("account_for_embedding_in_pipeline_split"):
        flags.append("emb/loss-slots")
    flags += [f"{k.split('_')[0]}={cfg[k]}" for k in split]
    return text + (" " + " ".join(flags) if flags else "")


LAYOUT_KEYS = ("tp", "pp", "cp", "ep", "etp", "dp")


def layout_brief(cfg: dict) -> str:
    """The parallel layout of a config (the sizes that make two configs the same layout, and dp)."""
    return " ".join(f"{k}={cfg[k]}" for k in LAYOUT_KEYS if k in cfg)


def variant_brief(cfg: dict) -> str:
    """What a config chooses inside its layout: vpp, micro-batch, recompute and the pipeline split."""
    text = f"vpp={cfg.get('vpp', 1)} mbs={cfg.get('micro_batch_size')} recompute={cfg.get('recompute', 'none')}"
    if cfg.get("recompute") == "selective":
        text += f"({'+'.join(cfg.get('recompute_modules') or ['core_attn'])})"
    if cfg.get("recompute") == "full" and cfg.get("recompute_num_layers"):
        text += f"({cfg['recompute_num_layers']} layers)"
    if cfg.get("account_for_embedding_in_pipeline_split"):
        text += " emb/loss-slots"
    text += "".join(f" {k.split('_')[0]}={cfg[k]}" for k in ("first_stage_layers", "last_stage_layers") if k in cfg)
    return text + "".join(f" {m}" for m in _algorithm_marks(cfg))


def margin_mark(entry: dict) -> str:
    """The margin column of a ranked entry: ``ok``, ``SHORT`` (headroom below the margin), or ``—``
    when the result carries no margin (older results)."""
    keeps = entry.get("keeps_margin")
    return "—" if keeps is None else ("ok" if keeps else "SHORT")

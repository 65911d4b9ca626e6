"""Pinned fields (``fixed``): their checks, the dimension values they leave, the per-search constants and
the routing distribution a pin gives."""

from __future__ import annotations



from costmodel import TrainingConfig, routing
from costmodel.spec import ModelSpec

from .. import frameworks

from .dimensions import ALGORITHM_DEFAULTS, SPLIT_FIELDS, RecomputeOption, SpaceError


def _apply_fixed(values: dict[str, list], fixed: dict) -> dict[str, list]:
    values = dict(values)
    for key in ("tp", "cp", "pp", "vpp", "ep", "etp", "micro_batch_size", "distributed_optimizer",
                "tp_comm_overlap", "moe_a2a_overlap", "moe_a2a_algorithm", "cp_comm_type"):
        if key in fixed:
            values[key] = [fixed[key]]
    if any(k in fixed for k in ("recompute", "recompute_modules", "recompute_num_layers")):
        opts = [o for o in values["recompute"] if not o.offload]  # a pinned recompute pins offload off
        if "recompute" in fixed:
            opts = [o for o in opts if o.recompute == fixed["recompute"]]
        if "recompute_modules" in fixed:
            mods = tuple(fixed["recompute_modules"])
            opts = [RecomputeOption("selective", mods)]
        if "recompute_num_layers" in fixed:
            opts = [RecomputeOption("full", None, fixed["recompute_num_layers"])]
        if fixed.get("recompute") == "selective" and not opts:
            opts = [RecomputeOption("selective", ("core_attn",))]
        values["recompute"] = opts
    if "offload_modules" in fixed:  # every recompute plan with the pinned offload (none with full recompute)
        off = tuple(fixed["offload_modules"] or ()) or None
        plans = {RecomputeOption(o.recompute, o.modules, o.num_layers, off): None for o in values["recompute"]
                 if off is None or o.recompute != "full"}
        values["recompute"] = list(plans)
    if any(k in fixed for k in SPLIT_FIELDS):
        values["split"] = ["fixed"]
    return values


# Config fields the search does not vary: one value for the whole search (pinned, or the framework's).
# The router's distribution and the experts' placement (costmodel/routing.py): pinned inputs, one for the
# whole search; the imbalance they give depends on each config's ep.
ROUTING_FIELDS = ("moe_expert_load", "moe_expert_skew", "expert_placement", "moe_expert_replicas")
CONSTANT_FIELDS = ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype",
                   "data_parallel_sharding_strategy", "moe_token_dispatcher_type", "attention_kernel", "fp8_recipe",
                   "delay_wgrad_compute", "activation_func_fp8_input_store", "parameter_ema", "mla_fa_without_pad")


def _with_dispatch_pin(fixed: dict) -> dict:
    """A pinned ``moe_token_dispatcher_type`` decides the dispatch: it pins ``moe_a2a_algorithm`` to the one
    it implies (flex hierarchical, the others flat; TrainingConfig refuses the two disagreeing), so the
    searched algorithm column and the configs the search writes agree with it."""
    d = fixed.get("moe_token_dispatcher_type")
    if d is not None and "moe_a2a_algorithm" not in fixed:
        fixed["moe_a2a_algorithm"] = "hierarchical" if d == "flex" else "flat"
    return fixed


def _constants(spec: ModelSpec, fixed: dict, framework: str | None) -> dict:
    """The pinned constants; a pinned algorithm must be one the framework can launch (``frameworks.
    ALGORITHMS``: e.g. MindSpeed-LLM has no hierarchical all-to-all)."""
    d = fixed.get("moe_token_dispatcher_type")
    if d is not None and spec.is_moe and framework is not None and d not in frameworks.DISPATCHERS[framework]:
        raise SpaceError("fix.moe_token_dispatcher_type", f"{frameworks.LABELS[framework]} cannot launch the {d} "
                                                          f"dispatcher (it offers {', '.join(frameworks.DISPATCHERS[framework])})")
    for name in ALGORITHM_DEFAULTS:
        if name in fixed and fixed[name] not in frameworks.algorithm_values(framework, name):
            if name == "moe_a2a_algorithm" and not spec.is_moe:
                continue  # no dispatch in a dense model
            raise SpaceError(f"fix.{name}", f"{frameworks.LABELS[framework]} cannot launch {fixed[name]} "
                                            f"(it offers {', '.join(frameworks.algorithm_values(framework, name))})")
    if fixed.get("delay_wgrad_compute") and fixed.get("moe_a2a_overlap") is not True:
        raise SpaceError("fix.delay_wgrad_compute", "delaying the weight gradients needs the all-to-all overlap: "
                                                    "pin moe_a2a_overlap=true too")
    return {k: fixed[k] for k in CONSTANT_FIELDS if k in fixed}


def _routing_imbalance(spec: ModelSpec, fixed: dict, eps: list[int], moe_load_imbalance: float | None,
                       framework: str | None) -> tuple[dict, dict[int, float]]:
    """(the pinned routing fields, max/mean tokens per EP rank for each ep that divides the experts);
    no imbalance table without a distribution. SpaceError names the field that does not fit, and a
    placement the framework cannot launch (``frameworks.express`` refuses ``balanced``: a result still
    reports what it would give, ``moe_routing.imbalance_balanced``)."""
    pinned = {k: fixed[k] for k in ROUTING_FIELDS if k in fixed}
    if framework is not None and pinned.get("expert_placement", "contiguous") != "contiguous":
        raise SpaceError("fix.expert_placement", f"{frameworks.LABELS[framework]} cannot launch a "
                                                 f"{pinned['expert_placement']} placement: no launch flag places "
                                                 "experts by load (both frameworks place them contiguously)")
    if pinned.get("moe_expert_load") is None and pinned.get("moe_expert_skew") is None:
        return pinned, {}
    name = "moe_expert_load" if pinned.get("moe_expert_load") is not None else "moe_expert_skew"
    if moe_load_imbalance is not None:
        raise SpaceError(f"fix.{name}", "a routing distribution sets the imbalance: give it or "
                                        "moe_load_imbalance, not both")
    cfg = TrainingConfig.model_validate({"global_batch_size": 1, **pinned})
    if (problem := routing.routing_problem(spec, cfg)) is not None:
        raise SpaceError(f"fix.{problem[0]}", problem[1])
    shares = routing.expert_shares(spec, cfg)
    return pinned, {e: routing.rank_imbalance(shares, e, cfg.expert_placement, cfg.moe_expert_replicas)
                    for e in eps if spec.num_experts % e == 0}


def validate_fixed(fixed: dict, global_batch_size: int) -> dict:
    """Type-check pinned fields through the config schema; raises SpaceError naming ``fix.KEY``."""
    from pydantic import ValidationError

    unknown = [k for k in fixed if k not in TrainingConfig.model_fields or k in ("global_batch_size", "dp")]
    if unknown:
        raise SpaceError(f"fix.{unknown[0]}", "not a config field that a search chooses")
    for key in ("precision", "moe_load_imbalance"):
        if key in fixed:
            raise SpaceError(f"fix.{key}", "is an input of the search (--precision, --moe-load-imbalance), not searched")
    # pins that need a partner the search sets (precision) or checks itself (build_space: the overlap)
    partners = {"precision": "fp8"} if fixed.get("fp8_recipe") is not None else {}
    if fixed.get("delay_wgrad_compute"):
        partners["moe_a2a_overlap"] = True
    try:
        cfg = TrainingConfig.model_validate({"global_batch_size": global_batch_size, **partners, **fixed})
    except ValidationError as exc:
        err = exc.errors()[0]
        raise SpaceError(f"fix.{'.'.join(map(str, err['loc']))}", err["msg"]) from None
    return {k: getattr(cfg, k) for k in fixed}

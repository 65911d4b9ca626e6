"""Building a search's space: the split rows per (pp, vpp), the grid of layouts, the cost model's validity
rules and the framework's mask applied, the searched algorithms added where they matter."""

from __future__ import annotations

from itertools import product
from typing import Callable

import numpy as np

from costmodel import validity
from costmodel.batch import CP_COMM_CODES, DEFAULT_MOE_LOAD_IMBALANCE, NO_VALUE, SCHEDULE_CODES
from costmodel.pipeline import stage_sets
from costmodel.spec import ClusterProfile, ModelSpec

from .core import SearchSpace
from .dimensions import SPLIT_FIELDS, SpaceError, _values
from .expressible import _keep_expressible
from .pins import _apply_fixed, _constants, _routing_imbalance, _with_dispatch_pin
from .splits import _schedule_fits, _split_fields


def build_space(spec: ModelSpec, profile: ClusterProfile, devices: int, global_batch_size: int, *,
                precision: str = "bf16", moe_load_imbalance: float | None = None,
                fixed: dict | None = None, allow_cross_domain_tp: bool = False,
                framework: str | None = None, check: Callable[[], None] | None = None) -> SearchSpace:
    """All valid configs of one search. ``fixed`` pins config fields (validated by the caller).

    ``framework`` (``search.frameworks.FRAMEWORKS``) keeps only the configs that framework can express;
    None offers every option the cost model has (the CLI and the service always name one). ``check`` is
    called between the steps of the build (``SearchSpace.check``) and may raise to stop it."""
    check = check or (lambda: None)
    fixed, constants, values, routed, imbalance_by_ep = _dimensions(spec, profile, devices, precision,
                                                                     moe_load_imbalance, fixed,
                                                                     allow_cross_domain_tp, framework)
    imbalance = DEFAULT_MOE_LOAD_IMBALANCE if moe_load_imbalance is None else moe_load_imbalance

    layouts: list[str] = []
    if "pipeline_layout" in fixed:
        layouts.append(fixed["pipeline_layout"])
    # Split options per (pp, vpp): computed once, in Python (a few hundred pairs at most).
    split_rows = []
    for pp, vpp, mode in product(values["pp"], values["vpp"], values["split"]):
        if vpp > 1 and pp == 1:
            continue
        if mode == "fixed":
            fields = {k: fixed[k] for k in SPLIT_FIELDS if k in fixed}
        else:
            fields = _split_fields(spec, pp, vpp, mode)
            if fields is None:
                continue
        if not _schedule_fits(fields.get("pipeline_schedule"), pp, vpp):
            continue
        if "pipeline_layout" in fields and fields["pipeline_layout"] not in layouts:
            layouts.append(fields["pipeline_layout"])
        split_rows.append((pp, vpp, fields))
    check()
    # every (split row, tp, cp, ep, etp, micro-batch), in itertools.product's order
    axes = [np.arange(len(split_rows))] + [np.asarray(values[k], dtype=np.int64)
                                           for k in ("tp", "cp", "ep", "etp", "micro_batch_size")]
    if not split_rows or any(len(a) == 0 for a in axes):
        raise SpaceError("pp", "no pipeline size fits this device count and model")
    g = np.stack([m.reshape(-1) for m in np.meshgrid(*axes, indexing="ij")], axis=1)
    split_idx = g[:, 0]
    pp_col = np.array([r[0] for r in split_rows], dtype=np.int64)[split_idx]
    vpp_col = np.array([r[1] for r in split_rows], dtype=np.int64)[split_idx]
    field_col = lambda key, default: np.array([r[2].get(key, default) for r in split_rows])[split_idx]  # noqa: E731
    parallel = {
        "tp": g[:, 1], "cp": g[:, 2], "pp": pp_col, "vpp": vpp_col, "ep": g[:, 3], "etp": g[:, 4],
        "micro_batch_size": g[:, 5],
        "first_stage_layers": field_col("first_stage_layers", NO_VALUE).astype(np.int64),
        "last_stage_layers": field_col("last_stage_layers", NO_VALUE).astype(np.int64),
        "account_for_embedding": field_col("account_for_embedding_in_pipeline_split", False).astype(bool),
        "account_for_loss": field_col("account_for_loss_in_pipeline_split", False).astype(bool),
        "layout_id": np.array([layouts.index(r[2]["pipeline_layout"]) if "pipeline_layout" in r[2] else NO_VALUE
                               for r in split_rows], dtype=np.int64)[split_idx],
        "schedule": np.array([SCHEDULE_CODES[r[2].get("pipeline_schedule") or "1f1b"] for r in split_rows],
                             dtype=np.int64)[split_idx],
        # the algorithms' resting values; _with_algorithms adds the others where they matter
        "moe_a2a_hierarchical": np.zeros(len(g), dtype=bool), "cp_comm": np.zeros(len(g), dtype=np.int64),
    }
    options = [(r, d, t, a) for r, d, t, a in product(values["recompute"], values["distributed_optimizer"],
                                                         values["tp_comm_overlap"], values["moe_a2a_overlap"])]
    space = SearchSpace(spec=spec, profile=profile, devices=devices, global_batch_size=global_batch_size,
                        precision=precision, moe_load_imbalance=imbalance, values=values, fixed=fixed,
                        parallel=parallel, options=options, layouts=layouts, framework=framework,
                        constants=constants, routing=routed, imbalance_by_ep=imbalance_by_ep, check=check)
    # Keep the layouts every validity rule accepts, checked by the cost model's own code.
    ok = np.concatenate([_valid_rows(space, np.arange(start, min(start + VALIDITY_CHUNK, len(g))))
                         for start in range(0, len(g), VALIDITY_CHUNK)])
    if not allow_cross_domain_tp and "tp" not in fixed:
        ok &= parallel["tp"] <= int(profile.fact("scale_up_domain"))
    check()
    space.parallel = _with_algorithms(space, {k: v[ok] for k, v in parallel.items()})
    check()
    if framework is not None and ok.any():
        _keep_expressible(space)
    if space.size == 0:
        if fixed:
            raise SpaceError("fix", f"the pinned values ({', '.join(f'{k}={v}' for k, v in fixed.items())}) "
                                    "leave no structurally valid config")
        raise _no_config_error(devices, global_batch_size, int(profile.fact("scale_up_domain")))
    space.check = None  # the build's own: a sampler's round is not stopped half-told
    return space


# Grid rows checked per call of the validity rules: a batch of all of them (half a million rows and more)
# would be a few hundred MB of fresh pages for the same operations.
VALIDITY_CHUNK = 100_000


def _valid_rows(space: SearchSpace, rows: np.ndarray) -> np.ndarray:
    """Which of the layout rows ``rows`` (of ``space.parallel``, option 0) every validity rule and the
    pipeline split accept."""
    probe = space.make_batch(rows, np.zeros(len(rows), dtype=np.int64))
    spec, profile = space.spec, space.profile
    broken = np.logical_or.reduce([r.broken for r in validity.check(spec, probe, space.devices, profile.has_fp8,
                                                                    profile.has_host_link)])
    if space.check is not None:
        space.check()
    return ~broken & stage_sets(spec, probe).valid


def check_pins(spec: ModelSpec, profile: ClusterProfile, devices: int, global_batch_size: int, *,
               precision: str = "bf16", moe_load_imbalance: float | None = None, fixed: dict | None = None,
               allow_cross_domain_tp: bool = False, framework: str | None = None) -> None:
    """The checks of ``build_space`` that enumerate no layout (milliseconds, where the build takes seconds
    on a large MoE model): the pins against the model, the framework and the precision, the routing inputs,
    a dimension the pins leave with no value, and a device count and batch that no tp × pp × cp and
    micro-batch size can split (Megatron's rule: dp = devices / (tp·pp·cp) a whole number, the global
    batch a multiple of micro-batch × dp). Raises ``SpaceError`` as ``build_space`` would; a space these
    pass may still turn out empty (the validity rules), which only the build finds."""
    _, _, values, _, _ = _dimensions(spec, profile, devices, precision, moe_load_imbalance, fixed,
                                     allow_cross_domain_tp, framework)
    for tp, pp, cp in product(values["tp"], values["pp"], values["cp"]):
        if devices % (tp * pp * cp) == 0:
            dp = devices // (tp * pp * cp)
            if any(global_batch_size % (mbs * dp) == 0 for mbs in values["micro_batch_size"]):
                return
    raise _no_config_error(devices, global_batch_size, int(profile.fact("scale_up_domain")))


def _dimensions(spec, profile, devices, precision, moe_load_imbalance, fixed, allow_cross_domain_tp, framework):
    """The pins (with the dispatch pin), the constant fields, each dimension's values, and the routing."""
    fixed = _with_dispatch_pin(dict(fixed or {}))
    constants = _constants(spec, fixed, framework)
    if constants.get("fp8_recipe") is not None and precision != "fp8":
        raise SpaceError("fix.fp8_recipe", "applies to precision fp8 only (--precision fp8)")
    values = _apply_fixed(_values(spec, profile, devices, allow_cross_domain_tp, framework), fixed)
    routed, imbalance_by_ep = _routing_imbalance(spec, fixed, values["ep"], moe_load_imbalance, framework)
    for key, vals in values.items():
        if not vals:
            raise SpaceError(f"fix.{key}" if key in fixed else key, "no value is left for this dimension")
    return fixed, constants, values, routed, imbalance_by_ep


def _no_config_error(devices: int, global_batch_size: int, node_size: int) -> SpaceError:
    """Name what the user most likely got wrong when no layout is valid: a device count that is not a
    whole number of nodes (e.g. 6,143 on 8-device nodes) is the devices' fault, not the batch's."""
    if devices % node_size:
        return SpaceError("devices", f"{devices} devices are not a whole number of {node_size}-device nodes, "
                                     f"and no layout on them divides global batch {global_batch_size} into "
                                     f"micro-batches (try {devices - devices % node_size} or "
                                     f"{devices + node_size - devices % node_size})")
    return SpaceError("global_batch_size", f"no structurally valid config for {devices} devices and "
                                           f"global batch {global_batch_size}: it must divide by "
                                           "micro_batch_size*dp for some layout")


def _with_algorithms(space: SearchSpace, par: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The layouts ``par`` (algorithm columns at zero) with each searched algorithm value where it makes
    a difference (see the module docstring): a layout holds the resting value (``SearchSpace.resting``)
    and, where the algorithm matters, every other value offered. Rows stay grouped by layout."""
    a2a_rest, cp_rest = space.resting("moe_a2a_algorithm"), space.resting("cp_comm_type")
    leaves = space.ep_leaves_domain(par["ep"], par["etp"])
    tp, cp = par["tp"], par["cp"]
    inside = np.gcd(cp, np.maximum(space._domain() // tp, 1))  # the Ulysses part of a2a+p2p (costmodel/layers.py)
    heads = space.spec.num_attention_heads
    keeps, hier, comm = [], [], []
    for a2a, kind in product(space.values["moe_a2a_algorithm"], space.values["cp_comm_type"]):
        keep = np.ones(len(tp), dtype=bool)
        if a2a != a2a_rest:
            keep &= leaves
        if kind != cp_rest:
            keep &= cp > 1
            ulysses = {"a2a": cp, "a2a+p2p": inside}.get(kind)
            if kind == "a2a+p2p":
                keep &= (inside > 1) & (inside < cp)  # else it is p2p or a2a
            if ulysses is not None:
                keep &= heads % (ulysses * tp) == 0
        keeps.append(keep)
        hier.append(a2a == "hierarchical")
        comm.append(CP_COMM_CODES[kind])
    # (layout, algorithm pair) in row-major order: each layout's kept pairs together, in the pairs' order
    row, pair = np.nonzero(np.stack(keeps, axis=1))
    out = {k: v[row] for k, v in par.items()}
    out["moe_a2a_hierarchical"] = np.array(hier, dtype=bool)[pair]
    out["cp_comm"] = np.array(comm, dtype=np.int64)[pair]
    return out

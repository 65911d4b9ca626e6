"""Model, cluster and config inputs as the HTTP API takes them, checked before any work is done.

Over HTTP a string is a preset or profile *name* only (never a path on the server), ``"base"`` must
name a shipped preset or profile, and sizes are capped at values no real model or cluster comes near
(so that a typo cannot make the service enumerate billions of divisors or expand a giant layout
string). Every problem is a 422 naming the field.
"""

from __future__ import annotations

import math
from functools import lru_cache

import hardware_profiles
import model_presets
from app.formats.bounds import config_problems, layout_problem
from app.formats.inputs import InputError, check_config_for_model, load_cluster, load_config, load_model
from costmodel import ClusterProfile, ModelSpec, TrainingConfig

from .errors import field_loc, invalid

# The bounds of specs and configs are app/formats/bounds.py's, the same as the CLI's and files'.
GRID_CAP = 10_000_000  # rows of the parallel-layout grid a search may build (docs: Service section)


@lru_cache(maxsize=1)
def model_names() -> frozenset[str]:
    return frozenset(model_presets.names())


@lru_cache(maxsize=1)
def cluster_names() -> frozenset[str]:
    return frozenset(hardware_profiles.names())


@lru_cache(maxsize=64)
def preset_model(name: str, seq_length: int | None) -> ModelSpec:
    return load_model({"base": name, "seq_length": seq_length} if seq_length else name)


@lru_cache(maxsize=16)
def named_cluster(name: str) -> ClusterProfile:
    return load_cluster(name)


def _from_input_error(exc: InputError, root: str = "body"):
    return invalid(field_loc(exc.field, root), exc.reason)


def _check_base(value: dict, field: str, known: frozenset[str], what: str) -> None:
    base = value.get("base")
    if base is None:
        return
    if not isinstance(base, str) or base not in known:
        raise invalid(["body", field, "base"], f"unknown {what} {base!r}; known: {', '.join(sorted(known))}")


MAX_NAME_CHARS = 200


def _check_calibrate_from(value: dict) -> None:
    """A request's ``calibrate_from`` names a shipped profile, never a file: anything else is one 422 that
    does not echo the value and reads nothing, so it says nothing of the server's files."""
    name = value.get("calibrate_from")
    if name is not None and (not isinstance(name, str) or name not in cluster_names()):
        raise invalid(["body", "cluster", "calibrate_from"], "must name a shipped cluster profile (a request "
                                                             "never names a file); known: "
                                                             f"{', '.join(sorted(cluster_names()))}")


def resolve_model(value: str | dict, seq_length: int | None = None) -> ModelSpec:
    if isinstance(value, str):
        if value not in model_names():
            known = ", ".join(sorted(model_names()))
            raise invalid(["body", "model"], f"unknown model preset {value!r}; known: {known}")
        return preset_model(value, seq_length)
    _check_base(value, "model", model_names(), "model preset")
    try:
        spec = load_model(value, seq_length)
    except InputError as exc:
        raise _from_input_error(exc) from None
    except Exception as exc:  # noqa: BLE001 - any malformed spec is the caller's input, named as such
        raise invalid(["body", "model"], f"not a valid model spec ({exc})") from None
    return spec


def resolve_cluster(value: str | dict) -> ClusterProfile:
    if isinstance(value, str):
        if value not in cluster_names():
            raise invalid(["body", "cluster"],
                          f"unknown cluster profile {value!r}; known: {', '.join(sorted(cluster_names()))}")
        return named_cluster(value)
    _check_base(value, "cluster", cluster_names(), "cluster profile")
    _check_calibrate_from(value)
    try:
        profile = load_cluster(value)
    except InputError as exc:
        raise _from_input_error(exc) from None
    except Exception as exc:  # noqa: BLE001
        raise invalid(["body", "cluster"], f"not a valid cluster profile ({exc})") from None
    if len(profile.name) > MAX_NAME_CHARS:  # the jobs table keeps the cluster's name in 200 characters
        raise invalid(["body", "cluster", "name"], f"at most {MAX_NAME_CHARS} characters", "string_too_long")
    for key in ("peak_bf16_tflops", "memory_gib", "devices_per_node", "scale_up_domain"):
        if key in profile.facts:
            v = profile.fact(key)
            if v is None or not math.isfinite(v) or v <= 0:
                raise invalid(["body", "cluster", "facts", key, "value"], "must be a positive number")
    # Any other NaN, infinite or negative number would give a "feasible" result with null times.
    for group in ("facts", "efficiency"):
        for key, item in getattr(profile, group).items():
            if item.value is not None and (not math.isfinite(item.value) or item.value < 0):
                raise invalid(["body", "cluster", group, key, "value"], "must be a finite number >= 0")
    return profile


def check_layout(layout, loc: list) -> None:
    """Reject a pipeline_layout whose expansion would be huge (``(t|)*1000000000``)."""
    if (problem := layout_problem(layout)) is not None:
        raise invalid(loc, problem)


def check_config_ints(data: dict, loc: list) -> None:
    for key, reason in config_problems(data):
        raise invalid([*loc, key], reason)


def resolve_config(value: dict) -> TrainingConfig:
    check_config_ints(value, ["body", "config"])
    check_layout(value.get("pipeline_layout"), ["body", "config", "pipeline_layout"])
    try:
        return load_config(value)
    except InputError as exc:
        raise _from_input_error(exc) from None


def check_config_for(spec: ModelSpec, config: TrainingConfig) -> None:
    """What the config states about the model's experts fits the model (422 naming the field)."""
    try:
        check_config_for_model(spec, config)
    except InputError as exc:
        raise _from_input_error(exc) from None


def layer_slots(spec: ModelSpec) -> int:
    """Decoder and MTP layers plus the embedding and the loss: no pipeline has more virtual stages."""
    return spec.num_layers + spec.mtp_num_layers + 2


def check_stages(spec: ModelSpec, pp, vpp, loc: list) -> None:
    """pp·vpp beyond the layer slots is impossible (every virtual stage holds at least one slot), and
    the cost model's per-stage arrays grow with it: a 422 rather than gigabytes of zeros."""
    pp = pp if isinstance(pp, int) and pp > 0 else 1
    vpp = vpp if isinstance(vpp, int) and vpp > 0 else 1
    if pp * vpp > layer_slots(spec):
        field = "vpp" if vpp > 1 else "pp"
        raise invalid([*loc, field], f"pp·vpp = {pp * vpp:,} virtual pipeline stages, but the model has only "
                                     f"{layer_slots(spec):,} layer slots (layers, MTP layers, embedding, loss)")


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def grid_estimate(spec: ModelSpec, profile: ClusterProfile, devices: int, fixed: dict,
                  allow_cross_domain_tp: bool) -> int:
    """An upper bound on the rows of the layout grid that ``search.build_space`` builds."""
    one = lambda key, n: 1 if key in fixed else n  # noqa: E731
    pp = one("pp", sum(1 for d in _divisors(devices) if d <= spec.num_layers))
    heads = math.gcd(spec.num_attention_heads, spec.query_groups)
    domain = profile.fact("scale_up_domain") or devices
    tp = one("tp", sum(1 for d in _divisors(heads) if allow_cross_domain_tp or d <= domain))
    ep = one("ep", len(_divisors(spec.num_experts)) if spec.is_moe else 1)
    etp = one("etp", 4 if spec.is_moe else 1)
    split_fixed = any(k in fixed for k in ("first_stage_layers", "last_stage_layers", "pipeline_layout",
                                            "account_for_embedding_in_pipeline_split",
                                            "account_for_loss_in_pipeline_split"))
    return pp * one("vpp", 8) * (1 if split_fixed else 3) * tp * one("cp", 5) * ep * etp * one("micro_batch_size", 4)

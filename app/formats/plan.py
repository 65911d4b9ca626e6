"""The capacity plan's JSON (``paraplan plan --json``, the service's ``plan`` jobs): one shape for both.

``{"inputs": {...}, "points": [{"devices", "feasible", "config", "evaluation", "tokens_per_s", "days",
"device_hours", "cost", "pareto", ...}], "pareto": [devices], "chosen": devices | null, "chosen_reason",
"plan_time_s", "planning_fixed"}`` (docs/guides/capacity.md).
"""

from __future__ import annotations

import re

from costmodel import ClusterProfile, ModelSpec
from search.capacity import PlanRequest, run_plan

from .inputs import InputError

# Suffixes of a token count (decimal, as token budgets are quoted: "19T tokens" = 19 × 10^12).
TOKEN_SUFFIXES = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12, "P": 10**15}
MAX_TOKENS = 1e18  # a million times Pangu's 19T budget; more is a typo
_TOKENS = re.compile(r"^\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMBGTP]?)\s*$", re.IGNORECASE)


def parse_tokens(text: str, field: str = "tokens") -> float:
    """A token count: a plain number (``1.9e13``) or one with a decimal suffix K, M, B (= G), T, P
    (``19T``, ``500B``); positive and at most ``MAX_TOKENS``."""
    m = _TOKENS.match(str(text))
    if not m:
        raise InputError(field, f"{text!r} is not a number of tokens (e.g. 19T, 500B, 1.9e13)")
    value = float(m.group(1)) * TOKEN_SUFFIXES[m.group(2).upper()]
    if value <= 0:
        raise InputError(field, f"must be positive (got {text})")
    if value > MAX_TOKENS:
        raise InputError(field, f"{text} is beyond any training budget (at most {MAX_TOKENS:.0e})")
    return value


def tokens_text(tokens: float) -> str:
    """A token count as budgets are quoted, with the largest decimal suffix that leaves at least 1
    (19e12 -> "19T", 5e11 -> "500B", 1.25e13 -> "12.5T", 800 -> "800")."""
    for suffix in ("P", "T", "B", "M", "K"):
        if abs(tokens) >= TOKEN_SUFFIXES[suffix]:
            return f"{tokens / TOKEN_SUFFIXES[suffix]:.4g}{suffix}"
    return f"{tokens:.4g}"


def plan_inputs(spec: ModelSpec, profile: ClusterProfile, req: PlanRequest, resolved: dict) -> dict:
    """What the plan was asked, with the defaults it resolved (device range, step, batch tokens)."""
    return {"model": spec.model_dump(mode="json", exclude_none=True), "cluster": profile.name,
            "profile_version": profile.version(), "tokens": req.tokens, **resolved,
            "deadline_days": req.deadline_days, "price_per_device_hour": req.price_per_device_hour,
            "precision": req.precision, "moe_load_imbalance": req.moe_load_imbalance,
            "memory_margin_gib": req.memory_margin_gib, "framework": req.framework}


def plan_result(req: PlanRequest, progress=None, check=None) -> dict:
    """Run the plan and return its JSON (``inputs`` first)."""
    result = run_plan(req, progress=progress, check=check)
    resolved = result.pop("resolved")
    return {"inputs": plan_inputs(req.spec, req.profile, req, resolved), **result}


def is_plan(result: dict) -> bool:
    """Whether a result is a plan (``points``), not a search (``top``)."""
    return isinstance(result, dict) and "points" in result and "top" not in result

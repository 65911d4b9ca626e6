"""One config's evaluation as the CLI and the API report it: ``costmodel.evaluate`` plus the presentation
rule below.

When the devices do not divide by tp·pp·cp, dp (devices / (tp·pp·cp)) is undefined, and the rules that
need dp (``ep*etp must divide tp*cp*dp``, ``global_batch_size ... divisible by micro_batch_size*dp``)
would be stated with a rounded-down dp that no launch could have (``tp*cp*dp=368`` for 6,000 devices
and tp·pp·cp = 128): after the clear reason ``devices=... is not divisible by tp*pp*cp=...`` they are
left out (issue 17). The config is infeasible either way; only the list of reasons changes.
"""

from __future__ import annotations

from costmodel import evaluate as _evaluate

# The validity rules (costmodel/validity.py) whose check uses dp, and the rule that leaves dp undefined.
DP_UNDEFINED = "devices_divisible"
NEEDS_DP = frozenset({"ep_etp_divides", "global_batch_divisible", "dp_mismatch"})


def without_undefined_dp(result: dict) -> dict:
    reasons = result.get("infeasible_reasons") or []
    if any(r.get("code") == DP_UNDEFINED for r in reasons):
        result["infeasible_reasons"] = [r for r in reasons if r.get("code") not in NEEDS_DP]
    return result


def evaluate(spec, profile, devices: int, config) -> dict:
    """``costmodel.evaluate`` with the reasons that need an undefined dp left out."""
    return without_undefined_dp(_evaluate(spec, profile, devices, config))

"""One config's evaluation as the CLI and the API report it: ``costmodel.evaluate`` plus the presentation
rule below.

When the devices do not divide by tp·pp·cp, dp (devices / (tp·pp·cp)) is undefined, and the rules that
need dp (``ep*etp must divide tp*cp*dp``, ``global_batch_size ... divisible by micro_batch_size*dp``)
would be stated with a rounded-down dp that no launch could have (``tp*cp*dp=368`` for 6,000 devices
and tp·pp·cp = 128): after the clear reason ``devices=... is not divisible by tp*pp*cp=...`` they are
left out. The config is infeasible either way; only the list of reasons changes.
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


# A fact beyond these bounds is what makes a result non-finite (a peak of 1e-308 TFLOP/s gave a
# "feasible" result with null times): named in the error when the result is not finite.
FACT_TINY, FACT_HUGE = 1e-6, 1e12


def non_finite_fields(result: dict) -> list[str]:
    """The result's numbers that are null or not finite where the contract has numbers: every time, rate
    and memory figure of a feasible result, or of one whose only reason is that it does not fit (``oom``:
    its times and memory are still computed; ``host_oom`` alike)."""
    import math

    reasons = {r.get("code") for r in result.get("infeasible_reasons") or []}
    if not (result.get("feasible") or (reasons and reasons <= {"oom", "host_oom"})):
        return []  # structurally invalid: nulls are the contract's answer for what cannot be computed
    fields = [(k, result.get(k)) for k in ("step_time_s", "tokens_per_s", "tokens_per_s_per_device",
                                           "model_tflops_per_device", "mfu", "hfu")]
    fields += [(f"time.{k}", v) for k, v in (result.get("time") or {}).items()]
    memory = result.get("memory") or {}
    lists = ("per_stage_peak_gib", "per_stage_offloaded_gib", "per_stage_peak_without_offload_gib")
    fields += [(f"memory.{k}", v) for k, v in memory.items() if k not in lists]
    fields += [(f"memory.{k}[{i}]", v) for k in lists for i, v in enumerate(memory.get(k) or [])]
    return [k for k, v in fields if not isinstance(v, (int, float)) or not math.isfinite(v)]


def degenerate_facts(profile) -> dict[str, float]:
    """The profile's non-zero numeric facts beyond any real device (outside ``FACT_TINY``..``FACT_HUGE``)."""
    return {k: f.value for k, f in profile.facts.items()
            if isinstance(f.value, (int, float)) and not isinstance(f.value, bool) and f.value != 0
            and not (FACT_TINY <= abs(f.value) <= FACT_HUGE)}


def refuse_degenerate(profile) -> None:
    """An ``InputError`` naming the profile's first finite fact beyond any real device, before anything is
    evaluated: a peak of 1e-308 TFLOP/s overflows the cost model's arithmetic (inf and NaN times) rather than
    failing cleanly. NaN, infinite and negative values are left to the callers' own checks."""
    import math

    from .errors import InputError

    bad = {k: v for k, v in degenerate_facts(profile).items() if math.isfinite(v)}
    if bad:
        name, value = next(iter(bad.items()))
        raise InputError(f"cluster.facts.{name}", f"{value:g} is beyond any real device ({FACT_TINY:g} to "
                                                  f"{FACT_HUGE:g}): the evaluations would not be finite")


def check_finite(result: dict, profile) -> dict:
    """``result`` if its numbers are finite, else an ``InputError`` naming the cluster field to blame: the
    profile's facts beyond any real device (``cluster.facts.<name>`` when it is one), else ``cluster``; the
    message lists the result fields that came out null."""
    from .errors import InputError

    bad = non_finite_fields(result)
    if not bad:
        return result
    facts = degenerate_facts(profile)
    field = f"cluster.facts.{next(iter(facts))}" if len(facts) == 1 else "cluster"
    blamed = (f"the profile's {', '.join(f'{k}={v:g}' for k, v in facts.items())} "
              f"{'is' if len(facts) == 1 else 'are'} beyond any real device ({FACT_TINY:g} to {FACT_HUGE:g})"
              if facts else "the profile's facts")
    shown = ", ".join(bad[:6]) + (f" and {len(bad) - 6} more" if len(bad) > 6 else "")
    raise InputError(field, f"{blamed}: the evaluation's {shown} would not be finite numbers")

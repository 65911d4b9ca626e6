"""How the benchmarks compare the results of two runs (one process against N): equal in everything but the
wall-clock fields, which differ between any two runs."""

from __future__ import annotations


def without_times(x):
    """A result (JSON-like: dicts, lists, values) with every ``…time_s`` field left out, at any depth."""
    if isinstance(x, dict):
        return {k: without_times(v) for k, v in x.items() if not k.endswith("time_s")}
    if isinstance(x, list):
        return [without_times(v) for v in x]
    return x

"""What a search ranks by: throughput (the default) or goodput, the throughput left once failures,
checkpoints and restarts are priced (``costmodel.resilience``; docs/guides/goodput.md).

Both engines read a scored batch through ``ranking_tokens_per_s``: with ``goodput`` each config's tokens/s is
multiplied by its goodput fraction, which depends on the config through its checkpoint (the model states a
rank holds) and its step time (checkpoints fall between steps)."""

from __future__ import annotations

import numpy as np

from costmodel.resilience import ResilienceOptions, checkpoint_links, goodput_arrays, weight_replicas_of

OBJECTIVES = ("throughput", "goodput")


def ranking_tokens_per_s(space, br, batch) -> np.ndarray:
    """The tokens/s the ranking compares, one per config of ``batch`` (scored as ``br``); with goodput, 0 for
    a structurally invalid config (never ranked: a large batch leaves it unscored, with no step time)."""
    if getattr(space, "objective", "throughput") != "goodput":
        return br.tokens_per_s
    ok = br.valid
    replicas = weight_replicas_of(space.devices, batch.tp[ok], batch.pp[ok], batch.cp[ok])
    a = goodput_arrays(space.profile, space.devices, br.step_time_s[ok], br.params_bytes[ok], br.optimizer_bytes[ok],
                       replicas, *checkpoint_links(space.profile),
                       getattr(space, "resilience", None) or ResilienceOptions())
    ranked = np.zeros(len(br.valid))
    ranked[ok] = br.tokens_per_s[ok] * a["goodput"]
    return ranked

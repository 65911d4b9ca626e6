"""The exhaustive engine: score every config of the space through the vectorised cost model.

It keeps the top K and the counts, not a record per config, so memory stays flat however large the
space; it is the ground truth wherever the space can be enumerated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from costmodel import evaluate_batch

from .space import SearchSpace

ProgressFn = Callable[[int, int], None]  # (configs scored so far, total)


@dataclass
class Ranked:
    """An engine's outcome: the best configs (as config dicts, best first) and the counts."""

    configs: list[dict]
    trials: int
    feasible_trials: int
    smallest_peak_gib: float | None = None  # over structurally valid configs, for "nothing fits"
    smallest_peak_config: dict | None = None
    history: list[dict] | None = None
    pareto: list[dict] | None = None
    extra: dict = field(default_factory=dict)


def _rank_order(tokens: np.ndarray, peak: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Best first: highest tokens/s, then the smaller memory peak, then enumeration order."""
    return np.lexsort((index, peak, -tokens))


def run_exhaustive(space: SearchSpace, top_k: int, progress: ProgressFn | None = None,
                   batch_size: int = 200_000) -> Ranked:
    total = space.size
    keep_tokens = np.empty(0)
    keep_peak = np.empty(0)
    keep_rows = np.empty(0, dtype=np.int64)
    keep_opts = np.empty(0, dtype=np.int64)
    keep_index = np.empty(0, dtype=np.int64)
    feasible = 0
    min_peak, min_at = np.inf, None
    done = 0
    for rows, opts, batch in space.batches(batch_size):
        br = evaluate_batch(space.spec, space.profile, space.devices, batch, keep_stages=False)
        feasible += int(br.feasible.sum())
        if br.valid.any():
            peaks = np.where(br.valid, br.peak_bytes, np.inf)
            j = int(np.argmin(peaks))
            if peaks[j] < min_peak:
                min_peak, min_at = float(peaks[j]), (int(rows[j]), int(opts[j]))
        ok = np.nonzero(br.feasible)[0]
        if len(ok):
            keep_tokens = np.concatenate([keep_tokens, br.tokens_per_s[ok]])
            keep_peak = np.concatenate([keep_peak, br.peak_bytes[ok]])
            keep_rows = np.concatenate([keep_rows, rows[ok]])
            keep_opts = np.concatenate([keep_opts, opts[ok]])
            keep_index = np.concatenate([keep_index, done + ok])
            order = _rank_order(keep_tokens, keep_peak, keep_index)[:top_k]
            keep_tokens, keep_peak = keep_tokens[order], keep_peak[order]
            keep_rows, keep_opts, keep_index = keep_rows[order], keep_opts[order], keep_index[order]
        done += len(rows)
        if progress:
            progress(done, total)
    configs = [space.config(int(r), int(o)) for r, o in zip(keep_rows, keep_opts)]
    return Ranked(configs=configs, trials=total, feasible_trials=feasible,
                  smallest_peak_gib=None if min_at is None else min_peak / 2**30,
                  smallest_peak_config=None if min_at is None else space.config(*min_at))

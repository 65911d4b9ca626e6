"""The exhaustive engine: score every config of the space through the vectorised cost model.

It keeps the best configs and the counts, not a record per config, so memory stays small however large
the space; it is the ground truth wherever the space can be enumerated. What it keeps is every config
ranked ahead of (or at) the best config of the K-th best parallel layout: that holds the top K configs,
the best config of each of the top K layouts, and their exact ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Callable

import numpy as np

from costmodel import evaluate_batch

from .space import SearchSpace

ProgressFn = Callable[[int, int], None]  # (configs scored so far, total)
GIB = 2**30
# What makes two configs the same parallel layout: the rest (vpp, pipeline split, micro-batch, recompute,
# overlaps) are variants of it.
LAYOUT_FIELDS = ("tp", "pp", "cp", "ep", "etp")


@dataclass
class Ranked:
    """An engine's outcome: the best configs (as config dicts, best first) and the counts.

    ``layouts``: the best config of each of the top K distinct layouts, best first, as
    ``{"layout": {tp, pp, cp, ep, etp}, "best_rank", "config", "variants"}`` (``best_rank``: that config's
    rank among all ranked configs; ``variants``: feasible configs scored with that layout)."""

    configs: list[dict]
    trials: int
    feasible_trials: int
    smallest_peak_gib: float | None = None  # over structurally valid configs, for "nothing fits"
    smallest_peak_config: dict | None = None
    history: list[dict] | None = None
    pareto: list[dict] | None = None
    extra: dict = field(default_factory=dict)
    layouts: list[dict] = field(default_factory=list)
    feasible_layouts: int = 0  # distinct layouts with at least one feasible config


def _rank_order(tokens: np.ndarray, peak: np.ndarray, index: np.ndarray,
                short: np.ndarray | None = None, offloads: np.ndarray | None = None) -> np.ndarray:
    """Best first: configs that keep the memory margin before those that do not (``short``), then the
    highest tokens/s, then at equal throughput those that offload nothing (``offloads``: a hidden copy
    costs no modelled time, but it loads the host link and host memory that the model does not charge,
    and Megatron-Core rates offload's overhead above selective recompute's), the smaller memory peak,
    enumeration order."""
    zeros = np.zeros(len(tokens), dtype=bool)
    short = zeros if short is None else short
    offloads = zeros if offloads is None else offloads
    return np.lexsort((index, peak, offloads, -tokens, short))


def layout_cut(layouts_sorted: np.ndarray, k: int) -> int:
    """How many best-first configs to keep: up to and including the first config of the k-th distinct
    layout (all of them when fewer than k layouts appear)."""
    _, first = np.unique(layouts_sorted, return_index=True)
    return len(layouts_sorted) if len(first) < k else int(np.sort(first)[k - 1]) + 1


def layout_firsts(layouts_sorted: np.ndarray, k: int) -> np.ndarray:
    """Positions of the first (best) config of each of the first k distinct layouts, best first."""
    _, first = np.unique(layouts_sorted, return_index=True)
    return np.sort(first)[:k]


@dataclass
class _Kept:
    """Feasible configs kept so far, best first (parallel arrays)."""

    short: np.ndarray
    tokens: np.ndarray
    offloads: np.ndarray
    peak: np.ndarray
    index: np.ndarray
    rows: np.ndarray
    opts: np.ndarray
    layout: np.ndarray

    @classmethod
    def empty(cls) -> "_Kept":
        return cls(np.zeros(0, bool), np.zeros(0), np.zeros(0, bool), np.zeros(0),
                   *(np.zeros(0, np.int64) for _ in range(4)))

    def merge(self, other: "_Kept", k: int, counterpart: np.ndarray) -> "_Kept":
        """Both sets, ranked, cut to what can still matter (``layout_cut``): a config dropped here ranks
        behind k layouts' best configs already, and later chunks only add better ones.

        An offload plan whose counterpart without offload (``counterpart``: per option index) keeps the
        margin is dropped too: it can only rank right behind it, at equal or lower throughput, and the
        samplers never score it (``scored_groups``), so both engines rank the same configs. Its counterpart
        ranks ahead of it, so it is in the merged set whenever the plan is."""
        cols = {f.name: np.concatenate([getattr(self, f.name), getattr(other, f.name)]) for f in fields(self)}
        n_opts = len(counterpart)
        good = (cols["rows"] * n_opts + cols["opts"])[~cols["short"]]
        base = counterpart[cols["opts"]]  # itself where every plan of the search offloads (a pinned offload)
        redundant = (base != cols["opts"]) & np.isin(cols["rows"] * n_opts + base, good)
        cols = {name: col[~redundant] for name, col in cols.items()}
        order = _rank_order(cols["tokens"], cols["peak"], cols["index"], cols["short"], cols["offloads"])
        order = order[:layout_cut(cols["layout"][order], k)]
        return _Kept(**{name: col[order] for name, col in cols.items()})


def _layout_codes(space: SearchSpace) -> tuple[np.ndarray, np.ndarray]:
    """The distinct layouts of the space (rows of ``LAYOUT_FIELDS`` values) and each parallel row's one."""
    cols = np.stack([space.parallel[k] for k in LAYOUT_FIELDS], axis=1)
    shapes, inverse = np.unique(cols, axis=0, return_inverse=True)
    return shapes, inverse.ravel()


def run_exhaustive(space: SearchSpace, top_k: int, progress: ProgressFn | None = None,
                   batch_size: int = 200_000, margin_gib: float = 0.0) -> Ranked:
    """Score the whole space; rank configs that keep ``margin_gib`` of headroom (GiB) first."""
    total = space.size
    shapes, layout_of_row = _layout_codes(space)
    variants = np.zeros(len(shapes), dtype=np.int64)
    kept = _Kept.empty()
    counterpart = np.asarray(space.offload_counterpart, dtype=np.int64)
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
            lay = layout_of_row[rows[ok]]
            variants += np.bincount(lay, minlength=len(shapes))
            room = (br.capacity_bytes - br.peak_bytes[ok]) / GIB  # as the result's memory.headroom_gib
            kept = kept.merge(_Kept(room < margin_gib, br.tokens_per_s[ok], batch.offload_modules[ok] != 0,
                                    br.peak_bytes[ok], done + ok, rows[ok], opts[ok], lay), top_k, counterpart)
        done += len(rows)
        if progress:
            progress(done, total)
    configs = [space.config(int(r), int(o)) for r, o in zip(kept.rows[:top_k], kept.opts[:top_k])]
    layouts = [{"layout": dict(zip(LAYOUT_FIELDS, map(int, shapes[kept.layout[p]]))), "best_rank": int(p) + 1,
                "config": space.config(int(kept.rows[p]), int(kept.opts[p])),
                "variants": int(variants[kept.layout[p]])} for p in layout_firsts(kept.layout, top_k)]
    return Ranked(configs=configs, trials=total, feasible_trials=feasible,
                  smallest_peak_gib=None if min_at is None else min_peak / 2**30,
                  smallest_peak_config=None if min_at is None else space.config(*min_at),
                  layouts=layouts, feasible_layouts=int((variants > 0).sum()))

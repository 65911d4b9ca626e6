"""The exhaustive engine: score every config of the space through the vectorised cost model.

It keeps the best configs and the counts, not a record per config, so memory stays small however large
the space; it is the ground truth wherever the space can be enumerated. What it keeps is every config
ranked ahead of (or at) the best config of the K-th best parallel layout: that holds the top K configs,
the best config of each of the top K layouts, and their exact ranks.

Most of a large space cannot reach that cut, and the engine decides it without scoring it: one config per
layout row (its layout, split and micro-batch) scored with the options that make a step shortest (no
recompute, no offload, every overlap on) bounds the throughput of all its options from above
(``_row_bounds``); once the kept configs hold K layouts, rows whose bound is below the cut are counted as
pruned. The rows are scored highest bound first, in small groups that double, so the cut is known early
and the scan stops where the highest bound left is below it. The same scoring gives each row a lower bound
on its memory peak (its model states): a row whose states alone overflow the device has no option that
fits, and is pruned too. Scoring in any order gives the same kept set (``_Kept.merge``), so the result
equals a plain full scan's.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field, fields, replace
from typing import Callable

import numpy as np

from costmodel import evaluate_batch, stragglers
from costmodel.batch import NO_VALUE
from costmodel.evaluate import CHUNK_CONFIGS
from costmodel.hardware import Hardware
from costmodel.pipeline import unique_rows

from .objective import ranking_tokens_per_s
from .pool import Pool, pool
from .space import SearchSpace

ProgressFn = Callable[[int, int], None]  # (configs scored so far, total)
GIB = 2**30
# What makes two configs the same parallel layout: the rest (vpp, pipeline split, micro-batch, recompute,
# overlaps) are variants of it.
LAYOUT_FIELDS = ("tp", "pp", "cp", "ep", "etp")
# With bounds, the first group of rows scored holds this fraction of a chunk's pairs (then groups double):
# the rows with the highest bounds, whose best config sets the cut that prunes the rest.
FIRST_GROUP_FRACTION = 64
# With a pool, a group of fewer pairs than one scorer chunk is scored in this process: split, each part would
# pay the transfer of its rows and its own evaluate's fixed cost for a few milliseconds of scoring, and the
# first groups of a bounded scan are that small.
POOL_MIN_PAIRS = CHUNK_CONFIGS
# Without bounds, whole groups are shared between the processes where there are at least this many per
# process (fewer: one process would wait for the last group, so each group is split instead), and at most
# this many per process are packed and sent ahead of the one it scores.
SHARED_GROUPS_PER_JOB = 2


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

    def merge(self, other: "_Kept", k: int) -> "_Kept":
        """Both sets, ranked, cut to what can still matter (``layout_cut``): a config dropped here ranks
        behind k layouts' best configs already, and later chunks only add better ones."""
        cols = {f.name: np.concatenate([getattr(self, f.name), getattr(other, f.name)]) for f in fields(self)}
        order = _rank_order(cols["tokens"], cols["peak"], cols["index"], cols["short"], cols["offloads"])
        order = order[:layout_cut(cols["layout"][order], k)]
        return _Kept(**{name: col[order] for name, col in cols.items()})


def _layout_codes(space: SearchSpace) -> tuple[np.ndarray, np.ndarray]:
    """The distinct layouts of the space (rows of ``LAYOUT_FIELDS`` values) and each parallel row's one."""
    return unique_rows([np.asarray(space.parallel[k], dtype=np.int64) for k in LAYOUT_FIELDS])


def _row_bounds(space: SearchSpace, batch_size: int = 200_000) -> tuple[np.ndarray, np.ndarray]:
    """An upper bound on the tokens/s of every option of each layout row of ``space`` (inf where unknown),
    and a lower bound on their memory peak in bytes (0 where unknown), scored in chunks of ``batch_size``
    rows as the configs are (``_chunk_bounds``): one call over every row would hold arrays a few times
    larger, fresh pages each, for no fewer operations."""
    n = len(space.parallel["tp"])
    chunks = [(np.zeros(0), np.zeros(0))] + [_chunk_bounds(space, np.arange(start, min(start + batch_size, n)))
                                             for start in range(0, n, batch_size)]
    return np.concatenate([c[0] for c in chunks]), np.concatenate([c[1] for c in chunks])


def _chunk_bounds(space: SearchSpace, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bounds of layout rows ``rows`` (``_row_bounds``).

    Each row is scored once with no recompute, no offload and both overlaps on. Every option of the row
    has the same layer costs but for what its recompute adds (the selective modules' or the recomputed
    layers' passes, never negative), the same or more exposed TP and EP traffic (less overlap), and
    offload time >= 0; so each stage's micro-batch time, the slowest stage's (``t_stage``) and the 1F1B
    bubble ((pp - 1)/vpp of it) are at least the bound row's, and the data-parallel and optimizer terms
    are >= 0. The bound step is those parts (less one part in 10^9 for the order of the float sums) plus
    the stragglers' wait on it; a DualPipe row's bubble is taken as 0.

    The memory bound: the weights, gradients and optimizer states of the bound config's peak stage and the
    framework's overhead. A stage's peak is at least its states plus the overhead, and no option changes
    the states (recompute, offload and the overlaps change activations and buffers only) where every
    option has the same ``distributed_optimizer``; a row whose bound is above the device memory has no
    option that fits."""
    n = len(rows)
    b = space.make_batch(rows, np.zeros(n, dtype=np.int64))
    b = replace(b, recompute=np.zeros(n, dtype=np.int64), recompute_num_layers=np.full(n, NO_VALUE, dtype=np.int64),
                offload_modules=np.zeros(n, dtype=np.int64), tp_comm_overlap=np.ones(n, dtype=bool),
                moe_a2a_overlap=np.ones(n, dtype=bool))
    br = evaluate_batch(space.spec, space.profile, space.devices, b, keep_stages=False)
    t = br.time
    per_stage = t["compute_s"] + t["tp_comm_s"] + t["cp_comm_s"] + t["ep_comm_s"] + t["pp_p2p_s"] + t["offload_s"]
    replica = (per_stage + np.where(b.schedule == 0, t["pp_bubble_s"], 0.0)) * (1.0 - 1e-9)
    dp = np.maximum(space.devices // (b.tp * b.pp * b.cp), 1)
    step = replica + stragglers.straggler_s(replica, dp, Hardware.from_profile(space.profile).straggler_cv)
    bound = space.global_batch_size * space.spec.seq_length / step
    states = (br.params_bytes + br.grads_bytes + br.optimizer_bytes + br.overhead_bytes) * (1.0 - 1e-9)
    same_states = len({o[1] for o in space.options}) == 1
    peak = np.where(br.valid & np.isfinite(states), states, 0.0) if same_states else np.zeros(n)
    return np.where(np.isfinite(bound) & (step > 0), bound, np.inf), peak


def run_exhaustive(space: SearchSpace, top_k: int, progress: ProgressFn | None = None,
                   batch_size: int = 200_000, margin_gib: float = 0.0, prune: bool = True, jobs: int = 1,
                   check: Callable[[], None] | None = None, procs: Pool | None = None) -> Ranked:
    """Score the whole space; rank configs that keep ``margin_gib`` of headroom (GiB) first.

    Two passes: every config whose option offloads nothing (or is its own counterpart, where offload is
    pinned), then each offload plan whose counterpart without offload (``SearchSpace.offload_counterpart``:
    same layout, micro-batch and other options) does not fit or keep the margin. Elsewhere an offload plan
    can only repeat its counterpart, slower or as fast, and ranks after it: it is decided unscored, as
    the samplers decide it (``scored_groups``), so both engines rank the same configs. ``prune``: decide
    the rows that cannot reach the cut by their bound (``_row_bounds``; False: the plain full scan).
    ``trials`` counts every config of the space (scored or so decided); ``feasible_trials`` and each
    layout's ``variants`` the feasible configs scored; ``extra`` the configs scored, pruned (throughput
    bound below the cut, or memory bound above the device's memory: ``_row_bounds``) and dominated
    (offload plans decided by their counterpart), which add up to ``trials``. Where nothing fits, the
    smallest peak is the plain scan's (``_Run.settle_smallest_peak``).

    ``jobs`` > 1: the row bounds and each group of rows are split into ``jobs`` parts scored by that many
    processes (``search.pool``), each part sent with its own rows of the space; the next group is chosen
    only once the whole group is merged, so the cut, the pruned rows and every count are the ones of
    ``jobs == 1``. Without bounds (``prune=False``) nothing waits for a cut: the groups are shared whole
    between the processes (``_Run._share_groups``). ``check()`` runs in this process while it waits for the
    parts and may raise to stop.
    ``procs``: a pool the caller started (``run_search`` starts it before building the space), used in
    place of ``jobs``."""
    with (nullcontext(procs) if procs is not None or jobs == 1 else pool(jobs)) as procs:
        total = space.size
        mask = space._option_mask()
        base = np.asarray(space.offload_counterpart, dtype=np.int64)
        plain = base == np.arange(len(base))
        run = _Run(space, top_k, margin_gib, progress, total, procs, check)
        bounds = None
        if prune:
            bounds, peak_lower = _row_bounds(space, batch_size) if procs is None else run.parallel_bounds(batch_size)
            run.unfit = peak_lower > Hardware.from_profile(space.profile).memory_bytes
        first = mask & plain[None, :]
        keeps: list[tuple[np.ndarray, np.ndarray]] = []  # the (rows, options) scored that fit and keep the margin
        run.score(first, batch_size, bounds, keeps)
        second = _offload_pass(mask, base, np.concatenate([r for r, _ in keeps] or [[]]).astype(np.int64),
                               np.concatenate([o for _, o in keeps] or [[]]).astype(np.int64))
        run.skipped = int(np.count_nonzero(mask)) - int(np.count_nonzero(first)) - int(np.count_nonzero(second))
        run.score(second, batch_size, bounds)
        if prune and len(run.kept.layout) == 0:
            run.settle_smallest_peak(first | second, peak_lower, batch_size)
        return run.ranked()


@dataclass
class _Part:
    """Some layout rows of a space, as a pool process gets them (``part_of``)."""

    space: SearchSpace  # the space with only those rows, its integer columns narrowed
    dtypes: dict[str, str]  # each column's own type

    def widened(self) -> SearchSpace:
        self.space.parallel = {k: v.astype(self.dtypes[k], copy=False) for k, v in self.space.parallel.items()}
        return self.space


def part_of(space: SearchSpace, rows: np.ndarray) -> _Part:
    """``space`` with only the layout rows ``rows`` (in that order): what a process needs to score or bound
    them, however large the space (its caches left to be rebuilt there). Each integer column travels in
    the narrowest integer type that holds its values (a layout's sizes are small numbers: 8 bytes become
    1 or 2) and is widened back there, so a part of the Pangu space pickles to a fraction of its size."""
    parallel = {}
    for k, v in space.parallel.items():
        col = v[rows]
        if col.dtype.kind in "iu" and len(col):
            col = col.astype(np.result_type(np.min_scalar_type(int(col.min())), np.min_scalar_type(int(col.max()))))
        parallel[k] = col
    return _Part(replace(space, parallel=parallel, _layouts_cache=None, _expressible_cache={}, _mask_cache=None,
                         check=None), {k: v.dtype.str for k, v in space.parallel.items()})


def _bounds_part(part: _Part) -> tuple[np.ndarray, np.ndarray]:
    """``_row_bounds`` of a part of the space, in a pool process."""
    return _row_bounds(part.widened())


def _score_part(part: _Part, *args) -> "_Chunk":
    """``_score_rows`` of a part of the space, in a pool process (row numbers: positions in the part)."""
    space = part.widened()
    return _score_rows(space, np.arange(len(space.parallel["tp"])), *args)


def _score_packed(packed: tuple) -> "_Chunk":
    """``_score_part`` of a group packed whole (``_Run._share_groups``), with the space's row numbers."""
    part, rows, *args = packed
    return _score_part(part, *args).on_rows(rows)


def _parts(rows: np.ndarray, counts: np.ndarray, n: int) -> list[np.ndarray]:
    """``rows`` cut into at most ``n`` runs of consecutive rows with about equal pairs (``counts`` per row)."""
    cum = np.cumsum(counts)
    edges = np.searchsorted(cum, cum[-1] * np.arange(1, n) / n, side="left") + 1
    return [part for part in np.split(rows, np.unique(np.clip(edges, 1, len(rows)))) if len(part)]


@dataclass
class _Chunk:
    """What scoring one chunk of layout rows gives (row numbers are those of the space it was scored on)."""

    kept: _Kept
    feasible: int  # feasible configs scored
    variants: np.ndarray  # feasible configs scored, per layout code
    scored: int
    min_key: tuple | None  # the smallest peak of a structurally valid config (``_smallest_peak_key``)
    keeps: tuple[np.ndarray, np.ndarray]  # (rows, options) that fit and keep the margin

    def on_rows(self, rows: np.ndarray) -> "_Chunk":
        """The same with local row numbers (positions in ``rows``) turned into ``rows``' values."""
        self.kept = replace(self.kept, rows=rows[self.kept.rows])
        self.keeps = (rows[self.keeps[0]], self.keeps[1])
        if self.min_key is not None:
            peak, offload, row, opt = self.min_key
            self.min_key = (peak, offload, int(rows[row]), opt)
        return self


def _score_rows(space: SearchSpace, rows: np.ndarray, sub: np.ndarray, starts: np.ndarray, layout_of: np.ndarray,
                layouts: int, top_k: int, margin_gib: float) -> _Chunk:
    """Score the pairs of ``sub`` (a mask over ``rows`` × options; ``starts``: each row's first pair's position
    in the enumeration, ``layout_of``: each row's layout code of ``layouts``), keeping the best ``top_k``
    layouts' worth (``_Kept.merge``)."""
    at, opts = np.nonzero(sub)  # row-major: each layout with its allowed options
    r = rows[at]
    index = starts[at] + np.cumsum(sub, axis=1)[at, opts] - 1
    batch = space.make_batch(r, opts)
    br = evaluate_batch(space.spec, space.profile, space.devices, batch, keep_stages=False)
    min_key = None
    if br.valid.any():
        plain = np.asarray(space.offload_counterpart) == np.arange(len(space.options))
        min_key = _smallest_peak_key(np.where(br.valid, br.peak_bytes, np.inf), r, opts, plain)
    ok = np.nonzero(br.feasible)[0]
    room = (br.capacity_bytes - br.peak_bytes[ok]) / GIB  # as the result's memory.headroom_gib
    lay = layout_of[at[ok]]
    kept = _Kept.empty()
    if len(ok):
        kept = kept.merge(_Kept(room < margin_gib, ranking_tokens_per_s(space, br, batch)[ok],
                                batch.offload_modules[ok] != 0, br.peak_bytes[ok], index[ok], r[ok], opts[ok], lay),
                          top_k)
    good = ok[room >= margin_gib]
    return _Chunk(kept, int(br.feasible.sum()), np.bincount(lay, minlength=layouts), len(r), min_key,
                  (r[good], opts[good]))


def _smallest_peak_key(peaks: np.ndarray, rows: np.ndarray, opts: np.ndarray, plain: np.ndarray) -> tuple:
    """(peak bytes, offloads, row, option) of the smallest of ``peaks``, ties to the config a plain scan
    meets first (the pass without offload first, then row-major), so that the smallest of such keys is
    the plain scan's whatever the order of scoring."""
    at = np.flatnonzero(peaks == peaks.min())
    at = at[np.lexsort((opts[at], rows[at], ~plain[opts[at]]))]
    j = int(at[0])
    return float(peaks[j]), bool(~plain[opts[j]]), int(rows[j]), int(opts[j])


def _offload_pass(mask: np.ndarray, base: np.ndarray, keep_rows: np.ndarray, keep_opts: np.ndarray) -> np.ndarray:
    """The (row, option) pairs of the offload pass: the offload plans of ``mask`` (options whose
    counterpart ``base`` is another) except where the counterpart's pair is among the kept ones
    (``keep_rows``, ``keep_opts``: scored, fits, keeps the margin). Cleared pair by kept pair rather than
    by gathering a counterpart column per option over the whole mask (a copy of it, column by column)."""
    offload = base != np.arange(len(base))
    second = mask & offload[None, :]
    for q in np.flatnonzero(offload):
        kept = keep_rows[keep_opts == base[q]]
        second[kept, q] = False
    return second


class _Run:
    """One exhaustive pass over chosen (row, option) pairs: the kept best, the counts, the progress."""

    def __init__(self, space: SearchSpace, top_k: int, margin_gib: float, progress: ProgressFn | None, total: int,
                 procs: Pool | None = None, check: Callable[[], None] | None = None):
        self.space, self.top_k, self.margin_gib, self.progress, self.total = space, top_k, margin_gib, progress, total
        self.procs, self.check = procs, check
        self.shapes, self.layout_of_row = _layout_codes(space)
        self.variants = np.zeros(len(self.shapes), dtype=np.int64)
        self.kept = _Kept.empty()
        self.feasible, self.done, self.skipped, self.pruned, self.index_base = 0, 0, 0, 0, 0
        self.min_key: tuple | None = None  # the smallest peak seen (``_smallest_peak_key``)
        self.unfit: np.ndarray | None = None  # rows whose memory bound is above the device memory
        self.settling = False  # scoring pairs already counted as pruned: progress stays where it is

    @property
    def min_peak(self) -> float:
        """The smallest peak (bytes) of a structurally valid config scored so far (inf before one)."""
        return np.inf if self.min_key is None else self.min_key[0]

    @property
    def min_at(self) -> tuple[int, int] | None:
        """That config's (row, option)."""
        return None if self.min_key is None else self.min_key[2:]

    def parallel_bounds(self, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """``_row_bounds`` of the space, its rows split in parts of at most about ``batch_size`` rows shared
        between the pool's processes and this one (``Pool.map_shared``; each row's bound is its own: the same
        numbers as in one process; a process's memory stays that of one part however large the space)."""
        n = len(self.space.parallel["tp"])
        parts = _parts(np.arange(n), np.ones(n, dtype=np.int64), max(self.procs.jobs, -(-n // batch_size)))
        # about batch_size rows or fewer: one _chunk_bounds call here (a row's bound does not depend on its batch)
        pairs = self.procs.map_shared(_bounds_part, lambda part: _chunk_bounds(self.space, part), parts, self.check,
                                      pack=lambda part: part_of(self.space, part))
        return np.concatenate([p[0] for p in pairs]), np.concatenate([p[1] for p in pairs])

    def cut_tokens(self) -> float | None:
        """Tokens/s of the best config of the K-th best layout so far, where configs below it cannot enter
        the kept set whatever their memory: it keeps the margin (else a slower config that keeps it would
        rank ahead). None before K layouts are kept. Under the goodput objective these are the ranking's
        tokens/s (throughput × goodput, never above the throughput a row's bound caps), so the cut stays exact."""
        kept = self.kept
        if len(kept.layout) == 0 or kept.short[-1] or len(np.unique(kept.layout)) < self.top_k:
            return None
        return float(kept.tokens[-1])

    def _row_groups(self, counts: np.ndarray, bounds: np.ndarray | None, batch_size: int):
        """The layout rows to score (those with pairs to score, ``counts``), in groups of at most about
        ``batch_size`` pairs, each group in row order. Without bounds: all of them, in row order. With them:
        without the rows whose memory bound rules them out (``unfit``), in the order of their bounds,
        highest first, in groups that start at ``FIRST_GROUP_FRACTION`` of ``batch_size`` and double, so
        that the cut (``cut_tokens``) is known after a few small groups; each group without the rows whose
        bound is below the cut known by then (their pairs counted as pruned), and once the highest bound
        left is below it, every row left is pruned."""
        rows = np.flatnonzero(counts)
        if bounds is None:
            if len(rows) == 0:
                return
            cum = np.cumsum(counts[rows])
            edges = np.searchsorted(cum, np.arange(batch_size, int(cum[-1]), batch_size), side="right")
            yield from (g for g in np.split(rows, np.unique(edges)) if len(g))
            return
        if self.unfit is not None:
            self.pruned += int(counts[rows[self.unfit[rows]]].sum())
            rows = rows[~self.unfit[rows]]
        order = rows[np.argsort(-bounds[rows], kind="stable")]
        size, at = max(1, batch_size // FIRST_GROUP_FRACTION), 0
        while at < len(order):
            cut = self.cut_tokens()
            if cut is not None and bounds[order[at]] < cut:  # every bound left is at most this one
                self.pruned += int(counts[order[at:]].sum())
                return
            end = at + int(np.searchsorted(np.cumsum(counts[order[at:]]), size)) + 1
            group = order[at:end]
            if cut is not None:
                live = bounds[group] >= cut
                self.pruned += int(counts[group[~live]].sum())
                group = group[live]
            at, size = end, min(2 * size, batch_size)
            if len(group):
                yield np.sort(group)

    def score(self, mask: np.ndarray, batch_size: int, bounds: np.ndarray | None = None,
              keeps: list | None = None) -> None:
        """Score the pairs of ``mask`` in chunks (those ``bounds`` cannot rule out), keeping the best; adds to
        ``keeps`` each chunk's (rows, options) that fit and keep the margin. A config's position in the
        enumeration (row-major over the passes) breaks ties, whatever the order of scoring."""
        counts = mask.sum(axis=1)
        starts = np.cumsum(counts) - counts + self.index_base  # each row's first pair's position
        pairs = int(counts.sum())
        self.index_base += pairs
        groups = self._row_groups(counts, bounds, batch_size)
        if bounds is None and self.procs is not None:
            groups = list(groups)
            # whole groups where each process gets several, of a chunk or more on average
            if len(groups) >= SHARED_GROUPS_PER_JOB * self.procs.jobs and pairs >= POOL_MIN_PAIRS * len(groups):
                for chunk in self._share_groups(groups, pairs, mask, starts):
                    self._absorb(chunk, keeps)
                self._report()
                return
        for group in groups:
            for chunk in self._score_group(group, mask, starts):
                self._absorb(chunk, keeps)
            self._report()

    def _share_groups(self, groups: list[np.ndarray], pairs: int, mask: np.ndarray,
                      starts: np.ndarray) -> list[_Chunk]:
        """Each group scored whole, the groups shared between the pool's processes and this one
        (``Pool.map_shared``), in the order of ``groups``. Without bounds no group waits for the cut an
        earlier one sets, so none waits for another: nobody idles until the last group, and no group is
        split, where each part of a split pays an evaluate's fixed costs and a part's setup again. Progress
        counts the groups finished, each as an equal share of their ``pairs`` (none while the smallest peak
        is settled: those pairs were counted as pruned)."""
        before = self.done + self.skipped + self.pruned

        def here(rows: np.ndarray) -> _Chunk:
            return self._score_here(rows, mask, starts)

        def pack(rows: np.ndarray) -> tuple:
            return part_of(self.space, rows), rows, *self._score_args(rows, mask, starts)

        def on_result(done: int) -> None:
            if self.progress and not self.settling and done < len(groups):  # the last: exact, once all are absorbed
                self.progress(before + pairs * done // len(groups), self.total)

        return self.procs.map_shared(_score_packed, here, groups, self.check, on_result, pack,
                                     ahead=SHARED_GROUPS_PER_JOB * (self.procs.jobs - 1))

    def _score_group(self, group: np.ndarray, mask: np.ndarray, starts: np.ndarray) -> list[_Chunk]:
        """The group's chunks scored, in row order: in this process (without a pool, or a group smaller than
        ``POOL_MIN_PAIRS``), or split in one part per worker, this process scoring the first and each pool
        process one of the others (sent with its rows of the space), all of them awaited."""
        if self.procs is None or int(mask[group].sum()) < POOL_MIN_PAIRS:
            return [self._score_here(group, mask, starts)]
        parts = _parts(group, mask[group].sum(axis=1), self.procs.jobs)
        # the pool's processes take every part but the first, this process that one (parts of equal pairs)
        futures = [self.procs.submit(_score_part, part_of(self.space, part), *self._score_args(part, mask, starts))
                   for part in parts[1:]]
        own = self._score_here(parts[0], mask, starts)
        return [own] + [self.procs.result(f, self.check).on_rows(part) for part, f in zip(parts[1:], futures)]

    def _score_args(self, rows: np.ndarray, mask: np.ndarray, starts: np.ndarray) -> tuple:
        """``_score_rows``'s arguments after the space and the rows, for the layout rows ``rows``."""
        return mask[rows], starts[rows], self.layout_of_row[rows], len(self.shapes), self.top_k, self.margin_gib

    def _score_here(self, rows: np.ndarray, mask: np.ndarray, starts: np.ndarray) -> _Chunk:
        """The layout rows ``rows`` scored in this process."""
        return _score_rows(self.space, rows, *self._score_args(rows, mask, starts))

    def _absorb(self, chunk: _Chunk, keeps: list | None) -> None:
        """Add one scored chunk to the kept set and the counts."""
        self.feasible += chunk.feasible
        self.variants += chunk.variants
        if chunk.min_key is not None and (self.min_key is None or chunk.min_key < self.min_key):
            self.min_key = chunk.min_key
        self.kept = self.kept.merge(chunk.kept, self.top_k)
        if keeps is not None:
            keeps.append(chunk.keeps)
        self.done += chunk.scored

    def _report(self) -> None:
        if self.progress and not self.settling:
            self.progress(self.done + self.skipped + self.pruned, self.total)

    def settle_smallest_peak(self, pairs: np.ndarray, peak_lower: np.ndarray, batch_size: int) -> None:
        """Nothing fits: score the rows ruled out by their memory bound (``unfit``) whose bound is not above
        the smallest peak found, lowest bound first, in doubling groups, until every row left has a bound
        above it; the smallest peak and its config are then a plain scan's. ``pairs``: both passes'."""
        counts = pairs.sum(axis=1)
        rows = np.flatnonzero(self.unfit & (counts > 0))
        rows = rows[np.argsort(peak_lower[rows], kind="stable")]
        size, at = max(1, batch_size // FIRST_GROUP_FRACTION), 0
        self.settling = True  # these pairs were reported as pruned: they move to scored, the total stays
        try:
            while at < len(rows) and peak_lower[rows[at]] <= self.min_peak:
                end = at + int(np.searchsorted(np.cumsum(counts[rows[at:]]), size)) + 1
                group = rows[at:end][peak_lower[rows[at:end]] <= self.min_peak]
                sub = np.zeros_like(pairs)
                sub[group] = pairs[group]
                self.pruned -= int(counts[group].sum())
                self.score(sub, batch_size)
                at, size = end, min(2 * size, batch_size)
        finally:
            self.settling = False

    def ranked(self) -> Ranked:
        space, kept, k = self.space, self.kept, self.top_k
        if self.progress:
            self.progress(self.total, self.total)
        configs = [space.config(int(r), int(o)) for r, o in zip(kept.rows[:k], kept.opts[:k])]
        layouts = [{"layout": dict(zip(LAYOUT_FIELDS, map(int, self.shapes[kept.layout[p]]))), "best_rank": int(p) + 1,
                    "config": space.config(int(kept.rows[p]), int(kept.opts[p])),
                    "variants": int(self.variants[kept.layout[p]])} for p in layout_firsts(kept.layout, k)]
        return Ranked(configs=configs, trials=self.total, feasible_trials=self.feasible,
                      smallest_peak_gib=None if self.min_at is None else self.min_peak / 2**30,
                      smallest_peak_config=None if self.min_at is None else space.config(*self.min_at),
                      layouts=layouts, feasible_layouts=int((self.variants > 0).sum()),
                      extra={"configs_scored": self.done, "configs_pruned": self.pruned,
                             "configs_dominated": self.skipped})

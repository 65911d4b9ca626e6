"""Pipeline parallelism: which layers each stage holds, micro-batches in flight, and the bubble.

Layer split rules (documented in docs/costmodel.md):

* ``pipeline_layout`` (Megatron's ``--pipeline-model-parallel-layout``): ``E`` embedding, ``t`` decoder
  layer, ``m`` MTP layer, ``L`` loss (with the LM head), ``|`` ends a virtual stage, ``X*n`` and
  ``(...)*n`` repeat. It lists pp·vpp virtual stages in model order; virtual stage i runs on pipeline
  rank ``i % pp`` as its chunk ``i // pp``.
* ``first_stage_layers`` / ``last_stage_layers`` (``--decoder-first/last-pipeline-num-layers``): the
  first / last pipeline rank holds that many layers, the other ranks share the rest as evenly as
  possible; each rank's layers are split over its vpp chunks as evenly as possible.
* otherwise every virtual stage gets ``slots // (pp·vpp)`` layer slots, where slots are the layers plus
  the embedding and the loss when ``account_for_*_in_pipeline_split`` is set; the remainder goes one
  slot each to the middle virtual stages first (1, 2, ...), then to the first and last, since these
  already carry the embedding and the LM head.

The embedding is on the first virtual stage, the LM head, loss and MTP layers on the last one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from .batch import DUALPIPE, DUALPIPEV, NO_VALUE, ConfigBatch
from .spec import ModelSpec

# Composition columns of a stage.
DENSE, MOE, EMB, HEAD, MTP = range(5)


class LayoutError(ValueError):
    pass


def parse_layout(layout: str) -> list[str]:
    """Expand a Megatron pipeline layout string into one token string per virtual stage."""
    text = re.sub(r"[\s,]", "", layout)

    def expand(s: str) -> str:
        # innermost parenthesised groups first, then single-symbol repeats
        pat = re.compile(r"\(([^()]*)\)\*(\d+)")
        while True:
            new = pat.sub(lambda mt: mt.group(1) * int(mt.group(2)), s)
            if new == s:
                break
            s = new
        if "(" in s or ")" in s:
            raise LayoutError(f"unbalanced or unrepeated parentheses in pipeline_layout {layout!r}")
        return re.sub(r"([EtmL])\*(\d+)", lambda mt: mt.group(1) * int(mt.group(2)), s)

    flat = expand(text)
    bad = set(flat) - set("EtmL|")
    if bad:
        raise LayoutError(f"pipeline_layout {layout!r} has unknown symbols {sorted(bad)}")
    stages = flat.split("|")
    if stages and stages[-1] == "" and len(stages) > 1:
        stages = stages[:-1]
    return stages


def _even_counts(total: int, parts: int, middle_first: bool) -> list[int]:
    base, rem = divmod(total, parts)
    counts = [base] * parts
    order = list(range(1, parts - 1)) + [0, parts - 1] if middle_first and parts > 2 else list(range(parts))
    for i in order[:rem]:
        counts[i] += 1
    return counts


def _virtual_stage_tokens(spec: ModelSpec, pp: int, vpp: int, first: int, last: int,
                          acc_emb: bool, acc_loss: bool) -> list[str]:
    """Token strings per virtual stage (model order) for the non-layout split rules."""
    L, S = spec.num_layers, pp * vpp
    if first != NO_VALUE or last != NO_VALUE:
        if pp == 1:
            per_rank = [L]
        else:
            if acc_emb or acc_loss:
                raise LayoutError("first/last_stage_layers cannot be combined with "
                                  "account_for_embedding/loss_in_pipeline_split (Megatron rejects it)")
            fixed = {0: first, pp - 1: last}
            fixed = {r: n for r, n in fixed.items() if n != NO_VALUE}
            rest = L - sum(fixed.values())
            free = [r for r in range(pp) if r not in fixed]
            if rest < 0 or (not free and rest != 0):
                raise LayoutError(f"first/last_stage_layers ({first}, {last}) do not add up to "
                                  f"num_layers {L} over pp={pp}")
            spread = _even_counts(rest, len(free), middle_first=False) if free else []
            per_rank = [fixed.get(r, 0) for r in range(pp)]
            for r, n in zip(free, spread):
                per_rank[r] = n
        counts = [0] * S
        for r in range(pp):
            for k, n in enumerate(_even_counts(per_rank[r], vpp, middle_first=False)):
                counts[k * pp + r] = n
        if min(counts) < 1:
            v = counts.index(min(counts))
            raise LayoutError(f"virtual stage {v} holds no layer (pp={pp}, vpp={vpp}, first/last "
                              f"stage layers {first}/{last})")
        tokens = ["t" * n for n in counts]
        tokens[0] = "E" + tokens[0]
    else:
        slots = _even_counts(L + int(acc_emb) + int(acc_loss), S, middle_first=True)
        tokens = []
        for v, n in enumerate(slots):
            emb = v == 0 and acc_emb
            loss = v == S - 1 and acc_loss
            if n < 1:
                raise LayoutError(f"virtual stage {v} holds no layer slot (pp={pp}, vpp={vpp}, "
                                  f"{spec.num_layers} layers{' + embedding' if acc_emb else ''}"
                                  f"{' + loss' if acc_loss else ''})")
            tokens.append("t" * (n - int(emb) - int(loss)))
        tokens[0] = "E" + tokens[0]
    tokens[-1] = tokens[-1] + "m" * spec.mtp_num_layers + "L"
    return tokens


def split_stages(spec: ModelSpec, pp: int, vpp: int, first: int, last: int, acc_emb: bool,
                 acc_loss: bool, layout: str | None, schedule: int = 0) -> np.ndarray:
    """Per physical stage composition, shape (pp, 5): dense layers, MoE layers, embedding, head, MTP.

    Raises LayoutError with the reason when the split is impossible (an empty virtual stage, a
    layout that does not match pp·vpp or num_layers, ...).
    """
    return split_chunks(spec, pp, vpp, first, last, acc_emb, acc_loss, layout, schedule).sum(axis=1)


def split_chunks(spec: ModelSpec, pp: int, vpp: int, first: int, last: int, acc_emb: bool,
                 acc_loss: bool, layout: str | None, schedule: int = 0) -> np.ndarray:
    """Per model chunk composition, shape (pp, chunks, 5): entry [r, k] is the chunk k of pipeline rank
    r (same columns as ``split_stages``, which is its sum over chunks).

    Megatron's schedules (``schedule`` 0): virtual stage k·pp + r, vpp chunks. DualPipeV: the model in
    2·pp virtual stages, rank r holding r and 2pp − 1 − r (MindSpeed dualpipev_chunks.py
    ``get_transformer_layer_offset``: the second chunk counts from the end, so the embedding and the LM
    head both sit on rank 0). DualPipe: the model in pp stages held twice, rank r holding stage r of the
    forward direction and stage pp − 1 − r of the reverse one (DeepSeek-V3 §3.2.1: two copies of the
    parameters)."""
    if schedule and first != NO_VALUE or schedule and last != NO_VALUE:
        raise LayoutError("first/last_stage_layers size pipeline ranks 0 and pp-1 of a 1F1B pipeline; DualPipe "
                          "places two chunks on every rank: give a pipeline_layout instead")
    stages = {0: pp * vpp, DUALPIPE: pp, DUALPIPEV: 2 * pp}[schedule]
    tokens = _stage_tokens(spec, pp, 1 if schedule else vpp, stages, first, last, acc_emb, acc_loss, layout)
    if schedule == DUALPIPEV:
        places = [[(v, 0)] if v < pp else [(2 * pp - 1 - v, 1)] for v in range(stages)]
    elif schedule == DUALPIPE:
        places = [[(v, 0), (pp - 1 - v, 1)] for v in range(stages)]
    else:
        places = [[(v % pp, v // pp)] for v in range(stages)]
    pattern = spec.moe_layer_pattern()
    comp = np.zeros((pp, 2 if schedule else vpp, 5), dtype=np.int64)
    layer = 0
    for v, t in enumerate(tokens):
        n = t.count("t")
        n_moe = sum(pattern[layer:layer + n])
        layer += n
        for r, k in places[v]:
            comp[r, k] = (n - n_moe, n_moe, t.count("E"), t.count("L"), t.count("m"))
    return comp


def _stage_tokens(spec: ModelSpec, pp: int, vpp: int, stages: int, first: int, last: int, acc_emb: bool,
                  acc_loss: bool, layout: str | None) -> list[str]:
    """Token strings of the ``stages`` virtual stages in model order, from the layout or the split rules
    (DualPipeV's 2·pp stages split as pp·2 would be: ``vpp`` is then 2)."""
    if layout is not None:
        tokens = parse_layout(layout)
        if len(tokens) != stages:
            want = f"pp*vpp is {stages}" if stages == pp * vpp else f"the DualPipe schedule has {stages}"
            raise LayoutError(f"pipeline_layout has {len(tokens)} virtual stages, {want}")
        n_t = sum(t.count("t") for t in tokens)
        if n_t != spec.num_layers:
            raise LayoutError(f"pipeline_layout places {n_t} decoder layers, the model has {spec.num_layers}")
        if "".join(tokens).count("m") != spec.mtp_num_layers:
            raise LayoutError(f"pipeline_layout places {''.join(tokens).count('m')} MTP layers, "
                              f"the model has {spec.mtp_num_layers}")
        if "".join(tokens).count("E") != 1 or "".join(tokens).count("L") != 1:
            raise LayoutError("pipeline_layout must hold exactly one E and one L")
    else:
        tokens = _virtual_stage_tokens(spec, pp, stages // pp, first, last, acc_emb, acc_loss)
    for v, t in enumerate(tokens):
        if not t:
            raise LayoutError(f"virtual stage {v} holds no layer slot (pp={pp}, vpp={vpp}, "
                              f"{spec.num_layers} layers)")
    return tokens


def _slot_flops(spec: ModelSpec) -> tuple[list[float], list[str]]:
    """Forward FLOPs per token of each slot in model order, with its layout symbols: the decoder
    layers (the first carries the embedding, a lookup with no matmul), the MTP modules and the LM head
    with the loss. The contract's FLOP count (costmodel/flops.py) weighs them, so a 150K-vocabulary
    head and an MTP module weigh what their matmuls do."""
    from .flops import (attention_core_flops_per_token, dense_layer_matmul_params,
                        moe_layer_active_matmul_params, mtp_matmul_params)

    core = attention_core_flops_per_token(spec)
    dense, moe = 2.0 * dense_layer_matmul_params(spec) + core, None
    if spec.is_moe:
        moe = 2.0 * moe_layer_active_matmul_params(spec) + core
    costs = [moe if is_moe else dense for is_moe in spec.moe_layer_pattern()]
    symbols = ["t"] * len(costs)
    symbols[0] = "Et"
    costs += [2.0 * mtp_matmul_params(spec) + core] * spec.mtp_num_layers
    symbols += ["m"] * spec.mtp_num_layers
    costs.append(2.0 * spec.hidden_size * spec.vocab_size)
    symbols.append("L")
    return costs, symbols


# Bounds of the cost-balanced split (``balanced_tokens``): elements scored per chunk of the banded dynamic
# programme (a few arrays of 8 bytes each, so tens of MiB at most), and the most candidate (stage, end,
# start) triples one split may score before it takes the split by prefix targets instead (measured: about
# half a second on one core of the development machine; 1,000 layers over 64 stages score 3.3 million).
BALANCE_CHUNK_ELEMENTS = 1 << 20
BALANCE_MAX_WORK = 40_000_000
# Sweeps of single-slot moves that spread tied stage sizes over the ranks (``_balance_ranks``); each costs
# O(S) trials of O(S) (every real split settles in a handful).
BALANCE_MAX_SWEEPS = 64


def balanced_tokens(spec: ModelSpec, pp: int, vpp: int) -> list[str] | None:
    """Per-virtual-stage tokens (``pipeline_layout`` symbols) of the contiguous split whose virtual
    stages are as equal in forward FLOPs (``_slot_flops``) as the slots allow; None where there are
    fewer slots than virtual stages.

    "As equal as possible" is the least sum of squared stage costs (a dynamic programme over slot
    boundaries), not the least maximum alone: with vpp > 1 a rank runs several chunks, and a split
    that only caps the heaviest chunk may leave a rank whose chunks are all at the cap (80 Llama
    layers over 8 stages: 11·7 + 3 caps chunks at 11, but rank 0 then holds 22 to rank 3's 14).

    Bounded by construction: the programme (``_least_squares_cuts``) scores S·(n-S+1)·w triples for n
    slots, S = pp·vpp stages and w the slots a stage of the optimum can hold (about 2n/S for even
    layers) and keeps S·(n-S+1) two-byte back pointers; when the triples would be more than
    ``BALANCE_MAX_WORK`` (10,000 even layers over 2 to 64 stages, say) the split is the one by prefix
    targets (``_target_cuts``: O(S·log n), every stage within a slot of its equal share), so any spec the
    bounds accept splits in under two seconds of CPU (10,000 layers over 1,250 × 4 stages: 1.7 s)."""
    costs, symbols = _slot_flops(spec)
    n, S = len(costs), pp * vpp
    if n < S:
        return None
    prefix = np.concatenate([[0.0], np.cumsum(costs)]) / sum(costs)  # normalised: squares stay O(1)
    cuts = _least_squares_cuts(prefix, S, max(costs) / sum(costs))
    if cuts is None:
        cuts = _target_cuts(prefix, S)
    cuts = _balance_ranks(cuts, prefix, pp)
    return ["".join(symbols[cuts[k]:cuts[k + 1]]) for k in range(S)]


def _stage_window(prefix: np.ndarray, S: int, max_slot: float) -> np.ndarray:
    """Per end boundary j, the first start boundary i a stage i..j-1 of a least-squares split can have.

    In a split of least sum of squares, a stage of two or more slots costs at most 2T/S + c_max (T the
    total, c_max the heaviest slot; here T = 1): with b the cheapest stage (c_b <= T/S) and d a neighbour
    of b other than the stage a, merging b into d costs 2·c_b·c_d <= 2(T/S)(T/S + c_max) (two neighbours
    differ by at most a boundary slot, else moving it lowers the sum), while cutting a in two at the slot
    boundary nearest its middle saves 2pq >= (c_a^2 - c_max^2)/2; so c_a <= 2T/S + c_max. When a is b's
    only neighbour, c_a <= c_b + c_max. The window allows 2T/S + 2·c_max, a whole slot of margin over
    rounding, and any single slot."""
    reach = prefix - (2.0 / S + 2.0 * max_slot) * (1.0 + 1e-9)
    first = np.searchsorted(prefix, reach, side="left")
    return np.minimum(first, np.maximum(np.arange(len(prefix)) - 1, 0))


def _least_squares_cuts(prefix: np.ndarray, S: int, max_slot: float) -> list[int] | None:
    """The stage boundaries of the least-sum-of-squares split of the slots into S non-empty stages, as
    the full dynamic programme over every (start, end) pair finds them (the same float sums, the same
    first minimum), but scoring only the starts ``_stage_window`` allows: the chosen split's stages all
    lie inside it, so what is left out only ever lost. None when that would score more than
    ``BALANCE_MAX_WORK`` triples."""
    n = len(prefix) - 1
    first = _stage_window(prefix, S, max_slot)
    width = np.arange(n + 1) - first  # starts scored per end
    span = n - S + 1  # the ends a stage can have: stage s ends in s+1 .. s+span
    if S > 1 and (S - 1) * int(width[1:].max()) * span > BALANCE_MAX_WORK:
        return None
    best = (prefix[1:span + 1] - prefix[0]) ** 2  # best[j - 1]: first j slots in one stage, j = 1 .. span
    # start of stage s ending at slot s + 1 + column, less its window's first start: < 65,536 for any spec
    # the bounds accept (n <= 10,101 slots), so two bytes each
    back = np.zeros((S, span), dtype=np.uint16 if n < 65_535 else np.int64)
    for stage in range(1, S):
        ends = np.arange(stage + 1, stage + 1 + span)
        best, back[stage] = _stage_step(prefix, best, stage, ends, first)
    cuts, j = [n], n
    for stage in range(S - 1, 0, -1):
        j = int(back[stage, j - stage - 1]) + int(_window_start(first, stage, j))
        cuts.append(j)
    return [0] + cuts[::-1]


def _stage_step(prefix: np.ndarray, prev: np.ndarray, stage: int, ends: np.ndarray,
                first: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One stage of the programme: for each end j, the least ``prev`` (the first j' slots in ``stage``
    stages, indexed j' - stage) plus the square of stage j'..j-1, over the allowed starts j', in chunks
    of at most ``BALANCE_CHUNK_ELEMENTS`` scored pairs; returns the minima and the first start reaching
    each, less the first allowed start (``_window_start``)."""
    lo = _window_start(first, stage, ends)  # a start leaves at least one slot per earlier stage
    width = ends - lo
    w = int(width.max())
    step = max(1, BALANCE_CHUNK_ELEMENTS // max(w, 1))
    out_best = np.empty(len(ends))
    out_back = np.empty(len(ends), dtype=np.int64)
    offsets = np.arange(w)
    for a in range(0, len(ends), step):
        e, l = ends[a:a + step], lo[a:a + step]
        starts = l[:, None] + offsets[None, :]  # (chunk, w), starts beyond j - 1 masked
        valid = starts < e[:, None]
        starts = np.where(valid, starts, e[:, None] - 1)
        total = prev[starts - stage] + (prefix[e][:, None] - prefix[starts]) ** 2
        total[~valid] = np.inf
        k = np.argmin(total, axis=1)
        out_back[a:a + step] = k
        out_best[a:a + step] = total[np.arange(len(e)), k]
    return out_best, out_back


def _window_start(first: np.ndarray, stage: int, ends):
    """The first start a stage ``stage`` ending at ``ends`` may have: in its window, and leaving a slot for
    each earlier stage."""
    return np.maximum(first[ends], stage)


def _target_cuts(prefix: np.ndarray, S: int) -> list[int]:
    """The linear fallback of ``balanced_tokens`` for splits beyond its work bound: stage k ends at the slot
    boundary nearest the prefix cost k/S, kept strictly increasing with room for the stages after it."""
    n = len(prefix) - 1
    near = np.searchsorted(prefix, np.arange(1, S) / S)
    cuts = [0]
    for k, j in enumerate(near.tolist(), start=1):
        if j > 0 and abs(prefix[j - 1] - k / S) <= abs(prefix[min(j, n)] - k / S):
            j -= 1
        cuts.append(int(min(max(j, cuts[-1] + 1), n - (S - k))))
    return cuts + [n]


def _balance_ranks(cuts: list[int], prefix: np.ndarray, pp: int) -> list[int]:
    """Among the splits as even per virtual stage as ``cuts``, one whose ranks are even too.

    Stage sizes that tie (2s and 3s of Llama's 80 layers over 32 stages) can sit in any order, but rank
    r runs stages r, r + pp, ...: moving single slots across stage boundaries while the sum of squared
    stage costs does not grow, as long as the sum of squared rank loads falls, spreads them over the
    ranks."""
    def costs(c):
        stage = np.diff(prefix[c])
        return float(stage @ stage), float(np.square(np.bincount(np.arange(len(stage)) % pp, stage)).sum())

    stage_sq, rank_sq = costs(cuts)
    tol = 1e-12 * max(stage_sq, 1e-300)
    improved, sweeps = True, 0
    while improved and sweeps < BALANCE_MAX_SWEEPS:
        improved, sweeps = False, sweeps + 1
        for k in range(1, len(cuts) - 1):
            for step in (-1, 1):
                moved = cuts[k] + step
                if not cuts[k - 1] < moved < cuts[k + 1]:
                    continue
                trial = cuts[:k] + [moved] + cuts[k + 1:]
                s_sq, r_sq = costs(trial)
                if s_sq <= stage_sq + tol and r_sq < rank_sq - tol:
                    cuts, stage_sq, rank_sq, improved = trial, min(s_sq, stage_sq), r_sq, True
    return cuts


@dataclass
class StageSet:
    """Candidate stages per config: compositions (N, K, 5) and pipeline ranks (N, K).

    For speed the batch path keeps, per distinct composition, only its lowest-rank stage: time depends
    on the composition alone and activation memory falls with the rank, so the maxima over stages are
    exact. A composition here includes the decoder layers of each model chunk when a rank's chunks are
    uneven (their activations differ, so which of them are in flight matters: see
    ``replay_peak_activation_bytes``); for the same chunks, a lower rank's in-flight set contains a
    higher rank's at every step. ``all_stages=True`` keeps every stage (used for per-stage reports).
    """

    comp: np.ndarray
    rank: np.ndarray
    valid: np.ndarray  # (N,) split possible
    errors: list[str | None]  # per split
    split_index: np.ndarray  # (N,)
    split_comps: list[np.ndarray]  # per split: every stage's composition, (pp, 5)
    # Per split (rows of split_index): compositions (S, K, 5) and ranks (S, K), so that per-stage
    # arrays can be gathered per column without going through the (N, K, 5) array.
    split_comp_table: np.ndarray | None = None
    split_rank_table: np.ndarray | None = None
    split_stage_count: np.ndarray | None = None  # (S,) stages kept before padding to K
    # Per split: the decoder layers (DENSE, MOE, MTP) of each chunk of the kept stages (S, K, V, 3),
    # V the batch's largest vpp (zero-padded), and whether that stage's chunks differ (S, K).
    split_chunk_table: np.ndarray | None = None
    split_uneven_table: np.ndarray | None = None
    split_chunk_acts: list[np.ndarray] | None = None  # per split: every rank's chunks, (pp, vpp, 3)
    split_unevens: list[np.ndarray] | None = None  # per split: (pp,) whether the rank's chunks differ
    split_replay_caches: list["ReplayMemo"] | None = None  # per split: m -> rank_in_flight_layers (shared)


class _TableStageSet(StageSet):
    """A StageSet built from its split tables: ``comp`` (N, K, 5) and ``rank`` (N, K) are gathered on
    first use, as the batch path reads the tables and a large batch's ``comp`` is tens of MB."""

    def _gathered(name, table):  # noqa: N805  (builds the two properties below)
        def get(self):
            value = self.__dict__.get(name)
            if value is None:
                value = self.__dict__[name] = getattr(self, table)[self.split_index]
            return value

        def set_(self, value):
            self.__dict__[name] = value

        return property(get, set_)

    comp = _gathered("comp", "split_comp_table")
    rank = _gathered("rank", "split_rank_table")
    del _gathered


def unique_rows(columns: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(np.stack(columns, axis=1), axis=0, return_inverse=True)`` for integer columns,
    without sorting rows: each row is packed into one int64 (mixed radix, which keeps the rows'
    lexicographic order), and small code ranges are deduplicated through a lookup table."""
    n = len(columns[0])
    if n == 1:  # one row (a single evaluate): itself, as the packing below would give it
        return np.array([[int(c[0]) for c in columns]], dtype=np.int64), np.zeros(1, dtype=np.intp)
    los, spans, total = [], [], 1
    for c in columns:
        if n == 0:
            break
        lo, hi = int(c.min()), int(c.max())
        los.append(lo)
        spans.append(hi - lo + 1)
        total *= hi - lo + 1
    if n == 0 or total >= 1 << 62:
        uniq, inverse = np.unique(np.stack(columns, axis=1), axis=0, return_inverse=True)
        return uniq, inverse.reshape(-1)
    code = np.zeros(n, dtype=np.int64)
    for c, lo, span in zip(columns, los, spans):
        if span > 1:
            code *= span
            code += c
            if lo:
                code -= lo
    if total <= max(4 * n, 1 << 16):
        present = np.zeros(total, dtype=bool)
        present[code] = True
        uniq_codes = np.flatnonzero(present)
        lookup = np.empty(total, dtype=np.intp)
        lookup[uniq_codes] = np.arange(len(uniq_codes))
        inverse = lookup[code]
    else:
        uniq_codes, inverse = np.unique(code, return_inverse=True)
    digits = []
    rest = uniq_codes.astype(np.int64)
    for lo, span in zip(reversed(los), reversed(spans)):
        rest, d = np.divmod(rest, span)
        digits.append(d + lo)
    return np.stack(digits[::-1], axis=1), inverse


# Decoder-layer columns of a chunk: what its stored activations depend on (the embedding stores
# none, the head's logits are counted once per stage).
CHUNK_ACT_COLUMNS = (DENSE, MOE, MTP)

class Memo(dict):
    """A dict of numpy results that forgets everything when it would pass ``max_entries`` entries or
    ``max_bytes`` bytes, and never keeps an entry above a sixteenth of them: the search asks for the
    same few thousand splits and replays again and again, while a long-lived server must not keep what
    one request for a 10,000-stage pipeline built (a plain cache would hold that memory for the
    process's life)."""

    def __init__(self, max_entries: int, max_bytes: int):
        super().__init__()
        self.max_entries, self.max_bytes, self.bytes = max_entries, max_bytes, 0

    def put(self, key, value, nbytes: int):
        """Remember ``value`` (``nbytes`` large) under ``key`` if it is small enough; returns ``value``."""
        if nbytes > self.max_bytes // 16:
            return value
        if len(self) >= self.max_entries or self.bytes + nbytes > self.max_bytes:
            self.clear()
            self.bytes = 0
        self[key] = value
        self.bytes += nbytes
        return value


class ReplayMemo:
    """One split's ``rank_in_flight_layers`` per micro-batch count, kept in the shared ``_REPLAYS``."""

    _next = 0

    def __init__(self):
        ReplayMemo._next += 1
        self.token = ReplayMemo._next

    def get(self, m: int):
        return _REPLAYS.get((self.token, m))

    def put(self, m: int, table: np.ndarray) -> np.ndarray:
        return _REPLAYS.put((self.token, m), table, table.nbytes)


_SPLIT_CACHE = Memo(4096, 128 << 20)
_REPLAYS = Memo(16384, 64 << 20)


def _split_cached(spec_key: str, spec: ModelSpec, pp: int, vpp: int, first: int, last: int, ae: bool,
                  al: bool, layout: str | None, schedule: int = 0
                  ) -> tuple[np.ndarray, str | None, np.ndarray, np.ndarray, np.ndarray, "ReplayMemo"]:
    """``split_stages`` (composition, error or None, lowest rank of each distinct composition, the
    chunks' decoder layers (pp, vpp, 3), whether each rank's chunks are uneven (pp,), and the
    ``ReplayMemo`` of its ``rank_in_flight_layers`` per m), remembered per model and split: a search
    scores the same few hundred splits chunk after chunk."""
    key = (spec_key, pp, vpp, first, last, ae, al, layout, schedule)
    hit = _SPLIT_CACHE.get(key)
    if hit is not None:
        return hit
    try:
        chunks, error = split_chunks(spec, pp, vpp, first, last, ae, al, layout, schedule), None
    except LayoutError as exc:
        chunks = np.zeros((pp, 2 if schedule else vpp, 5), dtype=np.int64)
        chunks[0, :, DENSE] = 1  # placeholder so that downstream arithmetic stays finite
        error = str(exc)
    comp = chunks.sum(axis=1)
    chunk_act = np.ascontiguousarray(chunks[:, :, list(CHUNK_ACT_COLUMNS)])
    # DualPipe's in-flight activations are the paper's closed form (dualpipe_microbatches_in_flight), not
    # a replay of Megatron's schedule: no chunk is uneven for it.
    uneven = (chunk_act != chunk_act[:, :1]).any(axis=(1, 2)) & (schedule == 0)
    first_rank: dict[tuple, int] = {}  # lowest rank of each distinct composition
    for r, row in enumerate(map(tuple, comp.tolist())):
        first_rank.setdefault(row + (tuple(chunk_act[r].ravel().tolist()) if uneven[r] else ()), r)
    candidates = np.fromiter(first_rank.values(), dtype=np.intp, count=len(first_rank))
    for a in (comp, chunk_act, uneven):
        a.flags.writeable = False  # shared between calls
    hit = (comp, error, candidates, chunk_act, uneven, ReplayMemo())
    return _SPLIT_CACHE.put(key, hit, comp.nbytes + candidates.nbytes + chunk_act.nbytes + uneven.nbytes)


def stage_sets(spec: ModelSpec, batch: ConfigBatch, all_stages: bool = False) -> StageSet:
    uniq, inverse = unique_rows([batch.pp, batch.vpp, batch.first_stage_layers, batch.last_stage_layers,
                                 batch.account_for_embedding.astype(np.int64),
                                 batch.account_for_loss.astype(np.int64), batch.layout_id, batch.schedule])
    per_split: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    split_comps: list[np.ndarray] = []
    split_chunk_acts: list[np.ndarray] = []
    split_unevens: list[np.ndarray] = []
    split_replay_caches: list[ReplayMemo] = []
    errors: list[str | None] = []
    spec_key = spec.model_dump_json()
    for pp, vpp, first, last, ae, al, lid, schedule in uniq.tolist():
        layout = batch.layouts[lid] if lid != NO_VALUE else None
        comp, error, candidates, chunk_act, uneven, replay_cache = _split_cached(
            spec_key, spec, pp, vpp, first, last, bool(ae), bool(al), layout, schedule)
        errors.append(error)
        split_comps.append(comp)
        split_chunk_acts.append(chunk_act)
        split_unevens.append(uneven & (error is None))
        split_replay_caches.append(replay_cache)
        ranks = np.arange(pp) if all_stages else candidates
        # an impossible split's placeholder chunks are not a schedule worth replaying
        per_split.append((comp[ranks], ranks, chunk_act[ranks], uneven[ranks] & (error is None)))
    K = max(len(p[1]) for p in per_split)
    V = max(p[2].shape[1] for p in per_split)
    comp_tab = np.zeros((len(per_split), K, 5), dtype=np.int64)
    rank_tab = np.zeros((len(per_split), K), dtype=np.int64)
    chunk_tab = np.zeros((len(per_split), K, V, len(CHUNK_ACT_COLUMNS)), dtype=np.int64)
    uneven_tab = np.zeros((len(per_split), K), dtype=bool)
    for i, (comp, ranks, chunk_act, uneven) in enumerate(per_split):
        # repeat the last stage: duplicates change neither max nor argmax
        fill = np.minimum(np.arange(K), len(ranks) - 1)
        comp_tab[i] = comp[fill]
        rank_tab[i] = ranks[fill]
        chunk_tab[i, :, :chunk_act.shape[1]] = chunk_act[fill]
        uneven_tab[i] = uneven[fill]
    valid_split = np.array([e is None for e in errors])
    return _TableStageSet(comp=None, rank=None, valid=valid_split[inverse],
                          errors=errors, split_index=inverse, split_comps=split_comps,
                          split_comp_table=comp_tab, split_rank_table=rank_tab,
                          split_stage_count=np.array([len(p[1]) for p in per_split], dtype=np.int64),
                          split_chunk_table=chunk_tab, split_uneven_table=uneven_tab,
                          split_chunk_acts=split_chunk_acts, split_unevens=split_unevens,
                          split_replay_caches=split_replay_caches)


def microbatches_in_flight(pp: np.ndarray, vpp: np.ndarray, m: np.ndarray, rank: np.ndarray,
                           schedule: np.ndarray | None = None) -> np.ndarray:
    """Stage activation sets held at the peak by pipeline rank ``rank``, in units of one micro-batch of
    the whole stage.

    1F1B (Narayanan et al. SC21 §2.2): rank r holds min(pp − r, m) micro-batches. Interleaved 1F1B:
    Megatron-Core warms up min((pp − r − 1)·2 + (vpp − 1)·pp, m·vpp) chunk micro-batches, then holds
    one more; each chunk is 1/vpp of the stage. Without pipelining, one micro-batch at a time.
    Exact when the rank's chunks store equal bytes; otherwise see ``replay_peak_activation_bytes``
    (the two agree on equal chunks). DualPipe schedules (``schedule`` > 0): ``dualpipe_microbatches_in_flight``.
    """
    pp, vpp, m = pp[:, None], vpp[:, None], m[:, None]
    one_f_one_b = np.minimum(pp - rank, m)
    chunks = np.minimum((pp - rank - 1) * 2 + (vpp - 1) * pp + 1, m * vpp)
    interleaved = chunks / vpp
    held = np.where(vpp > 1, interleaved, one_f_one_b)
    if schedule is not None:
        held = np.where(schedule[:, None] > 0, dualpipe_microbatches_in_flight(pp, schedule[:, None]), held)
    return np.where(pp > 1, held, 1.0).astype(np.float64, copy=False)


def dualpipe_microbatches_in_flight(pp: np.ndarray, schedule: np.ndarray) -> np.ndarray:
    """Activations a rank holds at the peak under DualPipe, in micro-batches of the whole rank (both its
    chunks), from the "Activation" column of DeepSeek-V3 Table 2 and the DualPipe README: PP + 1 chunks
    of activations, PP the number of pipeline stages, on every rank.

    DualPipe: PP = pp stages of L/pp layers, two per rank: (pp + 1)/2 rank micro-batches. DualPipeV:
    PP = 2·pp chunks of L/(2pp) layers on pp ranks, two per rank: (2pp + 1)/2. 1F1B holds pp on rank 0."""
    stages = np.where(schedule == DUALPIPEV, 2 * pp, pp)
    return (stages + 1) / 2.0


def rank_in_flight_layers(pp: int, vpp: int, m: int, chunk_layers: np.ndarray,
                          uneven: np.ndarray) -> np.ndarray:
    """``in_flight_layers`` of every rank whose chunks are ``uneven``, stacked and zero-padded to an
    array (pp, Q, C) (ranks with even chunks: zeros, as the closed form serves them)."""
    rows = {r: in_flight_layers(pp, vpp, m, r, chunk_layers[r]) for r in np.flatnonzero(uneven).tolist()}
    Q = max((len(t) for t in rows.values()), default=1)
    out = np.zeros((pp, Q, chunk_layers.shape[2]))
    for r, t in rows.items():
        out[r, :len(t)] = t
    out.flags.writeable = False
    return out


def schedule_order(pp: int, vpp: int, m: int, rank: int) -> tuple[int, list[int], list[int]]:
    """Rank ``rank``'s 1F1B schedule as Megatron-Core runs it: (warm-up forwards W, the model chunk of
    each forward in order, the model chunk of each backward in order), m·vpp of each.

    The rank runs forwards 0..W−1, then for k = 0, 1, ...: forward W + k, backward k, then the
    remaining backwards (``forward_backward_pipelining_with_interleaving`` /
    ``_without_interleaving`` in megatron/core/pipeline_parallel/schedules.py). Interleaved (vpp > 1):
    W = min((pp − rank − 1)·2 + (vpp − 1)·g, m·vpp) with the micro-batch group g = pp (Megatron's
    ``microbatch_group_size_per_vp_stage`` default); forward i runs the chunk of entry i of
    ``get_schedule_table`` (each group of g micro-batches through chunk 0, then chunk 1, ...; the last
    group takes every micro-batch left), backward i the chunk vpp − 1 − that. Without interleaving
    W = min(pp − rank − 1, m) and every pass is chunk 0; without pipelining (pp = 1) W = 0.
    """
    if vpp <= 1:
        warmup = min(max(pp - rank - 1, 0), m)
        return warmup, [0] * m, [0] * m
    g = pp
    table: list[int] = []
    for start in range(0, m, g):
        size = m - start if start + g >= m else g
        for chunk in range(vpp):
            table += [chunk] * size
    warmup = min((pp - rank - 1) * 2 + (vpp - 1) * g, m * vpp)
    return warmup, table, [vpp - 1 - c for c in table]


_ALIVE_CACHE = Memo(4096, 32 << 20)


# From 2·pp micro-batches on, one more group of pp adds one more period of the steady 1F1B phase and
# no new in-flight state (m ≥ pp suffices without interleaving): the warm-up holds fewer than
# (vpp + 1)·pp forwards and each group of the schedule table is pp micro-batches, so the states of
# m and m + pp are the same set. tests/test_pipeline_replay.py checks it against the full replay.
STEADY_FROM_GROUPS = 3  # one group more than the 2 found necessary
PRUNE_MAX_ROWS = 2048
DOMINANCE_BLOCK_CELLS = 1 << 20  # cells (row pairs × columns) one block of _maximal_rows compares: 1 MB of bools


def steady_microbatches(pp: int, m: int) -> int:
    """A micro-batch count whose schedule holds the same in-flight states as ``m``'s: ``m`` itself up
    to ``(STEADY_FROM_GROUPS + 1)·pp``, else the same residue mod pp above ``STEADY_FROM_GROUPS·pp``.
    Without it a replay costs O(m) time and memory: 10^6 micro-batches took 13 s and 180 MB."""
    floor = STEADY_FROM_GROUPS * max(pp, 1)
    return m if m < floor + pp else floor + (m - floor) % max(pp, 1)


def alive_counts(pp: int, vpp: int, m: int, rank: int) -> np.ndarray:
    """Micro-batches of each model chunk whose activations rank ``rank`` holds, at every moment that
    can be a peak (right after a forward), reduced to the maximal ones: an int array (Q, vpp), whose
    row q times the chunks' activation bytes of one micro-batch is the bytes held at that moment.

    A forward of (chunk, micro-batch) stores its activations until its backward frees them. Rows
    dominated by another row (no larger anywhere) are dropped where there are few: they can never be
    the peak for non-negative chunk sizes. Pure and remembered per (pp, vpp, m, rank)."""
    key = (int(pp), int(vpp), steady_microbatches(int(pp), int(m)), int(rank))
    hit = _ALIVE_CACHE.get(key)
    if hit is not None:
        return hit
    pp, vpp, m, rank = key
    m = max(m, 1)
    warmup, fwd, bwd = schedule_order(pp, vpp, m, rank)
    eye = np.eye(vpp, dtype=np.int64)
    started = np.cumsum(eye[fwd], axis=0)  # row i: forwards 0..i done
    freed = np.cumsum(eye[bwd], axis=0)  # row k: backwards 0..k done
    # after forward i: backwards 0..i − W − 1 done (none during the warm-up)
    done = np.arange(len(fwd)) - warmup
    states = started - np.where(done[:, None] > 0, freed[np.maximum(done - 1, 0)], 0)
    # Interleaved steady states hold the same number of micro-batches in different chunks, so most are
    # maximal and pruning a long schedule costs O(Q²) for little gain (pp 100 · vpp 50: minutes): past
    # PRUNE_MAX_ROWS forwards all states are kept, which leaves every peak the same.
    result = _maximal_rows(states) if len(states) <= PRUNE_MAX_ROWS else states
    result.flags.writeable = False
    _ALIVE_CACHE.put(key, result, result.nbytes)
    return result


def replay_peak_activation_bytes(pp: int, vpp: int, m: int, rank: int, chunk_bytes) -> float:
    """Peak stored activation bytes of pipeline rank ``rank`` over one step, replaying Megatron-Core's
    1F1B schedule (``schedule_order``): the maximum over time of the sum, over the (chunk, micro-batch)
    pairs whose forward has run and whose backward has not, of that chunk's bytes.

    ``chunk_bytes``: for each of the rank's vpp model chunks (chunk k is virtual stage k·pp + rank),
    the activation bytes one micro-batch stores in it. ``m``: micro-batches per step. With equal
    chunks this is ``microbatches_in_flight`` times the stage's bytes of one micro-batch."""
    chunk_bytes = np.asarray(chunk_bytes, dtype=np.float64)
    if _forwards(pp, vpp, m) > PRUNE_MAX_ROWS:
        return float(held_over_time(pp, vpp, m, rank, chunk_bytes[:, None]).max())
    return float((alive_counts(pp, vpp, m, rank) @ chunk_bytes).max())


def _forwards(pp: int, vpp: int, m: int) -> int:
    """Forwards a rank runs in the replayed schedule."""
    return max(steady_microbatches(int(pp), int(m)), 1) * int(vpp)


def held_over_time(pp: int, vpp: int, m: int, rank: int, chunk_values: np.ndarray) -> np.ndarray:
    """What rank ``rank`` holds right after each forward of its schedule, summed over the (chunk,
    micro-batch) pairs alive: an array (Q, C) from ``chunk_values`` (vpp, C), one micro-batch's
    value of each chunk. ``alive_counts(...) @ chunk_values`` without the (Q, vpp) counts: a long
    interleaved schedule costs O(Q·C), not O(Q·vpp) (pp 100 · vpp 50 took seconds in cumsums)."""
    warmup, fwd, bwd = schedule_order(pp, vpp, max(steady_microbatches(int(pp), int(m)), 1), rank)
    started = np.cumsum(chunk_values[fwd], axis=0)
    freed = np.cumsum(chunk_values[bwd], axis=0)
    done = np.arange(len(fwd)) - warmup
    return started - np.where(done[:, None] > 0, freed[np.maximum(done - 1, 0)], 0)


def _maximal_rows(rows: np.ndarray) -> np.ndarray:
    """The distinct rows of ``rows`` that no other row dominates (≥ everywhere, > somewhere), in
    ``np.unique`` order.

    With at most two varying columns, a staircase: by falling x (then falling y) a row is maximal iff
    its y beats every row before it. Otherwise every pair is compared, a block of rows against all of
    them per numpy call (``DOMINANCE_BLOCK_CELLS`` compared cells at most): O(Q²) cells in O(Q²/cells)
    calls, where a loop over rows made Q calls."""
    if len(rows) == 0 or rows.shape[1] == 0 or rows.dtype.kind not in "iu":
        rows = np.unique(rows, axis=0)
    else:  # packed into one integer per row: np.unique sorts rows as bytes, seconds for long replays
        rows = unique_rows(list(rows.T))[0]
    if len(rows) <= 1:
        return rows
    varying = np.flatnonzero(rows.max(axis=0) != rows.min(axis=0))
    if len(varying) == 1:
        return rows[[int(rows[:, varying[0]].argmax())]]
    if len(varying) == 2:
        x, y = rows[:, varying[0]], rows[:, varying[1]]
        order = np.lexsort((-y, -x))
        best_before = np.maximum.accumulate(np.concatenate(([np.iinfo(np.int64).min], y[order][:-1])))
        return rows[np.sort(order[y[order] > best_before])]
    # Distinct rows: one is dominated iff another is >= it everywhere. Compared in blocks of rows against
    # all of them at once (a Python loop over rows cost most of a cold search's schedule replays).
    cols = rows[:, varying]  # constant columns never decide
    dominated = np.zeros(len(cols), dtype=bool)
    block = max(1, DOMINANCE_BLOCK_CELLS // (len(cols) * cols.shape[1]))
    for start in range(0, len(cols), block):
        part = cols[start:start + block]
        ge = (cols[None, :, :] >= part[:, None, :]).all(axis=2)  # ge[i, j]: row j >= part row i
        ge[np.arange(len(part)), np.arange(start, start + len(part))] = False  # not itself
        dominated[start:start + block] = ge.any(axis=1)
    return rows[~dominated]


def _hull_rows(rows: np.ndarray) -> np.ndarray:
    """The rows of ``rows`` that can be the maximum of ``rows @ w`` for some w ≥ 0: the maximal rows,
    and with two varying columns only those on the upper-right convex hull (a row under the segment
    between two others never wins). With one varying column, the one largest row."""
    rows = _maximal_rows(rows)
    varying = np.flatnonzero(rows.max(axis=0) != rows.min(axis=0))
    if len(varying) == 0:
        return rows[:1]
    if len(varying) == 1:
        return rows[[int(rows[:, varying[0]].argmax())]]
    if len(varying) > 2:
        return rows
    x, y = rows[:, varying[0]], rows[:, varying[1]]
    order = np.lexsort((-y, x))  # x ascending; among maximal rows y then descends
    hull: list[int] = []
    for i in order.tolist():
        while len(hull) >= 2:
            o, a = hull[-2], hull[-1]
            cross = (x[a] - x[o]) * (y[i] - y[o]) - (y[a] - y[o]) * (x[i] - x[o])
            if cross < 0:
                break
            hull.pop()  # a is on or under the segment o -> i
        hull.append(i)
    return rows[hull]


_LAYERS_CACHE = Memo(4096, 32 << 20)


def in_flight_layers(pp: int, vpp: int, m: int, rank: int, chunk_layers: np.ndarray) -> np.ndarray:
    """``alive_counts`` in layers: for each maximal in-flight moment of rank ``rank``, the layers of
    each kind whose activations of one micro-batch are held, summed over the (chunk, micro-batch)
    pairs alive; an array (Q, C) from ``chunk_layers`` (vpp, C), the layers of each kind per chunk
    (C kinds, e.g. ``CHUNK_ACT_COLUMNS``). The peak bytes are max over rows of (row · bytes of one
    layer of each kind) when a chunk's bytes are its layers' sum. Pure, remembered per argument."""
    chunk_layers = np.asarray(chunk_layers, dtype=np.int64)
    key = (int(pp), int(vpp), max(steady_microbatches(int(pp), int(m)), 1), int(rank), chunk_layers.shape,
           chunk_layers.tobytes())
    hit = _LAYERS_CACHE.get(key)
    if hit is None:
        held = held_over_time(pp, vpp, m, rank, chunk_layers) if _forwards(pp, vpp, m) > PRUNE_MAX_ROWS \
            else alive_counts(pp, vpp, m, rank) @ chunk_layers  # the same rows, pruned and shared
        hit = _hull_rows(held)
        hit.flags.writeable = False
        _LAYERS_CACHE.put(key, hit, hit.nbytes)
    return hit


def a2a_overlap_extra_microbatches(vpp: np.ndarray, m: np.ndarray, a2a_overlap: np.ndarray,
                                   schedule: np.ndarray | None = None) -> np.ndarray:
    """Micro-batches of a stage held beyond the schedule's own when the expert all-to-all is overlapped.

    Megatron-Core's combined 1F1B (``--overlap-moe-expert-parallel-comm``) runs one micro-batch's
    forward beside another's backward, so its warm-up runs one more forward step than 1F1B's: one more
    model chunk's activations alive, 1/vpp of a stage's with interleaving and a whole stage's with
    pp = 1 (the next micro-batch's forward beside this one's backward). Megatron-LM d98e8a64
    ``megatron/core/pipeline_parallel/schedules.py``: "we schedule one extra micro-batch forward step
    before the 1f1b stages", and ``combined_1f1b_schedule_for_no_pipelining``. Zero without the overlap
    or with one micro-batch, and under DualPipe, whose PP + 1 chunks in flight (Table 2) already count the
    forward that runs beside a backward."""
    extra = np.where(a2a_overlap & (m > 1), 1.0 / vpp, 0.0)
    return extra if schedule is None else np.where(schedule > 0, 0.0, extra)


def bubble_s(pp: np.ndarray, vpp: np.ndarray, stage_microbatch_s: np.ndarray) -> np.ndarray:
    """Pipeline fill and drain: (pp − 1)/vpp micro-batch times of the slowest stage (SC21 §2.2.2)."""
    return (pp - 1) / vpp * stage_microbatch_s


# The weight-gradient half of a backward chunk: a layer's backward is two matmuls per forward matmul,
# one for the input gradient and one for the weights (Narayanan et al. SC21 §3.2: backward ≈ 2×
# forward), so W = B/2 of the rank's backward compute.
WEIGHT_GRAD_SHARE = 0.5


def dualpipe_bubble_s(pp: np.ndarray, schedule: np.ndarray, stage_microbatch_s: np.ndarray,
                      backward_share: np.ndarray) -> np.ndarray:
    """The bubble of a DualPipe schedule, in seconds, from one micro-batch's time on the slowest rank
    (``stage_microbatch_s``: both chunks, forward and backward, communication included) and the share of
    its compute that is backward (``backward_share``).

    A chunk (half the rank) takes c = t/2, of which F = c·(1 − β), B = c·β, W = B·WEIGHT_GRAD_SHARE, and
    the overlapped pair F&B = F + B (each one's communication hidden behind the other's compute, as
    far as the config's overlaps price it in t).
    * DualPipe (DeepSeek-V3 Table 2; pp stages, pp even): (pp/2 − 1)·(F&B + B − 3W).
    * DualPipeV as MindSpeed runs it (docs/zh/features/dualpipev.md at 028de58c, without
      --dualpipev-dw-detach: the cool-down does not split W): (pp − 1)·(F&B + B − W) − F."""
    c = stage_microbatch_s / 2.0
    f, b = c * (1.0 - backward_share), c * backward_share
    w = WEIGHT_GRAD_SHARE * b
    dualpipe = (pp / 2.0 - 1.0) * (c + b - 3.0 * w)
    dualpipev = (pp - 1.0) * (c + b - w) - f
    return np.maximum(np.where(schedule == DUALPIPEV, dualpipev, dualpipe), 0.0)

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

from .batch import NO_VALUE, ConfigBatch
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
                 acc_loss: bool, layout: str | None) -> np.ndarray:
    """Per physical stage composition, shape (pp, 5): dense layers, MoE layers, embedding, head, MTP.

    Raises LayoutError with the reason when the split is impossible (an empty virtual stage, a
    layout that does not match pp·vpp or num_layers, ...).
    """
    S = pp * vpp
    if layout is not None:
        tokens = parse_layout(layout)
        if len(tokens) != S:
            raise LayoutError(f"pipeline_layout has {len(tokens)} virtual stages, pp*vpp is {S}")
        n_t = sum(t.count("t") for t in tokens)
        if n_t != spec.num_layers:
            raise LayoutError(f"pipeline_layout places {n_t} decoder layers, the model has {spec.num_layers}")
        if "".join(tokens).count("m") != spec.mtp_num_layers:
            raise LayoutError(f"pipeline_layout places {''.join(tokens).count('m')} MTP layers, "
                              f"the model has {spec.mtp_num_layers}")
        if "".join(tokens).count("E") != 1 or "".join(tokens).count("L") != 1:
            raise LayoutError("pipeline_layout must hold exactly one E and one L")
    else:
        tokens = _virtual_stage_tokens(spec, pp, vpp, first, last, acc_emb, acc_loss)
    for v, t in enumerate(tokens):
        if not t:
            raise LayoutError(f"virtual stage {v} holds no layer slot (pp={pp}, vpp={vpp}, "
                              f"{spec.num_layers} layers)")
    pattern = spec.moe_layer_pattern()
    comp = np.zeros((pp, 5), dtype=np.int64)
    layer = 0
    for v, t in enumerate(tokens):
        r = v % pp
        n = t.count("t")
        n_moe = sum(pattern[layer:layer + n])
        layer += n
        comp[r] += (n - n_moe, n_moe, t.count("E"), t.count("L"), t.count("m"))
    return comp


@dataclass
class StageSet:
    """Candidate stages per config: compositions (N, K, 5) and pipeline ranks (N, K).

    For speed the batch path keeps, per distinct composition, only its lowest-rank stage: time depends
    on the composition alone and activation memory falls with the rank, so the maxima over stages are
    exact. ``all_stages=True`` keeps every stage (used for per-stage reports).
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


_SPLIT_CACHE: dict[tuple, tuple[np.ndarray, str | None, np.ndarray]] = {}
_SPLIT_CACHE_MAX = 4096


def _split_cached(spec_key: str, spec: ModelSpec, pp: int, vpp: int, first: int, last: int, ae: bool,
                  al: bool, layout: str | None) -> tuple[np.ndarray, str | None, np.ndarray]:
    """``split_stages`` (composition, error or None, lowest rank of each distinct composition),
    remembered per model and split: a search scores the same few hundred splits chunk after chunk."""
    key = (spec_key, pp, vpp, first, last, ae, al, layout)
    hit = _SPLIT_CACHE.get(key)
    if hit is not None:
        return hit
    try:
        comp, error = split_stages(spec, pp, vpp, first, last, ae, al, layout), None
    except LayoutError as exc:
        comp = np.zeros((pp, 5), dtype=np.int64)
        comp[0, DENSE] = 1  # placeholder so that downstream arithmetic stays finite
        error = str(exc)
    first_rank: dict[tuple, int] = {}  # lowest rank of each distinct composition
    for r, row in enumerate(map(tuple, comp.tolist())):
        first_rank.setdefault(row, r)
    candidates = np.fromiter(first_rank.values(), dtype=np.intp, count=len(first_rank))
    comp.flags.writeable = False  # shared between calls
    if len(_SPLIT_CACHE) >= _SPLIT_CACHE_MAX:
        _SPLIT_CACHE.clear()
    _SPLIT_CACHE[key] = (comp, error, candidates)
    return comp, error, candidates


def stage_sets(spec: ModelSpec, batch: ConfigBatch, all_stages: bool = False) -> StageSet:
    uniq, inverse = unique_rows([batch.pp, batch.vpp, batch.first_stage_layers, batch.last_stage_layers,
                                 batch.account_for_embedding.astype(np.int64),
                                 batch.account_for_loss.astype(np.int64), batch.layout_id])
    per_split: list[tuple[np.ndarray, np.ndarray]] = []
    split_comps: list[np.ndarray] = []
    errors: list[str | None] = []
    spec_key = spec.model_dump_json()
    for pp, vpp, first, last, ae, al, lid in uniq.tolist():
        layout = batch.layouts[lid] if lid != NO_VALUE else None
        comp, error, candidates = _split_cached(spec_key, spec, pp, vpp, first, last, bool(ae), bool(al), layout)
        errors.append(error)
        split_comps.append(comp)
        ranks = np.arange(pp) if all_stages else candidates
        per_split.append((comp[ranks], ranks))
    K = max(len(r) for _, r in per_split)
    comp_tab = np.zeros((len(per_split), K, 5), dtype=np.int64)
    rank_tab = np.zeros((len(per_split), K), dtype=np.int64)
    for i, (comp, ranks) in enumerate(per_split):
        pad = K - len(ranks)  # repeat the last stage: duplicates change neither max nor argmax
        comp_tab[i] = np.concatenate([comp, np.repeat(comp[-1:], pad, axis=0)])
        rank_tab[i] = np.concatenate([ranks, np.repeat(ranks[-1:], pad)])
    valid_split = np.array([e is None for e in errors])
    return _TableStageSet(comp=None, rank=None, valid=valid_split[inverse],
                          errors=errors, split_index=inverse, split_comps=split_comps,
                          split_comp_table=comp_tab, split_rank_table=rank_tab,
                          split_stage_count=np.array([len(r) for _, r in per_split], dtype=np.int64))


def microbatches_in_flight(pp: np.ndarray, vpp: np.ndarray, m: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """Stage activation sets held at the peak by pipeline rank ``rank``, in units of one micro-batch of
    the whole stage.

    1F1B (Narayanan et al. SC21 §2.2): rank r holds min(pp − r, m) micro-batches. Interleaved 1F1B:
    Megatron-Core warms up min((pp − r − 1)·2 + (vpp − 1)·pp, m·vpp) chunk micro-batches, then holds
    one more; each chunk is 1/vpp of the stage. Without pipelining, one micro-batch at a time.
    """
    pp, vpp, m = pp[:, None], vpp[:, None], m[:, None]
    one_f_one_b = np.minimum(pp - rank, m)
    chunks = np.minimum((pp - rank - 1) * 2 + (vpp - 1) * pp + 1, m * vpp)
    interleaved = chunks / vpp
    held = np.where(vpp > 1, interleaved, one_f_one_b)
    return np.where(pp > 1, held, 1.0).astype(np.float64)


def bubble_s(pp: np.ndarray, vpp: np.ndarray, stage_microbatch_s: np.ndarray) -> np.ndarray:
    """Pipeline fill and drain: (pp − 1)/vpp micro-batch times of the slowest stage (SC21 §2.2.2)."""
    return (pp - 1) / vpp * stage_microbatch_s

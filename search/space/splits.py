"""The pipeline-split options of a search: the even spread, embedding and loss as layer slots, first/last
stage sizes, the cost-balanced layout, and the DualPipe schedules with the fields each carries."""

from __future__ import annotations

import math

import numpy as np

from costmodel.batch import NO_VALUE, SCHEDULE_CODES
from costmodel.pipeline import LayoutError, balanced_tokens, split_chunks
from costmodel.spec import ModelSpec

from .. import frameworks

from .dimensions import SPLIT_BALANCED, SPLIT_DUALPIPE, SPLIT_DUALPIPEV, SPLIT_EVEN, SPLIT_FIRST_LAST, SPLIT_SLOTS


SCHEDULE_NAMES = {0: None, SCHEDULE_CODES["dualpipe"]: "dualpipe", SCHEDULE_CODES["dualpipev"]: "dualpipev"}


def _split_fields(spec: ModelSpec, pp: int, vpp: int, mode: str) -> dict | None:
    """The config fields of one pipeline-split option, or None where Megatron would not accept it."""
    L = spec.num_layers
    if mode == SPLIT_EVEN:
        return {}
    if mode in (SPLIT_DUALPIPEV, SPLIT_DUALPIPE):
        # vpp 1 and pp > 1; DualPipe runs its two directions over an even pp (costmodel.validity)
        if vpp > 1 or pp == 1 or (mode == SPLIT_DUALPIPE and pp % 2):
            return None
        return {"pipeline_schedule": mode}
    if mode == SPLIT_SLOTS:
        if pp > 1 and (L + 2) % (pp * vpp) == 0:
            return {"account_for_embedding_in_pipeline_split": True, "account_for_loss_in_pipeline_split": True}
        return None
    if mode == SPLIT_BALANCED:
        return _balanced_fields(spec, pp, vpp)
    if mode == SPLIT_FIRST_LAST and pp > 2 and vpp == 1 and L % pp:
        middle = math.ceil(L / pp)
        rest = L - (pp - 2) * middle
        first = rest // 2
        if first >= 1 and rest - first >= 1:
            return {"first_stage_layers": first, "last_stage_layers": rest - first}
    return None


_BALANCED_CACHE: dict[tuple[str, int, int], str | None] = {}


def _schedule_fields(fixed: dict, schedule: int) -> dict:
    """The config fields a DualPipe split carries: the schedule, and the gradient reduction's overlap off
    unless pinned, since MindSpeed, the one framework that runs DualPipeV, refuses the two together
    (dualpipev_feature.py at 028de58c), with the parameter gather's overlap, which needs it (Megatron's
    arguments.py: --overlap-param-gather requires --overlap-grad-reduce)."""
    name = SCHEDULE_NAMES[int(schedule)]
    if name is None:
        return {"pipeline_schedule": fixed["pipeline_schedule"]} if "pipeline_schedule" in fixed else {}
    return {"pipeline_schedule": name, **{k: fixed.get(k, False) for k in DUALPIPE_OVERLAPS_OFF}}


DUALPIPE_OVERLAPS_OFF = ("overlap_grad_reduce", "overlap_param_gather")


def _schedule_fits(schedule: str | None, pp: int, vpp: int) -> bool:
    """Whether a (pinned) schedule runs this pp and vpp (``TrainingConfig._schedule_matches_vpp``)."""
    if schedule == "interleaved":
        return vpp > 1
    return schedule is None or vpp == 1 and (schedule == "1f1b" or pp > 1)


def _overlap_column(fixed: dict, name: str, schedule: np.ndarray) -> np.ndarray:
    """``name`` (one of ``DUALPIPE_OVERLAPS_OFF``) of each config: pinned, else on, off with a DualPipe
    schedule (``_schedule_fields``)."""
    if name in fixed:
        return np.full(len(schedule), bool(fixed[name]))
    return np.asarray(schedule) == 0


def _balanced_layout(spec: ModelSpec, pp: int, vpp: int) -> str | None:
    """The cost-balanced ``pipeline_layout`` of (pp, vpp), or None where it holds the same layers per
    virtual stage as the even rule (offering it twice would only double the space). Remembered per
    spec: a sampler asks for it every trial."""
    key = (spec.model_dump_json(), pp, vpp)
    if key not in _BALANCED_CACHE:
        if len(_BALANCED_CACHE) > 4096:
            _BALANCED_CACHE.clear()
        _BALANCED_CACHE[key] = _balanced_layout_uncached(spec, pp, vpp)
    return _BALANCED_CACHE[key]


def _balanced_layout_uncached(spec: ModelSpec, pp: int, vpp: int) -> str | None:
    tokens = balanced_tokens(spec, pp, vpp)
    if tokens is None:
        return None
    layout = frameworks.layout_string(tokens)
    try:
        even = split_chunks(spec, pp, vpp, NO_VALUE, NO_VALUE, False, False, None)
    except LayoutError:  # the even spread leaves a virtual stage empty: only the balanced split exists
        return layout
    same = np.array_equal(split_chunks(spec, pp, vpp, NO_VALUE, NO_VALUE, False, False, layout), even)
    return None if same else layout


def _balanced_fields(spec: ModelSpec, pp: int, vpp: int) -> dict | None:
    """A split whose virtual stages are balanced by cost (costmodel.pipeline.balanced_tokens), as
    Megatron's ``--pipeline-model-parallel-layout``; only with pp > 1."""
    if pp == 1:
        return None
    layout = _balanced_layout(spec, pp, vpp)
    return None if layout is None else {"pipeline_layout": layout}

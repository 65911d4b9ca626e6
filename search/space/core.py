"""The space of one search as arrays: its dimension values, the valid parallel layouts, the option table,
and its size and enumeration in chunks."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from costmodel import ConfigBatch
from costmodel.batch import NO_VALUE, SCHEDULE_CODES
from costmodel.pipeline import unique_rows
from costmodel.spec import ClusterProfile, ModelSpec

from .columns import Columns
from .dimensions import (ALGORITHM_DEFAULTS, SPLIT_BALANCED, SPLIT_DUALPIPE, SPLIT_DUALPIPEV, SPLIT_FIRST_LAST,
                         SPLIT_SLOTS, RecomputeOption)
from .expressible import Expressible


@dataclass
class SearchSpace(Expressible, Columns):
    """Dimension values plus the valid parallel layouts (arrays) and the option table."""

    spec: ModelSpec
    profile: ClusterProfile
    devices: int
    global_batch_size: int
    precision: str
    moe_load_imbalance: float
    values: dict[str, list]
    fixed: dict
    parallel: dict[str, np.ndarray]  # valid parallel layouts, one entry per layout
    options: list[tuple[RecomputeOption, bool, bool, bool]]
    layouts: list[str] = field(default_factory=list)
    framework: str | None = None  # the training framework planned for (None: every option the model has)
    constants: dict = field(default_factory=dict)  # config fields one value for the whole search
    # A pinned routing distribution (``ROUTING_FIELDS``): every config states it instead of
    # ``moe_load_imbalance``, which then follows from each config's ep (``imbalance_by_ep``).
    routing: dict = field(default_factory=dict)
    imbalance_by_ep: dict[int, float] = field(default_factory=dict)
    _layouts_cache: dict | None = field(default=None, repr=False)
    _expressible_cache: dict = field(default_factory=dict, repr=False)
    _mask_cache: tuple | None = field(default=None, repr=False)
    # Called between the steps of the build (seconds on a big space; ``build_space`` clears it at the end);
    # it may raise to stop it: a worker whose job was cancelled stops there instead of finishing the build.
    check: Callable[[], None] | None = field(default=None, repr=False)
    # What the engines rank by (search/objective.py) and the checkpoint options goodput is priced with.
    objective: str = "throughput"
    resilience: object = None

    def layout_table(self) -> dict[str, np.ndarray]:
        """The distinct valid layouts without the micro-batch size (samplers score that inside a
        trial), with ``split`` as an index into ``values["split"]``."""
        if self._layouts_cache is None:
            p = self.parallel
            split = np.zeros(len(p["tp"]), dtype=np.int64)
            names = self.values["split"]
            if SPLIT_SLOTS in names:
                split[p["account_for_embedding"]] = names.index(SPLIT_SLOTS)
            if SPLIT_FIRST_LAST in names:
                split[p["first_stage_layers"] != NO_VALUE] = names.index(SPLIT_FIRST_LAST)
            if SPLIT_BALANCED in names:
                split[p["layout_id"] != NO_VALUE] = names.index(SPLIT_BALANCED)
            for mode in (SPLIT_DUALPIPEV, SPLIT_DUALPIPE):
                if mode in names:
                    split[p["schedule"] == SCHEDULE_CODES[mode]] = names.index(mode)
            uniq, _ = unique_rows([p["tp"], p["cp"], p["pp"], p["vpp"], p["ep"], p["etp"], split,
                                   p["moe_a2a_hierarchical"].astype(np.int64), p["cp_comm"]])
            self._layouts_cache = dict(zip(("tp", "cp", "pp", "vpp", "ep", "etp", "split", "moe_a2a_hierarchical",
                                            "cp_comm"), uniq.T))
        return self._layouts_cache

    # ---- size and enumeration ----------------------------------------------------------------
    def _option_mask(self) -> np.ndarray:
        """(layouts, options) pairs the space offers (remembered for the current ``parallel``)."""
        if self._mask_cache is None or self._mask_cache[0] is not self.parallel:
            self._mask_cache = (self.parallel, self.allowed(self.parallel))
        return self._mask_cache[1]

    def resting(self, name: str) -> str:
        """The value of a searched algorithm (``ALGORITHM_DEFAULTS``) that layouts hold where it makes no
        difference: the config default if the space offers it, else the first value offered."""
        vals = self.values[name]
        return ALGORITHM_DEFAULTS[name] if ALGORITHM_DEFAULTS[name] in vals else vals[0]

    def ep_leaves_domain(self, ep, etp) -> np.ndarray:
        """Whether EP groups of ``ep`` ranks ``etp`` apart span several scale-up domains (vectorised
        ``frameworks.ep_leaves_domain``; only then flat and hierarchical dispatch differ)."""
        return np.asarray(ep) > np.maximum(self._domain() // np.asarray(etp), 1)

    def layout_options(self, layout: dict) -> np.ndarray:
        """The options one layout (tp, cp, pp, vpp, ep, etp, split and the algorithms: a sampler's
        choice) offers, as a mask."""
        par, _, _ = self.choice_columns([{**layout, "micro_batch_size": 1, "option": 0}])
        return self.allowed(par)[0]


    @functools.cached_property
    def offload_counterpart(self) -> list[int]:
        """Per option, the first option with the same fields but no offload (itself where it offloads nothing)."""
        first: dict[tuple, int] = {}
        out = []
        for o, (rec, *rest) in enumerate(self.options):
            key = (rec.recompute, rec.modules, rec.num_layers, *rest)
            out.append(first.setdefault(key, o))
        return out

    @property
    def size(self) -> int:
        return int(np.count_nonzero(self._option_mask()))

    @property
    def plain_size(self) -> int:
        """Configs whose option offloads nothing or is its own counterpart (``offload_counterpart``): what
        an exhaustive search scores at least (and at most that plus the offload plans it needs). Counted
        per option column, not by copying those columns out of the mask."""
        base = np.asarray(self.offload_counterpart)
        per_option = np.count_nonzero(self._option_mask(), axis=0)
        return int(per_option[base == np.arange(len(base))].sum())

    def batches(self, batch_size: int = 200_000,
                mask: np.ndarray | None = None) -> Iterator[tuple[np.ndarray, np.ndarray, ConfigBatch]]:
        """Every valid config (or those of ``mask``, a part of ``_option_mask()``), in chunks of about
        ``batch_size``: (layout rows, option indices, batch)."""
        mask = self._option_mask() if mask is None else mask
        rows, opts = np.nonzero(mask)  # row-major: each layout with its allowed options
        for start in range(0, len(rows), batch_size):
            r, o = rows[start:start + batch_size], opts[start:start + batch_size]
            yield r, o, self.make_batch(r, o)

"""The config space of one search, built once as arrays: counted, enumerated in chunks and sampled.

Dimensions and the values offered (``docs/search.md`` is the user-facing copy):

* ``tp``: divisors of gcd(heads, query groups) inside the scale-up domain (any size with
  ``allow_cross_domain_tp``); ``cp``: 1, 2, 4, 8, 16; ``pp``: divisors of the device count up to the
  layer count; ``vpp``: 1-8 with pp > 1; ``ep``: divisors of the expert count; ``etp``: 1, 2, 4, 8
  (MoE only); ``micro_batch_size``: 1, 2, 4, 8.
* the pipeline split: the even spread (always), embedding and loss as layer slots where
  (layers + 2) divides by pp·vpp (Megatron's condition), and first/last stage sizes that give every
  middle stage the same number of layers (vpp = 1), and a split balanced by cost (pp > 1, any vpp):
  a ``pipeline_layout`` whose virtual stages are as equal in forward FLOPs as the layers allow, the
  embedding, LM head, loss and MTP modules at their cost (``costmodel.pipeline.balanced_tokens``),
  offered where it differs from the even spread.
* the pipeline schedule, offered as two more splits with vpp = 1 and pp > 1: DualPipeV
  (``pipeline_schedule: dualpipev``, MindSpeed's) and DeepSeek's DualPipe (even pp), each with
  ``overlap_grad_reduce`` off unless pinned (MindSpeed refuses DualPipeV with it); 1F1B and
  interleaving follow from vpp.
* ``recompute``: none; selective with one of ``SELECTIVE_SETS`` (the modules the model has);
  full with ``recompute_num_layers`` all, 1, 2 or 4 per stage. Beside them, where the profile states a
  host link, activation offload: each of ``OFFLOAD_SETS`` (the modules the model has) with no
  recompute, and MindSpeed's default swap set (``SWAP_ATTENTION_SET``) with each selective set
  ("Selective R/S"), so that the search weighs recompute against swap per module and keeps whichever
  costs less time for the memory it must save. Pinning a recompute field pins offload off unless
  ``offload_modules`` is pinned too.
* ``moe_a2a_algorithm`` (flat, hierarchical) where the expert-parallel group leaves the scale-up domain
  (ep > domain / etp; inside one domain the two price the same, so such layouts hold one value, the
  config default); ``cp_comm_type`` (p2p, a2a, allgather, a2a+p2p) with cp > 1, where a2a+p2p is
  offered only when its Ulysses part is neither 1 nor cp (else it equals p2p or a2a) and the Ulysses
  variants only with the attention heads divisible by Ulysses·tp (both frameworks require it). Both
  restricted to the values the framework can launch (``frameworks.ALGORITHMS``).
* ``distributed_optimizer``, ``tp_comm_overlap`` (tp > 1) and ``sequence_parallel`` (tp > 1) are
  on. Their off values are dominated in the cost model: the distributed optimizer moves less
  data-parallel traffic (a reduce-scatter plus a bf16 all-gather against an all-reduce of fp32
  gradients), shortens the optimizer step and saves 12 B per parameter; TP overlap never lengthens a
  step and costs no memory; sequence parallelism has the same communication volume and less memory
  (Korthikanti et al. 2022 §4.2.2). Offering the off values would only fill the top K with slower
  copies of the same layouts. Pin any of them with ``fixed`` (e.g. a framework without mc2:
  ``tp_comm_overlap=false``). ``moe_a2a_overlap`` is offered both ways with ep > 1 (off with ep = 1):
  it hides the dispatch but holds one more model chunk's activations, so the off value may be the
  one that fits.

* with a ``framework`` (``search.frameworks``), only the configs it can express: an overlap's off value
  is offered where the framework cannot combine the overlap with the rest of the option (an off value
  is dominated only by an on value the framework can run), the algorithms only the values it can launch
  (``frameworks.ALGORITHMS``: flat dispatch on MindSpeed-LLM), and the fields the search does not vary
  (``CONSTANT_FIELDS``) hold the pinned value.

Every offered config passes the cost model's validity rules (the same code checks both), and dp
follows from the device count. ``fixed`` pins any config field to one value.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from itertools import product
from typing import Callable, Iterator

import numpy as np

from costmodel import ConfigBatch, TrainingConfig, routing, validity
from costmodel.batch import (ATTENTION_KERNEL_CODES, CP_COMM_CODES, DEFAULT_MOE_LOAD_IMBALANCE, DISPATCHER_CODES,
                             DTYPE_BYTES, EMA_CODES, FP8_RECIPE_CODES, NO_VALUE, OFFLOAD_BITS, PRECISION_CODES,
                             RECOMPUTE_CODES, SCHEDULE_CODES, SHARDING_CODES, modules_mask)
SCHEDULE_NAMES = {0: None, SCHEDULE_CODES["dualpipe"]: "dualpipe", SCHEDULE_CODES["dualpipev"]: "dualpipev"}
from costmodel.pipeline import LayoutError, balanced_tokens, split_chunks, stage_sets, unique_rows
from costmodel.spec import ClusterProfile, ModelSpec

from . import frameworks

CP_VALUES = (1, 2, 4, 8, 16)
VPP_MAX = 8
ETP_VALUES = (1, 2, 4, 8)
MBS_VALUES = (1, 2, 4, 8)
FULL_RECOMPUTE_LAYERS = (None, 1, 2, 4)
SPLIT_EVEN, SPLIT_SLOTS, SPLIT_FIRST_LAST, SPLIT_BALANCED = "even", "embedding_loss_slots", "first_last", "balanced"
# The DualPipe schedules, offered as splits of their own: each fixes how layers sit on the ranks.
SPLIT_DUALPIPEV, SPLIT_DUALPIPE = "dualpipev", "dualpipe"
SPLIT_FIELDS = ("first_stage_layers", "last_stage_layers", "account_for_embedding_in_pipeline_split",
                "account_for_loss_in_pipeline_split", "pipeline_layout", "pipeline_schedule")
# Selective-recompute module sets, from Megatron-Core's default to the most memory-saving; a set is
# offered when the model has every module it names.
SELECTIVE_SETS = (
    ("core_attn",),
    ("layernorm",),
    ("layernorm", "mlp"),
    ("layernorm", "moe_act"),
    ("layernorm", "mla_up_proj"),
    ("layernorm", "mla_up_proj", "moe_act"),
    ("layernorm", "mla_up_proj", "moe_act", "shared_experts"),
    ("layernorm", "moe"),
    ("layernorm", "mla_up_proj", "moe"),
)
# Activation offload sets (Megatron-Core --offload-modules), each the counterpart of a recompute choice:
# the norm inputs (which no selective recompute drops), FlashAttention's tensors with its output
# (Megatron-Core offloads attn_proj only with core_attn), the input norm's output
# (layernorm recompute's tensor), the expert internals (moe_act / moe recompute's), MindSpeed's default
# --swap-modules (input_norm, self_attention, post_attention_norm) and everything.
SWAP_ATTENTION_SET = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm")
OFFLOAD_SETS = (
    ("attn_norm", "mlp_norm"),
    ("core_attn", "attn_proj"),
    ("qkv_linear",),
    ("moe_act",),
    ("expert_fc1", "moe_act"),
    SWAP_ATTENTION_SET,
    SWAP_ATTENTION_SET + ("expert_fc1", "moe_act"),
)
EXPERT_OFFLOADS = {"expert_fc1", "moe_act"}
PARALLEL_KEYS = ("tp", "cp", "pp", "vpp", "split", "ep", "etp", "micro_batch_size", "moe_a2a_algorithm", "cp_comm_type")
# The communication algorithms searched as layout dimensions, with the config field's default (the value
# a layout holds where the algorithm makes no difference).
ALGORITHM_DEFAULTS = {"moe_a2a_algorithm": TrainingConfig.model_fields["moe_a2a_algorithm"].default,
                      "cp_comm_type": TrainingConfig.model_fields["cp_comm_type"].default}
CP_COMM_NAMES = {code: name for name, code in CP_COMM_CODES.items()}
OPTION_KEYS = ("recompute", "distributed_optimizer", "tp_comm_overlap", "moe_a2a_overlap")


class SpaceError(ValueError):
    """A search request that leaves no dimension a value (field named)."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _modules_available(spec: ModelSpec) -> set[str]:
    have = {"core_attn", "layernorm"}
    pattern = spec.moe_layer_pattern()
    if 0 in pattern:
        have.add("mlp")
    if spec.is_moe:
        have |= {"moe_act", "moe"}
        if spec.moe_shared_expert_intermediate_size:
            have.add("shared_experts")
    if spec.multi_latent_attention:
        have.add("mla_up_proj")
    return have


@dataclass(frozen=True)
class RecomputeOption:
    """A memory plan: recompute (none, selective modules, full layers) and the modules offloaded."""

    recompute: str
    modules: tuple[str, ...] | None = None
    num_layers: int | None = None
    offload: tuple[str, ...] | None = None

    def fields(self) -> dict:
        out = {"recompute": self.recompute}
        if self.recompute == "selective":
            out["recompute_modules"] = list(self.modules)
        if self.recompute == "full":
            out["recompute_num_layers"] = self.num_layers
        if self.offload:
            out["offload_modules"] = list(self.offload)
        return out


def _offload_plans(spec: ModelSpec, selective: list[RecomputeOption]) -> list[RecomputeOption]:
    """The offload plans offered beside recompute (see the module docstring)."""
    sets = [o for o in OFFLOAD_SETS if spec.is_moe or not EXPERT_OFFLOADS & set(o)]
    return ([RecomputeOption("none", offload=o) for o in sets]
            + [RecomputeOption("selective", r.modules, offload=SWAP_ATTENTION_SET) for r in selective])


@dataclass
class SearchSpace:
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

    def allowed(self, par: dict[str, np.ndarray]) -> np.ndarray:
        """(configs, options) mask for layout columns ``par``: what the framework can express, with TP
        overlap on when tp > 1 and all-to-all overlap on when ep > 1 unless the framework cannot combine
        the overlap with the rest of the option (an off value is dominated only by an expressible on
        value, see the module docstring); a pinned overlap is taken as pinned."""
        tp, ep = np.asarray(par["tp"]), np.asarray(par["ep"])
        groups, inv = self._expressible_groups(par)
        # The mask depends on a config only through its expressible row, tp > 1 and ep > 1: work out each
        # distinct combination once and spread it (millions of configs, a few dozen combinations).
        key, inv = unique_rows([inv, (tp > 1).astype(np.int64), (ep > 1).astype(np.int64)])
        return self._allowed_rows(groups[key[:, 0]], key[:, 1] == 1, key[:, 2] == 1)[inv]

    def _allowed_rows(self, expr: np.ndarray, multi_tp: np.ndarray, multi_ep: np.ndarray) -> np.ndarray:
        """``allowed`` for rows of expressible masks ``expr`` and whether tp > 1, ep > 1 on each row."""
        tp_ov = np.array([o[2] for o in self.options])
        a2a = np.array([o[3] for o in self.options])
        ok = expr.copy()
        if "tp_comm_overlap" not in self.fixed:
            on = self._partner(2)
            beaten = (on >= 0)[None, :] & expr[:, np.maximum(on, 0)]
            ok &= np.where(tp_ov[None, :], multi_tp[:, None], ~multi_tp[:, None] | ~beaten)
        if "moe_a2a_overlap" not in self.fixed:
            # on only where there is a dispatch to hide; off is not dominated where it is on: the
            # overlap holds one more model chunk's activations (pipeline.a2a_overlap_extra_microbatches)
            ok &= ~a2a[None, :] | multi_ep[:, None]
        return ok

    def _partner(self, flag: int) -> np.ndarray:
        """For each option, the index of the same option with overlap ``flag`` (2: TP, 3: all-to-all) on
        (-1 when the space has no such option, or the option has it on already)."""
        index = {o: i for i, o in enumerate(self.options)}
        return np.array([-1 if o[flag] else index.get(o[:flag] + (True,) + o[flag + 1:], -1) for o in self.options])

    def expressible(self, par: dict[str, np.ndarray]) -> np.ndarray:
        """(configs, options) mask of what ``framework`` can express (all True without one). The rules of
        ``search.frameworks`` are scored on representative configs at pp = 1: per distinct (tp, ep, etp)
        and option with cp = 1 and flat dispatch (no option rule reads the algorithms), per distinct (tp,
        cp, ep, etp, dispatch, CP algorithm) with no recompute and no overlap; and the
        split rules per distinct split, etp, cp and option (``split_refusals`` says no other rule reads the
        split or fires at pp = 1, and no rule reads cp together with an option but DualPipeV's)."""
        groups, inv = self._expressible_groups(par)
        return groups[inv]

    def _expressible_groups(self, par: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """``expressible`` as its distinct rows (groups, options) and each config's row index."""
        n = len(par["tp"])
        if self.framework is None or n == 0:
            return np.ones((1, len(self.options)), dtype=bool), np.zeros(n, dtype=np.intp)
        col = lambda *keys: [np.asarray(par[k]).astype(np.int64) for k in keys]  # noqa: E731
        split_keys = ("pp", "vpp", "first_stage_layers", "last_stage_layers", "account_for_embedding",
                      "account_for_loss", "layout_id", "schedule", "etp", "cp")
        parts = [self._rows(col("tp", "ep", "etp"), "options", self._options_row),
                 self._rows(col("tp", "cp", "ep", "etp", "moe_a2a_hierarchical", "cp_comm"), "layout",
                            self._layout_row),
                 self._rows(col(*split_keys), "split", self._split_row)]
        key, inv = unique_rows([part_inv for _, part_inv in parts])
        groups = parts[0][0][key[:, 0]] & parts[1][0][key[:, 1]] & parts[2][0][key[:, 2]]
        return groups, inv

    def _rows(self, keys: list[np.ndarray], kind: str, row_fn) -> tuple[np.ndarray, np.ndarray]:
        """Rows of ``row_fn`` per distinct key (remembered) and each config's row index."""
        uniq, inv = unique_rows(keys)
        cache = self._expressible_cache
        rows = []
        for i, u in enumerate(uniq):
            if self.check is not None and i % 16 == 0:
                self.check()
            key = (kind, *map(int, u))
            if key not in cache:
                cache[key] = np.broadcast_to(row_fn(*map(int, u)), (len(self.options),))
            rows.append(cache[key])
        return np.array(rows, dtype=bool), inv

    def _option_fields(self, opt: int) -> dict:
        rec, dist, tp_ov, a2a = self.options[opt]
        return {"recompute_modules": None, "recompute_num_layers": None, "offload_modules": None, **rec.fields(),
                "distributed_optimizer": bool(dist), "tp_comm_overlap": bool(tp_ov), "moe_a2a_overlap": bool(a2a)}

    def _probe(self, **fields) -> TrainingConfig:
        """A representative config (no validation: every value comes from the space)."""
        if "probe" not in self._expressible_cache:
            base = {"global_batch_size": self.global_batch_size, "precision": self.precision,
                    "overlap_grad_reduce": self.fixed.get("overlap_grad_reduce", True),
                    "overlap_param_gather": self.fixed.get("overlap_param_gather", True), **self.constants}
            if "sequence_parallel" in self.fixed:
                base["sequence_parallel"] = self.fixed["sequence_parallel"]
            if self.constants.get("delay_wgrad_compute"):  # pinned with the overlap (_constants)
                base["moe_a2a_overlap"] = True
            self._expressible_cache["probe"] = TrainingConfig.model_validate(base)
        return self._expressible_cache["probe"].model_copy(update=fields)

    def _domain(self) -> int:
        return int(self.profile.fact("scale_up_domain"))

    def _options_row(self, tp: int, ep: int, etp: int) -> np.ndarray:
        return np.array([not frameworks.refusals(self._probe(tp=tp, ep=ep, etp=etp, moe_a2a_algorithm="flat",
                                                             **self._option_fields(o)),
                                                 self.spec, self.framework, self._domain(), split_rules=False)
                         for o in range(len(self.options))])

    def _layout_row(self, tp: int, cp: int, ep: int, etp: int, hierarchical: int, cp_comm: int) -> bool:
        cfg = self._probe(tp=tp, cp=cp, ep=ep, etp=etp, moe_a2a_algorithm="hierarchical" if hierarchical else "flat",
                          cp_comm_type=CP_COMM_NAMES[cp_comm])
        return not frameworks.refusals(cfg, self.spec, self.framework, self._domain(), split_rules=False)

    def layout_index(self, layout: str) -> int:
        """The index of a ``pipeline_layout`` string in ``layouts`` (added if new)."""
        if layout not in self.layouts:
            self.layouts.append(layout)
        return self.layouts.index(layout)

    def _split_row(self, pp, vpp, first, last, acc_emb, acc_loss, layout_id, schedule, etp, cp) -> np.ndarray:
        # etp and cp: MindSpeed's DualPipeV needs cp 1, and etp 1 for its forward-backward overlap
        # (frameworks._schedule)
        split = {"pp": pp, "vpp": vpp, "etp": etp, "cp": cp, "account_for_embedding_in_pipeline_split": bool(acc_emb),
                 "account_for_loss_in_pipeline_split": bool(acc_loss), **_schedule_fields(self.fixed, schedule)}
        if first != NO_VALUE:
            split["first_stage_layers"] = first
        if last != NO_VALUE:
            split["last_stage_layers"] = last
        if layout_id != NO_VALUE:
            split["pipeline_layout"] = self.layouts[layout_id]
        # split_refusals never reads offload_modules: options that differ only in it share one verdict,
        # which halves the probes where the space offers offload plans
        layout = frameworks.pipeline_split(self._probe(**split), self.spec, self.framework)  # the same for all
        verdict = {o: not frameworks.split_refusals(self._probe(**split, **self._option_fields(o)), self.spec,
                                                    self.framework, layout) for o in set(self.offload_counterpart)}
        return np.array([verdict[o] for o in self.offload_counterpart])

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
        return int(self._option_mask().sum())

    @property
    def plain_size(self) -> int:
        """Configs whose option offloads nothing or is its own counterpart (``offload_counterpart``): what
        an exhaustive search scores at least (and at most that plus the offload plans it needs)."""
        base = np.asarray(self.offload_counterpart)
        return int(self._option_mask()[:, base == np.arange(len(base))].sum())

    def batches(self, batch_size: int = 200_000,
                mask: np.ndarray | None = None) -> Iterator[tuple[np.ndarray, np.ndarray, ConfigBatch]]:
        """Every valid config (or those of ``mask``, a part of ``_option_mask()``), in chunks of about
        ``batch_size``: (layout rows, option indices, batch)."""
        mask = self._option_mask() if mask is None else mask
        rows, opts = np.nonzero(mask)  # row-major: each layout with its allowed options
        for start in range(0, len(rows), batch_size):
            r, o = rows[start:start + batch_size], opts[start:start + batch_size]
            yield r, o, self.make_batch(r, o)

    def make_batch(self, rows: np.ndarray, opts: np.ndarray) -> ConfigBatch:
        """Configs from layout indices and option indices (arrays of equal length)."""
        return self._columns_batch({k: v[rows] for k, v in self.parallel.items()}, opts)

    def _columns_batch(self, par: dict[str, np.ndarray], opts: np.ndarray) -> ConfigBatch:
        n = len(opts)
        opt_cols = self._option_columns()
        o = {k: v[opts] for k, v in opt_cols.items()}
        const = lambda value, dtype=np.int64: np.full(n, value, dtype=dtype)  # noqa: E731
        f = self.fixed
        return ConfigBatch(
            tp=par["tp"], pp=par["pp"], vpp=par["vpp"], cp=par["cp"], ep=par["ep"], etp=par["etp"],
            dp=const(NO_VALUE), micro_batch_size=par["micro_batch_size"],
            global_batch_size=const(self.global_batch_size),
            sequence_parallel=np.full(n, f["sequence_parallel"]) if "sequence_parallel" in f else par["tp"] > 1,
            tp_comm_overlap=o["tp_comm_overlap"], recompute=o["recompute"],
            recompute_modules=o["recompute_modules"], recompute_num_layers=o["recompute_num_layers"],
            distributed_optimizer=o["distributed_optimizer"],
            overlap_grad_reduce=_overlap_column(f, "overlap_grad_reduce", par["schedule"]),
            overlap_param_gather=_overlap_column(f, "overlap_param_gather", par["schedule"]),
            first_stage_layers=par["first_stage_layers"], last_stage_layers=par["last_stage_layers"],
            account_for_embedding=par["account_for_embedding"], account_for_loss=par["account_for_loss"],
            layout_id=par["layout_id"], precision=const(PRECISION_CODES[self.precision]),
            moe_a2a_overlap=o["moe_a2a_overlap"],
            moe_load_imbalance=self._imbalance_column(par["ep"]), layouts=self.layouts,
            moe_a2a_hierarchical=np.asarray(par["moe_a2a_hierarchical"], dtype=bool),
            cp_comm=np.asarray(par["cp_comm"], dtype=np.int64), schedule=np.asarray(par["schedule"], dtype=np.int64),
            offload_modules=o["offload_modules"], moe_expert_replicas=const(self.routing.get("moe_expert_replicas", 0)),
            **self._constant_columns(n))

    def _imbalance_column(self, ep: np.ndarray) -> np.ndarray:
        """max/mean tokens per EP rank of each config: the search's constant, or its routing's at that ep."""
        if not self.imbalance_by_ep:
            return np.full(len(ep), self.moe_load_imbalance, dtype=np.float64)
        lut = np.ones(max(self.imbalance_by_ep) + 1)  # an ep that does not divide the experts is invalid anyway
        for e, imb in self.imbalance_by_ep.items():
            lut[e] = imb
        return lut[ep]

    def _constant_columns(self, n: int) -> dict[str, np.ndarray]:
        """The batch columns of the per-search constants (``constants``; each column's default otherwise)."""
        c, out = self.constants, {}
        for key in ("main_grads", "main_params", "exp_avg", "exp_avg_sq"):
            if f"{key}_dtype" in c:
                out[f"{key}_bytes"] = np.full(n, DTYPE_BYTES[c[f"{key}_dtype"]], dtype=np.float64)
        if "data_parallel_sharding_strategy" in c:
            out["sharding"] = np.full(n, SHARDING_CODES[c["data_parallel_sharding_strategy"]], dtype=np.int64)
        if "moe_token_dispatcher_type" in c:
            out["moe_dispatcher"] = np.full(n, DISPATCHER_CODES[c["moe_token_dispatcher_type"]], dtype=np.int64)
        if "attention_kernel" in c:
            out["attention_kernel"] = np.full(n, ATTENTION_KERNEL_CODES[c["attention_kernel"]], dtype=np.int64)
        if c.get("fp8_recipe") is not None:
            out["fp8_recipe"] = np.full(n, FP8_RECIPE_CODES[c["fp8_recipe"]], dtype=np.int64)
        if c.get("delay_wgrad_compute") is not None:
            out["delay_wgrad"] = np.full(n, int(c["delay_wgrad_compute"]), dtype=np.int64)
        if "activation_func_fp8_input_store" in c:
            out["act_fp8_input_store"] = np.full(n, bool(c["activation_func_fp8_input_store"]))
        if "parameter_ema" in c:
            out["parameter_ema"] = np.full(n, EMA_CODES[c["parameter_ema"]], dtype=np.int64)
        if "mla_fa_without_pad" in c:
            out["mla_fa_without_pad"] = np.full(n, bool(c["mla_fa_without_pad"]))
        return out

    def _option_columns(self) -> dict[str, np.ndarray]:
        rec = [o[0] for o in self.options]
        return {
            "recompute": np.array([RECOMPUTE_CODES[r.recompute] for r in rec], dtype=np.int64),
            "recompute_modules": np.array([modules_mask(r.modules or ("core_attn",)) for r in rec], dtype=np.int64),
            "recompute_num_layers": np.array([NO_VALUE if r.num_layers is None else r.num_layers for r in rec],
                                             dtype=np.int64),
            "offload_modules": np.array([modules_mask(r.offload or (), OFFLOAD_BITS) for r in rec], dtype=np.int64),
            "distributed_optimizer": np.array([o[1] for o in self.options]),
            "tp_comm_overlap": np.array([o[2] for o in self.options]),
            "moe_a2a_overlap": np.array([o[3] for o in self.options]),
        }

    def config(self, row: int, opt: int) -> dict:
        """The training config (contract field names) of one layout/option pair."""
        return self._row_config({k: v[row].item() for k, v in self.parallel.items()}, opt)

    def _row_config(self, p: dict, opt: int) -> dict:
        rec, dist, tp_ov, a2a = self.options[opt]
        cfg = {"tp": p["tp"], "pp": p["pp"], "vpp": p["vpp"], "cp": p["cp"], "ep": p["ep"], "etp": p["etp"],
               "dp": self.devices // (p["tp"] * p["pp"] * p["cp"]),
               "micro_batch_size": p["micro_batch_size"], "global_batch_size": self.global_batch_size,
               "sequence_parallel": self.fixed.get("sequence_parallel", p["tp"] > 1),
               "tp_comm_overlap": bool(tp_ov), **rec.fields(), "distributed_optimizer": bool(dist),
               "overlap_grad_reduce": self.fixed.get("overlap_grad_reduce", True),
               "overlap_param_gather": self.fixed.get("overlap_param_gather", True),
               "precision": self.precision, "moe_a2a_overlap": bool(a2a),
               **(self.routing if self.imbalance_by_ep else {"moe_load_imbalance": self.moe_load_imbalance,
                                                             **self.routing}),
               **self.constants}
        # the searched algorithms: stated for MoE models (the dispatch) and with cp > 1, or when pinned
        if self.spec.is_moe or "moe_a2a_algorithm" in self.fixed:
            cfg["moe_a2a_algorithm"] = "hierarchical" if p["moe_a2a_hierarchical"] else "flat"
        if p["cp"] > 1 or "cp_comm_type" in self.fixed:
            cfg["cp_comm_type"] = CP_COMM_NAMES[int(p["cp_comm"])]
        if p["layout_id"] != NO_VALUE:
            cfg["pipeline_layout"] = self.layouts[p["layout_id"]]
        if p["first_stage_layers"] != NO_VALUE:
            cfg["first_stage_layers"] = p["first_stage_layers"]
        if p["last_stage_layers"] != NO_VALUE:
            cfg["last_stage_layers"] = p["last_stage_layers"]
        if p["account_for_embedding"]:
            cfg["account_for_embedding_in_pipeline_split"] = True
        if p["account_for_loss"]:
            cfg["account_for_loss_in_pipeline_split"] = True
        cfg.update(_schedule_fields(self.fixed, p["schedule"]))
        return cfg

    def choice_columns(self, choices: list[dict]) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
        """Layout columns, option indices and a split-accepted mask for per-dimension choices (what a
        sampler suggests); choices need not be valid, the cost model says which are."""
        n = len(choices)
        par = {k: np.array([c[k] for c in choices], dtype=np.int64)
               for k in ("tp", "cp", "pp", "vpp", "ep", "etp", "micro_batch_size")}
        splits = []
        for c in choices:
            splits.append({k: self.fixed[k] for k in SPLIT_FIELDS if k in self.fixed} if c["split"] == "fixed"
                          else _split_fields(self.spec, c["pp"], c["vpp"], c["split"]))
        split_ok = np.array([f is not None for f in splits], dtype=bool)
        splits = [f or {} for f in splits]
        par["first_stage_layers"] = np.array([f.get("first_stage_layers", NO_VALUE) for f in splits], dtype=np.int64)
        par["last_stage_layers"] = np.array([f.get("last_stage_layers", NO_VALUE) for f in splits], dtype=np.int64)
        par["account_for_embedding"] = np.array(
            [f.get("account_for_embedding_in_pipeline_split", False) for f in splits], dtype=bool)
        par["account_for_loss"] = np.array(
            [f.get("account_for_loss_in_pipeline_split", False) for f in splits], dtype=bool)
        par["layout_id"] = np.array([self.layout_index(f["pipeline_layout"]) if "pipeline_layout" in f else NO_VALUE
                                     for f in splits], dtype=np.int64)
        par["schedule"] = np.array([SCHEDULE_CODES[f.get("pipeline_schedule") or "1f1b"] for f in splits],
                                   dtype=np.int64)
        a2a, cpc = self.resting("moe_a2a_algorithm"), self.resting("cp_comm_type")
        par["moe_a2a_hierarchical"] = np.array([c.get("moe_a2a_algorithm", a2a) == "hierarchical" for c in choices],
                                               dtype=bool)
        par["cp_comm"] = np.array([CP_COMM_CODES[c.get("cp_comm_type", cpc)] for c in choices], dtype=np.int64)
        opts = np.array([c["option"] for c in choices], dtype=np.int64)
        return par, opts, split_ok

    def choice_batch(self, choices: list[dict]) -> tuple[ConfigBatch, np.ndarray]:
        par, opts, split_ok = self.choice_columns(choices)
        return self._columns_batch(par, opts), split_ok

    def choice_config(self, choice: dict) -> dict:
        par, opts, _ = self.choice_columns([choice])
        return self._row_config({k: v[0].item() for k, v in par.items()}, int(opts[0]))


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


def _values(spec: ModelSpec, profile: ClusterProfile, devices: int, allow_cross_domain_tp: bool,
            framework: str | None = None) -> dict[str, list]:
    domain = int(profile.fact("scale_up_domain"))
    tp_cap = devices if allow_cross_domain_tp else domain
    tp = [d for d in divisors(math.gcd(spec.num_attention_heads, spec.query_groups)) if d <= tp_cap]
    cp = [c for c in CP_VALUES if c == 1 or spec.seq_length % (2 * c) == 0]
    pp = [p for p in divisors(devices) if p <= spec.num_layers]
    vpp = list(range(1, VPP_MAX + 1))
    ep = divisors(spec.num_experts) if spec.is_moe else [1]
    etp = [e for e in ETP_VALUES if e <= domain] if spec.is_moe else [1]
    have = _modules_available(spec)
    selective = [RecomputeOption("selective", s) for s in SELECTIVE_SETS if set(s) <= have]
    recompute = ([RecomputeOption("none")] + selective
                 + [RecomputeOption("full", None, n) for n in FULL_RECOMPUTE_LAYERS]
                 + (_offload_plans(spec, selective) if profile.has_host_link else []))
    a2a = list(frameworks.algorithm_values(framework, "moe_a2a_algorithm")) if spec.is_moe else [
        ALGORITHM_DEFAULTS["moe_a2a_algorithm"]]
    return {"tp": tp, "cp": cp, "pp": pp, "vpp": vpp, "ep": ep, "etp": etp,
            "moe_a2a_algorithm": a2a, "cp_comm_type": list(frameworks.algorithm_values(framework, "cp_comm_type")),
            "micro_batch_size": list(MBS_VALUES),
            "split": [SPLIT_EVEN, SPLIT_SLOTS, SPLIT_FIRST_LAST, SPLIT_BALANCED, SPLIT_DUALPIPEV, SPLIT_DUALPIPE],
            "recompute": recompute, "distributed_optimizer": [True],
            "tp_comm_overlap": [False, True], "moe_a2a_overlap": [False, True] if spec.is_moe else [False]}


def _apply_fixed(values: dict[str, list], fixed: dict) -> dict[str, list]:
    values = dict(values)
    for key in ("tp", "cp", "pp", "vpp", "ep", "etp", "micro_batch_size", "distributed_optimizer",
                "tp_comm_overlap", "moe_a2a_overlap", "moe_a2a_algorithm", "cp_comm_type"):
        if key in fixed:
            values[key] = [fixed[key]]
    if any(k in fixed for k in ("recompute", "recompute_modules", "recompute_num_layers")):
        opts = [o for o in values["recompute"] if not o.offload]  # a pinned recompute pins offload off
        if "recompute" in fixed:
            opts = [o for o in opts if o.recompute == fixed["recompute"]]
        if "recompute_modules" in fixed:
            mods = tuple(fixed["recompute_modules"])
            opts = [RecomputeOption("selective", mods)]
        if "recompute_num_layers" in fixed:
            opts = [RecomputeOption("full", None, fixed["recompute_num_layers"])]
        if fixed.get("recompute") == "selective" and not opts:
            opts = [RecomputeOption("selective", ("core_attn",))]
        values["recompute"] = opts
    if "offload_modules" in fixed:  # every recompute plan with the pinned offload (none with full recompute)
        off = tuple(fixed["offload_modules"] or ()) or None
        plans = {RecomputeOption(o.recompute, o.modules, o.num_layers, off): None for o in values["recompute"]
                 if off is None or o.recompute != "full"}
        values["recompute"] = list(plans)
    if any(k in fixed for k in SPLIT_FIELDS):
        values["split"] = ["fixed"]
    return values


def build_space(spec: ModelSpec, profile: ClusterProfile, devices: int, global_batch_size: int, *,
                precision: str = "bf16", moe_load_imbalance: float | None = None,
                fixed: dict | None = None, allow_cross_domain_tp: bool = False,
                framework: str | None = None, check: Callable[[], None] | None = None) -> SearchSpace:
    """All valid configs of one search. ``fixed`` pins config fields (validated by the caller).

    ``framework`` (``search.frameworks.FRAMEWORKS``) keeps only the configs that framework can express;
    None offers every option the cost model has (the CLI and the service always name one). ``check`` is
    called between the steps of the build (``SearchSpace.check``) and may raise to stop it."""
    check = check or (lambda: None)
    fixed, constants, values, routed, imbalance_by_ep = _dimensions(spec, profile, devices, precision,
                                                                     moe_load_imbalance, fixed,
                                                                     allow_cross_domain_tp, framework)
    imbalance = DEFAULT_MOE_LOAD_IMBALANCE if moe_load_imbalance is None else moe_load_imbalance

    layouts: list[str] = []
    if "pipeline_layout" in fixed:
        layouts.append(fixed["pipeline_layout"])
    # Split options per (pp, vpp): computed once, in Python (a few hundred pairs at most).
    split_rows = []
    for pp, vpp, mode in product(values["pp"], values["vpp"], values["split"]):
        if vpp > 1 and pp == 1:
            continue
        if mode == "fixed":
            fields = {k: fixed[k] for k in SPLIT_FIELDS if k in fixed}
        else:
            fields = _split_fields(spec, pp, vpp, mode)
            if fields is None:
                continue
        if not _schedule_fits(fields.get("pipeline_schedule"), pp, vpp):
            continue
        if "pipeline_layout" in fields and fields["pipeline_layout"] not in layouts:
            layouts.append(fields["pipeline_layout"])
        split_rows.append((pp, vpp, fields))
    check()
    grid = list(product(range(len(split_rows)), values["tp"], values["cp"], values["ep"], values["etp"],
                        values["micro_batch_size"]))
    if not grid or not split_rows:
        raise SpaceError("pp", "no pipeline size fits this device count and model")
    g = np.array(grid, dtype=np.int64)
    split_idx = g[:, 0]
    pp_col = np.array([r[0] for r in split_rows], dtype=np.int64)[split_idx]
    vpp_col = np.array([r[1] for r in split_rows], dtype=np.int64)[split_idx]
    field_col = lambda key, default: np.array([r[2].get(key, default) for r in split_rows])[split_idx]  # noqa: E731
    parallel = {
        "tp": g[:, 1], "cp": g[:, 2], "pp": pp_col, "vpp": vpp_col, "ep": g[:, 3], "etp": g[:, 4],
        "micro_batch_size": g[:, 5],
        "first_stage_layers": field_col("first_stage_layers", NO_VALUE).astype(np.int64),
        "last_stage_layers": field_col("last_stage_layers", NO_VALUE).astype(np.int64),
        "account_for_embedding": field_col("account_for_embedding_in_pipeline_split", False).astype(bool),
        "account_for_loss": field_col("account_for_loss_in_pipeline_split", False).astype(bool),
        "layout_id": np.array([layouts.index(r[2]["pipeline_layout"]) if "pipeline_layout" in r[2] else NO_VALUE
                               for r in split_rows], dtype=np.int64)[split_idx],
        "schedule": np.array([SCHEDULE_CODES[r[2].get("pipeline_schedule") or "1f1b"] for r in split_rows],
                             dtype=np.int64)[split_idx],
        # the algorithms' resting values; _with_algorithms adds the others where they matter
        "moe_a2a_hierarchical": np.zeros(len(g), dtype=bool), "cp_comm": np.zeros(len(g), dtype=np.int64),
    }
    options = [(r, d, t, a) for r, d, t, a in product(values["recompute"], values["distributed_optimizer"],
                                                         values["tp_comm_overlap"], values["moe_a2a_overlap"])]
    space = SearchSpace(spec=spec, profile=profile, devices=devices, global_batch_size=global_batch_size,
                        precision=precision, moe_load_imbalance=imbalance, values=values, fixed=fixed,
                        parallel=parallel, options=options, layouts=layouts, framework=framework,
                        constants=constants, routing=routed, imbalance_by_ep=imbalance_by_ep, check=check)
    # Keep the layouts every validity rule accepts, checked by the cost model's own code.
    probe = space.make_batch(np.arange(len(g)), np.zeros(len(g), dtype=np.int64))
    broken = np.logical_or.reduce([r.broken for r in validity.check(spec, probe, devices, profile.has_fp8, profile.has_host_link)])
    check()
    ok = ~broken & stage_sets(spec, probe).valid
    if not allow_cross_domain_tp and "tp" not in fixed:
        ok &= probe.tp <= int(profile.fact("scale_up_domain"))
    check()
    space.parallel = _with_algorithms(space, {k: v[ok] for k, v in parallel.items()})
    check()
    if framework is not None and ok.any():
        _keep_expressible(space)
    if space.size == 0:
        if fixed:
            raise SpaceError("fix", f"the pinned values ({', '.join(f'{k}={v}' for k, v in fixed.items())}) "
                                    "leave no structurally valid config")
        raise _no_config_error(devices, global_batch_size, int(profile.fact("scale_up_domain")))
    space.check = None  # the build's own: a sampler's round is not stopped half-told
    return space


def check_pins(spec: ModelSpec, profile: ClusterProfile, devices: int, global_batch_size: int, *,
               precision: str = "bf16", moe_load_imbalance: float | None = None, fixed: dict | None = None,
               allow_cross_domain_tp: bool = False, framework: str | None = None) -> None:
    """The checks of ``build_space`` that enumerate no layout (milliseconds, where the build takes seconds
    on a large MoE model): the pins against the model, the framework and the precision, the routing inputs,
    a dimension the pins leave with no value, and a device count and batch that no tp × pp × cp and
    micro-batch size can split (Megatron's rule: dp = devices / (tp·pp·cp) a whole number, the global
    batch a multiple of micro-batch × dp). Raises ``SpaceError`` as ``build_space`` would; a space these
    pass may still turn out empty (the validity rules), which only the build finds."""
    _, _, values, _, _ = _dimensions(spec, profile, devices, precision, moe_load_imbalance, fixed,
                                     allow_cross_domain_tp, framework)
    for tp, pp, cp in product(values["tp"], values["pp"], values["cp"]):
        if devices % (tp * pp * cp) == 0:
            dp = devices // (tp * pp * cp)
            if any(global_batch_size % (mbs * dp) == 0 for mbs in values["micro_batch_size"]):
                return
    raise _no_config_error(devices, global_batch_size, int(profile.fact("scale_up_domain")))


def _dimensions(spec, profile, devices, precision, moe_load_imbalance, fixed, allow_cross_domain_tp, framework):
    """The pins (with the dispatch pin), the constant fields, each dimension's values, and the routing."""
    fixed = _with_dispatch_pin(dict(fixed or {}))
    constants = _constants(spec, fixed, framework)
    if constants.get("fp8_recipe") is not None and precision != "fp8":
        raise SpaceError("fix.fp8_recipe", "applies to precision fp8 only (--precision fp8)")
    values = _apply_fixed(_values(spec, profile, devices, allow_cross_domain_tp, framework), fixed)
    routed, imbalance_by_ep = _routing_imbalance(spec, fixed, values["ep"], moe_load_imbalance, framework)
    for key, vals in values.items():
        if not vals:
            raise SpaceError(f"fix.{key}" if key in fixed else key, "no value is left for this dimension")
    return fixed, constants, values, routed, imbalance_by_ep


def _no_config_error(devices: int, global_batch_size: int, node_size: int) -> SpaceError:
    """Name what the user most likely got wrong when no layout is valid: a device count that is not a
    whole number of nodes (e.g. 6,143 on 8-device nodes) is the devices' fault, not the batch's."""
    if devices % node_size:
        return SpaceError("devices", f"{devices} devices are not a whole number of {node_size}-device nodes, "
                                     f"and no layout on them divides global batch {global_batch_size} into "
                                     f"micro-batches (try {devices - devices % node_size} or "
                                     f"{devices + node_size - devices % node_size})")
    return SpaceError("global_batch_size", f"no structurally valid config for {devices} devices and "
                                           f"global batch {global_batch_size}: it must divide by "
                                           "micro_batch_size*dp for some layout")


# Config fields the search does not vary: one value for the whole search (pinned, or the framework's).
# The router's distribution and the experts' placement (costmodel/routing.py): pinned inputs, one for the
# whole search; the imbalance they give depends on each config's ep.
ROUTING_FIELDS = ("moe_expert_load", "moe_expert_skew", "expert_placement", "moe_expert_replicas")
CONSTANT_FIELDS = ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype",
                   "data_parallel_sharding_strategy", "moe_token_dispatcher_type", "attention_kernel", "fp8_recipe",
                   "delay_wgrad_compute", "activation_func_fp8_input_store", "parameter_ema", "mla_fa_without_pad")


def _with_dispatch_pin(fixed: dict) -> dict:
    """A pinned ``moe_token_dispatcher_type`` decides the dispatch: it pins ``moe_a2a_algorithm`` to the one
    it implies (flex hierarchical, the others flat; TrainingConfig refuses the two disagreeing), so the
    searched algorithm column and the configs the search writes agree with it."""
    d = fixed.get("moe_token_dispatcher_type")
    if d is not None and "moe_a2a_algorithm" not in fixed:
        fixed["moe_a2a_algorithm"] = "hierarchical" if d == "flex" else "flat"
    return fixed


def _constants(spec: ModelSpec, fixed: dict, framework: str | None) -> dict:
    """The pinned constants; a pinned algorithm must be one the framework can launch (``frameworks.
    ALGORITHMS``: e.g. MindSpeed-LLM has no hierarchical all-to-all)."""
    d = fixed.get("moe_token_dispatcher_type")
    if d is not None and spec.is_moe and framework is not None and d not in frameworks.DISPATCHERS[framework]:
        raise SpaceError("fix.moe_token_dispatcher_type", f"{frameworks.LABELS[framework]} cannot launch the {d} "
                                                          f"dispatcher (it offers {', '.join(frameworks.DISPATCHERS[framework])})")
    for name in ALGORITHM_DEFAULTS:
        if name in fixed and fixed[name] not in frameworks.algorithm_values(framework, name):
            if name == "moe_a2a_algorithm" and not spec.is_moe:
                continue  # no dispatch in a dense model
            raise SpaceError(f"fix.{name}", f"{frameworks.LABELS[framework]} cannot launch {fixed[name]} "
                                            f"(it offers {', '.join(frameworks.algorithm_values(framework, name))})")
    if fixed.get("delay_wgrad_compute") and fixed.get("moe_a2a_overlap") is not True:
        raise SpaceError("fix.delay_wgrad_compute", "delaying the weight gradients needs the all-to-all overlap: "
                                                    "pin moe_a2a_overlap=true too")
    return {k: fixed[k] for k in CONSTANT_FIELDS if k in fixed}


def _routing_imbalance(spec: ModelSpec, fixed: dict, eps: list[int], moe_load_imbalance: float | None,
                       framework: str | None) -> tuple[dict, dict[int, float]]:
    """(the pinned routing fields, max/mean tokens per EP rank for each ep that divides the experts);
    no imbalance table without a distribution. SpaceError names the field that does not fit, and a
    placement the framework cannot launch (``frameworks.express`` refuses ``balanced``: a result still
    reports what it would give, ``moe_routing.imbalance_balanced``)."""
    pinned = {k: fixed[k] for k in ROUTING_FIELDS if k in fixed}
    if framework is not None and pinned.get("expert_placement", "contiguous") != "contiguous":
        raise SpaceError("fix.expert_placement", f"{frameworks.LABELS[framework]} cannot launch a "
                                                 f"{pinned['expert_placement']} placement: no launch flag places "
                                                 "experts by load (both frameworks place them contiguously)")
    if pinned.get("moe_expert_load") is None and pinned.get("moe_expert_skew") is None:
        return pinned, {}
    name = "moe_expert_load" if pinned.get("moe_expert_load") is not None else "moe_expert_skew"
    if moe_load_imbalance is not None:
        raise SpaceError(f"fix.{name}", "a routing distribution sets the imbalance: give it or "
                                        "moe_load_imbalance, not both")
    cfg = TrainingConfig.model_validate({"global_batch_size": 1, **pinned})
    if (problem := routing.routing_problem(spec, cfg)) is not None:
        raise SpaceError(f"fix.{problem[0]}", problem[1])
    shares = routing.expert_shares(spec, cfg)
    return pinned, {e: routing.rank_imbalance(shares, e, cfg.expert_placement, cfg.moe_expert_replicas)
                    for e in eps if spec.num_experts % e == 0}


def _with_algorithms(space: SearchSpace, par: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The layouts ``par`` (algorithm columns at zero) with each searched algorithm value where it makes
    a difference (see the module docstring): a layout holds the resting value (``SearchSpace.resting``)
    and, where the algorithm matters, every other value offered. Rows stay grouped by layout."""
    a2a_rest, cp_rest = space.resting("moe_a2a_algorithm"), space.resting("cp_comm_type")
    leaves = space.ep_leaves_domain(par["ep"], par["etp"])
    tp, cp = par["tp"], par["cp"]
    inside = np.gcd(cp, np.maximum(space._domain() // tp, 1))  # the Ulysses part of a2a+p2p (costmodel/layers.py)
    heads = space.spec.num_attention_heads
    rows, hier, comm = [], [], []
    for a2a, kind in product(space.values["moe_a2a_algorithm"], space.values["cp_comm_type"]):
        keep = np.ones(len(tp), dtype=bool)
        if a2a != a2a_rest:
            keep &= leaves
        if kind != cp_rest:
            keep &= cp > 1
            ulysses = {"a2a": cp, "a2a+p2p": inside}.get(kind)
            if kind == "a2a+p2p":
                keep &= (inside > 1) & (inside < cp)  # else it is p2p or a2a
            if ulysses is not None:
                keep &= heads % (ulysses * tp) == 0
        idx = np.flatnonzero(keep)
        rows.append(idx)
        hier.append(np.full(len(idx), a2a == "hierarchical"))
        comm.append(np.full(len(idx), CP_COMM_CODES[kind], dtype=np.int64))
    idx = np.concatenate(rows)
    order = np.argsort(idx, kind="stable")
    out = {k: v[idx[order]] for k, v in par.items()}
    out["moe_a2a_hierarchical"] = np.concatenate(hier)[order]
    out["cp_comm"] = np.concatenate(comm)[order]
    return out


def _keep_expressible(space: SearchSpace) -> None:
    """Drop the layouts the framework can run with no option; none left is an input error naming why."""
    mask = space._option_mask()
    keep = mask.any(axis=1)
    if not keep.any():
        row = {k: v[0].item() for k, v in space.parallel.items()}
        cfg = TrainingConfig.model_validate(space._row_config(row, 0))
        reasons = frameworks.refusals(cfg, space.spec, space.framework, int(space.profile.fact("scale_up_domain")))
        first = reasons[0] if reasons else None
        field = f"fix.{first.field}" if first is not None and first.field in space.fixed else "framework"
        raise SpaceError(field, f"{frameworks.LABELS[space.framework]} cannot express any config of this search"
                                + (f" ({first})" if first is not None else ""))
    space.parallel = {k: v[keep] for k, v in space.parallel.items()}
    space._mask_cache = (space.parallel, mask[keep])


def validate_fixed(fixed: dict, global_batch_size: int) -> dict:
    """Type-check pinned fields through the config schema; raises SpaceError naming ``fix.KEY``."""
    from pydantic import ValidationError

    unknown = [k for k in fixed if k not in TrainingConfig.model_fields or k in ("global_batch_size", "dp")]
    if unknown:
        raise SpaceError(f"fix.{unknown[0]}", "not a config field that a search chooses")
    for key in ("precision", "moe_load_imbalance"):
        if key in fixed:
            raise SpaceError(f"fix.{key}", "is an input of the search (--precision, --moe-load-imbalance), not searched")
    # pins that need a partner the search sets (precision) or checks itself (build_space: the overlap)
    partners = {"precision": "fp8"} if fixed.get("fp8_recipe") is not None else {}
    if fixed.get("delay_wgrad_compute"):
        partners["moe_a2a_overlap"] = True
    try:
        cfg = TrainingConfig.model_validate({"global_batch_size": global_batch_size, **partners, **fixed})
    except ValidationError as exc:
        err = exc.errors()[0]
        raise SpaceError(f"fix.{'.'.join(map(str, err['loc']))}", err["msg"]) from None
    return {k: getattr(cfg, k) for k in fixed}

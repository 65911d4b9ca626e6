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

The package's modules, one concern each: ``dimensions`` (the values each dimension offers), ``splits``
(pipeline splits and schedules), ``pins`` (pinned fields and per-search constants), ``expressible``
(the framework's mask), ``columns`` (batches and configs out of the space), ``core`` (``SearchSpace``:
size and enumeration) and ``build`` (``build_space``). Every name is importable from ``search.space``.
"""

from __future__ import annotations

# ruff: noqa: F401  (the package's names, re-exported where callers import them)
from costmodel import ConfigBatch, TrainingConfig, routing, validity
from costmodel.batch import (ATTENTION_KERNEL_CODES, CP_COMM_CODES, DEFAULT_MOE_LOAD_IMBALANCE, DISPATCHER_CODES,
                             DTYPE_BYTES, EMA_CODES, FP8_RECIPE_CODES, NO_VALUE, OFFLOAD_BITS, PRECISION_CODES,
                             RECOMPUTE_CODES, SCHEDULE_CODES, SHARDING_CODES, modules_mask)
from costmodel.pipeline import LayoutError, balanced_tokens, split_chunks, stage_sets, unique_rows
from costmodel.spec import ClusterProfile, ModelSpec

from .. import frameworks
from .dimensions import (ALGORITHM_DEFAULTS, CP_COMM_NAMES, CP_VALUES, ETP_VALUES, EXPERT_OFFLOADS,
                         FULL_RECOMPUTE_LAYERS, MBS_VALUES, OFFLOAD_SETS, OPTION_KEYS, PARALLEL_KEYS, SELECTIVE_SETS,
                         SPLIT_BALANCED, SPLIT_DUALPIPE, SPLIT_DUALPIPEV, SPLIT_EVEN, SPLIT_FIELDS, SPLIT_FIRST_LAST,
                         SPLIT_SLOTS, SWAP_ATTENTION_SET, VPP_MAX, RecomputeOption, SpaceError, _modules_available,
                         _offload_plans, _values, divisors)
from .splits import (_BALANCED_CACHE, DUALPIPE_OVERLAPS_OFF, SCHEDULE_NAMES, _balanced_fields, _balanced_layout,
                     _balanced_layout_uncached, _overlap_column, _schedule_fields, _schedule_fits, _split_fields)
from .pins import (CONSTANT_FIELDS, ROUTING_FIELDS, _apply_fixed, _constants, _routing_imbalance, _with_dispatch_pin,
                   validate_fixed)
from .expressible import _keep_expressible
from .core import SearchSpace
from .build import _dimensions, _no_config_error, _with_algorithms, build_space, check_pins

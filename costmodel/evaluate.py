"""Step time, throughput, MFU/HFU and memory of a batch of configs: the assembly of the effects.

Per micro-batch, each pipeline stage costs its layers' compute plus the communication that is not
hidden; the slowest stage sets the 1F1B steady state and the bubble (Narayanan et al. SC21 §2.2).
The step adds the exposed data-parallel synchronisation and the optimizer step of the busiest stage:

    step = m · t_stage + (pp − 1)/vpp · t_stage + dp_exposed + optimizer + stragglers

with m = global_batch_size / (micro_batch_size · dp) micro-batches. Under DualPipe each micro-batch
passes one of a rank's two stages (m/2 · t_stage) and the bubble is DeepSeek-V3 Table 2's; under
DualPipeV MindSpeed's (``pipeline.dualpipe_bubble_s``). The step then waits for the slowest
data-parallel replica (``stragglers.straggler_s``). Every part of the breakdown is one of these
terms, so they add up to the step time.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass, replace

import numpy as np

from . import comm, layers, memory, pipeline, routing, stragglers, validity
from .batch import ATTENTION_KERNEL_CODES, DUALPIPE, FP8_RECIPE_CODES, NO_VALUE, ConfigBatch
from .compute import FP8_QUANTISE_BYTES
from .flops import model_flops_per_token
from .hardware import Hardware
from .spec import ClusterProfile, ModelSpec

TIME_KEYS = ("compute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s", "pp_bubble_s", "pp_p2p_s",
             "dp_comm_exposed_s", "optimizer_s", "offload_s", "straggler_s")
# Adam step per local parameter (fp32): read weight, gradient, two moments (16 B); write weight and
# moments (12 B); write the bf16 copy (2 B).
ADAM_BYTES_PER_PARAM = 30


@dataclass
class BatchResult:
    """Arrays with one entry per config (per-stage arrays: one row per config, one column per stage)."""

    valid: np.ndarray  # structurally valid (every rule holds)
    feasible: np.ndarray  # valid and fits in memory
    broken: dict[str, np.ndarray]  # rule code -> mask
    rules: list  # validity.Rule objects, for messages
    stages: pipeline.StageSet
    step_time_s: np.ndarray
    tokens_per_s: np.ndarray
    tokens_per_s_per_device: np.ndarray
    model_tflops_per_device: np.ndarray
    mfu: np.ndarray
    hfu: np.ndarray
    time: dict[str, np.ndarray]
    peak_bytes: np.ndarray
    peak_rank: np.ndarray
    params_bytes: np.ndarray  # at the peak stage
    grads_bytes: np.ndarray
    optimizer_bytes: np.ndarray
    activations_bytes: np.ndarray  # stored for the backward: micro-batches in flight + logits
    buffers_bytes: np.ndarray  # transient: MoE dispatch buffers, a recomputed layer's rebuilt activations
    stage_peak_bytes: np.ndarray  # (N, K)
    stage_rank: np.ndarray  # (N, K)
    capacity_bytes: float
    overhead_bytes: float  # the profile's framework overhead, on every device
    # Parts of the candidate stages' peaks, so that any stage's peak can be rebuilt (see stage_peaks).
    stage_states_bytes: np.ndarray  # (N, K) weights + gradients + optimizer
    stage_act_microbatch_bytes: np.ndarray  # (N, K) activations of one micro-batch of the stage
    stage_fixed_bytes: np.ndarray  # (N, K) logits, transient buffers, framework overhead
    microbatches: np.ndarray  # (N,)
    pp: np.ndarray
    vpp: np.ndarray
    # (N,) what a chunk's activations are made of, for ranks whose chunks are uneven (stage_peaks):
    # one dense, MoE and MTP layer's stored bytes, a fully recomputed layer's kept input, and the
    # layers fully recomputed per stage (0 without full recompute).
    layer_act_bytes: tuple | None = None
    layer_input_bytes: np.ndarray | None = None
    full_recompute_cap: np.ndarray | None = None
    overlap_extra_microbatches: np.ndarray | None = None  # (N,) see pipeline.a2a_overlap_extra_microbatches
    schedule: np.ndarray | None = None  # (N,) batch.SCHEDULE_CODES
    # Activation offload: host bytes a node holds at its busiest stage (devices_per_node devices of it),
    # the node's host memory, and each candidate stage's offloaded bytes of one micro-batch (N, K).
    host_bytes_per_node: np.ndarray | None = None
    host_capacity_bytes: float = 0.0
    stage_offload_microbatch_bytes: np.ndarray | None = None
    offload_modules: np.ndarray | None = None  # (N,) batch.OFFLOAD_BITS mask

    def stage_offloaded(self, i: int) -> np.ndarray:
        """Bytes each pipeline stage of config ``i`` holds in host memory (per device, rank order): its
        micro-batches in flight times its offloaded bytes of one micro-batch."""
        s = self.stages.split_index[i]
        comps = self.stages.split_comps[s]
        match = _first_row_match(comps, self.stages.comp[i])
        ranks = np.arange(len(comps))[None, :]
        held = pipeline.microbatches_in_flight(self.pp[i:i + 1], self.vpp[i:i + 1], self.microbatches[i:i + 1], ranks,
                                               None if self.schedule is None else self.schedule[i:i + 1])[0]
        extra = self.overlap_extra_microbatches[i]
        return self.stage_offload_microbatch_bytes[i, match] * (held + extra * (held < self.microbatches[i]))

    def stage_peaks(self, i: int) -> np.ndarray:
        """Peak bytes of every pipeline stage of config ``i``, in rank order.

        The batch path keeps one candidate per distinct stage composition; stages sharing a
        composition differ only in the micro-batches they hold in flight."""
        if self.stage_states_bytes is None:
            raise ValueError("per-stage memory was not kept: evaluate with keep_stages=True")
        s = self.stages.split_index[i]
        comps = self.stages.split_comps[s]
        cand = self.stages.comp[i]
        match = _first_row_match(comps, cand)
        ranks = np.arange(len(comps))[None, :]
        held = pipeline.microbatches_in_flight(self.pp[i:i + 1], self.vpp[i:i + 1], self.microbatches[i:i + 1], ranks,
                                               None if self.schedule is None else self.schedule[i:i + 1])[0]
        extra = self.overlap_extra_microbatches[i]
        held_act = self.stage_act_microbatch_bytes[i, match] * (held + extra * (held < self.microbatches[i]))
        uneven = self.stages.split_unevens[s] & (self.pp[i] > 1)
        for r in np.flatnonzero(uneven).tolist():  # chunks differ: replay the schedule (see _score)
            chunks = self.stages.split_chunk_acts[s][r].astype(np.float64)  # (vpp, 3) layers
            decoder = comps[r, pipeline.DENSE] + comps[r, pipeline.MOE]
            cap = self.full_recompute_cap[i]
            frac = min(decoder, cap) / max(decoder, 1) if cap > 0 else 0.0
            per_layer = [a[i] * (1 - f) + f * self.layer_input_bytes[i]
                         for a, f in zip(self.layer_act_bytes, (frac, frac, 0.0))]
            held_act[r] = pipeline.replay_peak_activation_bytes(
                int(self.pp[i]), int(self.vpp[i]), int(round(self.microbatches[i])), r, chunks @ per_layer
            ) + extra * self.stage_act_microbatch_bytes[i, match[r]]
        return self.stage_states_bytes[i, match] + held_act + self.stage_fixed_bytes[i, match]

    def __len__(self) -> int:
        return len(self.valid)


def _first_row_match(rows: np.ndarray, table: np.ndarray) -> np.ndarray:
    """For each row of ``rows``, the index of its first equal row in ``table`` (0 when none): what
    ``(rows[:, None] == table[None]).all(axis=2).argmax(axis=1)`` gives, without that (rows, table)
    array, which for a 10,000-stage pipeline is 500 MB and 1.5 s of one evaluate."""
    first: dict[tuple, int] = {}
    for j, key in enumerate(map(tuple, table.tolist())):
        first.setdefault(key, j)
    return np.fromiter((first.get(tuple(r), 0) for r in rows.tolist()), dtype=np.intp, count=len(rows))


def _shapes(spec: ModelSpec, b: ConfigBatch, dp: np.ndarray) -> memory.Shapes:
    tokens = (b.micro_batch_size * spec.seq_length / b.cp).astype(np.float64, copy=False)
    tokens_sp = np.where(b.sequence_parallel, tokens / b.tp, tokens)
    routed_mean = tokens_sp * (spec.moe_router_topk or 0)
    routed = routed_mean * routing.effective_imbalance(b.ep, b.moe_load_imbalance)
    modules = np.where(b.recompute == 1, b.recompute_modules, 0)
    return memory.Shapes(tokens=tokens, tokens_sp=tokens_sp, tokens_moe=tokens_sp, routed=routed,
                         routed_mean=routed_mean,
                         tp=b.tp, cp=b.cp, ep=b.ep, etp=b.etp, modules=modules,
                         gemm_input_bytes=np.where(b.precision == 1, 1.0, memory.BF16),
                         offload=b.offload_modules, seq_kv=float(spec.seq_length),
                         unfused_attention=b.attention_kernel == ATTENTION_KERNEL_CODES["unfused"],
                         act_input_bytes=memory.act_input_bytes(spec, b.act_fp8_input_store))


def _fp8_quant_bytes(b: ConfigBatch) -> np.ndarray:
    """Bytes per element to quantise an FP8 GEMM operand under each config's recipe (0 in BF16)."""
    by_code = np.array([FP8_QUANTISE_BYTES[name] for name in FP8_RECIPE_CODES])
    return np.where(b.precision == 1, by_code[b.fp8_recipe_codes()], 0.0)


def _recomputed_layers_total(spec: ModelSpec, b: ConfigBatch, split_index: np.ndarray,
                             all_comp: list[np.ndarray]) -> np.ndarray:
    """Decoder layers fully recomputed in the whole model: ``recompute_num_layers`` per stage."""
    total = np.zeros(len(b))
    full = b.recompute == 2
    if not full.any():
        return total
    uniq, inv = pipeline.unique_rows([split_index[full], b.recompute_num_layers[full]])
    # Decoder layers of every stage of the splits present, zero-padded to the deepest pipeline.
    used, row = np.unique(uniq[:, 0], return_inverse=True)
    comps = [all_comp[s] for s in used.tolist()]
    per_stage_layers = np.zeros((len(comps), max(len(c) for c in comps)), dtype=np.int64)
    in_split = np.zeros_like(per_stage_layers)
    for i, c in enumerate(comps):
        per_stage_layers[i, :len(c)] = c[:, pipeline.DENSE] + c[:, pipeline.MOE]
        in_split[i, :len(c)] = 1
    n = uniq[:, 1]
    cap = np.where(n != NO_VALUE, n, 1 << 30)[:, None]
    values = (np.minimum(per_stage_layers[row], cap) * in_split[row]).sum(axis=1)
    total[full] = values[inv]
    return total


def _stage_columns(st: pipeline.StageSet, split_index: np.ndarray, k: int) -> list[np.ndarray]:
    """The five composition columns of the first k candidate stages as float64 arrays of shape (k, N)."""
    table = st.split_comp_table[:, :k].transpose(2, 1, 0).astype(np.float64)  # (5, k, splits)
    return [np.take(table[i], split_index, axis=1) for i in range(5)]


def _first_argmax(x: np.ndarray) -> np.ndarray:
    """``np.argmax(x, axis=0)`` for a short first axis (K, N): K passes over rows instead of N short scans."""
    top = x.max(axis=0)
    if np.isnan(top).any():  # argmax reports the first NaN
        return np.argmax(x, axis=0)
    idx = np.full(x.shape[1], x.shape[0] - 1, dtype=np.intp)
    for k in range(x.shape[0] - 2, -1, -1):
        idx[x[k] == top] = k
    return idx


def _at(x: np.ndarray, flat_idx: np.ndarray) -> np.ndarray:
    """Entry ``idx[i]`` of column i of a (K, N) array (or of a (1, N) row broadcast to it), where
    ``flat_idx = idx * N + arange(N)``."""
    n = len(flat_idx)
    if x.shape[0] == 1:
        return np.broadcast_to(x, (1, n))[0].copy()
    return x.reshape(-1).take(flat_idx)


def _all_finite(*arrays) -> bool:
    return all(np.isfinite(a).all() for a in arrays)


# Large batches are scored in groups of configs with the same number of distinct stages (so that
# per-stage arrays are not padded to the batch's deepest split), in chunks that keep the temporaries
# within the last-level cache while paying each numpy call's fixed cost (about 1,700 calls per chunk
# for a MoE model) on many configs: 32,768 scored 100,000 configs 5-9 % faster than 16,384 on this
# 2-core machine (32 MB L3). Every config's numbers are computed element-wise, so neither the grouping
# nor the chunk size changes them.
GROUP_MIN_CONFIGS = 4096
CHUNK_CONFIGS = 32768
# A chunk's fixed cost (its numpy calls: about 2.5 ms for a MoE model) is about that of scoring 12,000
# more config-stages (about 0.2 µs each), measured on the costmodel benchmark's batches. A small group
# is scored with the stages of the next deeper one where that padding costs less than the chunks it
# saves: the stage sets repeat a split's last stage up to any depth, and a copy computes the same
# numbers as its original (the peak, the first of equal maxima, stays on the original).
CHUNK_FIXED_CONFIG_STAGES = 12_000


STAGE_KEYS = ("stage_peak_bytes", "stage_states_bytes", "stage_act_microbatch_bytes", "stage_fixed_bytes",
              "layer_act_dense_bytes", "layer_act_moe_bytes", "layer_act_mtp_bytes", "layer_input_bytes",
              "full_recompute_cap", "overlap_extra_microbatches", "stage_offload_microbatch_bytes")


def evaluate_batch(spec: ModelSpec, profile: ClusterProfile, devices: int, b: ConfigBatch,
                   all_stages: bool = False, keep_stages: bool = True, hw: Hardware | None = None) -> BatchResult:
    """Score every config of ``b`` for ``spec`` on ``devices`` devices of ``profile``.

    Invalid configs get finite placeholder numbers, masked by ``valid``; nothing raises for a bad
    config. A batch of at least ``GROUP_MIN_CONFIGS`` configs does not score its invalid configs: every
    number of theirs (times, bytes, throughputs, MFU/HFU, per-stage arrays, the peak's rank) is
    ``UNSCORED`` (0). A smaller batch (one config included) scores them like the valid ones, its
    formulas' numbers for a config that cannot run. ``all_stages`` keeps every pipeline stage in the
    per-stage arrays (for reports); ``keep_stages=False`` returns no per-stage arrays at all (searches:
    only the peak matters, and not writing (N, K) outputs saves a fifth of the time). ``hw``: the
    profile's hardware with its efficiency factors given per config (arrays of len(b)), to score many
    candidate factor sets in one call (``hardware_profiles.calibrate``); the profile's own when None."""
    hw = Hardware.from_profile(profile) if hw is None else hw
    rules = validity.check(spec, b, devices, profile.has_fp8, profile.has_host_link)
    st = pipeline.stage_sets(spec, b, all_stages=all_stages)
    broken = {r.code: r.broken for r in rules}
    broken["pipeline_split"] = ~st.valid
    valid = ~np.logical_or.reduce(list(broken.values()))

    scored = _score_in_groups(spec, hw, devices, b, st, keep_stages, valid)
    for key in STAGE_KEYS:
        scored.setdefault(key, None)
    layer_act = tuple(scored.pop(f"layer_act_{u}_bytes") for u in ("dense", "moe", "mtp"))
    scored["layer_act_bytes"] = None if layer_act[0] is None else layer_act
    # Host memory binds only where something is offloaded (a profile without a host link states none).
    host_ok = (b.offload_modules == 0) | (scored["host_bytes_per_node"] <= hw.host_memory_bytes)
    feasible = valid & (scored["peak_bytes"] <= hw.memory_bytes) & host_ok
    return BatchResult(valid=valid, feasible=feasible, broken=broken, rules=rules, stages=st, **scored,
                       stage_rank=st.rank if keep_stages else None, capacity_bytes=hw.memory_bytes,
                       host_capacity_bytes=hw.host_memory_bytes, offload_modules=b.offload_modules,
                       overhead_bytes=hw.framework_overhead_bytes,
                       pp=b.pp, vpp=b.vpp, schedule=b.schedule)


def _score_in_groups(spec: ModelSpec, hw: Hardware, devices: int, b: ConfigBatch, st: pipeline.StageSet,
                     keep_stages: bool = True, valid: np.ndarray | None = None) -> dict:
    """The scored outputs of ``b`` (``_score``'s keys, the times flattened as ``time.<key>``). A batch of
    at least ``GROUP_MIN_CONFIGS`` configs scores only its ``valid`` ones (all when None): grouped once by
    stage count, so that every chunk (``_chunk_plan``) is a slice of one gathered batch (columns, hardware
    factors, sizes), its outputs written to their configs' places; the others keep ``UNSCORED`` (0). A
    smaller batch is scored whole."""
    n, K = len(st.split_index), st.split_comp_table.shape[1]
    if n < GROUP_MIN_CONFIGS:
        return _drop_stages(_score(spec, hw, devices, b, st, st.split_index, K), keep_stages)
    scored = np.arange(n) if valid is None else np.flatnonzero(valid)
    if not len(scored):  # nothing to score: one config's outputs give the keys, shapes and dtypes
        first = np.zeros(1, dtype=np.intp)
        return _placeholders(_drop_stages(_score(spec, _rows_of(hw, first, n), devices, b.take(first), st,
                                                 st.split_index[:1], K), keep_stages), n, K)
    counts = st.split_stage_count[st.split_index[scored]]
    sizes = np.bincount(counts)
    ks = np.flatnonzero(sizes)
    plan = _chunk_plan(ks.tolist(), sizes[ks].tolist())
    # The configs of each merged group of stage counts, in batch order (gathers and scatters stream).
    depths = sorted({k for k, _, _ in plan})
    order = scored if len(depths) == 1 else np.concatenate(
        [scored[(counts > lo) & (counts <= hi)] for lo, hi in zip([0] + depths, depths)])
    nv = len(order)
    bs, hs, split = _take_configs(b, order, _constant_columns(b)), _rows_of(hw, order, n), st.split_index[order]
    # Layer costs depend on few columns: score each distinct combination of their inputs once.
    dp, m, shapes = _sizes(spec, devices, bs)
    ctx, head_weights = _layer_inputs(spec, hs, bs, shapes)
    distinct = _distinct_layer_inputs(bs, ctx, head_weights)
    if distinct is not None:
        member, inverse = distinct
        costs = _CostTable(_layer_costs(spec, _take_fields(ctx, member, nv, {}), head_weights[member]),
                           max(stop - start for _, start, stop in plan))
    full_layers = _recomputed_layers_total(spec, bs, split, st.split_comps)
    # The replayed schedules of uneven chunks, tabled once for the batch rather than per chunk.
    replay = _replay_tables(st, split, m) if st.split_uneven_table.any() else None
    out: dict = {}
    for k, start, stop in plan:
        sl = slice(start, stop)
        part = _drop_stages(_score(spec, _rows_of(hs, sl, nv), devices, _rows_of(bs, sl, nv), st, split[sl], k,
                                   None if distinct is None else costs.take(inverse[sl]), full_layers[sl],
                                   None if replay is None else (replay, replay.inverse[sl]),
                                   (dp[sl], m[sl], _rows_of(shapes, sl, nv))),
                            keep_stages)
        part.update({"time." + key: v for key, v in part.pop("time").items()})
        if not out:  # the outputs as rows of a few large blocks: fewer, larger page faults
            out = _output_rows(part, n, K, np.zeros)
        idx = order[sl]
        for key, v in part.items():
            if v.ndim == 2:  # per stage, (N, k) views of (k, N) rows: pad as the stage sets do
                for j in range(K):
                    out[key][j, idx] = v[:, min(j, k - 1)]
                continue
            out[key][idx] = v
    return _as_outputs(out)


def _chunk_plan(ks: list[int], sizes: list[int]) -> list[tuple[int, int, int]]:
    """The chunks (stages scored, start, stop) of configs sorted by stage count, ``sizes[g]`` of them with
    ``ks[g]`` stages (ascending): consecutive groups merged into the deepest of them where the padded
    stages cost less than the chunks saved (``CHUNK_FIXED_CONFIG_STAGES``, by dynamic programming over
    the groups), each merged group cut into ``round(configs / CHUNK_CONFIGS)`` (at least one) equal chunks."""
    starts = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    n_chunks = lambda i, j: max(1, round((starts[j] - starts[i]) / CHUNK_CONFIGS))  # noqa: E731  groups i..j-1
    best, cut = [0.0] + [float("inf")] * len(ks), [0] * (len(ks) + 1)
    for j in range(1, len(ks) + 1):  # best[j]: the cheapest plan of the first j groups
        for i in range(j):
            cost = best[i] + CHUNK_FIXED_CONFIG_STAGES * n_chunks(i, j) + (starts[j] - starts[i]) * ks[j - 1]
            if cost < best[j]:
                best[j], cut[j] = cost, i
    plan, j = [], len(ks)
    while j:
        i = cut[j]
        edges = np.linspace(starts[i], starts[j], n_chunks(i, j) + 1).round().astype(int).tolist()
        plan[:0] = [(ks[j - 1], a, b) for a, b in zip(edges, edges[1:])]
        j = i
    return plan


# What a config of a large batch that is not scored (structurally invalid) holds in every output:
# times, bytes, throughputs, utilisations and the peak's rank all 0.
UNSCORED = 0


def _as_outputs(rows: dict) -> dict:
    """``_score``'s outputs from output rows (``_output_rows``): per-stage ones as (n, K), the times in a dict."""
    out = {key: v.T if v.ndim == 2 else v for key, v in rows.items()}
    out["time"] = {key: out.pop("time." + key) for key in TIME_KEYS}
    return out


def _placeholders(part: dict, n: int, K: int) -> dict:
    """Outputs shaped like ``part``'s (one config's) for ``n`` configs, all ``UNSCORED``."""
    part.update({"time." + key: v for key, v in part.pop("time").items()})
    return _as_outputs(_output_rows({key: v.T if v.ndim == 2 else v for key, v in part.items()}, n, K, np.zeros))


def _rows_of(obj, rows: np.ndarray | slice, n: int):
    """Dataclass ``obj`` (a ConfigBatch, Shapes or Hardware, whose efficiency factors may be arrays of one
    value per config) of ``n`` configs for the configs ``rows``: its (n,) array fields gathered (an index
    array) or viewed (a slice); ``obj`` itself when the slice is all of it or it has no such field (so that
    a Hardware's derived values stay cached)."""
    if isinstance(rows, slice) and rows.start == 0 and rows.stop == n:
        return obj
    changes = {f.name: v[rows] for f in fields(obj)
               if isinstance(v := getattr(obj, f.name), np.ndarray) and v.shape == (n,)}
    return replace(obj, **changes) if changes else obj


_BATCH_COLUMNS = tuple(f.name for f in fields(ConfigBatch) if f.name != "layouts")


def _same_bits(v: np.ndarray) -> np.ndarray:
    """``v`` as integers of its width where it is a float array (so that -0.0 and 0.0 differ, NaN equals
    itself), for comparisons bit for bit."""
    return v.view(np.int64) if v.dtype == np.float64 else v


def _constant_columns(b: ConfigBatch) -> set[str]:
    """The columns of ``b`` that hold one value, bit for bit, in every config (a search's fixed options);
    a column whose first 64 configs differ is ruled out on them alone."""
    return {name for name in _BATCH_COLUMNS
            if (bits := _same_bits(getattr(b, name))).size and (bits[:64] == bits[0]).all()
            and (bits == bits[0]).all()}


def _take_configs(b: ConfigBatch, idx: np.ndarray, constant: set[str]) -> ConfigBatch:
    """``b.take(idx)``, read-only, where a ``constant`` column is a slice of its first ``len(idx)`` entries
    (the same values) instead of a gather: about half the columns of a search's batch."""
    kw = {}
    for name in _BATCH_COLUMNS:
        v = getattr(b, name)
        v = v[:len(idx)] if name in constant else v.take(idx)
        v.flags.writeable = False  # chunks are views of it: scoring never writes a column
        kw[name] = v
    return ConfigBatch(**kw, layouts=b.layouts)


def _drop_stages(part: dict, keep_stages: bool) -> dict:
    if not keep_stages:
        for key in STAGE_KEYS:
            part.pop(key, None)
    return part


def _output_rows(part: dict, n: int, K: int, alloc=np.empty) -> dict:
    """Outputs shaped like ``part``'s for ``n`` configs and ``K`` stages (``alloc``: ``np.empty`` or
    ``np.zeros``), as rows of one block per dtype and rank."""
    groups: dict = {}
    for key, v in part.items():
        groups.setdefault((v.dtype, v.ndim), []).append(key)
    out = {}
    for (dtype, ndim), keys in groups.items():
        block = alloc((len(keys), K, n) if ndim == 2 else (len(keys), n), dtype=dtype)
        out.update(zip(keys, block))
    return out


class _CostTable:
    """Layer costs of distinct configs, expanded to a chunk's configs field by field when the chunk's
    scoring first reads the field (a search reads about two thirds of them: the embedding's and the
    output head's costs mostly not). A cost with one value in every distinct config (bit for bit) is
    not gathered: a chunk gets a read-only slice of a row of that value, ``max_len`` long (the longest
    chunk)."""

    def __init__(self, costs, max_len: int):
        self.costs = costs
        self.arrays: dict[int, np.ndarray] = {}  # id -> array, shared arrays once
        self.constant: dict[int, np.ndarray] = {}
        n = len(costs[0].fwd_s)
        for c in costs:
            for f in fields(c):
                v = getattr(c, f.name)
                if isinstance(v, np.ndarray) and v.shape == (n,) and id(v) not in self.arrays:
                    self.arrays[id(v)] = v
                    if (_same_bits(v) == _same_bits(v)[0]).all():
                        self.constant[id(v)] = np.full(max_len, v[0], dtype=v.dtype)

    def take(self, idx: np.ndarray) -> list[layers.Cost]:
        taken: dict[int, np.ndarray] = {}  # id -> the chunk's array, shared arrays once
        return [_ChunkCost(self, c, idx, taken) for c in self.costs]

    def expand(self, v, idx: np.ndarray, taken: dict):
        """Field value ``v`` of a distinct-config cost for the configs ``idx`` (other values as they are)."""
        key = id(v)
        if key not in self.arrays:
            return v
        if key not in taken:
            if key in self.constant:
                taken[key] = self.constant[key][:len(idx)]
                taken[key].flags.writeable = False
            else:
                taken[key] = self.arrays[key].take(idx)
        return taken[key]


class _ChunkCost(layers.Cost):
    """A :class:`layers.Cost` of a chunk's configs whose fields are gathered from a ``_CostTable`` on
    first read (the dataclass's fields have no class defaults, so an unread one reaches __getattr__)."""

    def __init__(self, table: _CostTable, cost: layers.Cost, idx: np.ndarray, taken: dict):  # noqa: D107
        self.__dict__.update(_table=table, _cost=cost, _idx=idx, _taken=taken)

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        value = self._table.expand(getattr(self._cost, name), self._idx, self._taken)
        self.__dict__[name] = value
        return value


def _layer_inputs(spec: ModelSpec, hw: Hardware, b: ConfigBatch,
                  shapes: memory.Shapes) -> tuple[layers.Context, np.ndarray]:
    """What the layer costs read per config: the blocks' context and the output head's weight copies.
    (Large batches score each distinct combination once: see ``_distinct_layer_inputs``.)"""
    ctx = layers.Context(spec=spec, hw=hw, shapes=shapes, fp8=b.precision == 1, sp=b.sequence_parallel,
                         imbalance=routing.effective_imbalance(b.ep, b.moe_load_imbalance), modules=shapes.modules,
                         a2a_hierarchical=b.moe_a2a_hierarchical, dispatcher=b.moe_dispatcher, cp_comm=b.cp_comm,
                         grad_accum_bytes=b.main_grads_bytes.astype(np.int64),
                         expert_replicas=b.moe_expert_replicas.astype(np.int64),
                         fp8_quant_bytes=_fp8_quant_bytes(b),
                         pad_v_head=(~b.mla_fa_without_pad) & hw.fa_pads_v_head & spec.multi_latent_attention)
    holds_head = (spec.untie_embeddings_and_output_weights | (b.pp > 1)).astype(np.int64)
    # The last stage also keeps a copy of the embedding when MTP needs it there (pp > 1): a second
    # V·h/tp matrix, added as a count (adding the two bool arrays would be a logical or). Not under
    # DualPipe / DualPipeV, which put the first stage (the embedding) and the last (head and MTP) on one
    # rank: the MTP module uses that rank's own embedding, "physical sharing of parameters and
    # gradients, of the shared embedding and output head, between the MTP module and the main model"
    # (DeepSeek-V3 §3.2.3, "Shared Embedding and Output Head for Multi-Token Prediction").
    mtp_copy = (b.pp > 1) & (spec.mtp_num_layers > 0) & (b.schedule == 0)
    head_weights = holds_head + mtp_copy.astype(np.int64)
    return ctx, head_weights


def _layer_costs(spec: ModelSpec, ctx: layers.Context, head_weights: np.ndarray) -> tuple[layers.Cost, ...]:
    """Dense, MoE and MTP layers, embedding and output head of every config of ``ctx``."""
    dense = layers.dense_layer(ctx)
    moe = layers.moe_layer(ctx) if spec.is_moe else dense
    last_layer = moe if spec.moe_layer_pattern()[-1] else dense
    mtp = last_layer + layers.mtp_extra(ctx)
    emb = layers.embedding(ctx)
    head = layers.output_head(ctx, head_weights)
    return dense, moe, mtp, emb, head


def _per_config_arrays(obj, n: int) -> list[np.ndarray]:
    """The (n,) arrays among the fields of dataclass ``obj``, nested dataclasses included."""
    found = []
    for f in fields(obj):
        v = getattr(obj, f.name)
        if is_dataclass(v) and not isinstance(v, type):
            found += _per_config_arrays(v, n)
        elif isinstance(v, np.ndarray) and v.shape == (n,):
            found.append(v)
    return found


def _take_fields(obj, idx: np.ndarray, n: int, taken: dict):
    """A copy of dataclass ``obj`` with every (n,) array field (nested ones too) indexed by ``idx``.
    ``taken`` (id -> array) keeps arrays shared between fields shared."""
    changes = {}
    for f in fields(obj):
        v = getattr(obj, f.name)
        if is_dataclass(v) and not isinstance(v, type):
            changes[f.name] = _take_fields(v, idx, n, taken)
        elif isinstance(v, np.ndarray) and v.shape == (n,):
            if id(v) not in taken:
                taken[id(v)] = v[idx]
            changes[f.name] = taken[id(v)]
    return replace(obj, **changes)


def _replica_grad_sync_s(spec: ModelSpec, b: ConfigBatch, expert_grad_bytes: np.ndarray, hw: Hardware) -> np.ndarray:
    """A copy of a hot expert (``moe_expert_replicas``, routing.py) sums its gradient with its original
    each step: an all-reduce between two EP ranks, taken on the far half of the EP group (where the group
    spans nodes, across them), of the copies' share of each stage's expert gradients."""
    local = spec.num_experts / b.ep + b.moe_expert_replicas
    share = b.moe_expert_replicas / local
    stride = b.etp * np.maximum(b.ep // 2, 1)
    return comm.all_reduce_s(expert_grad_bytes * share[None, :], stride[None, :], 2, hw)


def _distinct_layer_inputs(b: ConfigBatch, ctx: layers.Context,
                           head_weights: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """One config per distinct combination of layer inputs and every config's combination, or None
    when most configs are distinct. Configs are grouped on the integer inputs (tp, cp, ep, etp,
    modules, flags, head copies) and the batch columns the float inputs derive from (micro-batch
    size, precision, imbalance); every float input is then checked bit for bit, so a grouping that
    misses an input is never used."""
    n = len(b)
    arrays = list({id(a): a for a in _per_config_arrays(ctx, n) + [np.asarray(head_weights)]}.values())
    imbalance = b.moe_load_imbalance
    if (imbalance != imbalance[0]).any():
        imbalance = np.unique(imbalance, return_inverse=True)[1]
    key = [a for a in arrays if a.dtype.kind in "biu"] + [b.micro_batch_size, b.precision]
    if not np.shares_memory(imbalance, b.moe_load_imbalance):
        key.append(imbalance)
    limit = max(4 * n, 1 << 16)
    columns = []
    for c in key:
        c = c.astype(np.int64, copy=False)
        lo, hi = int(c.min()), int(c.max())
        if hi > lo:
            columns.append((c, lo, hi - lo + 1))
    rank = np.prod([float(span) for _, _, span in columns]) > limit
    code = np.zeros(n, dtype=np.int64)
    total = 1
    for c, lo, span in columns:
        if rank and span > 2:  # the rank of each value among those present
            if span < 4 * n:
                present = np.zeros(span, dtype=bool)
                present[c - lo] = True
                ranks = np.cumsum(present) - 1
                c, span, lo = ranks[c - lo], int(ranks[-1]) + 1, 0
            else:
                uniq, c = np.unique(c, return_inverse=True)
                span, lo = len(uniq), 0
        total *= span
        if total > limit:
            return None
        code *= span
        code += c
        if lo:
            code -= lo
    present = np.zeros(total, dtype=bool)
    present[code] = True
    groups = np.flatnonzero(present)
    if len(groups) > n // 2:
        return None
    lookup = np.empty(total, dtype=np.intp)
    lookup[groups] = np.arange(len(groups))
    inverse = lookup[code]
    member = np.empty(len(groups), dtype=np.intp)
    member[inverse] = np.arange(n)  # any member stands for its group
    for a in arrays:
        if a.dtype.kind not in "biu":
            bits = a.view(np.int64) if a.dtype.itemsize == 8 else a
            if not np.array_equal(bits[member][inverse], bits):
                return None
    return member, inverse


@dataclass
class _ReplayTables:
    """The replayed schedule's layers in flight of a batch's distinct (split, m) groups: group g's ranks
    are rows ``offset[g]`` on of ``stacked`` (rows, Q, C), each rank's maximal moments (Q, zero-padded)
    by kind of layer (C, ``pipeline.CHUNK_ACT_COLUMNS``); ``inverse`` is each config's group."""

    uniq: np.ndarray  # (G, 2) split, m
    inverse: np.ndarray  # (N,)
    stacked: np.ndarray
    offset: np.ndarray  # (G,)


def _replay_tables(st: pipeline.StageSet, split_index: np.ndarray, m: np.ndarray) -> _ReplayTables:
    """``_ReplayTables`` of the configs with splits ``split_index`` and ``m`` micro-batches: the layers in
    flight depend on the split, the stage and m only, so they are tabled once per distinct (split, m)
    (and memoised across calls in the stage sets' replay caches)."""
    m_int = np.maximum(np.rint(m), 1).astype(np.int64)
    uniq, inverse = pipeline.unique_rows([split_index, m_int])
    per_rank = []  # per group: its split's (pp, Q, C) table
    for s, mi in uniq.tolist():
        cache = st.split_replay_caches[s]
        t = cache.get(mi)
        if t is None and not st.split_unevens[s].any():
            t = cache.put(mi, np.zeros((len(st.split_comps[s]), 1, len(pipeline.CHUNK_ACT_COLUMNS))))
        elif t is None:
            pp, vpp = len(st.split_comps[s]), st.split_chunk_acts[s].shape[1]
            t = cache.put(mi, pipeline.rank_in_flight_layers(pp, vpp, mi, st.split_chunk_acts[s],
                                                             st.split_unevens[s]))
        per_rank.append(t)
    by_q: dict[int, list[int]] = {}  # groups by table height, each padded to the tallest once
    for g, t in enumerate(per_rank):
        by_q.setdefault(t.shape[1], []).append(g)
    Q = max(by_q)  # zero rows pad: they never win
    blocks, order = [], []
    for q, groups in by_q.items():
        block = np.concatenate([per_rank[g] for g in groups])
        blocks.append(block if q == Q else np.pad(block, ((0, 0), (0, Q - q), (0, 0))))
        order += groups
    sizes = np.array([len(per_rank[g]) for g in order])
    offset = np.empty(len(per_rank), dtype=np.int64)
    offset[order] = np.cumsum(sizes) - sizes
    return _ReplayTables(uniq=uniq, inverse=inverse, stacked=np.concatenate(blocks), offset=offset)


def _replayed(st: pipeline.StageSet, tables: _ReplayTables, config_groups: np.ndarray, uneven: np.ndarray,
              held_act: np.ndarray, unit_chunk_col: list[int], layer_act: list[np.ndarray]) -> np.ndarray:
    """``held_act`` (K, N) with the stages whose chunks are uneven replaced by the replayed schedule's
    peak (``pipeline.in_flight_layers``): each config (its group in ``tables``: ``config_groups``) takes
    the maximum over the moments of its group's layers in flight times its bytes of one layer."""
    # Every config takes part (its even stages read zero rows, masked at the end): gathering and
    # scattering the configs with an uneven stage would cost more than it saves.
    present = np.zeros(len(tables.offset), dtype=bool)
    present[config_groups] = True
    groups = np.flatnonzero(present)  # the groups of these configs, renumbered 0..G-1
    lookup = np.empty(len(present), dtype=np.intp)
    lookup[groups] = np.arange(len(groups))
    inverse = lookup[config_groups]
    k = uneven.shape[0]
    # (G, k, Q, C): the rows of each group's kept stages
    table = tables.stacked[tables.offset[groups][:, None] + st.split_rank_table[tables.uniq[groups, 0], :k]]
    used = table.any(axis=(0, 1))  # (Q, C): rows and kinds of layer present somewhere
    qs, us = np.nonzero(used)
    # (R, k, N) for the R used (row, kind) pairs, one gather
    layers_in_flight = np.take(np.ascontiguousarray(table[:, :, qs, us].transpose(2, 1, 0)), inverse, axis=2)
    act_of = dict(zip(unit_chunk_col, layer_act))
    best = None
    for q in np.unique(qs).tolist():
        total = None
        for i in np.flatnonzero(qs == q).tolist():
            term = layers_in_flight[i] * act_of[int(us[i])]
            total = term if total is None else total + term
        best = total if best is None else np.maximum(best, total)
    return np.where(uneven, best, held_act)


def offload_exposed_s(c: layers.Cost, hw: Hardware) -> np.ndarray:
    """Offload time one layer of cost ``c`` exposes per micro-batch (s): its offloaded bytes cross the
    host link once in the forward (device to host) and once in the backward (host to device), each
    copy overlapped with the next layer's compute of that pass (Megatron-Core's offload manager
    starts a module's copy after its forward and prefetches the next layer's reload in backward:
    fine_grained_activation_offloading.md), so only what exceeds that pass of a layer is exposed."""
    copy_s = c.offload_bytes / hw.host_bytes_per_s if hw.host_bytes_per_s > 0 else 0.0 * c.offload_bytes
    return np.maximum(copy_s - c.fwd_s, 0.0) + np.maximum(copy_s - c.bwd_s, 0.0)


def _row(x) -> np.ndarray:
    """A per-config value (N,) as a float64 row (1, N), to broadcast against per-stage (K, N) arrays."""
    return np.asarray(x, dtype=np.float64)[None, :]


@dataclass
class _Unit:
    """One kind of decoder layer (dense, MoE or MTP) on the candidate stages: the cost of one layer, the
    layers of that kind per stage (K, N) and what its share of full recompute changes ((1, N) or (K, N))."""

    cost: layers.Cost
    count: np.ndarray
    chunk_col: int  # its column in the chunk tables (pipeline.CHUNK_ACT_COLUMNS)
    frac: np.ndarray  # fraction of these layers fully recomputed
    passes_overhead_s: np.ndarray  # fixed launch time of the layer's passes (forward, backward, recompute)
    one_plus_frac: np.ndarray
    one_minus_frac: np.ndarray
    frac_layer_input_bytes: np.ndarray  # the kept input of the recomputed fraction
    recomputed: np.ndarray  # frac > 0


@dataclass
class _Stages:
    """What the per-stage effects read: the candidate stages' layers (K, N) and one layer's costs."""

    n_emb: np.ndarray
    n_head: np.ndarray
    emb: layers.Cost
    head: layers.Cost
    units: list[_Unit]
    sel: np.ndarray  # (1, N) 1.0 under selective recompute
    layer_input_bytes: np.ndarray  # (1, N) what a fully recomputed layer keeps (its input)
    shape: tuple[int, int]  # (K, N)


def _dense_costs_finite(dense: layers.Cost) -> bool:
    return _all_finite(
        dense.fwd_s + dense.bwd_s + dense.selective_s + dense.tp_fwd_s + dense.gemm_fwd_s + dense.tp_bwd_s
        + dense.gemm_bwd_s + dense.cp_fwd_s + dense.cp_bwd_s + dense.selective_cp_s + dense.ep_fwd_s
        + dense.ep_bwd_s + dense.selective_ep_s + dense.act_bytes + dense.transient_bytes
        + dense.dense_params + dense.expert_params)


def _stages(spec: ModelSpec, hw: Hardware, b: ConfigBatch, st: pipeline.StageSet, split_index: np.ndarray,
            k: int, costs, shapes: memory.Shapes) -> _Stages:
    """The first ``k`` candidate stages of each config as counts of each kind of layer, with the share of
    the decoder layers that full recompute covers (``recompute_num_layers`` per stage, Megatron's
    ``--recompute-method block``). Per-stage arrays are (K, N): candidate stages along the first axis,
    configs along the second, so that per-config rows (1, N) broadcast along contiguous memory and
    reductions over stages are K row operations."""
    dense, moe, mtp, emb, head = costs
    n_dense, n_moe, n_emb, n_head, n_mtp = _stage_columns(st, split_index, k)
    N = n_dense.shape[1]
    decoder = n_dense + n_moe
    sel = _row(b.recompute == 1)
    full = b.recompute == 2
    rnl = np.where(b.recompute_num_layers == NO_VALUE, 1 << 30, b.recompute_num_layers)
    # The fraction is finite and non-negative, so multiplying by the 0/1 mask equals np.where(full, ., 0).
    full_frac = (np.minimum(decoder, _row(rnl)) / np.maximum(decoder, 1) * _row(full) if full.any()
                 else np.zeros((1, N)))
    layer_input = _row(memory.full_recompute_layer_bytes(spec, shapes))

    def recompute_terms(frac):
        # sel and frac are never both non-zero (selective vs full), so frac + sel is
        # np.where(sel > 0, 1.0, frac): the passes are forward, backward and recompute.
        passes = 2.0 + (frac + sel)
        return frac, passes * hw.layer_overhead_s, 1 + frac, 1 - frac, frac * layer_input, frac > 0

    layer_terms = recompute_terms(full_frac)
    units = [_Unit(dense, n_dense, 0, *layer_terms)]
    # A dense model's MoE unit is its dense layer counted zero times: it adds exact zeros when finite.
    if spec.is_moe or not _dense_costs_finite(dense):
        units.append(_Unit(moe, n_moe if spec.is_moe else 0 * n_moe, 1, *layer_terms))
    units.append(_Unit(mtp, n_mtp, 2, *recompute_terms(np.zeros((1, N)))))
    return _Stages(n_emb=n_emb, n_head=n_head, emb=emb, head=head, units=units, sel=sel,
                   layer_input_bytes=layer_input, shape=n_dense.shape)


def _compute_s(s: _Stages) -> np.ndarray:
    """Compute time of one micro-batch on each stage (K, N), s: every layer's forward and backward
    (backward ≈ 2× forward, Narayanan et al. SC21 §3.2, inside ``layers``), the recompute's extra forward
    (the selective modules', or the whole layer for the fully recomputed share: Korthikanti et al. 2022
    §5) and each pass's fixed launch time (the profile's calibrated ``layer_overhead_s``)."""
    emb, head = s.emb, s.head
    compute = s.n_emb * _row(emb.fwd_s + emb.bwd_s) + s.n_head * _row(head.fwd_s + head.bwd_s)
    for u in s.units:
        c = u.cost
        compute += u.count * (_row(c.fwd_s + c.bwd_s) + s.sel * _row(c.selective_s) + u.frac * _row(c.fwd_s)
                              + u.passes_overhead_s)
    return compute


def _tp_comm_s(s: _Stages, b: ConfigBatch, hw: Hardware) -> np.ndarray:
    """Exposed tensor-parallel communication of one micro-batch on each stage (K, N), s: the all-gathers
    and reduce-scatters of sequence parallelism (Korthikanti et al. 2022 §4.2.2, priced in ``layers``),
    of which up to the profile's ``tp_overlap`` hides behind the layer's GEMMs under ``tp_comm_overlap``;
    a fully recomputed layer repeats its forward's."""
    tp_ov = _row(np.where(b.tp_comm_overlap, hw.tp_overlap, 0.0))
    emb, head = s.emb, s.head
    tp_t = s.n_emb * _row(emb.tp_fwd_s) + s.n_head * (comm.exposed_s(_row(head.tp_fwd_s), _row(head.gemm_fwd_s), tp_ov)
                                                     + comm.exposed_s(_row(head.tp_bwd_s), _row(head.gemm_bwd_s), tp_ov))
    for u in s.units:
        c = u.cost
        tp_fwd = comm.exposed_s(_row(c.tp_fwd_s), _row(c.gemm_fwd_s), tp_ov)
        tp_t += u.count * (tp_fwd * u.one_plus_frac + comm.exposed_s(_row(c.tp_bwd_s), _row(c.gemm_bwd_s), tp_ov))
    return tp_t


def _cp_comm_s(s: _Stages) -> np.ndarray:
    """Context-parallel communication of one micro-batch on each stage (K, N), s: the attention's key/value
    exchange (ring, all-to-all or all-gather: ``layers``, after Liu et al. 2023 and Jacobs et al. 2023),
    repeated by the recomputed forward."""
    cp_t = np.zeros(s.shape)
    for u in s.units:
        c = u.cost
        # Units without CP traffic add exact zeros (frac is finite): skip them.
        if c.cp_fwd_s.any() or c.cp_bwd_s.any() or c.selective_cp_s.any():
            cp_t += u.count * (_row(c.cp_fwd_s + c.cp_bwd_s) + s.sel * _row(c.selective_cp_s) + u.frac * _row(c.cp_fwd_s))
    return cp_t


def _ep_comm_s(s: _Stages, b: ConfigBatch, hw: Hardware) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exposed expert-parallel all-to-all (dispatch and combine) of one micro-batch on each stage (K, N), s,
    and the NIC time of that dispatch in the forward and in the backward passes (K, N), s, which the
    data-parallel traffic overlapped with those passes cannot use (``_dp_exposed_s``).

    Under ``moe_a2a_overlap`` up to the profile's ``ep_overlap`` hides behind the layer's compute
    (DeepSeek-V3 §3.2.2: one micro-batch's all-to-all beside another's compute)."""
    ep_ov = _row(np.where(b.moe_a2a_overlap, hw.ep_overlap, 0.0))
    delay_wgrad = _row(b.delays_wgrad())
    ep_t, nic_fwd, nic_bwd = np.zeros(s.shape), np.zeros(s.shape), np.zeros(s.shape)
    for u in s.units:
        c, n, frac = u.cost, u.count, u.frac
        window = c.fwd_s + c.bwd_s
        # Units without EP traffic add exact zeros (frac is finite): skip them.
        if c.ep_fwd_s.any() or c.ep_bwd_s.any() or c.selective_ep_s.any() or np.isnan(window).any():
            ep_raw = _row(c.ep_fwd_s + c.ep_bwd_s) + s.sel * _row(c.selective_ep_s) + frac * _row(c.ep_fwd_s)
            # Under --delay-wgrad-compute the attention block's weight-gradient GEMMs run after the
            # layer's overlapped region, with no all-to-all in flight: they hide none of it.
            ep_t += n * comm.exposed_s(ep_raw, _row(window) - delay_wgrad * _row(c.delayed_wgrad_s), ep_ov)
            nic_fwd += n * _row(c.ep_nic_s)
            nic_bwd += n * _row(c.ep_nic_s) * (1 + frac + s.sel * _row(c.selective_ep_s > 0))
    return ep_t, nic_fwd, nic_bwd


def _pp_p2p_s(spec: ModelSpec, b: ConfigBatch, shapes: memory.Shapes, dp: np.ndarray, hw: Hardware) -> np.ndarray:
    """Pipeline point-to-point time of one micro-batch (1, N), s: each virtual-stage chunk sends its
    output (2·s·b·h/tp bytes under SP: Korthikanti et al. 2022 §4.2.2) forward and its input gradient
    back, ranks tp·cp·dp apart; each blocking send/recv also costs a handshake beyond the transfer
    (schedule step, stream sync: the profile's calibrated ``pp_chunk_overhead_s``), so fine interleaving
    (one layer per chunk) pays it per layer."""
    stride = b.tp * b.cp * dp
    send_s = comm.p2p_s(memory.BF16 * shapes.tokens_sp * spec.hidden_size, stride, hw)
    return _row(np.where(b.pp > 1, 2 * b.chunks * (send_s + hw.pp_chunk_overhead_s), 0.0))


def _offload(s: _Stages, hw: Hardware) -> tuple[np.ndarray, np.ndarray]:
    """Exposed activation offload and reload time of one micro-batch on each stage (K, N), s
    (``offload_exposed_s``), and the bytes that micro-batch leaves in host memory (K, N)."""
    offload_t, host_act = np.zeros(s.shape), np.zeros(s.shape)
    for u in s.units:
        c, n = u.cost, u.count
        if c.offload_bytes.any():
            offload_t += n * _row(offload_exposed_s(c, hw))
            host_act += n * _row(c.offload_bytes)
    return offload_t, host_act


def _pass_windows_s(s: _Stages) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward compute of one micro-batch on each stage (K, N), s: the windows that
    overlapped data-parallel traffic hides behind, and the backward share of DualPipe's bubble."""
    emb, head = s.emb, s.head
    fwd_window = s.n_emb * _row(emb.fwd_s) + s.n_head * _row(head.fwd_s)
    bwd_window = s.n_emb * _row(emb.bwd_s) + s.n_head * _row(head.bwd_s)
    for u in s.units:
        fwd_window += u.count * _row(u.cost.fwd_s)
        bwd_window += u.count * _row(u.cost.bwd_s)
    return fwd_window, bwd_window


def _bubble_s(b: ConfigBatch, t_stage: np.ndarray, pick, fwd_window: np.ndarray, bwd_window: np.ndarray) -> np.ndarray:
    """Pipeline fill and drain (N,), s: (pp − 1)/vpp micro-batch times of the slowest stage (Narayanan et
    al. SC21 §2.2), or DualPipe's and DualPipeV's bubble (DeepSeek-V3 Table 2, MindSpeed), which reads
    the backward share of the slowest stage's compute (``pick``: that stage's entry of a (K, N) array)."""
    bubble = pipeline.bubble_s(b.pp, b.vpp, t_stage)
    dual = b.schedule > 0
    if dual.any():
        fwd_c, bwd_c = pick(fwd_window), pick(bwd_window)
        backward_share = bwd_c / np.where(fwd_c + bwd_c > 0, fwd_c + bwd_c, 1.0)
        bubble = np.where(dual, pipeline.dualpipe_bubble_s(b.pp, b.schedule, t_stage, backward_share), bubble)
    return bubble


def _stage_params(s: _Stages) -> tuple[np.ndarray, np.ndarray]:
    """Dense and expert parameters held by each stage (K, N): the expert ones are sharded over the
    expert-data-parallel group, the dense ones over dp·cp."""
    dense_params = s.n_emb * _row(s.emb.dense_params) + s.n_head * _row(s.head.dense_params)
    expert_params = np.zeros(s.shape)
    for u in s.units:
        dense_params += u.count * _row(u.cost.dense_params)
        expert_params += u.count * _row(u.cost.expert_params)
    return dense_params, expert_params


def _dp_groups(b: ConfigBatch, dp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sizes of the groups that share dense weights (dp·cp) and expert weights (the expert-data-parallel
    group, tp·cp·dp / (ep·etp)), as integers: the domain arithmetic divides by them."""
    return dp * b.cp, np.maximum(b.tp * b.cp * dp // (b.ep * b.etp), 1)


def _dp_sync_s(spec: ModelSpec, b: ConfigBatch, hw: Hardware, dp_cp: np.ndarray, edp: np.ndarray,
               dense_params: np.ndarray, expert_params: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Gradient synchronisation and parameter all-gather of each stage (K, N), s, before overlap: with the
    distributed optimizer a reduce-scatter of the gradients in their main dtype and an all-gather of the
    bf16 weights, without it an all-reduce (twice a reduce-scatter's time) and no gather (ZeRO, Rajbhandari
    et al. 2020 §5; Megatron-Core's distributed optimizer); a replicated hot expert also all-reduces its
    gradient with its original."""
    sharded_opt = b.sharding >= 1  # the distributed optimizer or a deeper sharding stage
    dense_grp = (b.tp[None, :], _row(dp_cp))
    exp_grp = ((b.etp * b.ep)[None, :], _row(edp))
    grad_bytes = _row(b.main_grads_bytes)  # gradients are reduced in their main dtype
    dense_bus, exp_bus = comm.group_bus_bandwidth(*dense_grp, hw), comm.group_bus_bandwidth(*exp_grp, hw)
    grad_rs = (comm.reduce_scatter_s(grad_bytes * dense_params, *dense_grp, hw, dense_bus)
               + comm.reduce_scatter_s(grad_bytes * expert_params, *exp_grp, hw, exp_bus))
    param_ag = (comm.all_gather_s(memory.WEIGHT_BYTES * dense_params, *dense_grp, hw, dense_bus)
                + comm.all_gather_s(memory.WEIGHT_BYTES * expert_params, *exp_grp, hw, exp_bus))
    # Per-config selections as products with 0/1 and 1/2 rows (exact for finite values; np.where
    # otherwise): all-reduce without the distributed optimizer, no parameter all-gather.
    grad_sync = grad_rs * _row(np.where(sharded_opt, 1.0, 2.0))
    if b.moe_expert_replicas.any():
        grad_sync = grad_sync + _replica_grad_sync_s(spec, b, grad_bytes * expert_params, hw)
    dist = _row(sharded_opt)
    param_sync = param_ag * dist if _all_finite(param_ag) else np.where(dist > 0, param_ag, 0.0)
    return grad_sync, param_sync


def _dp_exposed_s(b: ConfigBatch, hw: Hardware, dp_cp: np.ndarray, edp: np.ndarray, grad_sync: np.ndarray,
                  param_sync: np.ndarray, windows: tuple, ep_nic: tuple) -> np.ndarray:
    """Exposed data-parallel synchronisation of the slowest stage (N,), s: the gradient reduction hides
    behind the last micro-batch's backward and the parameter gather behind the first one's forward,
    up to the profile's ``dp_overlap``, where the overlap is on.

    Overlapped DP traffic shares each device's NIC with the expert dispatch of the passes it hides
    behind: where a DP group crosses nodes, it can only use the part of the window in which the
    dispatch does not hold the NIC (the link's time is the sum of both traffics)."""
    fwd_window, bwd_window = windows
    nic_fwd, nic_bwd = ep_nic
    dp_ov = hw.dp_overlap
    dp_on_nic = _row(comm.spans_domains(b.tp, dp_cp, hw) | comm.spans_domains(b.etp * b.ep, edp, hw))
    bwd_window = np.maximum(bwd_window - dp_on_nic * nic_bwd, 0.0)
    fwd_window = np.maximum(fwd_window - dp_on_nic * nic_fwd, 0.0)

    def overlapped(sync, window, on):
        # exposed_s with no window and no overlap is the communication itself.
        if _all_finite(window):
            return comm.exposed_s(sync, window * _row(on), _row(np.where(on, dp_ov, 0.0)))
        return np.where(_row(on), comm.exposed_s(sync, window, dp_ov), sync)

    grad_exposed = overlapped(grad_sync, bwd_window, b.overlap_grad_reduce)
    param_exposed = overlapped(param_sync, fwd_window, b.overlap_param_gather)
    return (grad_exposed + param_exposed).max(axis=0)


def _optimizer_s(b: ConfigBatch, hw: Hardware, dp_cp: np.ndarray, edp: np.ndarray, dense_params: np.ndarray,
                 expert_params: np.ndarray) -> np.ndarray:
    """The busiest stage's Adam step (N,), s: memory-bound, ``ADAM_BYTES_PER_PARAM`` per local parameter at
    the HBM bandwidth; the distributed optimizer updates only its shard."""
    sharded_opt = b.sharding >= 1
    # x / 1 is x: dividing by the shard only with the distributed optimizer is the np.where of both.
    local_params = (dense_params / _row(np.where(sharded_opt, dp_cp, 1))
                    + expert_params / _row(np.where(sharded_opt, edp, 1)))
    return (ADAM_BYTES_PER_PARAM * local_params / hw.hbm_bytes_per_s).max(axis=0)


def _model_states_bytes(b: ConfigBatch, dp_cp: np.ndarray, edp: np.ndarray, dense_params: np.ndarray,
                        expert_params: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weights, gradients and optimizer states of each stage (K, N), bytes (``memory.model_state_bytes``),
    a parameter EMA kept on the device counted with the optimizer states."""
    params_b, grads_b, opt_b = memory.model_state_bytes(
        dense_params, expert_params, _row(dp_cp), _row(edp), _row(b.sharding), _row(b.main_grads_bytes),
        _row(b.main_params_bytes + b.exp_avg_bytes + b.exp_avg_sq_bytes))
    if (b.parameter_ema == 1).any():
        opt_b = opt_b + memory.ema_bytes(dense_params, expert_params, _row(b.parameter_ema))
    return params_b, grads_b, opt_b


def _in_flight(b: ConfigBatch, st: pipeline.StageSet, split_index: np.ndarray, k: int,
               m: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each candidate stage's pipeline rank (K, N), the micro-batches of activations it holds at its peak
    (K, N; ``pipeline.microbatches_in_flight``, with the extra one of an overlapped all-to-all,
    ``pipeline.a2a_overlap_extra_microbatches``, where the schedule has one left to start), and that
    extra (N,)."""
    rank = np.take(np.ascontiguousarray(st.split_rank_table[:, :k].T), split_index, axis=1)
    # (1, N) rows against (K, N) ranks: the function's [:, None] makes them (1, 1, N).
    in_flight = pipeline.microbatches_in_flight(b.pp[None, :], b.vpp[None, :], m[None, :], rank,
                                                b.schedule[None, :])[0]
    overlap_extra = pipeline.a2a_overlap_extra_microbatches(b.vpp, m, b.moe_a2a_overlap, b.schedule)
    return rank, in_flight + _row(overlap_extra) * (in_flight < _row(m)), overlap_extra


def _layer_activations(s: _Stages) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """Activations of one micro-batch: per unit, the bytes one of its layers stores for the backward
    ((1, N) or (K, N): a fully recomputed layer keeps only its input, Korthikanti et al. 2022 §4.2); the
    stored bytes of each stage (K, N); and its transient buffers (K, N): the largest layer's MoE dispatch
    buffers and, while a checkpointed layer is recomputed, its rebuilt activations."""
    layer_act, act, transient = [], np.zeros(s.shape), np.zeros(s.shape)
    for u in s.units:
        c = u.cost
        layer_act.append(_row(c.act_bytes) * u.one_minus_frac + u.frac_layer_input_bytes)
        act += u.count * layer_act[-1]
        rebuilt = u.recomputed * (_row(c.act_bytes) - s.layer_input_bytes)
        transient = np.maximum(transient, (u.count > 0) * (_row(c.transient_bytes) + rebuilt))
    return layer_act, act, transient


def _held_activations_bytes(s: _Stages, st: pipeline.StageSet, split_index: np.ndarray, b: ConfigBatch,
                            m: np.ndarray, act: np.ndarray, layer_act: list[np.ndarray], held: np.ndarray,
                            overlap_extra: np.ndarray, replay: tuple | None) -> np.ndarray:
    """Stored activations of each stage at its peak (K, N), bytes: one micro-batch's times those in flight.
    Where a rank's model chunks hold different layers, which chunks are in flight at the peak matters:
    the schedule is replayed on the chunks' bytes (tabled per distinct split and m, ``_replayed``;
    ``replay``: the whole batch's tables and these configs' groups in them, if already built)."""
    held_act = act * held
    k = s.shape[0]
    uneven = np.take(np.ascontiguousarray(st.split_uneven_table[:, :k].T), split_index, axis=1)
    uneven &= (b.pp > 1)[None, :]
    if uneven.any():
        if replay is None:
            tables = _replay_tables(st, split_index, m)
            replay = tables, tables.inverse
        held_act = _replayed(st, *replay, uneven, held_act, [u.chunk_col for u in s.units], layer_act)
        held_act += uneven * act * _row(overlap_extra)  # the replay holds no overlapped micro-batch
    return held_act


def _memory(spec: ModelSpec, hw: Hardware, devices: int, b: ConfigBatch, st: pipeline.StageSet,
            split_index: np.ndarray, s: _Stages, costs, m: np.ndarray, dp_cp: np.ndarray, edp: np.ndarray,
            params: tuple, host_act: np.ndarray, replay: tuple | None = None) -> dict:
    """Memory of each stage at its peak (bytes): model states, activations of the micro-batches in flight,
    the output layer's logits (one micro-batch), transient buffers and the framework's share; the peak
    stage's parts; the host memory a node's offloaded activations hold; and what ``BatchResult.stage_peaks``
    needs to rebuild any stage's peak."""
    params_b, grads_b, opt_b = _model_states_bytes(b, dp_cp, edp, *params)
    rank, held, overlap_extra = _in_flight(b, st, split_index, s.shape[0], m)
    layer_act, act, transient = _layer_activations(s)
    held_act = _held_activations_bytes(s, st, split_index, b, m, act, layer_act, held, overlap_extra, replay)
    logits = s.n_head * _row(s.head.act_bytes) * (1 + spec.mtp_num_layers)
    # Host memory holds the offloaded tensors of every micro-batch in flight; a node's devices are
    # counted at its busiest stage (tp, cp and ep groups fill a node before pp does).
    host_per_node = (host_act * held).max(axis=0) * min(hw.devices_per_node, devices)
    fixed = logits + transient
    stage_peak = params_b + grads_b + opt_b + (held_act + fixed) + hw.framework_overhead_bytes
    N = s.shape[1]
    dense, moe, mtp = costs[:3]
    full = b.recompute == 2
    rnl = np.where(b.recompute_num_layers == NO_VALUE, 1 << 30, b.recompute_num_layers)
    at_peak = lambda x, flat=_first_argmax(stage_peak) * N + np.arange(N): _at(x, flat)  # noqa: E731
    return dict(
        peak_bytes=at_peak(stage_peak), peak_rank=at_peak(rank),
        params_bytes=at_peak(params_b), grads_bytes=at_peak(grads_b), optimizer_bytes=at_peak(opt_b),
        # the peak's parts, which add up to it: states, stored activations (the micro-batches in
        # flight and the logits), transient buffers and the framework's overhead (a constant)
        activations_bytes=at_peak(held_act + logits), buffers_bytes=at_peak(transient),
        stage_peak_bytes=stage_peak.T,
        stage_states_bytes=(params_b + grads_b + opt_b).T, stage_act_microbatch_bytes=act.T,
        stage_fixed_bytes=(fixed + hw.framework_overhead_bytes).T,
        host_bytes_per_node=host_per_node, stage_offload_microbatch_bytes=host_act.T,
        layer_act_dense_bytes=dense.act_bytes + 0 * m, layer_act_moe_bytes=moe.act_bytes + 0 * m,
        layer_act_mtp_bytes=mtp.act_bytes + 0 * m, layer_input_bytes=s.layer_input_bytes[0],
        full_recompute_cap=np.where(full, rnl, 0).astype(np.float64), overlap_extra_microbatches=overlap_extra)


def _utilisation(spec: ModelSpec, hw: Hardware, devices: int, b: ConfigBatch, st: pipeline.StageSet,
                 split_index: np.ndarray, costs, step: np.ndarray, m: np.ndarray, dp: np.ndarray,
                 visits: np.ndarray, full_layers) -> dict:
    """Throughput (tokens/s), model FLOP/s per device, MFU (model FLOPs: Narayanan et al. SC21 §5.1) and
    HFU (the recompute's FLOPs added: Korthikanti et al. 2022 §6) of each config."""
    dense, moe = costs[0], costs[1]
    tokens_per_step = b.global_batch_size * spec.seq_length
    tokens_per_s = tokens_per_step / step
    flops_token = model_flops_per_token(spec)
    model_flops_per_device = flops_token * tokens_per_s / devices
    n_moe_layers = sum(spec.moe_layer_pattern())
    layer_flops = (spec.num_layers - n_moe_layers) * dense.flops_fwd + n_moe_layers * moe.flops_fwd
    layer_sel_flops = ((spec.num_layers - n_moe_layers) * dense.selective_flops
                       + n_moe_layers * moe.selective_flops)
    per_device_group = m * b.tp * b.cp * dp  # devices holding a layer × micro-batches
    if full_layers is None:
        full_layers = _recomputed_layers_total(spec, b, split_index, st.split_comps)
    full_layers = full_layers * visits  # DualPipe's two copies of a layer each see half the micro-batches
    recompute_flops = per_device_group * (np.where(b.recompute == 1, layer_sel_flops, 0.0)
                                          + full_layers / spec.num_layers * layer_flops)
    hfu = (flops_token * tokens_per_step + recompute_flops) / (step * devices * hw.peak_bf16_flops)
    return dict(tokens_per_s=tokens_per_s, tokens_per_s_per_device=tokens_per_s / devices,
                model_tflops_per_device=model_flops_per_device / 1e12,
                mfu=model_flops_per_device / hw.peak_bf16_flops, hfu=hfu)


def _sizes(spec: ModelSpec, devices: int, b: ConfigBatch) -> tuple[np.ndarray, np.ndarray, memory.Shapes]:
    """Data-parallel replicas, micro-batches per step and the formulas' shapes of each config."""
    dp, m = _dp_and_microbatches(devices, b)
    return dp, m, _shapes(spec, b, dp)


def _dp_and_microbatches(devices: int, b: ConfigBatch) -> tuple[np.ndarray, np.ndarray]:
    """Data-parallel replicas (devices over tp·pp·cp) and micro-batches per step (global batch over
    micro-batch size · dp, at least one) of each config."""
    dp = np.maximum(devices // (b.tp * b.pp * b.cp), 1)
    return dp, np.maximum(b.global_batch_size / (b.micro_batch_size * dp), 1.0)


def _score(spec: ModelSpec, hw: Hardware, devices: int, b: ConfigBatch, st: pipeline.StageSet,
           split_index: np.ndarray, k: int, costs=None, full_layers=None, replay=None, sizes=None) -> dict:
    """Times, throughput and memory of configs ``b`` (no validity): their splits are ``split_index``
    into the stage sets ``st``, whose first ``k`` candidate stages are scored. ``costs``: the layer
    costs of ``b``, ``full_layers`` its recomputed layers, ``replay`` its replay tables (see
    ``_held_activations_bytes``) and ``sizes`` its (dp, micro-batches, ``_shapes``), if already known."""
    dp, m, shapes = _sizes(spec, devices, b) if sizes is None else sizes
    costs = _layer_costs(spec, *_layer_inputs(spec, hw, b, shapes)) if costs is None else costs
    s = _stages(spec, hw, b, st, split_index, k, costs, shapes)
    # One micro-batch on each candidate stage, by effect (K, N); the slowest stage sets the pace.
    compute, tp, cp = _compute_s(s), _tp_comm_s(s, b, hw), _cp_comm_s(s)
    ep, *ep_nic = _ep_comm_s(s, b, hw)
    p2p = _pp_p2p_s(spec, b, shapes, dp, hw)
    offload, host_act = _offload(s, hw)
    stage_mb = compute + tp + cp + ep + p2p + offload
    pick = lambda x, flat=_first_argmax(stage_mb) * len(m) + np.arange(len(m)): _at(x, flat)  # noqa: E731
    t_stage = pick(stage_mb)
    # DualPipe sends each micro-batch through one of a rank's two stages (half the micro-batches go
    # each way), every other schedule through all of them.
    visits = np.where(b.schedule == DUALPIPE, 0.5, 1.0)
    passes = m * visits
    windows = _pass_windows_s(s)
    bubble = _bubble_s(b, t_stage, pick, *windows)
    params = _stage_params(s)
    dp_cp, edp = _dp_groups(b, dp)
    dp_exposed = _dp_exposed_s(b, hw, dp_cp, edp, *_dp_sync_s(spec, b, hw, dp_cp, edp, *params), windows, ep_nic)
    optimizer = _optimizer_s(b, hw, dp_cp, edp, *params)
    replica_step = passes * t_stage + bubble + dp_exposed + optimizer
    straggler = stragglers.straggler_s(replica_step, dp, hw.straggler_cv)
    step = replica_step + straggler
    time = {"compute_s": passes * pick(compute), "tp_comm_s": passes * pick(tp), "cp_comm_s": passes * pick(cp),
            "ep_comm_s": passes * pick(ep), "pp_bubble_s": bubble, "pp_p2p_s": passes * pick(p2p),
            "dp_comm_exposed_s": dp_exposed, "optimizer_s": optimizer, "offload_s": passes * pick(offload),
            "straggler_s": straggler}
    return dict(step_time_s=step, time=time, microbatches=m,
                **_utilisation(spec, hw, devices, b, st, split_index, costs, step, m, dp, visits, full_layers),
                **_memory(spec, hw, devices, b, st, split_index, s, costs, m, dp_cp, edp, params, host_act,
                           replay))

"""Step time, throughput, MFU/HFU and memory of a batch of configs: the assembly of the effects.

Per micro-batch, each pipeline stage costs its layers' compute plus the communication that is not
hidden; the slowest stage sets the 1F1B steady state and the bubble (Narayanan et al. SC21 §2.2).
The step adds the exposed data-parallel synchronisation and the optimizer step of the busiest stage:

    step = m · t_stage + (pp − 1)/vpp · t_stage + dp_exposed + optimizer

with m = global_batch_size / (micro_batch_size · dp) micro-batches. Every part of the breakdown is
one of these terms, so they add up to the step time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import comm, layers, memory, pipeline, validity
from .batch import NO_VALUE, ConfigBatch
from .flops import model_flops_per_token
from .hardware import GIB, Hardware
from .spec import ClusterProfile, ModelSpec

TIME_KEYS = ("compute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s", "pp_bubble_s", "pp_p2p_s",
             "dp_comm_exposed_s", "optimizer_s")
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
    activations_bytes: np.ndarray
    stage_peak_bytes: np.ndarray  # (N, K)
    stage_rank: np.ndarray  # (N, K)
    capacity_bytes: float
    # Parts of the candidate stages' peaks, so that any stage's peak can be rebuilt (see stage_peaks).
    stage_states_bytes: np.ndarray  # (N, K) weights + gradients + optimizer
    stage_act_microbatch_bytes: np.ndarray  # (N, K) activations of one micro-batch of the stage
    stage_fixed_bytes: np.ndarray  # (N, K) logits, transient buffers, framework overhead
    microbatches: np.ndarray  # (N,)
    pp: np.ndarray
    vpp: np.ndarray

    def stage_peaks(self, i: int) -> np.ndarray:
        """Peak bytes of every pipeline stage of config ``i``, in rank order.

        The batch path keeps one candidate per distinct stage composition; stages sharing a
        composition differ only in the micro-batches they hold in flight."""
        comps = self.stages.split_comps[self.stages.split_index[i]]
        cand = self.stages.comp[i]
        match = (comps[:, None, :] == cand[None, :, :]).all(axis=2).argmax(axis=1)
        ranks = np.arange(len(comps))[None, :]
        held = pipeline.microbatches_in_flight(self.pp[i:i + 1], self.vpp[i:i + 1], self.microbatches[i:i + 1], ranks)[0]
        return (self.stage_states_bytes[i, match] + self.stage_act_microbatch_bytes[i, match] * held
                + self.stage_fixed_bytes[i, match])

    def __len__(self) -> int:
        return len(self.valid)


def _shapes(spec: ModelSpec, b: ConfigBatch, dp: np.ndarray) -> memory.Shapes:
    tokens = (b.micro_batch_size * spec.seq_length / b.cp).astype(np.float64)
    tokens_sp = np.where(b.sequence_parallel, tokens / b.tp, tokens)
    routed = tokens_sp * (spec.moe_router_topk or 0) * b.moe_load_imbalance
    modules = np.where(b.recompute == 1, b.recompute_modules, 0)
    return memory.Shapes(tokens=tokens, tokens_sp=tokens_sp, tokens_moe=tokens_sp, routed=routed,
                         tp=b.tp, cp=b.cp, ep=b.ep, etp=b.etp, modules=modules,
                         gemm_input_bytes=np.where(b.precision == 1, 1.0, memory.BF16))


def _recomputed_layers_total(spec: ModelSpec, b: ConfigBatch, st: pipeline.StageSet,
                             all_comp: list[np.ndarray]) -> np.ndarray:
    """Decoder layers fully recomputed in the whole model: ``recompute_num_layers`` per stage."""
    total = np.zeros(len(b))
    full = b.recompute == 2
    if not full.any():
        return total
    keys = np.stack([st.split_index, b.recompute_num_layers], axis=1)
    uniq, inv = np.unique(keys[full], axis=0, return_inverse=True)
    per_stage_layers = [c[:, pipeline.DENSE] + c[:, pipeline.MOE] for c in all_comp]
    values = np.array([np.minimum(per_stage_layers[s], n if n != NO_VALUE else 1 << 30).sum()
                       for s, n in uniq.tolist()])
    total[full] = values[inv.reshape(-1)]
    return total


def evaluate_batch(spec: ModelSpec, profile: ClusterProfile, devices: int, b: ConfigBatch,
                   all_stages: bool = False) -> BatchResult:
    """Score every config of ``b`` for ``spec`` on ``devices`` devices of ``profile``.

    Invalid configs get finite placeholder numbers, masked by ``valid``; nothing raises for a bad
    config. ``all_stages`` keeps every pipeline stage in the per-stage arrays (for reports)."""
    hw = Hardware.from_profile(profile)
    rules = validity.check(spec, b, devices, profile.has_fp8)
    st = pipeline.stage_sets(spec, b, all_stages=all_stages)
    broken = {r.code: r.broken for r in rules}
    broken["pipeline_split"] = ~st.valid
    valid = ~np.logical_or.reduce(list(broken.values()))

    dp = np.maximum(devices // (b.tp * b.pp * b.cp), 1)
    m = np.maximum(b.global_batch_size / (b.micro_batch_size * dp), 1.0)
    shapes = _shapes(spec, b, dp)
    ctx = layers.Context(spec=spec, hw=hw, shapes=shapes, fp8=b.precision == 1, sp=b.sequence_parallel,
                         imbalance=b.moe_load_imbalance, modules=shapes.modules)
    dense = layers.dense_layer(ctx)
    moe = layers.moe_layer(ctx) if spec.is_moe else dense
    last_layer = moe if spec.moe_layer_pattern()[-1] else dense
    mtp = last_layer + layers.mtp_extra(ctx)
    emb = layers.embedding(ctx)
    holds_head = spec.untie_embeddings_and_output_weights or b.pp > 1
    # The last stage also keeps a copy of the embedding when MTP needs it there (pp > 1).
    head_weights = holds_head + ((b.pp > 1) & (spec.mtp_num_layers > 0))
    head = layers.output_head(ctx, head_weights)

    comp = st.comp
    n_dense, n_moe, n_emb, n_head, n_mtp = (comp[..., i].astype(np.float64) for i in range(5))
    col = lambda x: np.asarray(x, dtype=np.float64)[:, None]  # noqa: E731  (N,) -> (N, 1)
    decoder = n_dense + n_moe
    sel = col(b.recompute == 1)
    full = b.recompute == 2
    rnl = np.where(b.recompute_num_layers == NO_VALUE, 1 << 30, b.recompute_num_layers)
    full_frac = np.where(col(full) > 0, np.minimum(decoder, col(rnl)) / np.maximum(decoder, 1), 0.0)
    tp_ov = col(np.where(b.tp_comm_overlap, hw.tp_overlap, 0.0))
    ep_ov = col(np.where(b.moe_a2a_overlap, hw.ep_overlap, 0.0))

    units = [(dense, n_dense, full_frac), (moe, n_moe if spec.is_moe else 0 * n_moe, full_frac),
             (mtp, n_mtp, 0 * full_frac)]
    compute = n_emb * col(emb.fwd_s + emb.bwd_s) + n_head * col(head.fwd_s + head.bwd_s)
    tp_t = n_emb * col(emb.tp_fwd_s) + n_head * (comm.exposed_s(col(head.tp_fwd_s), col(head.gemm_fwd_s), tp_ov)
                                                 + comm.exposed_s(col(head.tp_bwd_s), col(head.gemm_bwd_s), tp_ov))
    cp_t = np.zeros_like(compute)
    ep_t = np.zeros_like(compute)
    fwd_window = n_emb * col(emb.fwd_s) + n_head * col(head.fwd_s)
    bwd_window = n_emb * col(emb.bwd_s) + n_head * col(head.bwd_s)
    act = np.zeros_like(compute)
    dense_params = n_emb * col(emb.dense_params) + n_head * col(head.dense_params)
    expert_params = np.zeros_like(compute)
    transient = np.zeros_like(compute)
    for c, n, frac in units:
        passes = 2.0 + np.where(sel > 0, 1.0, frac)  # forward, backward, recompute
        compute += n * (col(c.fwd_s + c.bwd_s) + sel * col(c.selective_s) + frac * col(c.fwd_s)
                        + passes * hw.layer_overhead_s)
        tp_fwd = comm.exposed_s(col(c.tp_fwd_s), col(c.gemm_fwd_s), tp_ov)
        tp_t += n * (tp_fwd * (1 + frac) + comm.exposed_s(col(c.tp_bwd_s), col(c.gemm_bwd_s), tp_ov))
        cp_t += n * (col(c.cp_fwd_s + c.cp_bwd_s) + sel * col(c.selective_cp_s) + frac * col(c.cp_fwd_s))
        ep_raw = col(c.ep_fwd_s + c.ep_bwd_s) + sel * col(c.selective_ep_s) + frac * col(c.ep_fwd_s)
        ep_t += n * comm.exposed_s(ep_raw, col(c.fwd_s + c.bwd_s), ep_ov)
        fwd_window += n * col(c.fwd_s)
        bwd_window += n * col(c.bwd_s)
        layer_input = col(memory.full_recompute_layer_bytes(spec, shapes))
        act += n * (col(c.act_bytes) * (1 - frac) + frac * layer_input)
        # while a checkpointed layer is recomputed, its activations beyond the kept input are alive
        rebuilt = (frac > 0) * (col(c.act_bytes) - layer_input)
        transient = np.maximum(transient, (n > 0) * (col(c.transient_bytes) + rebuilt))
        dense_params += n * col(c.dense_params)
        expert_params += n * col(c.expert_params)

    dp_cp = dp * b.cp
    p2p_stride = b.tp * b.cp * dp
    p2p = col(np.where(b.pp > 1, 2 * b.vpp * comm.p2p_s(memory.BF16 * shapes.tokens_sp * spec.hidden_size,
                                                          p2p_stride, hw), 0.0))
    stage_mb = compute + tp_t + cp_t + ep_t + p2p
    crit = np.argmax(stage_mb, axis=1)
    pick = lambda x: np.take_along_axis(np.broadcast_to(x, stage_mb.shape), crit[:, None], axis=1)[:, 0]  # noqa: E731
    t_stage = pick(stage_mb)
    bubble = pipeline.bubble_s(b.pp, b.vpp, t_stage)

    # Data-parallel gradient and parameter synchronisation of each stage (dense weights over dp·cp,
    # expert weights over the expert-data-parallel group), hidden behind the last micro-batch's
    # backward and the first one's forward where overlap is on.
    edp = np.maximum(b.tp * b.cp * dp // (b.ep * b.etp), 1)
    dist = col(b.distributed_optimizer)
    dense_grp = (col(b.tp), col(dp_cp))
    exp_grp = (col(b.etp * b.ep), col(edp))
    grad_rs = (comm.reduce_scatter_s(memory.GRAD_BYTES * dense_params, *dense_grp, hw)
               + comm.reduce_scatter_s(memory.GRAD_BYTES * expert_params, *exp_grp, hw))
    param_ag = (comm.all_gather_s(memory.WEIGHT_BYTES * dense_params, *dense_grp, hw)
                + comm.all_gather_s(memory.WEIGHT_BYTES * expert_params, *exp_grp, hw))
    grad_sync = np.where(dist > 0, grad_rs, 2.0 * grad_rs)  # all-reduce without the distributed optimizer
    param_sync = np.where(dist > 0, param_ag, 0.0)
    dp_ov = hw.dp_overlap
    grad_exposed = np.where(col(b.overlap_grad_reduce), comm.exposed_s(grad_sync, bwd_window, dp_ov), grad_sync)
    param_exposed = np.where(col(b.overlap_param_gather), comm.exposed_s(param_sync, fwd_window, dp_ov), param_sync)
    dp_exposed = (grad_exposed + param_exposed).max(axis=1)
    local_params = np.where(dist > 0, dense_params / col(dp_cp) + expert_params / col(edp), dense_params + expert_params)
    optimizer = (ADAM_BYTES_PER_PARAM * local_params / hw.hbm_bytes_per_s).max(axis=1)

    step = m * t_stage + bubble + dp_exposed + optimizer
    time = {"compute_s": m * pick(compute), "tp_comm_s": m * pick(tp_t), "cp_comm_s": m * pick(cp_t),
            "ep_comm_s": m * pick(ep_t), "pp_bubble_s": bubble, "pp_p2p_s": m * pick(p2p),
            "dp_comm_exposed_s": dp_exposed, "optimizer_s": optimizer}

    # Memory of each stage at its peak: model states, activations of the micro-batches in flight,
    # the output layer's logits (one micro-batch), transient buffers and the framework's share.
    params_b, grads_b, opt_b = memory.model_state_bytes(dense_params, expert_params, col(dp_cp), col(edp), dist)
    in_flight = pipeline.microbatches_in_flight(b.pp, b.vpp, m, st.rank)
    fixed = n_head * col(head.act_bytes) * (1 + spec.mtp_num_layers) + transient
    activations = act * in_flight + fixed
    stage_peak = params_b + grads_b + opt_b + activations + hw.framework_overhead_bytes
    peak_idx = np.argmax(stage_peak, axis=1)
    at_peak = lambda x: np.take_along_axis(x, peak_idx[:, None], axis=1)[:, 0]  # noqa: E731
    peak = at_peak(stage_peak)

    tokens_per_step = b.global_batch_size * spec.seq_length
    tokens_per_s = tokens_per_step / step
    flops_token = model_flops_per_token(spec)
    model_flops_per_device = flops_token * tokens_per_s / devices
    n_moe_layers = sum(spec.moe_layer_pattern())
    layer_flops = (spec.num_layers - n_moe_layers) * dense.flops_fwd + n_moe_layers * moe.flops_fwd
    layer_sel_flops = ((spec.num_layers - n_moe_layers) * dense.selective_flops
                       + n_moe_layers * moe.selective_flops)
    per_device_group = m * b.tp * b.cp * dp  # devices holding a layer × micro-batches
    full_layers = _recomputed_layers_total(spec, b, st, st.split_comps)
    recompute_flops = per_device_group * (np.where(b.recompute == 1, layer_sel_flops, 0.0)
                                          + full_layers / spec.num_layers * layer_flops)
    hfu = (flops_token * tokens_per_step + recompute_flops) / (step * devices * hw.peak_bf16_flops)

    feasible = valid & (peak <= hw.memory_bytes)
    return BatchResult(
        valid=valid, feasible=feasible, broken=broken, rules=rules, stages=st, step_time_s=step,
        tokens_per_s=tokens_per_s, tokens_per_s_per_device=tokens_per_s / devices,
        model_tflops_per_device=model_flops_per_device / 1e12,
        mfu=model_flops_per_device / hw.peak_bf16_flops, hfu=hfu, time=time,
        peak_bytes=peak, peak_rank=np.take_along_axis(st.rank, peak_idx[:, None], axis=1)[:, 0],
        params_bytes=at_peak(params_b), grads_bytes=at_peak(grads_b), optimizer_bytes=at_peak(opt_b),
        activations_bytes=at_peak(activations), stage_peak_bytes=stage_peak, stage_rank=st.rank,
        capacity_bytes=hw.memory_bytes, stage_states_bytes=params_b + grads_b + opt_b,
        stage_act_microbatch_bytes=act, stage_fixed_bytes=fixed + hw.framework_overhead_bytes,
        microbatches=m, pp=b.pp, vpp=b.vpp)

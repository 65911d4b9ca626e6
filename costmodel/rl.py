"""One RL post-training step (GRPO / PPO): rollout, log-prob passes, training, and the hand-over between
them, co-located (RL Fusion, verl's hybrid engine) or on two pools (OpenRLHF's split, asynchronous RL).

The step of ``prompts_per_step · responses_per_prompt`` samples:

1. **rollout**: ``dp`` engine instances of ``tp`` devices (``inference.py``) each generate their share of
   the samples: prefill of the prompts, then ``response_length`` decode steps at the batch the memory
   holds after the weights (and, co-located, the trainer's states kept on the device), in waves where
   the share does not fit at once;
2. **log-prob passes**: forward-only passes of the training model over the samples (prompt + response):
   the actor's (old log-probs), the reference model's when on, the critic's values for PPO; each priced
   as the forward part of the training config's step (``forward_pass_s``);
3. **training** on the samples: the existing training cost model (``evaluate``) with
   ``global_batch_size`` = samples and ``seq_length`` = prompt + response; PPO trains a critic of the
   same architecture and layout too;
4. **hand-over**: co-located, the switch (the refit: every full weight tensor gathered on every device,
   as NeMo-RL's ``export_hf_weights`` and verl's ``per_tensor_generator`` do, plus per-tensor host work;
   vLLM's level-1 sleep copying the engine's weights to the host and back; the trainer's states offloaded
   to the host and back when the plan offloads them; the reference weights loaded from the host);
   disaggregated, the full weights gathered and broadcast from the training pool to every rollout rank. With ``stale_sync`` (one step of staleness, Huawei's StaleSync, NeMo-RL's async GRPO) the two
   pools overlap: step = max(rollout, training side) + sync; else the sum.

Arrays run over rollout configs (tp, ep, offload), one training evaluation at a time; times seconds,
memory bytes (GiB in the result dicts).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import comm, inference
from .hardware import GIB, Hardware
from .spec import ModelSpec

# vLLM's default --gpu-memory-utilization (vllm/engine/arg_utils.py, EngineArgs.gpu_memory_utilization = 0.9).
MEMORY_FRACTION = 0.9
# Host-side cost of one weight tensor in a refit (exported from the trainer, packed, sent, unpacked and
# handed to the engine's ``load_weights``): NeMo-RL measured DeepSeek-V3 (training TP1/PP16/EP16 -> vLLM
# TP32) with every vLLM rank loading 45,395 tensors, 69.95 GiB, in 9.25 s over NIXL GPU RDMA
# (docs/guides/checkpoint-engine-refit.md, "DeepSeek-V3 Benchmark"); the rollout node's eight NICs move
# its 8 x 69.95 GiB in 1.6 s, leaving 7.7 s, 0.17 ms per tensor. (Its refit blog, 2025-08-12, found the
# same order per tensor: 0.18 ms to rebuild each CUDA IPC handle before packing.)
REFIT_S_PER_TENSOR = 0.17e-3
# Decode steps are priced at the midpoints of this many equal segments of the response (the step time
# is piecewise linear in the context: memory- or compute-bound, each linear in the KV read).
DECODE_SEGMENTS = 8


@dataclass(frozen=True)
class Workload:
    """One RL step's work. ``algorithm`` names the preset that set the defaults of ``reference`` and
    ``critic`` (grpo: reference on, no critic; ppo: both)."""
    prompts_per_step: int
    responses_per_prompt: int
    prompt_length: int
    response_length: int
    algorithm: str = "grpo"
    reference: bool = True
    critic: bool = False
    stale_sync: bool = False
    max_response_length: int | None = None  # the longest response (None: every response is response_length)

    @property
    def longest(self) -> int:
        return self.max_response_length or self.response_length

    @property
    def samples(self) -> int:
        return self.prompts_per_step * self.responses_per_prompt

    @property
    def seq_length(self) -> int:
        return self.prompt_length + self.response_length

    @property
    def models_trained(self) -> int:
        """Models whose states the trainer holds: the actor, and the critic for PPO."""
        return 2 if self.critic else 1

    @property
    def forward_passes(self) -> int:
        """Log-prob passes per step: the actor's old log-probs, the reference's, the critic's values."""
        return 1 + int(self.reference) + int(self.critic)


ALGORITHMS = {"grpo": {"reference": True, "critic": False}, "ppo": {"reference": True, "critic": True}}


# ---------------------------------------------------------------- rollout


def decode_s(spec: ModelSpec, hw: Hardware, tp, ep, batch, prompt_len: int, response_len: int) -> np.ndarray:
    """Seconds for one instance to decode ``response_len`` tokens for ``batch`` sequences after a
    ``prompt_len`` prompt: the sum of the decode steps, each priced at its segment's midpoint context."""
    seg = response_len / DECODE_SEGMENTS
    total = 0.0
    for k in range(DECODE_SEGMENTS):
        context = prompt_len + (k + 0.5) * seg
        total = total + seg * inference.decode_step_s(spec, hw, tp, batch, context, ep)
    return total


def rollout_batch(spec: ModelSpec, hw: Hardware, tp, wl: Workload, reserved_bytes=0.0) -> np.ndarray:
    """Sequences one instance keeps in flight: the KV cache of full-length samples (prompt + response)
    in the memory left after the weights, the overhead and ``reserved_bytes`` per device."""
    return inference.max_decode_batch(spec, hw, tp, wl.prompt_length + wl.longest, MEMORY_FRACTION, reserved_bytes)


def generation(spec: ModelSpec, hw: Hardware, tp, ep, instances, wl: Workload, reserved_bytes=0.0) -> dict:
    """The rollout phase on ``instances`` engine instances of ``tp`` devices: each takes
    ceil(samples / instances) samples, in ``waves`` of at most the batch its memory holds.
    Returns arrays: ``prefill_s``, ``decode_s``, ``max_batch``, ``batch``, ``waves``, ``kv_bytes`` (per
    device, at the wave's full length)."""
    share = np.ceil(wl.samples / np.maximum(instances, 1))
    cap = rollout_batch(spec, hw, tp, wl, reserved_bytes)
    batch = np.minimum(share, cap)
    safe = np.maximum(batch, 1.0)
    waves = np.ceil(share / safe)
    # the last wave carries the remainder; price every wave at the full batch (an upper bound within
    # one wave's difference) so that waves × per-wave time stays simple
    prefill = waves * inference.prefill_s(spec, hw, tp, safe, wl.prompt_length, ep)
    if wl.stale_sync:
        # asynchronous rollout keeps its engines full with the next step's prompts: continuous batching
        # over responses of the mean length
        decode = waves * decode_s(spec, hw, tp, ep, safe, wl.prompt_length, wl.response_length)
    else:
        # synchronous: a wave lasts as many steps as its longest response, its batch thinning as the
        # shorter ones finish (mean live batch = batch · mean / longest)
        live = safe * wl.response_length / wl.longest
        decode = waves * decode_s(spec, hw, tp, ep, live, wl.prompt_length, wl.longest)
    kv = batch * (wl.prompt_length + wl.longest) * inference.kv_bytes_per_token(spec, tp)
    return {"prefill_s": prefill, "decode_s": decode, "max_batch": cap, "batch": batch, "waves": waves,
            "kv_bytes": kv}


# ---------------------------------------------------------------- training side


def forward_pass_s(evaluation: dict) -> float:
    """Seconds of one forward-only pass over the step's samples with the training config of
    ``evaluation`` (a training evaluation result): the step without its optimizer and gradient sync,
    times the forward's share of the work, mfu / (3 · hfu) (forward = 2 of the 6 FLOPs per parameter
    and token, Narayanan et al. 2021; hfu / mfu adds the recomputed forward)."""
    t = evaluation["time"]
    work = evaluation["step_time_s"] - t["optimizer_s"] - t["dp_comm_exposed_s"]
    return work * evaluation["mfu"] / (3.0 * evaluation["hfu"])


def _states_bytes(evaluation: dict) -> float:
    """Weights, gradients and optimizer states one training device holds (its peak stage), bytes."""
    m = evaluation["memory"]
    return (m["params_gib"] + m["grads_gib"] + m["optimizer_gib"]) * GIB


def train_side(evaluation: dict, wl: Workload) -> dict:
    """Seconds of the training pool's work per step: log-prob passes and the optimizer steps."""
    fwd = forward_pass_s(evaluation)
    step = evaluation["step_time_s"]
    return {"actor_logprob_s": fwd, "reference_logprob_s": fwd if wl.reference else 0.0,
            "critic_value_s": fwd if wl.critic else 0.0, "actor_train_s": step,
            "critic_train_s": step if wl.critic else 0.0}


def logprob_peak_bytes(evaluation: dict, wl: Workload, states_kept: bool) -> float:
    """Peak bytes per device of the log-prob phase: the actor's (and the reference's) weights, the
    training step's stored activations and buffers as a bound on a forward's, the overhead, and the
    gradients and optimizer states unless offloaded."""
    m = evaluation["memory"]
    weights = m["params_gib"] * (1 + int(wl.reference))
    states = (m["grads_gib"] + m["optimizer_gib"]) * wl.models_trained if states_kept else 0.0
    critic_weights = m["params_gib"] if wl.critic and not states_kept else 0.0
    return (weights + critic_weights + states + m["activations_gib"] + m["buffers_gib"] + m["overhead_gib"]) * GIB


def train_peak_bytes(evaluation: dict, wl: Workload, states_kept: bool) -> float:
    """Peak bytes per device while training: the training step's peak, plus the other model's states
    (PPO: actor and critic alternate) where they stay on the device."""
    other = _states_bytes(evaluation) if wl.critic and states_kept else 0.0
    return evaluation["memory"]["peak_gib"] * GIB + other


# ---------------------------------------------------------------- hand-over


def reshard_s(spec: ModelSpec, hw: Hardware, tp, devices: int) -> np.ndarray:
    """Co-located switch, training layout -> rollout layout. The refit materialises every full
    (unsharded) bf16 tensor on every device and the rollout engine keeps its shard of it: NeMo-RL's
    Megatron worker exports HF tensors with ``export_hf_weights``, which "does PP/TP/EP gathers to
    materialize full unsharded tensors" on each rank, and streams them to the co-located vLLM worker
    over CUDA IPC (nemo_rl/models/policy/workers/megatron_policy_worker.py; NeMo-RL's refit blog,
    2025-08-12: "After this step each policy worker gets full model parameters"); verl's
    ``per_tensor_generator`` all-gathers each tensor whole the same way. So each device receives the
    whole model, not its 1/tp rollout shard: an all-gather of the full weights over the job's devices
    (``comm.all_gather_s``, the job's bus bandwidth: scale-up inside one domain, the domain's NICs
    together across domains; the speed of light NeMo-RL's blog quotes for DeepSeek-V3, 3.3 s)."""
    full = inference.full_weight_bytes(spec) + 0.0 * np.asarray(tp)
    return comm.all_gather_s(full, 1, np.asarray(devices), hw) + refit_tensors_s(spec)


def refit_tensors_s(spec: ModelSpec) -> float:
    """The refit's per-tensor host work: ``REFIT_S_PER_TENSOR`` for each of the model's Hugging Face
    weight tensors (``inference.hf_tensor_count``), which NeMo-RL's bridge exports and vLLM's
    ``load_weights`` takes one at a time; it dominates a fine-grained MoE's refit (256 experts x 3
    projections x 58 layers for DeepSeek-V3: 7.7 s of its 9.25 s sharded refit)."""
    return REFIT_S_PER_TENSOR * inference.hf_tensor_count(spec)


def broadcast_s(nbytes, size, hw: Hardware) -> np.ndarray:
    """A pipelined ring broadcast of ``nbytes`` from one rank to a ``size``-rank group: every rank
    receives the whole buffer once at the group's bus bandwidth, plus one step's latency per hop."""
    bw, lat = comm.group_bus_bandwidth(1, np.asarray(size), hw)
    return np.where(np.asarray(size) > 1, nbytes / bw + (np.asarray(size) - 1) * lat, 0.0)


def offload_s(hw: Hardware, nbytes: float) -> float:
    """Seconds to move ``nbytes`` per device to the host and back (before rollout, before training)
    over the device-host link; inf where the profile states no host link."""
    if hw.host_bytes_per_s <= 0:
        return float("inf")
    return 2.0 * nbytes / hw.host_bytes_per_s


def rollout_sleep_s(spec: ModelSpec, hw: Hardware, tp) -> np.ndarray:
    """Co-located: the rollout engine sleeps while the trainer runs and wakes for the next rollout.
    vLLM's level-1 sleep, the one NeMo-RL (nemo_rl/models/generation/vllm/vllm_worker.py,
    ``llm.sleep(level=1)``) and verl's hybrid engine call, "will offload the model weights and discard
    the kv cache ... The model weights are backed up in CPU memory" (vLLM ``LLM.sleep``), and
    ``wake_up(tags=["weights"])`` copies them back before the refit overwrites them: the engine's
    shard out to the host and back each step."""
    return offload_s(hw, inference.weight_bytes_per_device(spec, tp))


def reference_load_s(hw: Hardware, evaluation: dict, wl: Workload) -> float:
    """Seconds to bring the reference model's weights (the training layout's params) from the host for
    its pass (verl's ``ref.param_offload``): the reference is never trained, so it lives on the host."""
    if not wl.reference:
        return 0.0
    if hw.host_bytes_per_s <= 0:
        return float("inf")
    return evaluation["memory"]["params_gib"] * GIB / hw.host_bytes_per_s


def weight_sync_s(spec: ModelSpec, hw: Hardware, tp, rollout_devices: int, train_devices: int) -> np.ndarray:
    """Disaggregated: the new bf16 weights sent from the training pool to every rollout device. As in
    the co-located refit, the training ranks first materialise every full tensor (the all-gather of
    ``reshard_s`` over the training pool), then one rank broadcasts every full tensor to all rollout
    ranks, which keep their shard: NeMo-RL's default non-colocated transport "broadcasts every full
    parameter tensor from the training ranks to every generation rank" (docs/design-docs/
    nccl-reshard-refit.md; ``packed_broadcast_producer`` over one NCCL group spanning both pools).
    The two run in turn, bucket by bucket, and each tensor pays the per-tensor host work
    (``refit_tensors_s``). Measured for DeepSeek-V3 with training TP1/PP16/EP16 and vLLM TP32: 14.21 s
    (NeMo-RL docs/guides/checkpoint-engine-refit.md, NCCL column, not used to set the per-tensor cost);
    this prices about 7.1 s of transfers + 7.7 s of tensors: 14.9 s (docs/guides/rl.md; the parts are rounded)."""
    full = inference.full_weight_bytes(spec) + 0.0 * np.asarray(tp)
    gather = comm.all_gather_s(full, 1, np.asarray(train_devices), hw)
    return gather + broadcast_s(full, rollout_devices + train_devices, hw) + refit_tensors_s(spec)


# ---------------------------------------------------------------- the step


def colocated_step(spec: ModelSpec, hw: Hardware, devices: int, evaluation: dict, wl: Workload,
                   tp, ep, offload) -> dict:
    """The co-located step on all ``devices`` for rollout configs (``tp``, ``ep``, ``offload``: the
    trainer's states moved to the host during rollout) and one training evaluation. Phases run in
    turn, so the step is their sum; each phase's peak memory must fit."""
    tp, ep, offload = np.broadcast_arrays(np.asarray(tp), np.asarray(ep), np.asarray(offload, dtype=bool))
    states = _states_bytes(evaluation) * wl.models_trained
    kept = np.where(offload, 0.0, states)
    gen = generation(spec, hw, tp, ep, devices // tp, wl, kept)
    side = train_side(evaluation, wl)
    switch = (reshard_s(spec, hw, tp, devices) + rollout_sleep_s(spec, hw, tp)
              + np.where(offload, offload_s(hw, states), 0.0) + reference_load_s(hw, evaluation, wl))
    phases = {"prefill_s": gen["prefill_s"], "decode_s": gen["decode_s"], "switch_s": switch,
              **{k: np.full(tp.shape, v) for k, v in side.items()}}
    rollout_peak = (inference.weight_bytes_per_device(spec, tp) + gen["kv_bytes"] + kept
                    + hw.framework_overhead_bytes)
    memory = {"rollout": rollout_peak,
              "logprob": np.where(offload, logprob_peak_bytes(evaluation, wl, False),
                                  logprob_peak_bytes(evaluation, wl, True)),
              "train": np.where(offload, train_peak_bytes(evaluation, wl, False),
                                train_peak_bytes(evaluation, wl, True))}
    step = sum(phases.values())
    return _finish(phases, dict(phases), step, memory, gen, hw, evaluation, wl, devices)


def disaggregated_step(spec: ModelSpec, hw: Hardware, rollout_devices: int, train_devices: int,
                       evaluation: dict, wl: Workload, tp, ep) -> dict:
    """The step with ``rollout_devices`` generating and ``train_devices`` scoring and training
    (``evaluation`` is the training config's on ``train_devices``). With ``wl.stale_sync`` the pools
    overlap (the longer side is the critical path; the other side's parts are reported as hidden),
    else they run in turn; the weight sync is exposed either way."""
    tp, ep = np.broadcast_arrays(np.asarray(tp), np.asarray(ep))
    gen = generation(spec, hw, tp, ep, rollout_devices // tp, wl)
    side = train_side(evaluation, wl)
    sync = weight_sync_s(spec, hw, tp, rollout_devices, train_devices)
    roll = {"prefill_s": gen["prefill_s"], "decode_s": gen["decode_s"]}
    train = {k: np.full(tp.shape, v) for k, v in side.items()}
    phases = {**roll, "weight_sync_s": sync, **train}
    roll_s, train_s = sum(roll.values()), sum(train.values())
    if wl.stale_sync:
        # exposed: the longer pool's parts in full, the shorter pool's not at all
        rollout_longer = roll_s >= train_s
        time = {k: np.where(rollout_longer, v, 0.0) for k, v in roll.items()}
        time.update({k: np.where(rollout_longer, 0.0, v) for k, v in train.items()})
        time["weight_sync_s"] = sync
        step = np.maximum(roll_s, train_s) + sync
    else:
        time = dict(phases)
        step = roll_s + train_s + sync
    memory = {"rollout": inference.weight_bytes_per_device(spec, tp) + gen["kv_bytes"] + hw.framework_overhead_bytes,
              "logprob": np.full(tp.shape, logprob_peak_bytes(evaluation, wl, True)),
              "train": np.full(tp.shape, train_peak_bytes(evaluation, wl, True))}
    return _finish(phases, time, step, memory, gen, hw, evaluation, wl, rollout_devices + train_devices)


def _finish(phases: dict, time: dict, step, memory: dict, gen: dict, hw: Hardware, evaluation: dict,
            wl: Workload, devices: int) -> dict:
    """Throughputs and feasibility of a scored set of plans."""
    fits = np.all([m <= hw.memory_bytes for m in memory.values()], axis=0)
    feasible = fits & (gen["max_batch"] >= 1) & bool(evaluation["feasible"]) & np.isfinite(step)
    return {"step_time_s": step, "phases": phases, "time": time, "memory": memory, "generation": gen,
            "feasible": feasible, "samples_per_s": wl.samples / step,
            "generated_tokens_per_s": wl.samples * wl.response_length / step,
            "trained_tokens_per_s": wl.samples * wl.seq_length / step, "devices": devices}


def plan_dict(scored: dict, i: int, hw: Hardware, *, mode: str, tp, ep, offload, rollout_devices: int,
              train_devices: int, training: dict) -> dict:
    """The JSON-ready plan ``i`` of a scored set: mode, split, rollout and training configs, throughputs,
    the phases (``time`` adds up to ``step_time_s``; ``phases_s`` has every phase's full length) and the
    peak memory of each phase."""
    g = scored["generation"]
    step = float(scored["step_time_s"][i])
    devices = scored["devices"]
    reasons = []
    for phase, m in scored["memory"].items():
        if m[i] > hw.memory_bytes:
            reasons.append({"code": "oom", "message": f"{phase} phase needs {m[i] / GIB:.1f} GiB of "
                                                      f"{hw.memory_bytes / GIB:.1f}"})
    if g["max_batch"][i] < 1:
        reasons.append({"code": "rollout_oom", "message": "the rollout weights leave no room for one sequence's KV cache"})
    if not training["evaluation"]["feasible"]:
        reasons += training["evaluation"]["infeasible_reasons"]
    return {
        "mode": mode, "feasible": bool(scored["feasible"][i]), "infeasible_reasons": reasons,
        "devices": devices, "rollout_devices": rollout_devices, "train_devices": train_devices,
        "rollout": {"tp": int(tp[i]), "ep": int(ep[i]), "dp": int(rollout_devices // tp[i]),
                    "max_batch": int(g["max_batch"][i]), "batch": int(g["batch"][i]), "waves": int(g["waves"][i]),
                    "memory_fraction": MEMORY_FRACTION, "offload_training_state": bool(offload[i])},
        "training": training,
        "step_time_s": step,
        "samples_per_s": float(scored["samples_per_s"][i]),
        "generated_tokens_per_s": float(scored["generated_tokens_per_s"][i]),
        "trained_tokens_per_s": float(scored["trained_tokens_per_s"][i]),
        "trained_tokens_per_s_per_device": float(scored["trained_tokens_per_s"][i]) / devices,
        "time": {k: float(v[i]) for k, v in scored["time"].items()},
        "phases_s": {k: float(v[i]) for k, v in scored["phases"].items()},
        "memory": {"capacity_gib": hw.memory_bytes / GIB,
                   **{f"{k}_peak_gib": float(v[i]) / GIB for k, v in scored["memory"].items()},
                   "rollout_kv_cache_gib": float(g["kv_bytes"][i]) / GIB},
    }

"""The memory margin: room a recommendation leaves for what the cost model does not count.

The cost model's peak covers weights, gradients, optimizer states, activations, MoE dispatch buffers,
logits and the profile's framework overhead. It does not see allocator fragmentation (the caching
allocator holds memory it cannot hand out, in blocks split by earlier requests) or communication
buffers beyond that overhead. A config whose headroom (capacity − peak) is below the margin still fits
in the model, so it is still ranked, but after every config that keeps the margin, and flagged.

Why 4 GiB by default (docs/search.md repeats this):

* GMLake (Guo et al., ASPLOS 2024, arXiv:2401.08156) measures the PyTorch caching allocator's
  fragmentation on eight LLMs trained with recomputation, ZeRO and offloading on A100-80GB: 9.2 GB on
  average, up to 25 GB, without virtual-memory (expandable) segments.
* Megatron and MindSpeed jobs usually run with expandable segments
  (``PYTORCH_CUDA_ALLOC_CONF`` / ``PYTORCH_NPU_ALLOC_CONF=expandable_segments:True``, Ascend's
  documented remedy for fragmentation), which removes most of it. What remains in OOM reports on
  80 GB devices is 1–2 GiB "reserved by PyTorch but unallocated" (e.g. vllm-project/compressed-tensors
  PR #587: 1.83 GiB with 78 GiB in use).
* 4 GiB is twice that residue, leaving the rest for NCCL/HCCL buffers of the several communicators a
  3-D/MoE layout opens (tp, cp, ep, dp, pp groups). It is 5–6 % of a 64–80 GiB device: small enough
  not to push the search to memory-lean, slower layouts; pass 0 to rank by throughput alone.
"""

from __future__ import annotations

import math

DEFAULT_MEMORY_MARGIN_GIB = 4.0  # GiB; reason and sources in the module docstring
MAX_MEMORY_MARGIN_GIB = 1024.0  # GiB; no accelerator has this much memory: anything above is a typo


def margin_problem(margin_gib: float, capacity_gib: float | None = None) -> str | None:
    """Why ``margin_gib`` is not a usable margin (None when it is): negative, not a finite number, above
    ``MAX_MEMORY_MARGIN_GIB``, or (given the device memory ``capacity_gib``) not below the capacity, which
    would leave no config able to keep it."""
    if not isinstance(margin_gib, (int, float)) or isinstance(margin_gib, bool) or not math.isfinite(margin_gib):
        return "must be a finite number of GiB"
    if margin_gib < 0:
        return "must be at least 0 GiB"
    if margin_gib > MAX_MEMORY_MARGIN_GIB:
        return f"must be at most {MAX_MEMORY_MARGIN_GIB:g} GiB"
    if capacity_gib is not None and margin_gib >= capacity_gib:
        return f"must be below the device memory ({capacity_gib:g} GiB): no config could keep it"
    return None


def headroom_gib(evaluation: dict) -> float | None:
    """Capacity − peak of one evaluation result (GiB; negative when it does not fit), None when unknown.
    Older results without ``memory.headroom_gib`` get it from the capacity and the peak."""
    mem = evaluation.get("memory") or {}
    if mem.get("headroom_gib") is not None:
        return float(mem["headroom_gib"])
    if mem.get("capacity_gib") is None or mem.get("peak_gib") is None:
        return None
    return float(mem["capacity_gib"]) - float(mem["peak_gib"])


def margin_fields(evaluation: dict, margin_gib: float | None) -> dict:
    """What a ranked entry says about the margin: ``keeps_margin`` (headroom ≥ margin), and for a config
    that does not keep it a ``margin_warning`` in words. Empty when the margin is unknown (a job stored
    before margins existed) or the headroom cannot be computed."""
    room = headroom_gib(evaluation)
    if margin_gib is None or room is None:
        return {}
    if room >= margin_gib:
        return {"keeps_margin": True}
    return {"keeps_margin": False, "margin_warning": (
        f"headroom {room:.1f} GiB is below the {margin_gib:g} GiB memory margin: allocator fragmentation or "
        "communication buffers may not fit; ranked after every config that keeps the margin")}

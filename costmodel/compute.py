"""Compute time on one device: matmuls, the attention core and memory-bound kernels.

All functions take numpy arrays (one entry per config) and return seconds.
"""

from __future__ import annotations

import numpy as np

from .hardware import Hardware

BF16_BYTES = 2


def _saturation(flops: np.ndarray, hw: Hardware) -> np.ndarray:
    """Fraction of the large-GEMM efficiency a kernel of ``flops`` reaches: small GEMMs (TP/ETP-sharded
    weights, short micro-batches, few tokens per expert) fill the cores poorly. A hyperbolic curve
    with one calibrated constant, the size at which half of the peak efficiency is lost."""
    return flops / (flops + hw.gemm_half_flops)


def gemm_s(m, k, n, hw: Hardware, fp8, count=1.0) -> np.ndarray:
    """Time of ``count`` matmuls (m×k)·(k×n): the slower of the compute roofline, at an efficiency that
    falls as the GEMM shrinks, and the HBM roofline of reading both operands and writing the result.

    FP8 matmuls run at the profile's FP8 peak times ``fp8_gemm_eff_ratio`` (casts and scaling)."""
    flops = 2.0 * m * k * n
    eff = hw.gemm_eff_max * _saturation(flops, hw)
    fp8 = fp8 & (hw.peak_fp8_flops > 0)  # without an FP8 peak the config is invalid; keep numbers finite
    peak = np.where(fp8, hw.peak_fp8_flops * hw.fp8_gemm_eff_ratio, hw.peak_bf16_flops)
    elem = np.where(fp8, 1.0, BF16_BYTES)
    compute = flops / (peak * eff)
    memory = (m * k + k * n + m * n) * elem / hw.hbm_bytes_per_s
    return count * np.maximum(compute, memory)


def grouped_gemm_s(m, k, n, groups, hw: Hardware, fp8) -> np.ndarray:
    """Time of one grouped GEMM (TEGroupedMLP, npu_gmm): ``groups`` matmuls of (m/groups × k)·(k × n)
    in one kernel call, so the per-call cost of the saturation curve is paid once on the total
    FLOPs, at ``moe_gemm_eff_ratio`` of a dense GEMM's efficiency (per-expert tails); but the HBM roofline reads every group's weight matrix, which binds when each expert gets
    few tokens (the arithmetic intensity of a group is about m/groups FLOPs per weight byte)."""
    flops = 2.0 * m * k * n
    elem = np.where(fp8 & (hw.peak_fp8_flops > 0), 1.0, BF16_BYTES)
    memory = (m * k + groups * k * n + m * n) * elem / hw.hbm_bytes_per_s
    return np.maximum(gemm_s(m / groups, k, n, hw, fp8, groups) / hw.moe_gemm_eff_ratio, memory)


def grouped_weight_grad_s(m, k, n, groups, hw: Hardware, fp8, accum_bytes) -> np.ndarray:
    """Time of the weight-gradient grouped GEMM: the FLOPs of the forward one, while its output is
    accumulated into each weight's main gradient in place (Megatron's gradient_accumulation_fusion,
    MindSpeed's npu_gmm weight-gradient path): every micro-batch reads and rewrites ``accum_bytes``
    per weight, besides reading the two inputs. With dense GEMMs (thousands of tokens per weight) the
    FLOPs dominate; with fine-grained experts (hundreds of tokens each) this traffic does."""
    elem = np.where(fp8 & (hw.peak_fp8_flops > 0), 1.0, BF16_BYTES)
    memory = ((m * k + m * n) * elem + 2.0 * accum_bytes * groups * k * n) / hw.hbm_bytes_per_s
    return np.maximum(gemm_s(m / groups, k, n, hw, fp8, groups) / hw.moe_gemm_eff_ratio, memory)


def attention_core_s(flops, scores, calls, hw: Hardware) -> np.ndarray:
    """FlashAttention forward time (BF16 even in FP8 recipes, as Transformer Engine's default).

    ``flops`` of score and value matmuls in ``calls`` kernel calls (context-parallel ring attention
    runs one call per ring step, each paying the fixed per-call cost of the saturation curve), plus
    the softmax of ``scores`` score elements on the vector units: FlashAttention-3 (Shah et al. 2024,
    §3) shows exponentials have a throughput far below the matmuls', so per score the softmax costs
    the same whatever the head dim while the matmuls cost 2·(d_qk + d_v) FLOPs: small heads (64) and
    long sequences run far from the matmul peak."""
    matmul, softmax = _attention_core_parts(flops, scores, calls, hw)
    return matmul + softmax


def attention_core_bwd_s(flops, scores, calls, hw: Hardware) -> np.ndarray:
    """FlashAttention backward time: five matmuls against the forward's two (it recomputes the
    scores: Dao 2023, "FlashAttention-2", §3.1.2), and one exponential per score again (the
    recomputation of P = exp(S − L) in its Algorithm 2), so the softmax part costs what the forward's does."""
    matmul, softmax = _attention_core_parts(flops, scores, calls, hw)
    return ATTN_BACKWARD_FACTOR * matmul + softmax


def _attention_core_parts(flops, scores, calls, hw: Hardware) -> tuple[np.ndarray, np.ndarray]:
    matmul = flops / (hw.peak_bf16_flops * hw.attn_eff * _saturation(flops / calls, hw))
    return matmul, scores / hw.softmax_scores_per_s


def memory_bound_s(nbytes, hw: Hardware) -> np.ndarray:
    """Norms, activations, softmax, router and token permutation: bytes moved over achievable HBM bandwidth."""
    return nbytes / hw.hbm_bytes_per_s


# FlashAttention-2's backward runs five matmuls against the forward's two (it recomputes the scores):
# Dao 2023, "FlashAttention-2", §3.1.2 (backward pass).
ATTN_BACKWARD_FACTOR = 2.5

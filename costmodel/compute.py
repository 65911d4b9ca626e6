"""Compute time on one device: matmuls, the attention core and memory-bound kernels.

All functions take numpy arrays (one entry per config) and return seconds.
"""

from __future__ import annotations

import numpy as np

from .hardware import Hardware

BF16_BYTES = 2


def _saturation(flops: np.ndarray, hw: Hardware, half_flops=None) -> np.ndarray:
    """Fraction of the large-GEMM efficiency a kernel of ``flops`` reaches: small GEMMs (TP/ETP-sharded
    weights, short micro-batches, few tokens per expert) fill the cores poorly. A hyperbolic curve
    with one calibrated constant, the size at which half of the peak efficiency is lost
    (``half_flops``, the profile's BF16 one unless given: see ``fp8_half_flops``)."""
    return flops / (flops + (hw.gemm_half_flops if half_flops is None else half_flops))


def fp8_half_flops(hw: Hardware) -> np.ndarray:
    """Half-efficiency size of an FP8 GEMM (FLOPs). The curve's time is F/(P·η) + F_half/(P·η): a fixed
    cost per call of F_half/(P·η) seconds (launch, wave quantisation, the tail of the last tiles), which
    a faster matmul rate does not shorten. Kept in seconds at the FP8 rate P8 = peak_fp8 ·
    fp8_gemm_eff_ratio, the FP8 half size is F_half · P8 / P_bf16: a small GEMM (a per-expert one) gains
    little from FP8 while a large one gains the full rate ratio (the issue's MXFP8 Qwen3-235B log)."""
    fp8_rate = hw.peak_fp8_flops * hw.fp8_gemm_eff_ratio
    return hw.gemm_half_flops * np.where(fp8_rate > 0, fp8_rate, hw.peak_bf16_flops) / hw.peak_bf16_flops


def gemm_s(m, k, n, hw: Hardware, fp8, count=1.0) -> np.ndarray:
    """Time of ``count`` matmuls (m×k)·(k×n): the slower of the compute roofline, at an efficiency that
    falls as the GEMM shrinks, and the HBM roofline of reading both operands and writing the result.

    FP8 matmuls run at the profile's FP8 peak times ``fp8_gemm_eff_ratio`` (casts and scaling)."""
    flops = 2.0 * m * k * n
    fp8 = fp8 & (hw.peak_fp8_flops > 0)  # without an FP8 peak the config is invalid; keep numbers finite
    eff = hw.gemm_eff_max * _saturation(flops, hw, np.where(fp8, fp8_half_flops(hw), hw.gemm_half_flops))
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


# Bytes moved per element to quantise one FP8 GEMM operand (Transformer Engine's fused cast-transpose):
# read the BF16 tensor (2), write its FP8 cast (1) and the transposed cast the other pass's GEMM reads
# (1; Hopper's FP8 tensor cores take only the TN layout, MXFP8 keeps row- and column-wise copies), with
# the amax reduced in the same kernel under delayed scaling (the scale comes from the amax history) and
# per block inside it for blockwise and MXFP8 (their scales, 1 per 32 or 128 elements, are negligible).
# Current (per-tensor) scaling must know the amax before the cast: one more BF16 read (2).
# Megatron-Core --fp8-recipe delayed|tensorwise|blockwise|mxfp8 (batch.FP8_RECIPE_CODES order).
FP8_QUANTISE_BYTES = {"delayed": 4.0, "tensorwise": 6.0, "blockwise": 4.0, "mxfp8": 4.0}


def fp8_quantise_s(elements, bytes_per_element, hw: Hardware) -> np.ndarray:
    """Memory-bound quantisation of FP8 GEMM operands: ``elements`` BF16 elements cast at
    ``bytes_per_element`` (``FP8_QUANTISE_BYTES``; 0 for a BF16 config) over achievable HBM bandwidth.
    Per GEMM (m×k)·(k×n) the forward casts its input (m·k) and the backward its output gradient (m·n),
    which the data- and weight-gradient GEMMs share; weights are cast once per step (Transformer
    Engine's is_first_microbatch cache) and not priced. Per input element the cast costs the same
    whatever the GEMM's width n, while the GEMM costs 2n FLOPs: against an FP8 matmul of rate P8 it adds
    bytes·P8/(2n·HBM) of the GEMM's time, most on narrow and small GEMMs (per-expert, TP-sharded)."""
    return elements * bytes_per_element / hw.hbm_bytes_per_s


def memory_bound_s(nbytes, hw: Hardware) -> np.ndarray:
    """Norms, activations, softmax, router and token permutation: bytes moved over achievable HBM bandwidth."""
    return nbytes / hw.hbm_bytes_per_s


# FlashAttention-2's backward runs five matmuls against the forward's two (it recomputes the scores):
# Dao 2023, "FlashAttention-2", §3.1.2 (backward pass).
ATTN_BACKWARD_FACTOR = 2.5

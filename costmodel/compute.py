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
    little from FP8 while a large one gains the full rate ratio (a public Megatron-Bridge tuning log of
    Qwen3-235B on 256 B200 measured MXFP8 25 % slower than BF16: docs/costmodel.md)."""
    fp8_rate = hw.peak_fp8_flops * hw.fp8_gemm_eff_ratio
    return hw.gemm_half_flops * np.where(fp8_rate > 0, fp8_rate, hw.peak_bf16_flops) / hw.peak_bf16_flops


def gemm_s(m, k, n, hw: Hardware, fp8, count=1.0) -> np.ndarray:
    """Time of ``count`` matmuls (m×k)·(k×n): the slower of the compute roofline, at an efficiency that
    falls as the GEMM shrinks, and the HBM roofline of reading both operands and writing the result.

    FP8 matmuls run at the profile's FP8 peak times ``fp8_gemm_eff_ratio`` (casts and scaling)."""
    flops = 2.0 * m * k * n
    fp8 = fp8 & (hw.peak_fp8_flops > 0)  # without an FP8 peak the config is invalid; keep numbers finite
    eff = hw.gemm_eff_max * _saturation(flops, hw, np.where(fp8, hw.derived(fp8_half_flops), hw.gemm_half_flops))
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


def flash_attention_fill(seq_kv) -> np.ndarray:
    """Fraction of its long-sequence (plateau) matmul efficiency FlashAttention reaches when each query
    tile sweeps ``seq_kv`` keys: ``seq_kv / (seq_kv + ATTN_FILL_HALF_SEQ_TOKENS)``.

    Each thread block loads its query tile, loops over the key/value tiles and writes its output, and
    causal masking computes the diagonal tiles in full: both fixed costs per query tile, amortised over
    ``seq_kv / tile`` steps, so throughput rises with the sequence and saturates (FlashAttention-2,
    Dao 2023, arXiv 2307.08691, Fig. 4-7; FlashAttention-3, Shah et al. 2024, arXiv 2407.08608,
    Fig. 5-6). ``seq_kv`` is the key length of one kernel call: the sequence per ring step under
    context parallelism (s/ring), the whole sequence under Ulysses. The head dim is not in this factor:
    its effect, smaller heads further from peak, is the softmax's (``attention_core_s``: one exponential
    per score whatever the head dim), which with the profiles' prior exponential rates reproduces
    FlashAttention-3's head-dim 64/128/256 plateau ratios (see ATTN_FILL_HALF_SEQ_TOKENS)."""
    seq_kv = np.asarray(seq_kv, dtype=np.float64)
    return seq_kv / (seq_kv + ATTN_FILL_HALF_SEQ_TOKENS)


def attention_core_s(flops, scores, calls, hw: Hardware, seq_kv=None) -> np.ndarray:
    """FlashAttention forward time (BF16 even in FP8 recipes, as Transformer Engine's default).

    ``flops`` of score and value matmuls in ``calls`` kernel calls (context-parallel ring attention
    runs one call per ring step, each paying the fixed per-call cost of the saturation curve), at
    ``attn_eff`` times the sequence fill of ``seq_kv`` keys per call (``flash_attention_fill``; None:
    the plateau), plus the softmax of ``scores`` score elements on the vector units: FlashAttention-3
    (Shah et al. 2024, §3) shows exponentials have a throughput far below the matmuls', so per score
    the softmax costs the same whatever the head dim while the matmuls cost 2·(d_qk + d_v) FLOPs:
    small heads (64) and long sequences run far from the matmul peak."""
    matmul, softmax = _attention_core_parts(flops, scores, calls, hw, seq_kv)
    return matmul + softmax


def attention_core_bwd_s(flops, scores, calls, hw: Hardware, seq_kv=None) -> np.ndarray:
    """FlashAttention backward time: five matmuls against the forward's two (it recomputes the
    scores: Dao 2023, "FlashAttention-2", §3.1.2), and one exponential per score again (the
    recomputation of P = exp(S − L) in its Algorithm 2), so the softmax part costs what the forward's does."""
    matmul, softmax = _attention_core_parts(flops, scores, calls, hw, seq_kv)
    return ATTN_BACKWARD_FACTOR * matmul + softmax


def _attention_core_parts(flops, scores, calls, hw: Hardware, seq_kv=None) -> tuple[np.ndarray, np.ndarray]:
    fill = 1.0 if seq_kv is None else flash_attention_fill(seq_kv)
    matmul = flops / (hw.peak_bf16_flops * hw.attn_eff * fill * _saturation(flops / calls, hw))
    return matmul, scores / hw.softmax_scores_per_s


def unfused_attention_fwd_s(seq_q, seq_kv, qk_dim, v_dim, batch_heads, hw: Hardware) -> np.ndarray:
    """Forward time of attention that materialises the scores (Megatron's CoreAttention before
    FlashAttention: baddbmm, FusedScaleMaskSoftmax, attention dropout, bmm): ``batch_heads`` =
    micro-batch × local heads problems of ``seq_q`` queries against ``seq_kv`` keys.

    The QK^T and PV batched GEMMs at GEMM efficiency (``gemm_s``, whose HBM roofline writes and reads
    the s_q × s_kv scores); they compute every score, the causally masked ones too (the mask is applied
    in the softmax). Then memory-bound passes over the s_q·s_kv·batch_heads scores:
    ``UNFUSED_SOFTMAX_FWD_BYTES`` per score (the fused scale-mask-softmax and the dropout)."""
    count = batch_heads
    gemms = (gemm_s(seq_q, qk_dim, seq_kv, hw, False, count) + gemm_s(seq_q, seq_kv, v_dim, hw, False, count))
    return gemms + memory_bound_s(UNFUSED_SOFTMAX_FWD_BYTES * seq_q * seq_kv * batch_heads, hw)


def unfused_attention_bwd_s(seq_q, seq_kv, qk_dim, v_dim, batch_heads, hw: Hardware) -> np.ndarray:
    """Backward of ``unfused_attention_fwd_s``: each of the two batched GEMMs twice (input and the
    other operand's gradients, SC21 §5.1), and ``UNFUSED_SOFTMAX_BWD_BYTES`` per score (dropout and
    softmax gradients)."""
    count = batch_heads
    gemms = (gemm_s(seq_q, qk_dim, seq_kv, hw, False, count) + gemm_s(seq_q, seq_kv, v_dim, hw, False, count))
    return (2.0 * gemms
            + memory_bound_s(UNFUSED_SOFTMAX_BWD_BYTES * seq_q * seq_kv * batch_heads, hw))


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

# Sequence at which FlashAttention reaches half its plateau matmul efficiency (flash_attention_fill),
# from the causal training curves of FlashAttention-3 (Shah et al. 2024, arXiv 2407.08608, BF16 forward
# and backward speed panels on H100 SXM5), read from the values printed above the bars as transcribed on
# the pages the project's search returned (two head-dim-128 forward panels; the one whose values at short
# sequences are lower, standard attention 26-35 against 74-139 TFLOP/s, taken as the causal one):
# a least-squares fit of P·s/(s + c) to FlashAttention-3 causal forward (292, 423, 521, 579, 602, 616
# TFLOP/s at s = 512 … 16k) gives c = 605 tokens, FlashAttention-2 on the same panel (191, 260, 298,
# 319, 333, 335) c = 405, FlashAttention-3 backward (316, 424, 501, 542, 559, 561) c = 425, each
# within 3 % rms; non-causal forwards fill sooner (c = 210-280). Rounded to 512. The A100 curves of
# FlashAttention-2 (arXiv 2307.08691, Fig. 4-7) were not legible in what the search returned and are
# not used. Across head dims the fitted c shows no trend (64: 280, 128: 210 non-causal; 128: 605,
# 256: 685 causal) while the plateaus fall with the head dim (497, 648, 756 TFLOP/s for 64, 128, 256,
# non-causal forward): the ratios 0.77 and 0.86 are what the softmax term already gives with H100's
# 3.9e12 exponentials/s at a 0.75 matmul plateau (0.79 and 0.86), so the head dim stays there.
ATTN_FILL_HALF_SEQ_TOKENS = 512.0

# Megatron's unfused attention (megatron/core/transformer/dot_product_attention.py; legacy
# model/transformer.py CoreAttention): FusedScaleMaskSoftmax reads the fp16/bf16 scores and writes the
# probabilities (2 + 2 B per score), the attention dropout reads them and writes its output and its
# 1-byte mask (2 + 2 + 1): 9 B per score forward. Backward: the dropout gradient reads the incoming
# gradient and the mask and writes (2 + 1 + 2), the softmax gradient reads the gradient and the softmax
# output and writes (2 + 2 + 2): 11 B. The stored tensors are Korthikanti et al. 2022's 5·a·s²·b bytes
# (softmax output 2, dropout mask 1, dropout output 2; memory.py). Dropout as in Megatron's default
# --attention-dropout 0.1, which the SC21 and Korthikanti runs used.
UNFUSED_SOFTMAX_FWD_BYTES = 2 * BF16_BYTES + 2 * BF16_BYTES + 1
UNFUSED_SOFTMAX_BWD_BYTES = (BF16_BYTES + 1 + BF16_BYTES) + 3 * BF16_BYTES

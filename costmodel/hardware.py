"""A cluster profile turned into SI scalars (FLOP/s, B/s, s, bytes) for the vectorised formulas."""

from __future__ import annotations

from dataclasses import dataclass

from .spec import ClusterProfile

GIB = 2.0**30


@dataclass(frozen=True)
class Hardware:
    peak_bf16_flops: float
    peak_fp8_flops: float  # 0 when the device has no FP8 matmul
    memory_bytes: float
    hbm_bytes_per_s: float  # achievable: line rate × hbm_eff
    devices_per_node: int
    scale_up_domain: int
    scale_up_bytes_per_s: float  # achievable per device and direction: line rate × scale_up_bw_eff
    scale_out_bytes_per_s: float
    scale_up_link_bytes_per_s: float  # full-mesh domains (HCCS): one pair link; 0 for switched domains
    scale_up_latency_s: float
    scale_out_latency_s: float
    framework_overhead_bytes: float
    gemm_eff_max: float
    gemm_half_flops: float
    attn_eff: float
    fp8_gemm_eff_ratio: float
    tp_overlap: float
    ep_overlap: float
    dp_overlap: float
    layer_overhead_s: float
    softmax_scores_per_s: float  # attention score elements the vector units process per second
    moe_gemm_eff_ratio: float  # grouped expert GEMMs relative to dense GEMMs of the same size
    pp_chunk_overhead_s: float  # blocking send/recv handshake of one pipeline chunk, per pass
    straggler_cv: float  # step-time coefficient of variation of one data-parallel replica (stragglers.py)
    # Device <-> host link per device and direction (the link's line rate over the devices sharing it),
    # and the host memory of a node; 0 when the profile states no host link.
    host_bytes_per_s: float = 0.0
    host_memory_bytes: float = 0.0
    # The framework's flash-attention path pads V to the QK head dim where they differ (MLA): MindSpeed-LLM
    # on Ascend (profile fact flash_attention_pads_v_head); GPU flash kernels take unequal dims.
    fa_pads_v_head: bool = False

    def derived(self, fn):
        """``fn(self)``, computed once per Hardware (it is frozen): what a formula derives from the
        hardware alone and every call of it would otherwise recompute (FP8's half-efficiency GEMM size
        for each GEMM of a layer, say)."""
        cache = self.__dict__.setdefault("_derived", {})
        if fn not in cache:
            cache[fn] = fn(self)
        return cache[fn]

    @classmethod
    def from_profile(cls, p: ClusterProfile, factors: dict | None = None) -> "Hardware":
        """The profile's hardware; ``factors`` overrides efficiency factors by their profile key, with
        scalars or with arrays of one value per config (a calibration scoring many candidate factor
        sets at once: every formula takes them element-wise)."""
        factors = factors or {}

        def eff(key: str, unset: float | None = None):
            # ``unset``: the value of a factor the profile leaves at 0 or null (no such effect measured)
            if key in factors:
                return factors[key]
            v = p.eff(key)
            return unset if unset is not None and not v else v

        return cls(
            peak_bf16_flops=p.fact("peak_bf16_tflops") * 1e12,
            peak_fp8_flops=(p.fact("peak_fp8_tflops") or 0.0) * 1e12,
            memory_bytes=p.fact("memory_gib") * GIB,
            hbm_bytes_per_s=p.fact("hbm_bandwidth_gbps") * 1e9 * eff("hbm_eff"),
            devices_per_node=int(p.fact("devices_per_node")),
            scale_up_domain=int(p.fact("scale_up_domain")),
            scale_up_bytes_per_s=p.fact("scale_up_bandwidth_gbps") * 1e9 * eff("scale_up_bw_eff"),
            scale_out_bytes_per_s=p.fact("scale_out_bandwidth_gbps") * 1e9 * eff("scale_out_bw_eff"),
            scale_up_link_bytes_per_s=(p.facts["scale_up_link_gbps"].value or 0.0) * 1e9 * eff("scale_up_bw_eff")
            if "scale_up_link_gbps" in p.facts else 0.0,
            scale_up_latency_s=p.fact("scale_up_latency_us") * 1e-6,
            scale_out_latency_s=p.fact("scale_out_latency_us") * 1e-6,
            framework_overhead_bytes=p.fact("framework_overhead_gib") * GIB,
            gemm_eff_max=eff("gemm_eff_max"),
            gemm_half_flops=eff("gemm_half_gflop") * 1e9,
            attn_eff=eff("attn_eff"),
            fp8_gemm_eff_ratio=eff("fp8_gemm_eff_ratio", 1.0),
            tp_overlap=eff("tp_overlap"),
            ep_overlap=eff("ep_overlap"),
            dp_overlap=eff("dp_overlap"),
            layer_overhead_s=eff("layer_overhead_us") * 1e-6,
            softmax_scores_per_s=eff("softmax_gscores_per_s") * 1e9,
            moe_gemm_eff_ratio=eff("moe_gemm_eff_ratio", 1.0),
            pp_chunk_overhead_s=eff("pp_chunk_overhead_us") * 1e-6,
            straggler_cv=eff("straggler_cv"),
            host_bytes_per_s=(p.fact("host_link_bandwidth_gbps") * 1e9 / p.fact("host_link_devices")
                              if p.has_host_link else 0.0),
            host_memory_bytes=p.fact("host_memory_gib") * GIB if p.has_host_link else 0.0,
            fa_pads_v_head=bool(p.facts["flash_attention_pads_v_head"].value)
            if "flash_attention_pads_v_head" in p.facts else False,
        )

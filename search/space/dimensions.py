"""The values each dimension of a search offers: parallel sizes, micro-batches, pipeline splits by name,
and the memory plans (recompute and activation offload); see the package docstring."""

from __future__ import annotations

import math
from dataclasses import dataclass


from costmodel import TrainingConfig
from costmodel.batch import CP_COMM_CODES
from costmodel.spec import ClusterProfile, ModelSpec

from .. import frameworks


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

"""A whole config in a framework's terms: ``express`` gathers every concern's flags and refusals."""

from __future__ import annotations

from dataclasses import dataclass, field

from costmodel import ModelSpec, TrainingConfig

from .megatron import _a2a_overlap_pipeline
from .options import (_attention, _context_parallel, _fp8, _full_recompute, _memory_savings, _moe, _offload,
                      _optimizer_dtypes, _recompute, _schedule, _sharding, _tp_overlap)
from .split import Split, pipeline_split
from .table import FRAMEWORKS, Refusal


@dataclass
class Expression:
    """A config's flags by concern (``groups``, in launch order) and what the framework cannot express."""

    split: Split
    groups: dict[str, list[str]] = field(default_factory=dict)
    refusals: list[Refusal] = field(default_factory=list)

    def add(self, group: str, flags: list[str], refusals: list[Refusal] = ()) -> None:
        self.groups.setdefault(group, []).extend(flags)
        self.refusals.extend(refusals)


def express(config: TrainingConfig, spec: ModelSpec, framework: str,
            scale_up_domain: int | None = None, split_rules: bool = True, split: Split | None = None) -> Expression:
    """The flags of ``config`` in ``framework`` and the refusals of what it cannot express.

    ``scale_up_domain`` (devices per scale-up domain, from the cluster profile) decides whether the
    expert-parallel group leaves the domain (then the dispatch algorithm matters) and the Ulysses degree
    of ``cp_comm_type=a2a+p2p``; unknown, the choices that depend on it are refused rather than guessed.
    ``split_rules=False`` leaves out the all-to-all overlap's pipeline rules (``_a2a_overlap_pipeline``),
    for the search's probes at pp = 1, which score those per split (``split_refusals``). ``split``:
    ``pipeline_split`` of the config, where the caller has it (it reads the split fields only, so the
    probes that share them share one).
    """
    if framework not in FRAMEWORKS:
        raise ValueError(f"unknown framework {framework!r}; known: {', '.join(FRAMEWORKS)}")
    ms = framework == "mindspeed"
    out = Expression(split=pipeline_split(config, spec, framework) if split is None else split)
    out.add("recompute", *_recompute(config, spec, ms, out.split))
    out.add("offload", *_offload(config, ms))
    out.add("sharding", *_sharding(config, ms))
    out.add("optimizer", *_optimizer_dtypes(config, ms))
    out.add("tp_overlap", *_tp_overlap(config, spec, ms))
    out.add("context_parallel", *_context_parallel(config, spec, ms, scale_up_domain))
    out.add("attention", _attention(config, ms))
    out.add("moe", *_moe(config, spec, ms, scale_up_domain))
    out.add("schedule", *_schedule(config, spec, ms, out.split))
    if split_rules:
        out.refusals += _a2a_overlap_pipeline(config, spec, ms)
    if config.expert_placement == "balanced":
        # Megatron-Core places local experts contiguously (expert e on EP rank e // (E / ep)); neither it nor
        # MindSpeed-LLM has a flag that permutes experts over ranks at launch.
        out.refusals.append(Refusal("expert_placement", "balanced", "no launch flag places experts by load "
                                                                    "(both frameworks place them contiguously)"))
    if config.moe_expert_replicas:
        # Megatron-Core's and MindSpeed-LLM's expert layers hold E / ep experts per rank, each once;
        # replicated experts (DeepSeek's EPLB) exist in inference engines only.
        out.refusals.append(Refusal("moe_expert_replicas", str(config.moe_expert_replicas),
                                    "no launch flag replicates experts in training (each rank holds E / ep)"))
    out.add("precision", *_fp8(config, ms))
    out.add("memory_savings", *_memory_savings(config, ms))
    return out


def refusals(config: TrainingConfig, spec: ModelSpec, framework: str,
             scale_up_domain: int | None = None, split_rules: bool = True, split: Split | None = None) -> list[Refusal]:
    """What ``framework`` cannot express of ``config`` (empty: a launch carries the plan out)."""
    return express(config, spec, framework, scale_up_domain, split_rules, split).refusals


def split_refusals(config: TrainingConfig, spec: ModelSpec, framework: str, split: Split | None = None) -> list[Refusal]:
    """The refusals that depend on the pipeline split (pp, vpp, split fields): the full-recompute count and
    the all-to-all overlap's schedule. Every other rule reads tp, cp, ep, etp, sequence parallelism and
    the options only (the search probes them at pp = 1 with ``split_rules=False``) and scores these apart
    (search/space.py). ``split``: ``pipeline_split`` of the config, where the caller has it (it reads the
    split fields only, so one split serves every option)."""
    ms = framework == "mindspeed"
    split = pipeline_split(config, spec, framework) if split is None else split
    out = _a2a_overlap_pipeline(config, spec, ms) + _schedule(config, spec, ms, split)[1]
    if config.recompute == "full":
        out += _full_recompute(config, ms, split)[1]
    return out

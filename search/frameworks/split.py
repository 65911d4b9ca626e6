"""The pipeline split as each framework states it: the cost model's virtual stages (``stage_tokens``), and
Megatron-LM's split flags or layout string, or MindSpeed-LLM's no-op padding (``pipeline_split``)."""

from __future__ import annotations

from dataclasses import dataclass

from costmodel import ModelSpec, TrainingConfig
from costmodel.batch import NO_VALUE
from costmodel.pipeline import _virtual_stage_tokens, parse_layout


@dataclass
class Split:
    """How the framework places the cost model's pipeline split."""

    flags: list[str]
    num_layers: int  # --num-layers (MindSpeed pads virtual stages with no-op layers)
    real: list[int]  # positions of the model's layers among the num_layers
    chunks: list[list[int]]  # decoder layers of each pipeline rank's model chunks: chunks[rank][chunk]


def stage_tokens(cfg: TrainingConfig, spec: ModelSpec) -> list[str]:
    """The cost model's split: one token string (``E``, ``t``, ``m``, ``L``) per virtual stage, in model
    order (DualPipeV: 2·pp of them, costmodel.pipeline.split_chunks)."""
    if cfg.pipeline_layout is not None:
        return parse_layout(cfg.pipeline_layout)
    first = NO_VALUE if cfg.first_stage_layers is None else cfg.first_stage_layers
    last = NO_VALUE if cfg.last_stage_layers is None else cfg.last_stage_layers
    vpp = 2 if cfg.schedule == "dualpipev" else cfg.vpp
    return _virtual_stage_tokens(spec, cfg.pp, vpp, first, last,
                                 cfg.account_for_embedding_in_pipeline_split,
                                 cfg.account_for_loss_in_pipeline_split)


def layout_string(tokens: list[str]) -> str:
    """Megatron's ``--pipeline-model-parallel-layout`` for per-virtual-stage tokens (runs compressed)."""
    def stage(tok: str) -> str:
        out, i = [], 0
        while i < len(tok):
            j = i
            while j < len(tok) and tok[j] == tok[i]:
                j += 1
            out.append(tok[i] if j - i == 1 else f"{tok[i]}*{j - i}")
            i = j
        return ",".join(out)
    return "|".join(stage(t) for t in tokens)


def _chunks(counts: list[int], cfg: TrainingConfig) -> list[list[int]]:
    """Per pipeline rank, its chunks' layer counts: virtual stage k·pp + r is chunk k of rank r; under
    DualPipeV rank r holds r and 2pp − 1 − r, under DualPipe stages r and pp − 1 − r."""
    pp = cfg.pp
    if cfg.schedule == "dualpipev":
        return [[counts[r], counts[2 * pp - 1 - r]] for r in range(pp)]
    if cfg.schedule == "dualpipe":
        return [[counts[r], counts[pp - 1 - r]] for r in range(pp)]
    return [[counts[k * pp + r] for k in range(len(counts) // pp)] for r in range(pp)]


def pipeline_split(cfg: TrainingConfig, spec: ModelSpec, framework: str) -> Split:
    tokens = stage_tokens(cfg, spec)
    counts = [t.count("t") for t in tokens]
    if framework == "megatron":
        return Split(_megatron_split_flags(cfg, spec, tokens), spec.num_layers, list(range(spec.num_layers)),
                     _chunks(counts, cfg))
    if _noop_expressible(tokens, spec):
        return _noop_split(cfg, counts)
    # MindSpeed's PipelineModelParallelLayoutFeature ("Support --pipeline-model-parallel-layout from
    # Megatron dev on core_r0.12.1", mindspeed/features_manager/pipeline_parallel/
    # pipeline_model_parallel_layout_feature.py, registered by MindSpeed-LLM): for splits that place the
    # embedding, MTP or loss elsewhere than no-op padding can (it derives vpp from the string).
    layout = cfg.pipeline_layout or layout_string(tokens)
    return Split(["--pipeline-model-parallel-layout", layout], spec.num_layers, list(range(spec.num_layers)),
                 _chunks(counts, cfg))


def _megatron_split_flags(cfg: TrainingConfig, spec: ModelSpec, tokens: list[str]) -> list[str]:
    """A layout states the split; first/last stage sizes need --num-virtual-stages-per-pipeline-rank
    (Megatron requires it for uneven splits); else --account-for-* with the layers per virtual stage, or,
    when the slots do not divide by pp·vpp, the layout string of the even-spread rule."""
    if cfg.pipeline_layout is not None:
        return ["--pipeline-model-parallel-layout", cfg.pipeline_layout]
    if cfg.first_stage_layers is not None or cfg.last_stage_layers is not None:
        if cfg.pp > 1 and not _megatron_uneven_exact(cfg, spec):
            return ["--pipeline-model-parallel-layout", layout_string(tokens)]
        args = ["--num-virtual-stages-per-pipeline-rank", str(cfg.vpp)] if cfg.pp > 1 else []
        if cfg.first_stage_layers is not None:
            args += ["--decoder-first-pipeline-num-layers", str(cfg.first_stage_layers)]
        if cfg.last_stage_layers is not None:
            args += ["--decoder-last-pipeline-num-layers", str(cfg.last_stage_layers)]
        return args
    ae, al = cfg.account_for_embedding_in_pipeline_split, cfg.account_for_loss_in_pipeline_split
    slots, stages = spec.num_layers + int(ae) + int(al), cfg.pp * cfg.vpp
    if slots % stages:
        return ["--pipeline-model-parallel-layout", layout_string(tokens)]
    args = (["--account-for-embedding-in-pipeline-split"] if ae else []) + \
           (["--account-for-loss-in-pipeline-split"] if al else [])
    if cfg.vpp > 1:
        return args + ["--num-layers-per-virtual-pipeline-stage", str(slots // stages)]
    # With one stage the flag states nothing, and older Megatron-LM releases assert it needs pp > 1.
    return args + (["--num-virtual-stages-per-pipeline-rank", "1"] if cfg.pp > 1 else [])


def _megatron_uneven_exact(cfg: TrainingConfig, spec: ModelSpec) -> bool:
    """Whether --decoder-first/last-pipeline-num-layers give the cost model's split: Megatron (HEAD
    transformer_config.py, "Uneven PP") requires the first and last counts and the layers of each middle
    rank to divide by vpp and the middle layers to divide by the middle ranks, then spreads evenly; the
    cost model spreads any remainder (pipeline.py), which only a layout string can state."""
    fixed = [n for n in (cfg.first_stage_layers, cfg.last_stage_layers) if n is not None]
    middle = cfg.pp - len(fixed)
    rest = spec.num_layers - sum(fixed)
    if any(n <= 0 or n % cfg.vpp for n in fixed):
        return False
    if middle == 0:
        return rest == 0
    return rest > 0 and rest % middle == 0 and (rest // middle) % cfg.vpp == 0


def _noop_expressible(tokens: list[str], spec: ModelSpec) -> bool:
    """No-op padding keeps the embedding on the first virtual stage and the MTP layers and the loss on
    the last (where MindSpeed-LLM builds them): any other placement needs a layout string."""
    tail = "m" * spec.mtp_num_layers + "L"
    inner = [tokens[0].removeprefix("E")] + tokens[1:-1] + [tokens[-1].removesuffix(tail)]
    if len(tokens) == 1:
        inner = [tokens[0].removeprefix("E").removesuffix(tail)]
    return tokens[0].startswith("E") and tokens[-1].endswith(tail) and all(set(t) <= {"t"} for t in inner)


def _noop_split(cfg: TrainingConfig, counts: list[int]) -> Split:
    """Every virtual stage padded with no-op layers (``--noop-layers``, as MindSpeed-LLM's DeepSeek-V3
    recipe pads 61 layers to 64) up to the largest, real layers first, so that --num-layers divides by
    pp·vpp and each stage holds exactly the layers the cost model placed there."""
    width = max(counts)
    real, noop = [], []
    for v, n in enumerate(counts):
        real += [v * width + i for i in range(n)]
        noop += [v * width + i for i in range(n, width)]
    args = ["--num-layers-per-virtual-pipeline-stage", str(width)] if cfg.vpp > 1 else []
    if noop:
        # --noop-layers: MindSpeed mindspeed/arguments.py (_add_training_args), NoopLayersFeature in
        # MindSpeed-LLM; "--noop-layers 61,62,63" in examples/mcore/deepseek3/pretrain_deepseek3_671b_4k_ptd.sh
        args += ["--noop-layers", ",".join(map(str, noop))]
    return Split(args, width * len(counts), real, _chunks(counts, cfg))

"""Training-script arguments for a ranked config: Megatron-LM / Megatron-Core, or MindSpeed-LLM (Ascend).

Pure functions: ``launch_args(config, spec, fmt)`` returns a list of argument tokens (``["--tensor-model-
parallel-size", "8", "--sequence-parallel", ...]``); ``format_args(tokens)`` prints them one flag (with
its values) per line, joined with `` \\`` + newline, ready to paste into a shell script. No launcher
flags (torchrun, nodes, ...), no data/tokenizer/optimizer flags: only what ParaPlan chose and the model.

Every parallel-size and batch flag is always emitted, defaults included (``--expert-tensor-parallel-size``
too: Megatron's default for it is tp, ParaPlan's is 1).

Pipeline split (the cost model's rules, docs/costmodel.md "Pipeline split"):

* Megatron: a config's ``pipeline_layout`` goes out as ``--pipeline-model-parallel-layout``; its
  ``first/last_stage_layers`` as ``--decoder-first/last-pipeline-num-layers`` (with
  ``--num-virtual-stages-per-pipeline-rank``, which Megatron requires for uneven splits); otherwise when
  the layer slots divide by pp·vpp, ``--account-for-*`` and ``--num-layers-per-virtual-pipeline-stage``
  (``--num-virtual-stages-per-pipeline-rank 1`` without interleaving). When they do not divide, the
  even-spread rule gives uneven counts that Megatron's flags cannot express, and a layout string
  (``E``/``t``/``m``/``L``, ``|`` per virtual stage) states the exact split.
* MindSpeed-LLM: the decoder layers of every virtual stage are padded with no-op layers
  (``--noop-layers``, as MindSpeed-LLM's DeepSeek-V3 recipe pads 61 layers to 64) up to the largest
  stage, so that ``--num-layers`` (padded) divides by pp·vpp and each stage holds exactly the layers the
  cost model placed there.

Selective recompute on MindSpeed-LLM (Megatron core 0.12.1, no ``--recompute-modules``): ``core_attn`` is
``--recompute-granularity selective``, ``layernorm`` ``--recompute-norm``, ``moe_act``
``--recompute-activation-function``; ``mla_up_proj``, ``mlp``, ``moe`` and ``shared_experts`` have no
MindSpeed-LLM flag and are left out (the run then keeps more activations than the cost model assumed).

Full recompute: ``recompute_num_layers`` null (all layers) is ``--recompute-method uniform
--recompute-num-layers 1``; N layers per pipeline stage is ``--recompute-method block`` with
ceil(N / vpp) layers per virtual stage (Megatron counts block recompute per model chunk).
"""

from __future__ import annotations

import math

from costmodel import ModelSpec, TrainingConfig
from costmodel.batch import NO_VALUE
from costmodel.pipeline import _virtual_stage_tokens, parse_layout

FORMATS = ("megatron", "mindspeed")


def _config(config: dict | TrainingConfig) -> TrainingConfig:
    return config if isinstance(config, TrainingConfig) else TrainingConfig.model_validate(config)


def stage_tokens(cfg: TrainingConfig, spec: ModelSpec) -> list[str]:
    """The cost model's split: one token string (``E``, ``t``, ``m``, ``L``) per virtual stage."""
    if cfg.pipeline_layout is not None:
        return parse_layout(cfg.pipeline_layout)
    first = NO_VALUE if cfg.first_stage_layers is None else cfg.first_stage_layers
    last = NO_VALUE if cfg.last_stage_layers is None else cfg.last_stage_layers
    return _virtual_stage_tokens(spec, cfg.pp, cfg.vpp, first, last,
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
            n = j - i
            out.append(tok[i] if n == 1 else f"{tok[i]}*{n}")
            i = j
        return ",".join(out)
    return "|".join(stage(t) for t in tokens)


def layer_freq_expr(pattern: list[int]) -> str:
    """A 0/1 list as Megatron's python-expression string, e.g. ``([0]*3+[1]*58)``."""
    runs: list[list[int]] = []
    for v in pattern:
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([v, 1])
    return "(" + "+".join(f"[{v}]" if n == 1 else f"[{v}]*{n}" for v, n in runs) + ")"


# Selective recompute on MindSpeed-LLM: it runs on Megatron core 0.12.1 (its README), which has no
# --recompute-modules (added in core 0.13); MindSpeed's own flags stand for the modules it can recompute:
# --recompute-norm (mindspeed/features_manager/recompute/norm_function.py) and
# --recompute-activation-function (mindspeed/features_manager/recompute/activation_function.py).
MINDSPEED_RECOMPUTE = {"layernorm": "--recompute-norm", "moe_act": "--recompute-activation-function"}
MINDSPEED_NO_RECOMPUTE_FLAG = ("mla_up_proj", "mlp", "moe", "shared_experts")


def _recompute(cfg: TrainingConfig, fmt: str = "megatron") -> list[str]:
    if cfg.recompute == "selective":
        modules = cfg.recompute_modules or ["core_attn"]
        if fmt == "megatron":
            return ["--recompute-granularity", "selective", "--recompute-modules", *modules]
        args = ["--recompute-granularity", "selective"] if "core_attn" in modules else []
        return args + [MINDSPEED_RECOMPUTE[m] for m in modules if m in MINDSPEED_RECOMPUTE]
    if cfg.recompute == "full":
        if cfg.recompute_num_layers is None:
            return ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
        per_chunk = math.ceil(cfg.recompute_num_layers / cfg.vpp)
        return ["--recompute-granularity", "full", "--recompute-method", "block",
                "--recompute-num-layers", str(per_chunk)]
    return []


def _megatron_split(cfg: TrainingConfig, spec: ModelSpec) -> list[str]:
    if cfg.pipeline_layout is not None:
        return ["--pipeline-model-parallel-layout", cfg.pipeline_layout]
    if cfg.first_stage_layers is not None or cfg.last_stage_layers is not None:
        args = ["--num-virtual-stages-per-pipeline-rank", str(cfg.vpp)]
        if cfg.first_stage_layers is not None:
            args += ["--decoder-first-pipeline-num-layers", str(cfg.first_stage_layers)]
        if cfg.last_stage_layers is not None:
            args += ["--decoder-last-pipeline-num-layers", str(cfg.last_stage_layers)]
        return args
    ae, al = cfg.account_for_embedding_in_pipeline_split, cfg.account_for_loss_in_pipeline_split
    slots, stages = spec.num_layers + int(ae) + int(al), cfg.pp * cfg.vpp
    if slots % stages:
        return ["--pipeline-model-parallel-layout", layout_string(stage_tokens(cfg, spec))]
    args = (["--account-for-embedding-in-pipeline-split"] if ae else []) + \
           (["--account-for-loss-in-pipeline-split"] if al else [])
    if cfg.vpp > 1:
        return args + ["--num-layers-per-virtual-pipeline-stage", str(slots // stages)]
    return args + ["--num-virtual-stages-per-pipeline-rank", "1"]


def _mindspeed_split(cfg: TrainingConfig, spec: ModelSpec) -> tuple[list[str], int, list[int]]:
    """(split flags, padded num_layers, the padded positions of the real layers)."""
    counts = [t.count("t") for t in stage_tokens(cfg, spec)]
    width = max(counts)
    real, noop = [], []
    for v, n in enumerate(counts):
        real += [v * width + i for i in range(n)]
        noop += [v * width + i for i in range(n, width)]
    args = ["--num-layers-per-virtual-pipeline-stage", str(width)] if cfg.vpp > 1 else []
    if noop:
        # --noop-layers: MindSpeed mindspeed/arguments.py (_add_training_args: "Specity the noop layers."),
        # used as "--noop-layers 61,62,63" in MindSpeed-LLM examples/mcore/deepseek3/pretrain_deepseek3_671b_4k_ptd.sh
        args += ["--noop-layers", ",".join(map(str, noop))]
    return args, width * len(counts), real


def _model_args(spec: ModelSpec, fmt: str, num_layers: int, real: list[int]) -> list[str]:
    a = ["--num-layers", str(num_layers), "--hidden-size", str(spec.hidden_size),
         "--ffn-hidden-size", str(spec.ffn_hidden_size), "--num-attention-heads", str(spec.num_attention_heads)]
    if spec.query_groups != spec.num_attention_heads:
        a += ["--group-query-attention", "--num-query-groups", str(spec.query_groups)]
    if not spec.multi_latent_attention:
        a += ["--kv-channels", str(spec.head_dim)]
    a += ["--seq-length", str(spec.seq_length), "--max-position-embeddings", str(spec.seq_length)]
    if spec.swiglu:
        a.append("--swiglu")
    if spec.untie_embeddings_and_output_weights:
        a.append("--untie-embeddings-and-output-weights")
    if spec.multi_latent_attention:
        a.append("--multi-latent-attention")
        if spec.q_lora_rank is not None:
            a += ["--q-lora-rank", str(spec.q_lora_rank)]
        a += ["--kv-lora-rank", str(spec.kv_lora_rank), "--qk-head-dim", str(spec.qk_head_dim)]
        if spec.qk_pos_emb_head_dim is not None:
            a += ["--qk-pos-emb-head-dim", str(spec.qk_pos_emb_head_dim)]
        a += ["--v-head-dim", str(spec.v_head_dim)]
    if spec.is_moe:
        a += ["--num-experts", str(spec.num_experts), "--moe-router-topk", str(spec.moe_router_topk),
              "--moe-ffn-hidden-size", str(spec.expert_ffn)]
        if spec.moe_shared_expert_intermediate_size:
            a += ["--moe-shared-expert-intermediate-size", str(spec.moe_shared_expert_intermediate_size)]
        if num_layers != spec.num_layers:  # no-op padding (MindSpeed): the pattern at the padded positions
            pattern = [0] * num_layers
            for i, v in zip(real, spec.moe_layer_pattern()):
                pattern[i] = v
            a += ["--moe-layer-freq", layer_freq_expr(pattern)]
        elif isinstance(spec.moe_layer_freq, list):
            a += ["--moe-layer-freq", layer_freq_expr(spec.moe_layer_freq)]
        else:
            a += ["--moe-layer-freq", str(spec.moe_layer_freq)]
    if spec.mtp_num_layers:
        a += ["--mtp-num-layers", str(spec.mtp_num_layers)]
    a += ["--vocab-size", str(spec.vocab_size)]
    if fmt == "mindspeed":
        # both, as MindSpeed-LLM's DeepSeek-V3 recipe (pretrain_deepseek3_671b_4k_ptd.sh) does
        a += ["--padded-vocab-size", str(spec.vocab_size)]
    return a


def launch_args(config: dict | TrainingConfig, spec: ModelSpec, fmt: str = "megatron") -> list[str]:
    """Argument tokens of the training script for one config of ``spec`` (``fmt``: megatron | mindspeed)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    cfg = _config(config)
    a = ["--tensor-model-parallel-size", str(cfg.tp), "--pipeline-model-parallel-size", str(cfg.pp)]
    if fmt == "megatron":
        split, num_layers, real = _megatron_split(cfg, spec), spec.num_layers, list(range(spec.num_layers))
    else:
        split, num_layers, real = _mindspeed_split(cfg, spec)
    a += split
    a += ["--context-parallel-size", str(cfg.cp), "--expert-model-parallel-size", str(cfg.ep),
          "--expert-tensor-parallel-size", str(cfg.etp),
          "--micro-batch-size", str(cfg.micro_batch_size), "--global-batch-size", str(cfg.global_batch_size)]
    if cfg.sp:
        a.append("--sequence-parallel")
    a += _recompute(cfg, fmt)
    if cfg.distributed_optimizer:
        a.append("--use-distributed-optimizer")
    if cfg.overlap_grad_reduce:
        a.append("--overlap-grad-reduce")
    if cfg.overlap_param_gather and cfg.distributed_optimizer:  # Megatron asserts the distributed optimizer
        a.append("--overlap-param-gather")
    if cfg.tp_comm_overlap:
        if fmt == "megatron":
            a.append("--tp-comm-overlap")
        else:
            # MC2 (matmul + collective fused): MindSpeed mindspeed/arguments.py _add_coc_args "--use-ascend-mc2"
            # (MindSpeed-LLM deprecates its old "--use-mc2" for it: features_manager/arguments/deprecated_args.py)
            a.append("--use-ascend-mc2")
    if spec.is_moe:
        a += ["--moe-token-dispatcher-type", "alltoall", "--moe-grouped-gemm"]
        if cfg.moe_a2a_overlap:
            if fmt == "megatron":
                a.append("--overlap-moe-expert-parallel-comm")
            else:
                # MindSpeed mindspeed/arguments.py and features_manager/moe/moe_alltoall_overlap.py
                # "--moe-alltoall-overlap-comm" (needs --moe-grouped-gemm: core/transformer/moe/moe_feature/overlap)
                a.append("--moe-alltoall-overlap-comm")
    a.append("--bf16")
    if cfg.precision == "fp8":
        a += ["--fp8-format", "hybrid"]
    if fmt == "mindspeed":
        # MindSpeed fused kernels, as in MindSpeed-LLM's recipes (pretrain_deepseek3_671b_4k_ptd.sh):
        # "--use-flash-attn" (MindSpeed features_manager/transformer/flash_attention/fusion_attention_v1_feature.py),
        # "--use-fused-rmsnorm" (MindSpeed mindspeed/arguments.py, features_manager/megatron_basic/megatron_basic.py)
        a += ["--use-flash-attn", "--use-fused-rmsnorm"]
    return a + _model_args(spec, fmt, num_layers, real)


def format_args(tokens: list[str]) -> str:
    """One flag (with its values) per line, lines joined with `` \\`` + newline; a trailing newline."""
    lines: list[str] = []
    for tok in tokens:
        if tok.startswith("--") or not lines:
            lines.append(tok)
        else:
            lines[-1] += " " + (f'"{tok}"' if any(c in tok for c in "()*|[]") else tok)
    return " \\\n".join(lines) + "\n"


def flags(tokens: list[str]) -> dict[str, list[str]]:
    """``{"--flag": [values...]}`` of a token list (for checks and tests)."""
    out: dict[str, list[str]] = {}
    key = None
    for tok in tokens:
        if tok.startswith("--"):
            key = tok
            out[key] = []
        elif key is not None:
            out[key].append(tok)
    return out

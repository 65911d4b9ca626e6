"""Training-script arguments for a ranked config: Megatron-LM / Megatron-Core, or MindSpeed-LLM (Ascend).

Pure functions: ``launch_args(config, spec, fmt)`` returns a list of argument tokens (``["--tensor-model-
parallel-size", "8", "--sequence-parallel", ...]``); ``format_args(tokens)`` prints them one flag (with
its values) per line, joined with `` \\`` + newline, ready to paste into a shell script. No launcher
flags (torchrun, nodes, ...), no data/tokenizer/optimizer flags: only what ParaPlan chose and the model.

Every parallel-size and batch flag is always emitted, defaults included (``--expert-tensor-parallel-size``
too: Megatron's default for it is tp, ParaPlan's is 1). How each planned choice is stated (pipeline
split, recompute, sharding, dtypes, overlaps, CP algorithm, dispatcher) and which choices a framework
cannot express comes from ``search.frameworks`` (its docstring has the table and the sources), the
table the search space reads too: a config with such a choice raises ``InexpressibleError`` naming it,
never an argument list that silently runs something else.
"""

from __future__ import annotations

import math

from costmodel import ModelSpec, TrainingConfig
from search.frameworks import (FRAMEWORKS, InexpressibleError, express, layout_string,  # noqa: F401 - re-exported
                               stage_tokens)

FORMATS = FRAMEWORKS


def _config(config: dict | TrainingConfig) -> TrainingConfig:
    return config if isinstance(config, TrainingConfig) else TrainingConfig.model_validate(config)


def layer_freq_expr(pattern: list[int]) -> str:
    """A 0/1 list as Megatron's python-expression string, e.g. ``([0]*3+[1]*58)``."""
    runs: list[list[int]] = []
    for v in pattern:
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([v, 1])
    return "(" + "+".join(f"[{v}]" if n == 1 else f"[{v}]*{n}" for v, n in runs) + ")"


def _model_args(spec: ModelSpec, fmt: str, num_layers: int, real: list[int], tp: int) -> list[str]:
    a = ["--num-layers", str(num_layers), "--hidden-size", str(spec.hidden_size),
         "--ffn-hidden-size", str(spec.ffn_hidden_size), "--num-attention-heads", str(spec.num_attention_heads)]
    if spec.query_groups != spec.num_attention_heads:
        a += ["--group-query-attention", "--num-query-groups", str(spec.query_groups)]
    if not spec.multi_latent_attention:
        a += ["--kv-channels", str(spec.head_dim)]
    a += ["--seq-length", str(spec.seq_length), "--max-position-embeddings", str(spec.seq_length)]
    a += _architecture_args(spec)
    a += _activation_args(spec, fmt)
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
        a += _mla_rope_args(spec, fmt)
    if spec.is_moe:
        a += ["--num-experts", str(spec.num_experts), "--moe-router-topk", str(spec.moe_router_topk),
              "--moe-ffn-hidden-size", str(spec.expert_ffn)]
        a += _router_args(spec)
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
    else:
        a += ["--make-vocab-size-divisible-by", str(vocab_divisor(spec.vocab_size, tp))]
    return a


def _activation_args(spec: ModelSpec, fmt: str) -> list[str]:
    """The MLP's activation and Gemma-2's soft-capping. Megatron-LM: --swiglu (gated SiLU),
    --no-bias-swiglu-fusion / --no-bias-gelu-fusion (bias_activation_fusion off). MindSpeed-LLM
    (mindspeed_llm/training/arguments.py: --geglu "Geglu activate function", --gelu-tanh "Tanh Geglu
    activate function"; its Gemma-2 scripts pass --gelu-tanh alone): --geglu for a gated GELU,
    --gelu-tanh for a gated GELU-tanh, --output-logit-softcapping and --attn-logit-softcapping with the caps."""
    gated, act = spec.swiglu, spec.activation
    a = []
    if fmt == "mindspeed" and gated and act != "silu":
        a.append("--gelu-tanh" if act == "gelu_tanh" else "--geglu")
    elif gated:
        a.append("--swiglu")
    if not spec.bias_activation_fusion:
        a.append("--no-bias-swiglu-fusion" if gated and act == "silu" else "--no-bias-gelu-fusion")
    if fmt == "mindspeed":
        if spec.final_logit_softcapping is not None:
            a += ["--output-logit-softcapping", _num(spec.final_logit_softcapping)]
        if spec.attn_logit_softcapping is not None:
            a += ["--attn-logit-softcapping", _num(spec.attn_logit_softcapping)]
    return a


def vocab_divisor(vocab: int, tp: int) -> int:
    """``--make-vocab-size-divisible-by`` that keeps the planned vocabulary: Megatron pads the vocabulary to
    a multiple of this times tp (HEAD megatron/core/tokenizers/utils/build_tokenizer.py ``vocab_size_with_padding``,
    default 128),
    which would add rows the plan did not count (151,936 at tp 4 becomes 152,064). The largest divisor of
    128 whose product with tp divides the vocabulary; 1 when tp does not divide it (Megatron must then pad
    to a multiple of tp for its vocabulary-parallel embedding)."""
    return math.gcd(vocab // tp, 128) if vocab % tp == 0 else 1


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _architecture_args(spec: ModelSpec) -> list[str]:
    """Norm, position embedding and biases, stated always where Megatron's defaults (LayerNorm, learned
    absolute positions, biases on: megatron/training/arguments.py and transformer_config.py at HEAD
    d98e8a64 and core_v0.12.1 a845aa7e, the line MindSpeed-LLM runs) differ from most models, so that the
    launch builds the planned architecture whatever those defaults become."""
    a = ["--normalization", spec.normalization, "--position-embedding-type", spec.position_embedding_type]
    if spec.position_embedding_type == "rope":
        a += ["--rotary-base", str(spec.rotary_base)]
    if not spec.add_bias_linear:
        a.append("--disable-bias-linear")
        if spec.add_qkv_bias:
            a.append("--add-qkv-bias")  # Megatron turns add_qkv_bias on with add_bias_linear
    if spec.qk_layernorm:
        a.append("--qk-layernorm")
    return a


def _mla_rope_args(spec: ModelSpec, fmt: str) -> list[str]:
    """MLA's YaRN rotary scaling. Megatron-LM: --rotary-scaling-factor, --mscale, --mscale-all-dim (core_v0.12.1
    and HEAD _add_mla_args; its MLA always applies YaRN, original length 4096 fixed in MLATransformerConfig,
    and a factor of 1 is plain RoPE). MindSpeed-LLM's own MLA reads its --rope-scaling-* flags instead
    (mindspeed_llm features_manager MLA feature; examples/mcore/deepseek3/pretrain_deepseek3_671b_4k_ptd.sh
    ROPE_ARGS), with YaRN only when --rope-scaling-type yarn is given."""
    names = ("rotary_scaling_factor", "mscale", "mscale_all_dim")
    if fmt != "mindspeed":
        return [x for n in names if getattr(spec, n) is not None
                for x in ("--" + n.replace("_", "-"), _num(getattr(spec, n)))]
    if spec.rotary_scaling_factor is None or spec.rotary_scaling_factor == 1:
        return []
    a = ["--rope-scaling-type", "yarn", "--rope-scaling-factor", _num(spec.rotary_scaling_factor),
         "--rope-scaling-original-max-position-embeddings", "4096"]
    for n, flag in (("mscale", "--rope-scaling-mscale"), ("mscale_all_dim", "--rope-scaling-mscale-all-dim")):
        if getattr(spec, n) is not None:
            a += [flag, _num(getattr(spec, n))]
    return a


def _router_args(spec: ModelSpec) -> list[str]:
    """The router's score function, expert bias, scaling and group routing (Megatron-Core's --moe-router-*
    flags, in both core_v0.12.1 and HEAD; defaults softmax, no bias, no scaling, no groups)."""
    a = ["--moe-router-score-function", spec.moe_router_score_function]
    if spec.moe_router_pre_softmax:
        a.append("--moe-router-pre-softmax")
    if spec.moe_router_enable_expert_bias:
        a.append("--moe-router-enable-expert-bias")
    if spec.moe_router_topk_scaling_factor is not None:
        a += ["--moe-router-topk-scaling-factor", _num(spec.moe_router_topk_scaling_factor)]
    if spec.moe_router_num_groups is not None:
        a += ["--moe-router-num-groups", str(spec.moe_router_num_groups),
              "--moe-router-group-topk", str(spec.moe_router_group_topk)]
    return a


def launch_args(config: dict | TrainingConfig, spec: ModelSpec, fmt: str = "megatron",
                scale_up_domain: int | None = None) -> list[str]:
    """Argument tokens of the training script for one config of ``spec`` (``fmt``: megatron | mindspeed).

    ``scale_up_domain``: the cluster's devices per scale-up domain (where known), which decides whether
    the EP dispatch algorithm matters and the Ulysses degree of ``cp_comm_type=a2a+p2p``. Raises
    ``InexpressibleError`` (a ``ValueError``) naming every option the format cannot express."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    cfg = _config(config)
    e = express(cfg, spec, fmt, scale_up_domain)
    if e.refusals:
        raise InexpressibleError(fmt, e.refusals)
    g = e.groups
    split = e.split.flags
    if cfg.pp == 1 and "--num-virtual-stages-per-pipeline-rank" in split:
        # Older Megatron-LM releases assert this flag only with pipeline parallelism; with pp 1 it
        # states nothing (one stage, one chunk)
        i = split.index("--num-virtual-stages-per-pipeline-rank")
        split = split[:i] + split[i + 2:]
    a = ["--tensor-model-parallel-size", str(cfg.tp), "--pipeline-model-parallel-size", str(cfg.pp), *split,
         *g["schedule"],
         "--context-parallel-size", str(cfg.cp), "--expert-model-parallel-size", str(cfg.ep),
         "--expert-tensor-parallel-size", str(cfg.etp),
         "--micro-batch-size", str(cfg.micro_batch_size), "--global-batch-size", str(cfg.global_batch_size)]
    if cfg.sp:
        a.append("--sequence-parallel")
    a += g["recompute"] + g.get("offload", []) + g["sharding"] + g["optimizer"] + g["tp_overlap"] + g["context_parallel"] + g["moe"]
    a += ["--bf16", *g["precision"], *g.get("memory_savings", [])]
    if fmt == "megatron":
        a += g["attention"]  # --attention-backend unfused where planned (search/frameworks/options.py _attention)
    if fmt == "mindspeed":
        # MindSpeed fused kernels, as in MindSpeed-LLM's recipes (pretrain_deepseek3_671b_4k_ptd.sh):
        # "--use-flash-attn" unless the plan is unfused attention (search/frameworks/options.py _attention),
        # "--use-fused-rmsnorm" (MindSpeed mindspeed/arguments.py, features_manager/megatron_basic/megatron_basic.py)
        a += g["attention"] + (["--use-fused-rmsnorm"] if spec.normalization == "RMSNorm" else [])
    return a + _model_args(spec, fmt, e.split.num_layers, e.split.real, cfg.tp)


# Environment the exported flags need, keyed by the flag that needs it. Megatron-LM's validate_args
# (core_v0.16.1 megatron/training/arguments.py) asserts NVTE_CPU_OFFLOAD_V1=1 with fine-grained activation
# offloading on Transformer Engine >= 2.10, "to avoid offloading weights".
LAUNCH_ENV = {"--fine-grained-activation-offloading": {"NVTE_CPU_OFFLOAD_V1": "1"}}
ENV_HEADER = "X-Launch-Env"  # the launch route's header for them: space-separated KEY=VALUE


def launch_env(tokens: list[str]) -> dict[str, str]:
    """Environment variables the launch of ``tokens`` needs (empty for most configs)."""
    env: dict[str, str] = {}
    for flag, needs in LAUNCH_ENV.items():
        if flag in tokens:
            env.update(needs)
    return env


def env_note(env: dict[str, str]) -> str:
    """The one-line reminder the CLI prints on stderr (the arguments on stdout stay pipeable)."""
    return "note: launch with " + " ".join(f"{k}={v}" for k, v in env.items()) + " in the environment " \
           "(Megatron-LM asserts it for these flags)"


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

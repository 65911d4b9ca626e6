"""The exported launch builds the planned model and split.

Each export is read back the way the framework reads it: the flags parsed with the framework's own defaults
for the model's options (Megatron-LM's are GPT-2's: LayerNorm, learned absolute positions, biases on, GeLU,
tied embeddings, softmax router), the vocabulary padded by Megatron's rule, no-op layers removed, and the
pipeline split derived as Megatron derives it. The result must reproduce the preset: layers, widths, heads,
groups, experts, router, normalization, position embedding, biases, and each virtual stage's layers.

Defaults and rules quoted from NVIDIA/Megatron-LM megatron/training/arguments.py and
megatron/core/transformer/transformer_config.py at d98e8a64ddf34856e74b24714e3bedb2f5a39553 (the same at
core_v0.12.1 a845aa7e12b3a117e24c2352b9e3e60bad2e3a17, which MindSpeed-LLM runs, for every flag read here).
This is not Megatron's own validate_args (which needs torch and Megatron-LM's training package; the
megatron-core wheel on PyPI ships megatron/core only): it checks the architecture and the split, and the
rules of validate_args this export must meet are listed in ``megatron_rules``.
"""

from __future__ import annotations

import argparse
import functools
import math

import pytest

from app.formats.inputs import load_cluster, load_model
from app.formats.launch import launch_args
from costmodel import TrainingConfig
from costmodel.pipeline import parse_layout
from model_presets import names
from search import SearchRequest, run_search
from search.frameworks import stage_tokens

# tests/test_megatron_validate.py reads this module's searches (top_configs, cached in the process):
# one xdist group runs both modules on one worker, so the searches run once (tests/README.md)
pytestmark = pytest.mark.xdist_group("launch-searches")


def _parser() -> argparse.ArgumentParser:
    """The model flags with Megatron-LM's defaults (arguments.py), the rest ignored."""
    p = argparse.ArgumentParser(add_help=False)
    add = p.add_argument
    for name in ("--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--num-query-groups",
                 "--kv-channels", "--seq-length", "--max-position-embeddings", "--q-lora-rank", "--kv-lora-rank",
                 "--qk-pos-emb-head-dim", "--num-experts", "--moe-ffn-hidden-size",
                 "--moe-shared-expert-intermediate-size", "--mtp-num-layers", "--vocab-size", "--padded-vocab-size",
                 "--moe-router-num-groups", "--moe-router-group-topk", "--num-layers-per-virtual-pipeline-stage",
                 "--num-virtual-stages-per-pipeline-rank", "--decoder-first-pipeline-num-layers",
                 "--decoder-last-pipeline-num-layers", "--tensor-model-parallel-size",
                 "--pipeline-model-parallel-size"):
        add(name, type=int, default=None)
    add("--qk-head-dim", type=int, default=128)
    add("--v-head-dim", type=int, default=128)
    add("--moe-router-topk", type=int, default=2)
    add("--rotary-base", type=int, default=10000)
    add("--make-vocab-size-divisible-by", type=int, default=128)
    add("--normalization", default="LayerNorm", choices=["LayerNorm", "RMSNorm"])
    add("--position-embedding-type", default="learned_absolute",
        choices=["learned_absolute", "rope", "yarn", "mrope", "relative", "none"])
    add("--disable-bias-linear", action="store_false", dest="add_bias_linear")
    add("--add-qkv-bias", action="store_true")
    for flag in ("--group-query-attention", "--swiglu", "--untie-embeddings-and-output-weights",
                 "--multi-latent-attention", "--qk-layernorm", "--moe-router-pre-softmax",
                 "--moe-router-enable-expert-bias", "--account-for-embedding-in-pipeline-split",
                 "--account-for-loss-in-pipeline-split"):
        add(flag, action="store_true")
    add("--moe-router-score-function", default="softmax", choices=["softmax", "sigmoid"])
    add("--moe-router-topk-scaling-factor", type=float, default=None)
    add("--rotary-scaling-factor", type=float, default=1.0)
    add("--mscale", type=float, default=1.0)
    add("--mscale-all-dim", type=float, default=0.0)
    # MindSpeed-LLM's MLA YaRN flags (its MLA feature: --rope-scaling-factor default 1.0, no YaRN without the type)
    add("--rope-scaling-type", default=None)
    add("--rope-scaling-factor", type=float, default=1.0)
    add("--rope-scaling-mscale", type=float, default=1.0)
    add("--rope-scaling-mscale-all-dim", type=float, default=0.0)
    add("--moe-layer-freq", default="1")
    add("--noop-layers", default=None)
    add("--pipeline-model-parallel-layout", default=None)
    return p


def read_back(tokens: list[str], fmt: str) -> tuple[dict, argparse.Namespace]:
    """The architecture the framework builds from ``tokens``, in ModelSpec's terms."""
    a, _ = _parser().parse_known_args(tokens)
    noop = {int(x) for x in a.noop_layers.split(",")} if a.noop_layers else set()
    real = [i for i in range(a.num_layers) if i not in noop]
    # arguments.py moe_freq_type: an int, or a python expression evaluated to a list
    freq = a.moe_layer_freq
    pattern = eval(freq) if freq.startswith(("[", "(")) else int(freq)  # noqa: S307 - as Megatron does
    if isinstance(pattern, list):
        pattern = [pattern[i] for i in real]
    if a.padded_vocab_size is not None:
        vocab = a.padded_vocab_size
    else:  # megatron/core/tokenizers/utils/build_tokenizer.py vocab_size_with_padding
        multiple = a.make_vocab_size_divisible_by * a.tensor_model_parallel_size
        vocab = math.ceil(a.vocab_size / multiple) * multiple
    heads = a.num_attention_heads
    arch = {
        "num_layers": len(real), "hidden_size": a.hidden_size, "num_attention_heads": heads,
        "query_groups": a.num_query_groups if a.group_query_attention else heads,
        "ffn_hidden_size": a.ffn_hidden_size, "vocab_size": vocab, "seq_length": a.seq_length,
        "swiglu": a.swiglu, "untie_embeddings_and_output_weights": a.untie_embeddings_and_output_weights,
        "normalization": a.normalization, "position_embedding_type": a.position_embedding_type,
        "add_bias_linear": a.add_bias_linear,
        "add_qkv_bias": a.add_bias_linear or a.add_qkv_bias,  # arguments.py: bias on turns the QKV bias on
        "qk_layernorm": a.qk_layernorm, "multi_latent_attention": a.multi_latent_attention,
        "mtp_num_layers": a.mtp_num_layers or 0, "is_moe": a.num_experts is not None,
    }
    if a.position_embedding_type == "rope":
        arch["rotary_base"] = a.rotary_base
    if a.multi_latent_attention:
        arch.update(q_lora_rank=a.q_lora_rank, kv_lora_rank=a.kv_lora_rank, qk_head_dim=a.qk_head_dim,
                    qk_pos_emb_head_dim=a.qk_pos_emb_head_dim, v_head_dim=a.v_head_dim)
        if fmt == "mindspeed":
            yarn = a.rope_scaling_type == "yarn"
            arch["rope_scaling"] = (a.rope_scaling_factor if yarn else 1.0, a.rope_scaling_mscale,
                                    a.rope_scaling_mscale_all_dim if yarn else None)
        else:
            arch["rope_scaling"] = (a.rotary_scaling_factor, a.mscale, a.mscale_all_dim)
    else:
        arch["head_dim"] = a.kv_channels or a.hidden_size // heads
    if a.num_experts is not None:
        arch.update(num_experts=a.num_experts, moe_router_topk=a.moe_router_topk,
                    expert_ffn=a.moe_ffn_hidden_size or a.ffn_hidden_size,
                    moe_shared_expert_intermediate_size=a.moe_shared_expert_intermediate_size or 0,
                    moe_layer_pattern=pattern if isinstance(pattern, list)
                    else [1 if i % pattern == 0 else 0 for i in range(len(real))],
                    moe_router_score_function=a.moe_router_score_function,
                    moe_router_pre_softmax=a.moe_router_pre_softmax,
                    moe_router_enable_expert_bias=a.moe_router_enable_expert_bias,
                    moe_router_topk_scaling_factor=a.moe_router_topk_scaling_factor,
                    moe_router_num_groups=a.moe_router_num_groups, moe_router_group_topk=a.moe_router_group_topk)
    return arch, a


def planned(spec) -> dict:
    """The same facts of the preset, as the cost model planned them."""
    arch = {
        "num_layers": spec.num_layers, "hidden_size": spec.hidden_size, "num_attention_heads": spec.num_attention_heads,
        "query_groups": spec.query_groups, "ffn_hidden_size": spec.ffn_hidden_size, "vocab_size": spec.vocab_size,
        "seq_length": spec.seq_length, "swiglu": spec.swiglu,
        "untie_embeddings_and_output_weights": spec.untie_embeddings_and_output_weights,
        "normalization": spec.normalization, "position_embedding_type": spec.position_embedding_type,
        "add_bias_linear": spec.add_bias_linear, "add_qkv_bias": spec.add_bias_linear or spec.add_qkv_bias,
        "qk_layernorm": spec.qk_layernorm, "multi_latent_attention": spec.multi_latent_attention,
        "mtp_num_layers": spec.mtp_num_layers, "is_moe": spec.is_moe,
    }
    if spec.position_embedding_type == "rope":
        arch["rotary_base"] = spec.rotary_base
    if spec.multi_latent_attention:
        arch.update(q_lora_rank=spec.q_lora_rank, kv_lora_rank=spec.kv_lora_rank, qk_head_dim=spec.qk_head_dim,
                    qk_pos_emb_head_dim=spec.qk_pos_emb_head_dim, v_head_dim=spec.v_head_dim)
        factor = spec.rotary_scaling_factor if spec.rotary_scaling_factor is not None else 1.0
        arch["rope_scaling"] = (factor, 1.0 if spec.mscale is None else spec.mscale,
                                None if factor == 1.0 and spec.mscale_all_dim is None else
                                (spec.mscale_all_dim or 0.0))
    else:
        arch["head_dim"] = spec.head_dim
    if spec.is_moe:
        arch.update({k: getattr(spec, k) for k in (
            "num_experts", "moe_router_topk", "expert_ffn", "moe_shared_expert_intermediate_size",
            "moe_router_score_function", "moe_router_pre_softmax", "moe_router_enable_expert_bias",
            "moe_router_topk_scaling_factor", "moe_router_num_groups", "moe_router_group_topk")},
            moe_layer_pattern=spec.moe_layer_pattern())
    return arch


def _compare(spec, tokens: list[str], fmt: str) -> argparse.Namespace:
    got, a = read_back(tokens, fmt)
    want = planned(spec)
    if fmt == "megatron" and want.get("rope_scaling", (None, None, None))[2] is None and "rope_scaling" in got:
        got["rope_scaling"] = got["rope_scaling"][:2] + (None,)  # no YaRN: mscale_all_dim has no effect
    if fmt == "mindspeed" and "rope_scaling" in got and got["rope_scaling"][0] == 1.0:
        want["rope_scaling"] = (1.0, got["rope_scaling"][1], None)
    diff = {k: (got.get(k), want[k]) for k in want if got.get(k) != want[k]}
    assert not diff, f"{fmt} export of {spec.name} builds another model: {diff}"
    return a


def megatron_stage_counts(a: argparse.Namespace, spec, cfg: TrainingConfig) -> list[int]:
    """Decoder layers per virtual stage (model order) as Megatron-LM places them from the split flags
    (arguments.py validate_args and transformer_config.py: a layout states them; first/last stage counts
    with the rest even over the middle ranks, each rank even over its vpp chunks; else every virtual stage
    holds (layers + embedding + loss slots) / (pp·vpp), the embedding and loss taking one on the first and
    the last)."""
    pp = cfg.pp
    if a.pipeline_model_parallel_layout is not None:
        return [t.count("t") for t in parse_layout(a.pipeline_model_parallel_layout)]
    if pp == 1:
        return [spec.num_layers]
    if a.decoder_first_pipeline_num_layers is not None or a.decoder_last_pipeline_num_layers is not None:
        vpp = a.num_virtual_stages_per_pipeline_rank or 1
        fixed = {0: a.decoder_first_pipeline_num_layers, pp - 1: a.decoder_last_pipeline_num_layers}
        fixed = {r: n for r, n in fixed.items() if n is not None}
        rest, middle = spec.num_layers - sum(fixed.values()), pp - len(fixed)
        assert all(n % vpp == 0 for n in fixed.values()), "transformer_config.py: first/last layers % vpp"
        assert middle == 0 or (rest % middle == 0 and (rest // middle) % vpp == 0), "middle layers % (ranks, vpp)"
        per_rank = [fixed.get(r, rest // middle if middle else 0) for r in range(pp)]
        return [per_rank[v % pp] // vpp for v in range(pp * vpp)]
    slots = spec.num_layers + a.account_for_embedding_in_pipeline_split + a.account_for_loss_in_pipeline_split
    assert slots % pp == 0, "arguments.py: layers (+ embedding, loss) divisible by pp"
    per_stage = a.num_layers_per_virtual_pipeline_stage or slots // pp
    stages = slots // per_stage
    counts = [per_stage] * stages
    counts[0] -= a.account_for_embedding_in_pipeline_split
    counts[-1] -= a.account_for_loss_in_pipeline_split
    return counts


def megatron_rules(a: argparse.Namespace, tokens: list[str], cfg: TrainingConfig) -> None:
    """validate_args / TransformerConfig rules on the exported flags (HEAD d98e8a64)."""
    split = [x for x in ("--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
                         "--pipeline-model-parallel-layout") if x in tokens]
    assert len(split) <= 1, f"arguments.py: no more than one of {split}"
    if a.decoder_first_pipeline_num_layers is not None or a.decoder_last_pipeline_num_layers is not None:
        assert "--num-layers-per-virtual-pipeline-stage" not in tokens  # "please use --num-virtual-stages-..."
    # the interleaved schedule with pp <= 2 needs p2p overlap, which is on unless --no-overlap-p2p-communication
    assert "--no-overlap-p2p-communication" not in tokens
    if "--overlap-param-gather" in tokens:
        assert "--overlap-grad-reduce" in tokens and ("--use-distributed-optimizer" in tokens)
    if a.mtp_num_layers:
        assert a.position_embedding_type in ("rope", "none"), "MTP needs rope or no position embedding"
    if a.num_experts is not None and a.add_bias_linear:
        assert cfg.etp == 1, "Bias in Moe is only supported when ETP==1"
    if a.moe_router_enable_expert_bias:
        assert a.moe_router_score_function == "sigmoid"
    if "--fp8-format" in tokens and cfg.recompute == "selective" and \
            {"layernorm", "moe_act"} & set(cfg.recompute_modules or []):
        i = tokens.index("--fp8-recipe")
        assert tokens[i + 1] != "delayed", "Delayed scaling does not support moe_act and layernorm recompute"
    if "--overlap-moe-expert-parallel-comm" in tokens:
        assert cfg.recompute != "full" and "moe" not in (cfg.recompute_modules or [])
        assert cfg.pp == 1 or cfg.vpp > 1


def check(spec, cfg: dict, fmt: str, domain: int | None) -> None:
    c = TrainingConfig.model_validate(cfg)
    tokens = launch_args(c, spec, fmt, domain)
    a = _compare(spec, tokens, fmt)
    want = [t.count("t") for t in stage_tokens(c, spec)]
    if fmt == "megatron":
        megatron_rules(a, tokens, c)
        assert megatron_stage_counts(a, spec, c) == want
    elif a.pipeline_model_parallel_layout is not None:
        assert [t.count("t") for t in parse_layout(a.pipeline_model_parallel_layout)] == want
    else:  # no-op padding: real layers of each padded virtual stage
        noop = {int(x) for x in a.noop_layers.split(",")} if a.noop_layers else set()
        per = a.num_layers // len(want)
        assert [sum(i not in noop for i in range(v * per, (v + 1) * per)) for v in range(len(want))] == want


# ---- every preset's best config -------------------------------------------------------------------

# (cluster, devices, global batch size) per preset: the README's and the issues' runs where there is one
RUNS = {
    "deepseek-v3-671b": ("nvidia-h100-80gb", 1024, 4096), "gpt-1.3b": ("nvidia-h100-80gb", 8, 64),
    "gpt3-175b": ("nvidia-h100-80gb", 512, 1536), "llama3-405b": ("nvidia-h100-80gb", 2048, 2048),
    "llama3-70b": ("nvidia-h100-80gb", 512, 1024), "mixtral-8x22b": ("nvidia-h100-80gb", 256, 1024),
    "pangu-ultra-moe-718b": ("ascend-910b", 6144, 7680), "qwen3-235b-a22b": ("nvidia-h100-80gb", 512, 2048),
    "tiny-dense": ("nvidia-h100-80gb", 8, 64), "tiny-mla-moe": ("nvidia-h100-80gb", 32, 64),
    "tiny-moe": ("nvidia-h100-80gb", 8, 64),
}


def test_every_preset_has_a_run():
    assert sorted(RUNS) == names()


@functools.lru_cache(maxsize=None)
def top_configs(preset: str, fmt: str) -> tuple[dict, ...]:
    """The feasible configs among the top 3 of a search of ``preset`` planned for ``fmt`` (RUNS; also
    read by tests/test_megatron_validate.py)."""
    cluster, devices, gbs = RUNS[preset]
    spec, profile = load_model(preset), load_cluster(cluster)
    result = run_search(SearchRequest(spec=spec, profile=profile, devices=devices, global_batch_size=gbs,
                                      sampler="tpe", n_trials=40, seed=7, top_k=3, framework=fmt))
    return tuple(e["config"] for e in result["top"] if e["evaluation"]["feasible"])


@pytest.mark.parametrize("fmt", ["megatron", "mindspeed"])
@pytest.mark.parametrize("preset", sorted(RUNS))
def test_best_config_of_each_preset_builds_the_preset(preset, fmt):
    configs = top_configs(preset, fmt)
    assert configs, f"no feasible config of {preset} on {RUNS[preset]}"
    profile = load_cluster(RUNS[preset][0])
    for cfg in configs:
        check(load_model(preset), cfg, fmt, int(profile.fact("scale_up_domain")))


# ---- one config of each pipeline-split kind --------------------------------------------------------

SPLITS = {
    "one stage": {"tp": 2, "pp": 1},
    "even, vpp": {"tp": 2, "pp": 4, "vpp": 2, "account_for_embedding_in_pipeline_split": True,
                  "account_for_loss_in_pipeline_split": True},  # 61 + 2 slots do not divide by 8: a layout
    "first only, exact": {"tp": 2, "pp": 4, "first_stage_layers": 16},  # 45 over 3 ranks
    "account for both, divides": {"tp": 2, "pp": 7, "account_for_embedding_in_pipeline_split": True,
                                  "account_for_loss_in_pipeline_split": True},  # 63 slots over 7
    "first/last exact": {"tp": 2, "pp": 8, "first_stage_layers": 7, "last_stage_layers": 6},
    "first/last, not by vpp": {"tp": 2, "pp": 8, "vpp": 2, "first_stage_layers": 7, "last_stage_layers": 6},
    "first only, vpp": {"tp": 2, "pp": 4, "vpp": 3, "first_stage_layers": 10},
    "layout": {"tp": 2, "pp": 16, "vpp": 2, "pipeline_layout": "Et|(tt|)*30mL"},
    "uneven spread": {"tp": 2, "pp": 16},
}


@pytest.mark.parametrize("fmt", ["megatron", "mindspeed"])
@pytest.mark.parametrize("kind", list(SPLITS))
def test_each_pipeline_split_kind_is_launched_as_planned(kind, fmt):
    spec = load_model("deepseek-v3-671b")
    cfg = {"ep": 8, "global_batch_size": 4096, "moe_a2a_algorithm": "flat", **SPLITS[kind]}
    cfg = {k: v for k, v in cfg.items() if v is not None}
    check(spec, cfg, fmt, 8)


def test_dense_pipeline_splits_with_vpp():
    spec = load_model("llama3-70b")  # 80 layers: 4 ranks of 2 chunks of 10; first/last 20 and 20, 2 chunks each
    for cfg in ({"tp": 8, "pp": 4, "vpp": 2}, {"tp": 8, "pp": 4, "vpp": 2, "first_stage_layers": 20,
                                                 "last_stage_layers": 20}):
        for fmt in ("megatron", "mindspeed"):
            check(spec, {**cfg, "global_batch_size": 1024}, fmt, 8)
    tokens = launch_args({"tp": 8, "pp": 4, "vpp": 2, "first_stage_layers": 20, "last_stage_layers": 20,
                          "global_batch_size": 1024}, spec, "megatron", 8)
    assert "--decoder-first-pipeline-num-layers" in tokens  # exact: stated as Megatron's own flags


# ---- the rules Megatron applies to a pasted launch --------------------------------------------------

def test_the_vocabulary_is_not_padded_beyond_the_plan():
    spec = load_model("qwen3-235b-a22b")  # 151,936 = 2^7 · 1187: Megatron's default would pad it at tp 2 and up
    for tp in (1, 2, 4, 8):
        got, _ = read_back(launch_args({"tp": tp, "ep": 8, "global_batch_size": 1024}, spec, "megatron", 8),
                           "megatron")
        assert got["vocab_size"] == 151936, tp


def test_fp8_states_the_recipe_its_recompute_needs():
    spec = load_model("tiny-moe")
    base = {"tp": 2, "ep": 2, "global_batch_size": 64, "precision": "fp8"}
    f = launch_args(base, spec, "megatron", 8)
    assert f[f.index("--fp8-recipe") + 1] == "delayed"
    for module in ("layernorm", "moe_act"):
        cfg = {**base, "recompute": "selective", "recompute_modules": ["core_attn", module]}
        f = launch_args(cfg, spec, "megatron", 8)
        assert f[f.index("--fp8-recipe") + 1] == "tensorwise", module


def test_param_gather_overlap_is_never_emitted_without_grad_reduce_overlap():
    from app.formats.launch import InexpressibleError
    spec = load_model("tiny-dense")
    cfg = {"tp": 2, "global_batch_size": 64, "overlap_grad_reduce": False}
    with pytest.raises(InexpressibleError, match="overlap_param_gather"):
        launch_args(cfg, spec, "megatron")
    tokens = launch_args({**cfg, "overlap_param_gather": False}, spec, "megatron")
    assert "--overlap-param-gather" not in tokens and "--overlap-grad-reduce" not in tokens


def test_moe_biases_need_etp_1():
    from search.frameworks import refusals
    spec = load_model({"base": "tiny-moe", "add_bias_linear": True, "position_embedding_type": "rope"})
    assert not refusals(TrainingConfig(tp=2, ep=2, etp=1, global_batch_size=64), spec, "megatron", 8)
    assert [r.field for r in refusals(TrainingConfig(tp=2, ep=2, etp=2, global_batch_size=64), spec,
                                      "megatron", 8)] == ["etp"]

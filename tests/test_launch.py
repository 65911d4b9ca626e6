"""Launch arguments (app/formats/launch.py, `paraplan export`, `GET /v1/jobs/{id}/configs/{rank}/launch`).

Every flag emitted must be a real argument of the framework: the lists below are copied from the
frameworks' sources (named with their commits), and the values must be what the config says.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from app.cli import main
from app.formats.inputs import load_cluster, load_model
from app.formats.launch import InexpressibleError, flags, format_args, launch_args, layout_string, stage_tokens
from costmodel import TrainingConfig, evaluate
from costmodel.pipeline import parse_layout
from search import SearchRequest, run_search

from service_util import TINY_JOB, Server, wait_for

ROOT = Path(__file__).resolve().parents[1]

# Megatron-LM argument names, copied from NVIDIA/Megatron-LM megatron/training/arguments.py at commit
# 67f3515c8a0539d38c23f59dd8b85efdcbb3af3d (2026-01-29, the last commit that still spells every parallel
# flag out as a literal add_argument); --micro-batch-size and --global-batch-size are generated at that
# commit by ArgumentGroupFactory(TrainingConfig) from megatron/training/training_config.py's fields
# micro_batch_size / global_batch_size.
MEGATRON_ARGS = [
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--num-layers-per-virtual-pipeline-stage",
    "--num-virtual-stages-per-pipeline-rank", "--expert-model-parallel-size", "--expert-tensor-parallel-size",
    "--context-parallel-size", "--sequence-parallel", "--recompute-granularity", "--recompute-method",
    "--recompute-num-layers", "--recompute-modules", "--use-distributed-optimizer", "--overlap-grad-reduce",
    "--overlap-param-gather", "--micro-batch-size", "--global-batch-size", "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers", "--account-for-embedding-in-pipeline-split",
    "--account-for-loss-in-pipeline-split", "--pipeline-model-parallel-layout", "--tp-comm-overlap",
    "--overlap-moe-expert-parallel-comm", "--moe-token-dispatcher-type", "--moe-grouped-gemm", "--fp8-format",
    "--bf16", "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads",
    "--group-query-attention", "--num-query-groups", "--kv-channels", "--seq-length", "--max-position-embeddings",
    "--swiglu", "--untie-embeddings-and-output-weights", "--multi-latent-attention", "--q-lora-rank",
    "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim", "--num-experts",
    "--moe-router-topk", "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size", "--moe-layer-freq",
    "--mtp-num-layers", "--vocab-size", "--padded-vocab-size",
    # the same commit: the flex dispatcher's backend, the CP algorithm, the precision-aware optimizer, Megatron-FSDP
    "--moe-flex-dispatcher-backend", "--cp-comm-type", "--hierarchical-context-parallel-sizes",
    "--use-precision-aware-optimizer", "--main-grads-dtype", "--exp-avg-dtype", "--exp-avg-sq-dtype",
    "--use-megatron-fsdp", "--data-parallel-sharding-strategy",
    # the same commit, literal add_argument (arguments.py L3100): the EP overlap's delayed weight gradients
    "--delay-wgrad-compute",
    # NVIDIA/Megatron-LM megatron/training/arguments.py at d98e8a64ddf34856e74b24714e3bedb2f5a39553 (its default
    # "auto" is the bf16 model dtype, so the export states the planned gradient dtype)
    "--megatron-fsdp-main-grads-dtype",
    # the model's architecture and router, the fp8 recipe and the vocabulary padding: literal add_argument
    # calls at 67f3515c (and at core_v0.12.1 a845aa7e); generated from TransformerConfig at d98e8a64
    "--normalization", "--position-embedding-type", "--rotary-base", "--disable-bias-linear", "--add-qkv-bias",
    "--qk-layernorm", "--rotary-scaling-factor", "--mscale", "--mscale-all-dim", "--moe-router-score-function",
    "--moe-router-pre-softmax", "--moe-router-enable-expert-bias", "--moe-router-topk-scaling-factor",
    "--moe-router-num-groups", "--moe-router-group-topk", "--fp8-recipe", "--make-vocab-size-divisible-by",
    # activation offload: generated from megatron/core/transformer/transformer_config.py's fields
    # fine_grained_activation_offloading and offload_modules (core_v0.16.1, 55ac7082, lines 889 and 894)
    "--fine-grained-activation-offloading", "--offload-modules",
]

# MindSpeed-LLM argument names. Megatron (core 0.12.1, which MindSpeed-LLM runs on) names as MindSpeed-LLM's
# own recipe uses them: Ascend/MindSpeed-LLM examples/mcore/deepseek3/pretrain_deepseek3_671b_4k_ptd.sh at
# commit c77308a14bfcb1aa7ca61da9c1aa24a893cb1b91 (and --num-layers-per-virtual-pipeline-stage,
# --recompute-granularity selective, --overlap-grad-reduce, --overlap-param-gather, --group-query-attention,
# --num-query-groups, --kv-channels from the same repository's examples/mcore/*/pretrain_*.sh) ...
MINDSPEED_MEGATRON_ARGS = [
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--num-layers-per-virtual-pipeline-stage",
    "--expert-model-parallel-size", "--expert-tensor-parallel-size", "--context-parallel-size",
    "--sequence-parallel", "--recompute-granularity", "--recompute-method", "--recompute-num-layers",
    "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather", "--micro-batch-size",
    "--global-batch-size", "--moe-token-dispatcher-type", "--moe-grouped-gemm", "--bf16", "--num-layers",
    "--hidden-size", "--ffn-hidden-size", "--num-attention-heads", "--group-query-attention", "--num-query-groups",
    "--kv-channels", "--seq-length", "--max-position-embeddings", "--swiglu",
    "--untie-embeddings-and-output-weights", "--multi-latent-attention", "--q-lora-rank", "--kv-lora-rank",
    "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim", "--num-experts", "--moe-router-topk",
    "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size", "--moe-layer-freq", "--mtp-num-layers",
    "--vocab-size", "--padded-vocab-size",
    # core_v0.12.1 (a845aa7e12b3a117e24c2352b9e3e60bad2e3a17) megatron/training/arguments.py:1568
    "--recompute-modules",
    # core_v0.12.1 arguments.py, as the DeepSeek-V3 recipe above uses them (GPT_ARGS, MLA_ARGS, MOE_ARGS)
    "--normalization", "--position-embedding-type", "--rotary-base", "--disable-bias-linear", "--add-qkv-bias",
    "--qk-layernorm", "--moe-router-score-function", "--moe-router-pre-softmax", "--moe-router-enable-expert-bias",
    "--moe-router-topk-scaling-factor", "--moe-router-num-groups", "--moe-router-group-topk",
]
# ... and MindSpeed's own, from Ascend/MindSpeed at commit 028de58ca629d035185b00ff7d1eb7eff4f7fd48:
MINDSPEED_OWN_ARGS = [
    "--use-ascend-mc2",                    # mindspeed/arguments.py _add_coc_args; features_manager/tensor_parallel/mc2.py
    "--moe-alltoall-overlap-comm",         # mindspeed/arguments.py; features_manager/moe/moe_alltoall_overlap.py
    "--noop-layers",                       # mindspeed/arguments.py ("Specity the noop layers.")
    "--use-fused-rmsnorm",                 # mindspeed/arguments.py; features_manager/megatron_basic/megatron_basic.py
    "--use-flash-attn",                    # features_manager/transformer/flash_attention/fusion_attention_v1_feature.py
    "--recompute-norm",                    # features_manager/recompute/norm_function.py
    "--recompute-activation-function",     # features_manager/recompute/activation_function.py
    "--fp8-format",                        # Megatron's, documented for MindSpeed in docs/zh/features/transformer_engine.md
    "--enable-recompute-layers-per-pp-rank",  # features_manager/recompute/enable_recompute_layers_per_pp_rank.py
    "--pipeline-model-parallel-layout",    # features_manager/pipeline_parallel/pipeline_model_parallel_layout_feature.py
    "--ulysses-degree-in-cp",              # features_manager/context_parallel/ulysses_context_parallel.py
    "--reuse-fp32-param",                  # features_manager/memory/reuse_fp32_param.py
    "--schedules-method",                  # features_manager/pipeline_parallel/dualpipev_feature.py (choices: dualpipev)
    "--moe-fb-overlap",                    # features_manager/moe/fb_overlap.py
    "--swap-attention", "--swap-modules",  # features_manager/memory/swap_attention.py (SwapAttentionFeature)
    # ... and MindSpeed-LLM's own, at c77308a14bfcb1aa7ca61da9c1aa24a893cb1b91:
    "--recompute-mla-up-proj", "--mla-up-proj-tp-overlap", "--mla-mm-split",  # .../multi_latent_attention/mla_feature.py
    "--context-parallel-algo",             # features_manager/context_parallel/context_parallel_feature.py
    # MLA's YaRN: the DeepSeek-V3 recipe's ROPE_ARGS (MindSpeed-LLM's MLA feature registers them)
    "--rope-scaling-type", "--rope-scaling-factor", "--rope-scaling-mscale", "--rope-scaling-mscale-all-dim",
    "--rope-scaling-original-max-position-embeddings",
    "--quant-states",                      # features_manager/low_precision/low_precision_optimizer_feature.py
]
# How MindSpeed-LLM recomputes each selective module (search/frameworks/ says why): through Megatron's
# --recompute-modules, or a flag of its own.
MINDSPEED_MODULE_FLAG = {"moe_act": "--recompute-activation-function", "mla_up_proj": "--recompute-mla-up-proj"}
MINDSPEED_ARGS = MINDSPEED_MEGATRON_ARGS + MINDSPEED_OWN_ARGS


@pytest.fixture(scope="module")
def pangu():
    return load_model("pangu-ultra-moe-718b")


def _pangu_search(pangu, framework):
    return run_search(SearchRequest(spec=pangu, profile=load_cluster("ascend-910b"), devices=6144,
                                    global_batch_size=7680, sampler="tpe", n_trials=100, seed=1, framework=framework))


@pytest.fixture(scope="module")
def pangu_best(pangu):
    """The best Pangu config planned for MindSpeed-LLM (the Ascend default)."""
    return _pangu_search(pangu, "mindspeed")["best"]["config"]


@pytest.fixture(scope="module")
def pangu_best_megatron(pangu):
    return _pangu_search(pangu, "megatron")["best"]["config"]


ASCEND_DOMAIN = 8  # devices per HCCS domain of ascend-910b (the profile's scale_up_domain)


def _one(f: dict, key: str) -> str:
    assert len(f[key]) == 1, (key, f[key])
    return f[key][0]


def check_common(tokens: list[str], cfg: dict, known: list[str]) -> dict:
    """Every flag known; the parallel sizes and batch values those of the config."""
    f = flags(tokens)
    unknown = [k for k in f if k not in known]
    assert not unknown, f"flags not in the framework's list: {unknown}"
    c = TrainingConfig.model_validate(cfg)
    assert _one(f, "--tensor-model-parallel-size") == str(c.tp)
    assert _one(f, "--pipeline-model-parallel-size") == str(c.pp)
    assert _one(f, "--context-parallel-size") == str(c.cp)
    assert _one(f, "--expert-model-parallel-size") == str(c.ep)
    assert _one(f, "--expert-tensor-parallel-size") == str(c.etp)
    assert _one(f, "--micro-batch-size") == str(c.micro_batch_size)
    assert _one(f, "--global-batch-size") == str(c.global_batch_size)
    assert ("--sequence-parallel" in f) == c.sp
    assert ("--use-distributed-optimizer" in f) == (c.sharding != "no_shard")
    assert "--bf16" in f
    assert ("--fp8-format" in f) == (c.precision == "fp8")
    if c.recompute == "none":
        assert "--recompute-granularity" not in f
    elif c.recompute == "full":
        assert _one(f, "--recompute-granularity") == "full"
    return f


def megatron_vpp(f: dict, spec, cfg: TrainingConfig) -> int:
    """The vpp Megatron derives from the flags (megatron/training/arguments.py validate_args)."""
    if "--pipeline-model-parallel-layout" in f:
        return len(parse_layout(_one(f, "--pipeline-model-parallel-layout"))) // cfg.pp
    if "--num-virtual-stages-per-pipeline-rank" in f:
        return int(_one(f, "--num-virtual-stages-per-pipeline-rank"))
    if cfg.pp == 1:  # one stage: no split flag, no virtual stages
        assert "--num-layers-per-virtual-pipeline-stage" not in f
        return 1
    slots = spec.num_layers + ("--account-for-embedding-in-pipeline-split" in f) + \
        ("--account-for-loss-in-pipeline-split" in f)
    assert slots % cfg.pp == 0
    return slots // cfg.pp // int(_one(f, "--num-layers-per-virtual-pipeline-stage"))


def check_megatron(spec, cfg: dict, domain: int | None = None) -> dict:
    tokens = launch_args(cfg, spec, "megatron", domain)
    f = check_common(tokens, cfg, MEGATRON_ARGS)
    c = TrainingConfig.model_validate(cfg)
    assert megatron_vpp(f, spec, c) == c.vpp
    assert _one(f, "--num-layers") == str(spec.num_layers)
    if c.recompute == "selective":
        assert _one(f, "--recompute-granularity") == "selective"
        assert f["--recompute-modules"] == (c.recompute_modules or ["core_attn"])
    # the split Megatron runs is the cost model's: a layout states it, or the flags give the same counts
    if "--pipeline-model-parallel-layout" in f:
        assert parse_layout(_one(f, "--pipeline-model-parallel-layout")) == stage_tokens(c, spec)
    assert ("--tp-comm-overlap" in f) == c.tp_comm_overlap
    assert ("--overlap-moe-expert-parallel-comm" in f) == (c.moe_a2a_overlap and spec.is_moe)
    return f


def check_mindspeed(spec, cfg: dict, domain: int | None = None) -> dict:
    tokens = launch_args(cfg, spec, "mindspeed", domain)
    f = check_common(tokens, cfg, MINDSPEED_ARGS)
    c = TrainingConfig.model_validate(cfg)
    if c.recompute == "selective":  # every planned module is recomputed, by one flag or the other
        for m in c.recompute_modules or ["core_attn"]:
            assert MINDSPEED_MODULE_FLAG[m] in f if m in MINDSPEED_MODULE_FLAG else m in f["--recompute-modules"], m
    if "--pipeline-model-parallel-layout" in f:  # splits no-op padding cannot place
        assert parse_layout(_one(f, "--pipeline-model-parallel-layout")) == stage_tokens(c, spec)
        assert "--noop-layers" not in f and "--num-layers-per-virtual-pipeline-stage" not in f
        return f
    layers = int(_one(f, "--num-layers"))
    dualpipev = c.schedule == "dualpipev"
    assert (_one(f, "--schedules-method") == "dualpipev") if dualpipev else "--schedules-method" not in f
    stages = 2 * c.pp if dualpipev else c.pp * c.vpp
    assert layers % stages == 0 and layers >= spec.num_layers
    noop = [int(x) for x in _one(f, "--noop-layers").split(",")] if "--noop-layers" in f else []
    assert layers - len(noop) == spec.num_layers
    per = layers // stages
    if c.vpp > 1:
        assert _one(f, "--num-layers-per-virtual-pipeline-stage") == str(per)
    # real (non-noop) layers per virtual stage are the cost model's counts
    counts = [sum(1 for i in range(v * per, (v + 1) * per) if i not in noop) for v in range(stages)]
    assert counts == [t.count("t") for t in stage_tokens(c, spec)]
    assert ("--use-ascend-mc2" in f) == c.tp_comm_overlap
    overlap = "--moe-fb-overlap" if dualpipev else "--moe-alltoall-overlap-comm"
    assert (overlap in f) == (c.moe_a2a_overlap and spec.is_moe)
    if dualpipev:  # MindSpeed's DualpipeVFeature refuses these with it
        assert "--overlap-grad-reduce" not in f and "--num-layers-per-virtual-pipeline-stage" not in f
    if spec.is_moe and isinstance(spec.moe_layer_freq, list):
        pattern = eval(_one(f, "--moe-layer-freq"))  # noqa: S307 - Megatron evaluates this expression too
        assert len(pattern) == layers and [pattern[i] for i in range(layers) if i not in noop] == spec.moe_layer_freq
    return f


def test_pangu_best_config(pangu, pangu_best, pangu_best_megatron):
    f = check_megatron(pangu, pangu_best_megatron, ASCEND_DOMAIN)
    assert "--multi-latent-attention" in f and _one(f, "--num-experts") == "256"
    assert _one(f, "--moe-layer-freq") == "([0]*3+[1]*58)"
    assert _one(f, "--mtp-num-layers") == "1" and _one(f, "--q-lora-rank") == "1536"
    m = check_mindspeed(pangu, pangu_best, ASCEND_DOMAIN)
    if "mla_up_proj" in (pangu_best.get("recompute_modules") or []):  # the option the old export dropped
        assert "--recompute-mla-up-proj" in m
        assert ("--mla-up-proj-tp-overlap" in m) == (pangu_best["tp"] > 1)


def test_unrestricted_pangu_configs_export_or_refuse(pangu):
    """Configs planned without a framework: each export states every planned choice or refuses naming one."""
    top = _pangu_search(pangu, None)["top"]
    for entry in top:
        for fmt, check in (("megatron", check_megatron), ("mindspeed", check_mindspeed)):
            try:
                check(pangu, entry["config"], ASCEND_DOMAIN)
            except InexpressibleError as exc:
                assert exc.refusals and all(r.field in TrainingConfig.model_fields for r in exc.refusals)
                assert exc.field in str(exc)


def test_pangu_example_config(pangu):
    """Huawei's plan (README): both overlaps with the moe recompute module, hierarchical dispatch across
    nodes. Neither framework runs that combination; each refusal names the options."""
    cfg = json.loads((ROOT / "examples" / "pangu-ultra-moe-6144.json").read_text())
    with pytest.raises(InexpressibleError, match="moe_a2a_overlap") as exc:
        launch_args(cfg, pangu, "megatron", ASCEND_DOMAIN)
    assert {r.field for r in exc.value.refusals} == {"moe_a2a_overlap"}
    with pytest.raises(InexpressibleError) as exc:
        launch_args(cfg, pangu, "mindspeed", ASCEND_DOMAIN)
    assert {r.field for r in exc.value.refusals} == {"recompute_modules", "moe_a2a_algorithm", "moe_a2a_overlap",
                                                     "tp_comm_overlap"}  # MC2 with grouped-GEMM experts
    # without the all-to-all overlap Megatron-LM runs it (DeepEP for the hierarchical dispatch) ...
    no_a2a = {**cfg, "moe_a2a_overlap": False}
    f = check_megatron(pangu, no_a2a, ASCEND_DOMAIN)
    # 61 layers + embedding + loss over pp·vpp = 32 virtual stages does not divide: a layout states it
    assert "--pipeline-model-parallel-layout" in f
    assert f["--moe-token-dispatcher-type"] == ["flex"] and f["--moe-flex-dispatcher-backend"] == ["deepep"]
    # ... and MindSpeed-LLM too with flat dispatch and no MC2: mla_up_proj and moe are recomputed, as planned
    m = check_mindspeed(pangu, {**no_a2a, "moe_a2a_algorithm": "flat", "tp_comm_overlap": False}, ASCEND_DOMAIN)
    assert "--use-ascend-mc2" not in m and "--moe-alltoall-overlap-comm" not in m
    assert m["--recompute-modules"] == ["layernorm", "moe"] and "--recompute-mla-up-proj" in m
    assert "--mla-up-proj-tp-overlap" in m and "--mla-mm-split" in m  # tp 8 (mla_feature.py)


def test_dense_llama_with_vpp():
    spec = load_model("llama3-70b")
    cfg = {"tp": 8, "pp": 4, "vpp": 5, "micro_batch_size": 1, "global_batch_size": 1024, "recompute": "selective"}
    f = check_megatron(spec, cfg)
    assert _one(f, "--num-layers-per-virtual-pipeline-stage") == "4"
    assert _one(f, "--num-query-groups") == "8" and "--group-query-attention" in f
    assert "--num-experts" not in f and "--moe-token-dispatcher-type" not in f
    m = check_mindspeed(spec, cfg)
    assert "--noop-layers" not in m and _one(m, "--num-layers") == "80"


def test_deepseek_layout_config():
    spec = load_model("deepseek-v3-671b")
    cfg = {"tp": 2, "pp": 16, "vpp": 2, "ep": 64, "micro_batch_size": 1, "global_batch_size": 4096,
           "pipeline_layout": "Et|(tt|)*30mL", "recompute": "full", "moe_a2a_overlap": True}
    res = evaluate(spec, load_cluster("nvidia-h100-80gb"), 2048, TrainingConfig(**cfg))
    assert res["step_time_s"] is not None, res["infeasible_reasons"]  # a structurally valid split
    # Megatron-LM disables full recompute with the EP all-to-all overlap (transformer_config.py)
    with pytest.raises(InexpressibleError, match="moe_a2a_overlap=true: Megatron-LM disables full recompute"):
        launch_args(cfg, spec, "megatron", 8)
    cfg["moe_a2a_overlap"] = False
    f = check_megatron(spec, cfg, 8)
    assert _one(f, "--pipeline-model-parallel-layout") == "Et|(tt|)*30mL"
    assert "--num-virtual-stages-per-pipeline-rank" not in f  # Megatron forbids it with a layout
    assert f["--recompute-method"] == ["uniform"] and f["--recompute-num-layers"] == ["1"]
    m = check_mindspeed(spec, {**cfg, "moe_a2a_algorithm": "flat"}, 8)
    assert _one(m, "--num-layers") == "64"  # 32 virtual stages of 2, three of them padded


def test_uneven_spread_and_first_last():
    spec = load_model("deepseek-v3-671b")
    even = {"tp": 2, "pp": 16, "ep": 64, "global_batch_size": 4096, "recompute": "full", "recompute_num_layers": 2}
    f = check_megatron(spec, even, 8)
    assert parse_layout(_one(f, "--pipeline-model-parallel-layout")) == stage_tokens(TrainingConfig(**even), spec)
    assert f["--recompute-method"] == ["block"] and f["--recompute-num-layers"] == ["2"]
    check_mindspeed(spec, {**even, "moe_a2a_algorithm": "flat"}, 8)
    # 7 + 6 * 8 + 6 = 61: Megatron's uneven split gives exactly the cost model's
    fl = {"tp": 2, "pp": 8, "ep": 64, "global_batch_size": 4096, "first_stage_layers": 7, "last_stage_layers": 6}
    f = check_megatron(spec, fl, 8)
    assert _one(f, "--decoder-first-pipeline-num-layers") == "7"
    assert _one(f, "--decoder-last-pipeline-num-layers") == "6"
    check_mindspeed(spec, {**fl, "moe_a2a_algorithm": "flat"}, 8)
    # with vpp 2 Megatron needs 7 and 6 divisible by vpp (transformer_config.py "Uneven PP"): a layout states it
    fl["vpp"] = 2
    f = check_megatron(spec, fl, 8)
    assert "--decoder-first-pipeline-num-layers" not in f and "--decoder-last-pipeline-num-layers" not in f
    assert parse_layout(_one(f, "--pipeline-model-parallel-layout")) == stage_tokens(TrainingConfig(**fl), spec)
    check_mindspeed(spec, {**fl, "moe_a2a_algorithm": "flat"}, 8)


def test_fp8_and_defaults():
    spec = load_model("llama3-70b")
    cfg = {"tp": 4, "pp": 2, "global_batch_size": 512, "precision": "fp8", "tp_comm_overlap": True,
           "distributed_optimizer": False}
    f = check_megatron(spec, cfg)
    assert f["--fp8-format"] == ["hybrid"] and "--tp-comm-overlap" in f
    assert "--overlap-param-gather" not in f  # Megatron asserts it needs the distributed optimizer
    assert _one(f, "--num-virtual-stages-per-pipeline-rank") == "1"
    assert f["--expert-tensor-parallel-size"] == ["1"]  # always: Megatron's default would be tp
    # MindSpeed's MC2 runs fp8 only with the mxfp8 recipe (transformer_engine_basic.py)
    with pytest.raises(InexpressibleError, match="tp_comm_overlap"):
        launch_args(cfg, spec, "mindspeed")
    check_mindspeed(spec, {**cfg, "tp_comm_overlap": False})


def test_layout_string_round_trip(pangu):
    tokens = stage_tokens(TrainingConfig(tp=8, pp=16, vpp=2, global_batch_size=7680,
                                         account_for_embedding_in_pipeline_split=True,
                                         account_for_loss_in_pipeline_split=True), pangu)
    assert parse_layout(layout_string(tokens)) == tokens
    assert math.fsum(t.count("t") for t in tokens) == 61


def test_format_args_one_flag_per_line(pangu, pangu_best_megatron):
    text = format_args(launch_args(pangu_best_megatron, pangu, "megatron", ASCEND_DOMAIN))
    lines = text.rstrip("\n").split(" \\\n")
    assert all(line.startswith("--") for line in lines)
    assert '--moe-layer-freq "([0]*3+[1]*58)"' in lines


# ---- CLI -----------------------------------------------------------------------------------------

def _search_file(path, *extra: str):
    res = CliRunner().invoke(main, ["search", "--model", "tiny-moe", "--cluster", "nvidia-h100-80gb", "--devices",
                                    "8", "--global-batch-size", "64", "--sampler", "exhaustive", "--top", "3",
                                    *extra, "--json"])
    assert res.exit_code == 0, res.output
    path.write_text(res.stdout)
    return path


@pytest.fixture(scope="module")
def result_file(tmp_path_factory):
    """Planned for Megatron-LM (the GPU default)."""
    return _search_file(tmp_path_factory.mktemp("export") / "result.json")


@pytest.fixture(scope="module")
def result_file_mindspeed(tmp_path_factory):
    return _search_file(tmp_path_factory.mktemp("export") / "result-ms.json", "--framework", "mindspeed")


H100_DOMAIN = 8  # nvidia-h100-80gb's scale_up_domain (NVLink)


def test_export_cli(result_file, result_file_mindspeed):
    for fmt, path in (("megatron", result_file), ("mindspeed", result_file_mindspeed)):
        result = json.loads(path.read_text())
        assert result["inputs"]["framework"] == fmt
        spec = load_model(result["inputs"]["model"])
        res = CliRunner().invoke(main, ["export", "--format", fmt, "--rank", "2", str(path)])
        assert res.exit_code == 0, res.output
        assert res.stdout == format_args(launch_args(result["top"][1]["config"], spec, fmt, H100_DOMAIN))
    result = json.loads(result_file.read_text())
    res = CliRunner().invoke(main, ["export", "--format", "megatron", str(result_file)])
    assert res.stdout == format_args(launch_args(result["best"]["config"], spec, "megatron", H100_DOMAIN))


@pytest.fixture(scope="module")
def shared_experts_file(tmp_path_factory):
    """Planned for Megatron-LM with the shared experts recomputed, which MindSpeed-LLM cannot do."""
    return _search_file(tmp_path_factory.mktemp("export") / "result-se.json",
                        "--fix", 'recompute_modules=["layernorm","shared_experts"]')


def test_export_cli_refuses_an_option_the_format_cannot_express(shared_experts_file):
    res = CliRunner().invoke(main, ["export", "--format", "mindspeed", str(shared_experts_file)])
    assert res.exit_code == 2, res.output
    assert res.stdout == ""  # nothing a script could run by mistake
    assert "top.1.config.recompute_modules" in res.stderr and "shared-expert recompute" in res.stderr
    assert CliRunner().invoke(main, ["export", "--format", "megatron", str(shared_experts_file)]).exit_code == 0


@pytest.mark.parametrize("args, field", [
    (["--format", "megatron", "--rank", "9", "RESULT"], "rank"),
    (["--format", "megatron", "--rank", "0", "RESULT"], "rank"),
    (["--format", "megatron", "missing.json"], "RESULT.json"),
    (["--format", "megatron", "BAD"], "inputs.model"),
    (["--format", "megatron", "NOTJSON"], "RESULT.json"),
    (["--format", "nope", "RESULT"], "format"),
])
def test_export_cli_errors(result_file, tmp_path, args, field):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"top": []}))
    notjson = tmp_path / "not.json"
    notjson.write_text("{")
    subst = {"RESULT": str(result_file), "BAD": str(bad), "NOTJSON": str(notjson)}
    res = CliRunner().invoke(main, ["export", *[subst.get(a, a) for a in args]])
    assert res.exit_code == 2, res.output
    assert field in res.output


# ---- HTTP ----------------------------------------------------------------------------------------

def test_launch_route(tmp_path):
    srv = Server(tmp_path / "p.db", tmp_path / "serve.log").start()
    try:
        with srv.client() as c:
            job = c.post("/v1/jobs", json=TINY_JOB).raise_for_status().json()
            assert job["inputs"]["search"]["framework"] == "megatron"  # the GPU default, resolved and kept
            assert wait_for(c, job["id"])["status"] == "succeeded"
            spec = load_model(c.get(f"/v1/jobs/{job['id']}").json()["inputs"]["model"])
            configs = c.get(f"/v1/jobs/{job['id']}/configs").json()["items"]
            r = c.get(f"/v1/jobs/{job['id']}/configs/2/launch", params={"format": "megatron"})
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
            assert r.text == format_args(launch_args(configs[1]["config"], spec, "megatron", H100_DOMAIN))
            # another framework's export: the arguments, or a 422 naming each option it cannot express
            r = c.get(f"/v1/jobs/{job['id']}/configs/2/launch", params={"format": "mindspeed"})
            try:
                expected = format_args(launch_args(configs[1]["config"], spec, "mindspeed", H100_DOMAIN))
                assert r.status_code == 200 and r.text == expected
            except InexpressibleError as exc:
                assert r.status_code == 422
                assert [d["option"] for d in r.json()["detail"]] == [x.field for x in exc.refusals]
            assert c.get(f"/v1/jobs/{job['id']}/configs/99/launch").status_code == 404
            assert c.get("/v1/jobs/00000000-0000-4000-8000-000000000000/configs/1/launch").status_code == 404
            assert c.get(f"/v1/jobs/{job['id']}/configs/1/launch", params={"format": "x"}).status_code == 422
            doc = c.get("/openapi.json").json()["paths"]["/v1/jobs/{job_id}/configs/{rank}/launch"]["get"]
            assert {"404", "422"} <= set(doc["responses"])
            assert "text/plain" in doc["responses"]["200"]["content"]
        # the CLI's --server path prints the same text
        res = CliRunner().invoke(main, ["export", "--format", "megatron", "--rank", "2", "--server", srv.url,
                                        "--job", job["id"]])
        assert res.exit_code == 0, res.output
        assert res.stdout == format_args(launch_args(configs[1]["config"], spec, "megatron", H100_DOMAIN))
        res = CliRunner().invoke(main, ["export", "--format", "megatron", "--rank", "99", "--server", srv.url,
                                        "--job", job["id"]])
        assert res.exit_code == 2 and "rank" in res.output
    finally:
        srv.stop()


def test_launch_route_refuses_an_option_the_format_cannot_express(tmp_path):
    srv = Server(tmp_path / "p.db", tmp_path / "serve.log").start()
    try:
        with srv.client() as c:
            body = {**TINY_JOB, "search": {**TINY_JOB["search"], "framework": "megatron",
                                           "fixed": {"recompute_modules": ["layernorm", "shared_experts"]}}}
            job = c.post("/v1/jobs", json=body).raise_for_status().json()
            assert wait_for(c, job["id"])["status"] == "succeeded"
            r = c.get(f"/v1/jobs/{job['id']}/configs/1/launch", params={"format": "mindspeed"})
            assert r.status_code == 422 and r.headers["content-type"].startswith("application/json")
            detail = r.json()["detail"]
            assert detail[0]["loc"] == ["query", "format"] and detail[0]["type"] == "inexpressible_option"
            assert detail[0]["option"] == "recompute_modules" and "shared_experts" in detail[0]["msg"]
            assert c.get(f"/v1/jobs/{job['id']}/configs/1/launch", params={"format": "megatron"}).status_code == 200
            # a bad framework in the job body is a 422 naming the field
            r = c.post("/v1/jobs", json={**TINY_JOB, "search": {"framework": "deepspeed"}})
            assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "search", "framework"]
        res = CliRunner().invoke(main, ["export", "--format", "mindspeed", "--server", srv.url, "--job", job["id"]])
        assert res.exit_code == 2 and "recompute_modules" in res.stderr, res.output
        # the framework defaults by the profile's vendor, and submit --framework sends it
        ascend = ["submit", "--server", srv.url, "--model", "tiny-moe", "--cluster", "ascend-910b", "--devices", "8",
                  "--global-batch-size", "32", "--sampler", "exhaustive", "--json"]
        res = CliRunner().invoke(main, ascend)
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["inputs"]["search"]["framework"] == "mindspeed"
        res = CliRunner().invoke(main, [*ascend, "--framework", "megatron"])
        assert json.loads(res.stdout)["inputs"]["search"]["framework"] == "megatron"
    finally:
        srv.stop()


# ---- the searched communication algorithms, exported ----------------------------------------------

MULTI_NODE = ["--model", "tiny-mla-moe", "--cluster", "nvidia-h100-80gb", "--devices", "32", "--global-batch-size",
              "64", "--sampler", "exhaustive", "--top", "1", "--json"]


def _algorithm_search(framework: str, *fix: str) -> dict:
    res = CliRunner().invoke(main, ["search", *MULTI_NODE, "--framework", framework,
                                    *[a for f in fix for a in ("--fix", f)]])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def _export(tmp_path, result: dict, fmt: str):
    path = tmp_path / f"{fmt}.json"
    path.write_text(json.dumps(result))
    return CliRunner().invoke(main, ["export", "--format", fmt, str(path)])


def _exported_flags(res) -> dict[str, list[str]]:
    assert res.exit_code == 0, res.output
    return flags([t.strip('"') for line in res.stdout.split(" \\\n") for t in line.split()])


# What each format states for each value: the flags of search/frameworks/table.py's ALGORITHMS table (None: refused)
DISPATCH_FLAGS = {
    ("flat", "megatron"): {"--moe-token-dispatcher-type": ["alltoall"]},
    ("hierarchical", "megatron"): {"--moe-token-dispatcher-type": ["flex"], "--moe-flex-dispatcher-backend": ["deepep"]},
    ("flat", "mindspeed"): {"--moe-token-dispatcher-type": ["alltoall"]},
    ("hierarchical", "mindspeed"): None,
}


@pytest.mark.parametrize("value", ["flat", "hierarchical"])
def test_export_states_the_searched_dispatch_or_refuses_it(tmp_path, value):
    result = _algorithm_search("megatron", "ep=16", f"moe_a2a_algorithm={value}")  # 16 ranks over 2 NVLink domains
    cfg = result["best"]["config"]
    assert cfg["moe_a2a_algorithm"] == value and cfg["ep"] == 16
    for fmt in ("megatron", "mindspeed"):
        res, want = _export(tmp_path, result, fmt), DISPATCH_FLAGS[value, fmt]
        if want is None:
            assert res.exit_code == 2 and res.stdout == "" and "top.1.config.moe_a2a_algorithm" in res.stderr
            continue
        got = _exported_flags(res)
        assert {k: got.get(k) for k in want} == want
        if value == "flat":
            assert "--moe-flex-dispatcher-backend" not in got


# (pins that make the value matter, Megatron's flags, MindSpeed-LLM's flags)
CP_CASES = {
    "p2p": (["tp=2", "cp=4"], {"--cp-comm-type": None}, {"--context-parallel-algo": ["megatron_cp_algo"]}),
    "a2a": (["tp=2", "cp=4"], {"--cp-comm-type": ["a2a"]}, {"--context-parallel-algo": ["ulysses_cp_algo"]}),
    "allgather": (["tp=2", "cp=4"], {"--cp-comm-type": ["allgather"]},
                  {"--context-parallel-algo": ["kvallgather_cp_algo"]}),
    # tp 4 leaves 2 CP ranks per 8-GPU domain: Ulysses over 2, a ring of 2 across
    "a2a+p2p": (["tp=4", "cp=4"], {"--cp-comm-type": ["a2a+p2p"], "--hierarchical-context-parallel-sizes": ["2", "2"]},
                {"--context-parallel-algo": ["hybrid_cp_algo"], "--ulysses-degree-in-cp": ["2"]}),
}


@pytest.mark.parametrize("kind", list(CP_CASES))
def test_export_states_the_searched_cp_algorithm(tmp_path, kind):
    pins, megatron, mindspeed = CP_CASES[kind]
    for fmt, want in (("megatron", megatron), ("mindspeed", mindspeed)):
        result = _algorithm_search(fmt, *pins, f"cp_comm_type={kind}")
        assert result["best"]["config"]["cp_comm_type"] == kind
        got = _exported_flags(_export(tmp_path, result, fmt))
        assert {k: got.get(k) for k in want} == want


def test_a_framework_without_an_algorithm_neither_plans_nor_exports_it(tmp_path, monkeypatch):
    """The table is the one place: a framework that lacks a value gets none in its search and a refusal on export."""
    from search import frameworks
    # MC2 and hierarchical dispatch pinned off: MindSpeed-LLM would refuse them first (not the point here)
    result = _algorithm_search("megatron", "tp=2", "cp=4", "cp_comm_type=allgather", "tp_comm_overlap=false",
                               "moe_a2a_algorithm=flat")
    monkeypatch.setitem(frameworks.ALGORITHMS, "mindspeed",
                        {**frameworks.ALGORITHMS["mindspeed"], "cp_comm_type": ("p2p", "a2a", "a2a+p2p")})
    res = _export(tmp_path, result, "mindspeed")
    assert res.exit_code == 2 and "top.1.config.cp_comm_type" in res.stderr
    res = CliRunner().invoke(main, ["search", *MULTI_NODE[:-3], "--top", "50", "--json", "--framework", "mindspeed",
                                    "--fix", "cp=4"])
    assert res.exit_code == 0, res.output
    kinds = {e["config"]["cp_comm_type"] for e in json.loads(res.stdout)["top"]}
    assert kinds and "allgather" not in kinds
    res = CliRunner().invoke(main, ["search", *MULTI_NODE, "--framework", "mindspeed", "--fix", "cp_comm_type=allgather"])
    assert res.exit_code == 2 and "fix.cp_comm_type" in res.output


def test_launch_route_states_or_refuses_the_dispatch(tmp_path):
    srv = Server(tmp_path / "p.db", tmp_path / "serve.log").start()
    try:
        with srv.client() as c:
            body = {"model": "tiny-mla-moe", "cluster": "nvidia-h100-80gb", "devices": 32, "global_batch_size": 64,
                    "search": {"sampler": "exhaustive", "top_k": 3, "framework": "megatron",
                               "fixed": {"ep": 16, "moe_a2a_algorithm": "hierarchical"}}}
            job = c.post("/v1/jobs", json=body).raise_for_status().json()
            assert wait_for(c, job["id"])["status"] == "succeeded"
            r = c.get(f"/v1/jobs/{job['id']}/configs/1/launch", params={"format": "megatron"})
            assert r.status_code == 200 and "--moe-token-dispatcher-type flex" in r.text
            assert "--moe-flex-dispatcher-backend deepep" in r.text
            r = c.get(f"/v1/jobs/{job['id']}/configs/1/launch", params={"format": "mindspeed"})
            assert r.status_code == 422 and r.json()["detail"][0]["option"] == "moe_a2a_algorithm"
            assert "x-launch-env" not in {k.lower() for k in r.headers}
            # a config that offloads: the environment Megatron-LM asserts comes in a header, and
            # `paraplan export --server` prints it as the local export does
            body["search"]["fixed"] = {"ep": 16, "moe_a2a_algorithm": "flat", "offload_modules": ["attn_norm"]}
            job = c.post("/v1/jobs", json=body).raise_for_status().json()
            assert wait_for(c, job["id"])["status"] == "succeeded"
            r = c.get(f"/v1/jobs/{job['id']}/configs/1/launch", params={"format": "megatron"})
            assert r.status_code == 200 and "--offload-modules attn_norm" in r.text
            assert r.headers["x-launch-env"] == "NVTE_CPU_OFFLOAD_V1=1"
        res = CliRunner().invoke(main, ["export", "--format", "megatron", "--server", srv.url, "--job", job["id"]])
        assert res.exit_code == 0, res.output
        assert "--offload-modules attn_norm" in res.stdout and "NVTE_CPU_OFFLOAD_V1=1" in res.stderr
    finally:
        srv.stop()


SWAP_SET = ["attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm"]  # MindSpeed's default swap modules


@pytest.mark.parametrize("modules, mindspeed", [
    (SWAP_SET, "input_norm,self_attention,post_attention_norm"),
    (["attn_norm"], "input_norm"),
    (["core_attn", "attn_proj"], None),  # MindSpeed swaps self_attention's qkv_linear, core_attn, attn_proj together
    (["expert_fc1", "moe_act"], None),  # MindSpeed has no expert swap
])
def test_export_states_the_searched_offload_or_refuses_it(tmp_path, modules, mindspeed):
    result = _algorithm_search("megatron", f"offload_modules={json.dumps(modules)}", "moe_a2a_algorithm=flat",
                               "tp_comm_overlap=false")
    assert result["best"]["config"]["offload_modules"] == modules
    res = _export(tmp_path, result, "megatron")
    got = _exported_flags(res)
    assert got["--fine-grained-activation-offloading"] == [] and got["--offload-modules"] == modules
    # Megatron-LM asserts NVTE_CPU_OFFLOAD_V1=1 with this flag: the note goes to stderr, stdout stays the flags
    assert "NVTE_CPU_OFFLOAD_V1=1" in res.stderr and "NVTE" not in res.stdout
    res = _export(tmp_path, result, "mindspeed")
    if mindspeed is None:
        assert res.exit_code == 2 and res.stdout == "" and "top.1.config.offload_modules" in res.stderr
        return
    got = _exported_flags(res)
    assert got["--swap-attention"] == [] and got["--swap-modules"] == [mindspeed]
    assert "--offload-modules" not in got and "NVTE" not in res.stderr


def test_export_without_offload_needs_no_environment(tmp_path):
    result = _algorithm_search("megatron", "offload_modules=[]", "moe_a2a_algorithm=flat")
    res = _export(tmp_path, result, "megatron")
    assert "--offload-modules" not in _exported_flags(res) and res.stderr == ""

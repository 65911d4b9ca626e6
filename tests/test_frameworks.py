"""The framework table (search/frameworks/): what Megatron-LM and MindSpeed-LLM can express, that a
search planned for one offers nothing else, and that the default follows the profile's vendor."""

from __future__ import annotations

import json
import types
import typing

import numpy as np
import pytest
from click.testing import CliRunner

from app.cli import main
from app.formats.inputs import load_cluster, load_model
from app.formats.launch import InexpressibleError, flags, launch_args
from costmodel import TrainingConfig
from search import build_space, validate_fixed
from search.frameworks import FIELDS, FRAMEWORKS, default_framework, ep_leaves_domain, express, refusals, stage_tokens
from search.space import SPLIT_FIELDS


@pytest.fixture(scope="module")
def mla():
    return load_model("tiny-mla-moe")


def _search(*args: str) -> dict:
    res = CliRunner().invoke(main, ["search", *args, "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


# ---- the default ---------------------------------------------------------------------------------

def test_default_framework_follows_the_profile_vendor():
    assert default_framework("ascend-910b") == default_framework("ascend-910c-cloudmatrix384") == "mindspeed"
    assert default_framework("nvidia-h100-80gb") == default_framework("nvidia-a100-80gb") == "megatron"
    common = ["--model", "tiny-moe", "--devices", "8", "--global-batch-size", "32", "--sampler", "exhaustive",
              "--top", "1"]
    assert _search(*common, "--cluster", "ascend-910b")["inputs"]["framework"] == "mindspeed"
    assert _search(*common, "--cluster", "nvidia-h100-80gb")["inputs"]["framework"] == "megatron"
    assert _search(*common, "--cluster", "ascend-910b", "--framework", "megatron")["inputs"]["framework"] == "megatron"


# ---- every field -----------------------------------------------------------------------------------

def test_every_config_field_is_accounted_for():
    assert set(FIELDS) == set(TrainingConfig.model_fields)


# A config where every field matters: tp and cp inside a 4-device domain, EP leaving it, MLA + MoE + MTP.
BASE = {"tp": 2, "pp": 2, "cp": 4, "ep": 8, "global_batch_size": 64, "moe_a2a_algorithm": "flat"}
DOMAIN = 4
# Values to try for the integer and string fields (the Literal and bool fields try every other value).
ALTERNATIVES = {"tp": [1], "pp": [1], "vpp": [2], "cp": [1], "ep": [1], "etp": [2], "micro_batch_size": [2],
                "global_batch_size": [128], "first_stage_layers": [2], "last_stage_layers": [2],
                "recompute_num_layers": [1], "pipeline_layout": ["Ettt|ttmL"],
                # alltoall is the base's flat dispatch (the same flags); flex contradicts its stated flat
                "moe_token_dispatcher_type": ["allgather", "alltoall_seq"],
                "offload_modules": [["attn_norm"], ["core_attn", "attn_proj"], ["moe_act"]],
                # interleaved needs vpp > 1: the vpp alternative is that plan
                "pipeline_schedule": ["1f1b", "dualpipe", "dualpipev"],
                "recompute_modules": [[m] for m in ("layernorm", "mla_up_proj", "moe_act", "mlp", "moe",
                                                    "shared_experts")]}
# The field needs this around it to matter.
CONTEXT = {"recompute_modules": {"recompute": "selective"}, "recompute_num_layers": {"recompute": "full"},
           "fp8_recipe": {"precision": "fp8"}, "delay_wgrad_compute": {"moe_a2a_overlap": True, "vpp": 2}}
NO_FLAG = {"dp", "moe_load_imbalance", "moe_expert_load", "moe_expert_skew"}  # FIELDS says why
# Fields valid only beside a value that is refused itself: test_expert_replicas_are_refused checks them.
REFUSED_CONTEXT = {"moe_expert_replicas"}
SAME_AS_DEFAULT = {("sequence_parallel", True), ("data_parallel_sharding_strategy", "optim"),
                   ("pipeline_schedule", "1f1b"), ("fp8_recipe", "delayed"), ("delay_wgrad_compute", True)}


def _values(name: str) -> list:
    """The values of ``name`` other than the one the base config has."""
    info = TrainingConfig.model_fields[name]
    if name in ALTERNATIVES:
        return ALTERNATIVES[name]
    current = BASE.get(name, info.default)
    ann = info.annotation
    parts = typing.get_args(ann) if typing.get_origin(ann) in (typing.Union, types.UnionType) else (ann,)
    literal = [v for a in parts if typing.get_origin(a) is typing.Literal for v in typing.get_args(a)]
    if literal:
        return [v for v in literal if v != current]
    assert bool in parts, f"add test values for the new field {name!r}"
    return [v for v in (True, False) if v != current]


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("name", sorted(set(TrainingConfig.model_fields) - NO_FLAG - REFUSED_CONTEXT))
def test_a_non_default_value_changes_the_flags_or_is_refused(mla, framework, name):
    """Nothing is dropped silently: every non-default value of every field shows in the arguments, or the
    export refuses naming it."""
    base = TrainingConfig.model_validate({**BASE, **CONTEXT.get(name, {})})
    before = launch_args(base, mla, framework, DOMAIN)
    for value in _values(name):
        if (name, value if not isinstance(value, list) else None) in SAME_AS_DEFAULT:
            continue
        cfg = TrainingConfig.model_validate({**BASE, **CONTEXT.get(name, {}), name: value})
        try:
            after = launch_args(cfg, mla, framework, DOMAIN)
        except InexpressibleError as exc:
            assert exc.refusals, (name, value)
            continue
        if stage_tokens(cfg, mla) == stage_tokens(base, mla) and name in SPLIT_FIELDS and framework == "mindspeed":
            continue  # the same layers on every stage: the same plan (no-op padding states the split itself)
        assert after != before, f"{framework}: {name}={value} changes nothing in the arguments"


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_expert_replicas_are_refused_naming_the_field(mla, framework):
    routed = {**BASE, "moe_expert_skew": 0.5, "expert_placement": "balanced"}
    assert _fields(routed, mla, framework) == {"expert_placement"}
    assert _fields({**routed, "moe_expert_replicas": 1}, mla, framework) == {"expert_placement", "moe_expert_replicas"}


def test_modelling_inputs_need_no_flag(mla):
    for fw in FRAMEWORKS:
        base = launch_args(BASE, mla, fw, DOMAIN)
        assert launch_args({**BASE, "moe_load_imbalance": 2.0}, mla, fw, DOMAIN) == base
        assert launch_args({**BASE, "dp": 3}, mla, fw, DOMAIN) == base
        assert launch_args({**BASE, "moe_expert_skew": 1.0}, mla, fw, DOMAIN) == base


# ---- what each framework can and cannot say ------------------------------------------------------

def _fields(cfg: dict, spec, fw: str, domain: int | None = DOMAIN) -> set[str]:
    return {r.field for r in refusals(TrainingConfig.model_validate(cfg), spec, fw, domain)}


def _flags(cfg: dict, spec, fw: str, domain: int | None = DOMAIN) -> dict:
    return flags(launch_args(cfg, spec, fw, domain))


def test_selective_recompute(mla):
    sel = {**BASE, "recompute": "selective"}
    m = _flags({**sel, "recompute_modules": ["layernorm", "mla_up_proj", "moe_act", "moe"]}, mla, "mindspeed")
    assert m["--recompute-modules"] == ["layernorm", "moe"]  # Megatron core 0.12.1's code, kept by MindSpeed-LLM
    assert {"--recompute-mla-up-proj", "--mla-up-proj-tp-overlap", "--mla-mm-split",
            "--recompute-activation-function"} <= set(m)
    assert _fields({**sel, "recompute_modules": ["shared_experts"]}, mla, "mindspeed") == {"recompute_modules"}
    assert _fields({**sel, "recompute_modules": ["shared_experts"]}, mla, "megatron") == set()
    no_sp = {**sel, "recompute_modules": ["mla_up_proj"], "sequence_parallel": False}
    assert _fields(no_sp, mla, "mindspeed") == {"recompute_modules", "sequence_parallel"}
    assert _fields({**sel, "recompute_modules": ["mla_up_proj"]}, load_model("tiny-moe"), "megatron") \
        == {"recompute_modules"}  # no MLA in the model


def test_full_recompute_counts(mla):
    # 5 layers over pp 2 · vpp 2: rank 0 holds chunks of 1 and 1 layers, rank 1 of 2 and 1
    full = {**BASE, "vpp": 2, "recompute": "full"}
    assert _fields({**full, "recompute_num_layers": 1}, mla, "megatron") == {"recompute_num_layers"}
    m = _flags({**full, "recompute_num_layers": 1}, mla, "mindspeed")
    assert m["--recompute-num-layers"] == ["1"] and "--enable-recompute-layers-per-pp-rank" in m
    f = _flags({**full, "recompute_num_layers": 2}, mla, "megatron")
    assert f["--recompute-method"] == ["block"] and f["--recompute-num-layers"] == ["1"]  # one per chunk
    f = _flags(full, mla, "megatron")
    assert f["--recompute-method"] == ["uniform"] and f["--recompute-num-layers"] == ["1"]


def test_dispatch_algorithm(mla):
    hier = {**BASE, "moe_a2a_algorithm": "hierarchical"}
    f = _flags(hier, mla, "megatron")  # ep 8 leaves the 4-device domain: hierarchical is DeepEP
    assert f["--moe-token-dispatcher-type"] == ["flex"] and f["--moe-flex-dispatcher-backend"] == ["deepep"]
    assert _flags(BASE, mla, "megatron")["--moe-token-dispatcher-type"] == ["alltoall"]  # flat
    assert _fields(hier, mla, "mindspeed") == {"moe_a2a_algorithm"}
    assert _fields(hier, mla, "mindspeed", domain=None) == {"moe_a2a_algorithm"}  # unknown domain: not guessed
    assert _fields({**hier, "ep": 2}, mla, "mindspeed") == set()  # inside the domain flat is the same
    assert _flags({**hier, "ep": 2}, mla, "megatron")["--moe-token-dispatcher-type"] == ["alltoall"]


def test_context_parallel_algorithms(mla):
    flat = BASE
    assert "--cp-comm-type" not in _flags(flat, mla, "megatron")  # p2p is Megatron's default
    assert _flags(flat, mla, "mindspeed")["--context-parallel-algo"] == ["megatron_cp_algo"]
    for kind, algo in (("a2a", "ulysses_cp_algo"), ("allgather", "kvallgather_cp_algo")):
        assert _flags({**flat, "cp_comm_type": kind}, mla, "megatron")["--cp-comm-type"] == [kind]
        assert _flags({**flat, "cp_comm_type": kind}, mla, "mindspeed")["--context-parallel-algo"] == [algo]
    hybrid = {**flat, "cp_comm_type": "a2a+p2p"}  # Ulysses over the 2 CP ranks inside the domain, ring across
    f = _flags(hybrid, mla, "megatron")
    assert f["--cp-comm-type"] == ["a2a+p2p"] and f["--hierarchical-context-parallel-sizes"] == ["2", "2"]
    m = _flags(hybrid, mla, "mindspeed")
    assert m["--context-parallel-algo"] == ["hybrid_cp_algo"] and m["--ulysses-degree-in-cp"] == ["2"]
    assert _fields(hybrid, mla, "megatron", domain=None) == {"cp_comm_type"}


def test_model_state_dtypes_and_sharding(mla):
    flat = BASE
    pao = {**flat, "main_params_dtype": "bf16", "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "fp8"}
    f = _flags(pao, mla, "megatron")
    assert "--use-precision-aware-optimizer" in f and f["--exp-avg-dtype"] == ["bf16"]
    assert f["--exp-avg-sq-dtype"] == ["fp8"] and "--main-params-dtype" not in f  # remainders: fp32's default
    assert _fields({**flat, "exp_avg_dtype": "bf16"}, mla, "megatron") == {"main_params_dtype"}
    assert _fields({**pao, "distributed_optimizer": False}, mla, "megatron") == {"main_params_dtype"}
    assert _fields(pao, mla, "mindspeed") == {"exp_avg_dtype"}
    m = _flags({**flat, "main_params_dtype": "bf16", "exp_avg_dtype": "fp8", "exp_avg_sq_dtype": "fp8"}, mla,
               "mindspeed")
    assert "--reuse-fp32-param" in m and m["--quant-states"] == ["fp8"]
    assert _fields({**flat, "main_grads_dtype": "bf16"}, mla, "mindspeed") == {"main_grads_dtype"}
    zero3 = {**flat, "data_parallel_sharding_strategy": "optim_grads_params"}
    f = _flags(zero3, mla, "megatron")
    assert "--use-megatron-fsdp" in f and f["--data-parallel-sharding-strategy"] == ["optim_grads_params"]
    assert f["--megatron-fsdp-main-grads-dtype"] == ["fp32"]
    assert _fields(zero3, mla, "mindspeed") == {"data_parallel_sharding_strategy"}
    assert "--use-distributed-optimizer" not in _flags({**flat, "data_parallel_sharding_strategy": "no_shard"},
                                                       mla, "mindspeed")
    assert _fields({**flat, "overlap_grad_reduce": False}, mla, "megatron") == {"overlap_param_gather"}


def test_overlap_combinations(mla):
    flat = {**BASE, "vpp": 2}
    both = {**flat, "tp_comm_overlap": True, "moe_a2a_overlap": True}
    assert _fields(both, mla, "megatron") == set()
    # MC2 and the all-to-all overlap exclude each other; MC2 and the grouped-GEMM experts of an MoE model too
    assert _fields(both, mla, "mindspeed") == {"moe_a2a_overlap", "tp_comm_overlap"}
    assert _fields({**flat, "tp_comm_overlap": True}, mla, "mindspeed") == {"tp_comm_overlap"}
    assert _fields({**flat, "ep": 1, "tp_comm_overlap": True}, load_model("tiny-dense"), "mindspeed") == set()
    assert _fields({**flat, "tp_comm_overlap": True, "precision": "fp8"}, mla, "mindspeed") == {"tp_comm_overlap"}
    assert _fields({**flat, "tp": 1, "tp_comm_overlap": True}, mla, "megatron") == {"tp_comm_overlap"}
    a2a = {**flat, "moe_a2a_overlap": True}
    assert _fields({**a2a, "recompute": "full"}, mla, "megatron") == {"moe_a2a_overlap"}
    assert _fields({**a2a, "vpp": 1}, mla, "megatron") == {"moe_a2a_overlap"}  # pp > 1 needs interleaving
    moe = {**a2a, "recompute": "selective", "recompute_modules": ["moe"]}
    assert _fields(moe, mla, "megatron") == {"moe_a2a_overlap"}
    assert _fields(moe, mla, "mindspeed") == {"recompute_modules"}
    assert _fields({**a2a, "ep": 1}, mla, "mindspeed") == {"moe_a2a_overlap"}


def test_refusal_message_names_the_option(mla):
    cfg = {**BASE, "recompute": "selective", "recompute_modules": ["shared_experts"]}
    with pytest.raises(InexpressibleError, match=r"MindSpeed-LLM cannot express recompute_modules=\[shared_experts\]"):
        launch_args(cfg, mla, "mindspeed", DOMAIN)
    assert express(TrainingConfig.model_validate(cfg), mla, "megatron", DOMAIN).refusals == []


# ---- the search ------------------------------------------------------------------------------------

SPACES = [("tiny-mla-moe", "ascend-910b", 32, 64, {}), ("tiny-moe", "nvidia-h100-80gb", 16, 64, {}),
          ("tiny-mla-moe", "ascend-910b", 16, 32, {"sequence_parallel": False}),
          ("tiny-moe", "ascend-910b", 16, 64, {"cp_comm_type": "a2a+p2p", "main_params_dtype": "bf16"})]


def _distinct(configs: list[dict], domain: int) -> dict[str, dict]:
    """Configs by everything but the micro-batch size and dp, which no rule reads (always emitted as is),
    and the dispatch (CP) algorithm where the EP group stays inside the scale-up domain (cp = 1), where
    it makes no difference to the plan or the launch (each space states its own resting value there)."""
    def key(c: dict) -> tuple:
        drop = {"micro_batch_size", "dp"}
        # ep_leaves_domain reads ep and etp only: no validated config needed for the hundreds of thousands here
        if not ep_leaves_domain(types.SimpleNamespace(ep=c.get("ep", 1), etp=c.get("etp", 1)), domain):
            drop.add("moe_a2a_algorithm")
        if c.get("cp", 1) == 1:
            drop.add("cp_comm_type")
        return tuple(sorted((k, json.dumps(v) if isinstance(v, (list, dict)) else v)
                            for k, v in c.items() if k not in drop))
    return {key(c): c for c in configs}


def _configs(space) -> list[dict]:
    """What ``_distinct`` keeps of every config the space offers, without building them all (a million and
    more here): of the pairs that differ only in the micro-batch size and dp (layouts alike but for the
    micro-batch size, same option), only the last, ordered by where each such set ends. ``_distinct`` of
    this list is ``_distinct`` of all the configs: the same keys, each with the same (last) config."""
    rows, opts = np.nonzero(space._option_mask())
    fields = [v for k, v in space.parallel.items() if k != "micro_batch_size"]  # dp follows tp, pp and cp
    _, layout = np.unique(np.stack(fields, axis=1), axis=0, return_inverse=True)
    pair = layout.reshape(-1)[rows].astype(np.int64) * len(space.options) + opts
    _, last_reversed = np.unique(pair[::-1], return_index=True)
    keep = np.sort(len(pair) - 1 - last_reversed)
    # space.config(row, opt), with the columns turned into Python values once instead of per config
    columns = {k: v[rows[keep]].tolist() for k, v in space.parallel.items()}
    return [space._row_config({k: v[i] for k, v in columns.items()}, o) for i, o in enumerate(opts[keep].tolist())]


@pytest.mark.parametrize("model,cluster,devices,gbs,fixed", SPACES)
def test_a_framework_space_holds_only_what_it_expresses(model, cluster, devices, gbs, fixed):
    spec, profile = load_model(model), load_cluster(cluster)
    domain = int(profile.fact("scale_up_domain"))
    everything = build_space(spec, profile, devices, gbs, fixed=validate_fixed(fixed, gbs))
    unrestricted = _configs(everything)
    for fw in FRAMEWORKS:
        space = build_space(spec, profile, devices, gbs, fixed=validate_fixed(fixed, gbs), framework=fw)
        offered = _distinct(_configs(space), domain)
        assert space.size > 0
        for cfg in offered.values():
            assert not refusals(TrainingConfig.model_validate(cfg), spec, fw, domain), cfg
        # ... and drops nothing else: what the unrestricted space offers and the framework can express
        for key, cfg in _distinct([{**c, **space.constants} for c in unrestricted], domain).items():
            if key not in offered:
                assert refusals(TrainingConfig.model_validate(cfg), spec, fw, domain), cfg


@pytest.mark.parametrize("framework,args", [
    ("mindspeed", ["--model", "tiny-mla-moe", "--cluster", "ascend-910b", "--devices", "32",
                   "--global-batch-size", "64"]),
    ("megatron", ["--model", "tiny-moe", "--cluster", "nvidia-h100-80gb", "--devices", "8",
                  "--global-batch-size", "64"]),
    ("mindspeed", ["--model", "tiny-moe", "--cluster", "nvidia-h100-80gb", "--devices", "16",
                   "--global-batch-size", "64", "--sampler", "tpe", "--trials", "40", "--seed", "3"]),
])
def test_every_top_config_of_a_framework_search_exports(tmp_path, framework, args):
    result = _search(*args, "--framework", framework, "--top", "10")
    assert result["inputs"]["framework"] == framework and result["top"]
    path = tmp_path / "result.json"
    path.write_text(json.dumps(result))
    for entry in result["top"]:
        res = CliRunner().invoke(main, ["export", "--format", framework, "--rank", str(entry["rank"]), str(path)])
        assert res.exit_code == 0, (entry["config"], res.output)


@pytest.mark.parametrize("extra, field", [
    (["--framework", "mindspeed", "--fix", "exp_avg_dtype=bf16"], "fix.exp_avg_dtype"),
    (["--framework", "mindspeed", "--fix", "moe_a2a_algorithm=hierarchical"], "fix.moe_a2a_algorithm"),
    (["--framework", "mindspeed", "--fix", "data_parallel_sharding_strategy=optim_grads"],
     "fix.data_parallel_sharding_strategy"),
    (["--framework", "deepspeed"], "framework"),
])
def test_search_input_a_framework_cannot_run_names_the_field(extra, field):
    res = CliRunner().invoke(main, ["search", "--model", "tiny-moe", "--cluster", "nvidia-h100-80gb", "--devices",
                                    "8", "--global-batch-size", "64", *extra])
    assert res.exit_code == 2, res.output
    assert field in res.output

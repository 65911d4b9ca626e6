"""The CONTRACT's validity rules, one test each, and the input errors of the schemas.

A broken rule makes a config structurally infeasible: ``feasible`` false, the rule's reason code,
null times and memory. Each test also checks a neighbouring config that keeps the rule, so that the
test fails if the rule fires for the wrong reason. Input errors (types, ranges, enums, unknown fields)
are pydantic ValidationErrors that name the field.
"""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

import model_presets
from costmodel import validity
from costmodel.batch import ConfigBatch
from costmodel.result import evaluate
from costmodel.spec import ModelSpec, TrainingConfig

H100 = "nvidia-h100-80gb"

CONTRACT_CODES = {"tp_divides_heads", "devices_divisible", "dp_mismatch", "ep_etp_divides", "dense_ep",
                  "ep_divides_experts", "global_batch_divisible", "seq_divisible", "vpp_needs_pp",
                  "fp8_unsupported"}
# Codes the project adds (docs/costmodel.md, "Validity rules"): the pipeline schedules' needs and
# what activation offload needs.
EXTENSION_CODES = {"dualpipe_needs_pp", "dualpipe_even_pp", "dualpipe_microbatches", "dualpipev_layers",
                   "offload_needs_host_link", "offload_full_recompute", "offload_needs_moe",
                   "unfused_attention_cp", "fp8_input_store_needs_swiglu"}


def run(spec, devices, profile_name=H100, **cfg):
    from conftest import load_profile

    prof = load_profile(profile_name) if isinstance(profile_name, str) else profile_name
    return evaluate(spec, prof, devices, TrainingConfig(**cfg))


def codes(result) -> list[str]:
    return [r["code"] for r in result["infeasible_reasons"]]


def assert_broken(result, code):
    """Exactly this rule is broken; the result is structurally infeasible with nulls."""
    assert codes(result) == [code], result["infeasible_reasons"]
    assert result["feasible"] is False
    msg = result["infeasible_reasons"][0]["message"]
    assert isinstance(msg, str) and msg
    assert result["step_time_s"] is None and result["tokens_per_s"] is None and result["mfu"] is None
    assert all(v is None for v in result["time"].values())
    assert result["memory"]["peak_gib"] is None
    json.dumps(result, allow_nan=False)


def assert_valid(result):
    assert codes(result) in ([], ["oom"]), result["infeasible_reasons"]
    assert result["step_time_s"] is not None and result["step_time_s"] > 0


def test_rule_codes_are_the_contracts(preset):
    spec = preset("tiny-moe")
    rules = validity.check(spec, ConfigBatch.from_configs([TrainingConfig(global_batch_size=1)]), 1, True)
    assert {r.code for r in rules} == CONTRACT_CODES | EXTENSION_CODES


# ---- tp divides num_attention_heads and num_query_groups ------------------------------------------


def test_tp_must_divide_query_groups(preset):
    spec = preset("tiny-dense")  # 8 heads, 4 query groups
    assert_valid(run(spec, 4, tp=4, global_batch_size=1))
    r = run(spec, 8, tp=8, global_batch_size=1)  # divides the heads, not the groups
    assert_broken(r, "tp_divides_heads")
    assert "num_query_groups" in r["infeasible_reasons"][0]["message"]


def test_tp_must_divide_heads(preset):
    spec = model_presets.load({"base": "tiny-dense", "num_attention_heads": 12, "num_query_groups": 12,
                               "kv_channels": 32, "seq_length": 576})  # 576 = 6 · 96 = 8 · 72
    assert_valid(run(spec, 6, tp=6, global_batch_size=1))
    assert_broken(run(spec, 8, tp=8, global_batch_size=1), "tp_divides_heads")


# ---- devices divisible by tp·pp·cp --------------------------------------------------------------


def test_devices_divisible_by_tp_pp_cp(preset):
    spec = preset("tiny-dense")
    assert_valid(run(spec, 8, tp=4, global_batch_size=2))
    assert_broken(run(spec, 6, tp=4, global_batch_size=1), "devices_divisible")
    assert_broken(run(spec, 12, tp=2, pp=4, global_batch_size=1), "devices_divisible")
    assert_broken(run(spec, 6, cp=4, global_batch_size=1), "devices_divisible")


def test_undivided_devices_leave_out_the_rules_that_need_dp(preset):
    # 6 devices, tp 4: dp is undefined, so ep*etp | tp*cp*dp and gbs | mbs*dp are not judged with a
    # rounded-down dp: with dp = 1 both would fire (ep*etp = 16 does not divide tp*cp*dp = 4, gbs 7
    # not by mbs*dp = 2).
    spec = preset("tiny-moe")
    r = run(spec, 6, tp=4, ep=8, etp=2, micro_batch_size=2, global_batch_size=7)
    assert [x["code"] for x in r["infeasible_reasons"]] == ["devices_divisible"]
    # with 8 devices dp is 2 and the same rules do fire
    codes = {x["code"] for x in run(spec, 8, tp=4, ep=8, etp=2, micro_batch_size=2, global_batch_size=7)["infeasible_reasons"]}
    assert {"ep_etp_divides", "global_batch_divisible"} <= codes


# ---- dp, when given, must match -----------------------------------------------------------------


def test_dp_mismatch(preset):
    spec = preset("tiny-dense")
    assert_valid(run(spec, 8, tp=2, dp=4, global_batch_size=4))
    assert_broken(run(spec, 8, tp=2, dp=2, global_batch_size=4), "dp_mismatch")


# ---- ep·etp divides tp·cp·dp --------------------------------------------------------------------


def test_ep_etp_divides_tp_cp_dp(preset):
    spec = preset("tiny-moe")  # 8 experts, 6 layers
    # 8 devices, pp 2: tp·cp·dp = 4
    assert_valid(run(spec, 8, pp=2, ep=4, global_batch_size=4))
    assert_valid(run(spec, 8, pp=2, ep=2, etp=2, global_batch_size=4))
    assert_broken(run(spec, 8, pp=2, ep=8, global_batch_size=4), "ep_etp_divides")
    assert_broken(run(spec, 8, pp=2, ep=4, etp=2, global_batch_size=4), "ep_etp_divides")


def test_moe_folding_lets_ep_span_tp_and_cp(preset):
    # ep·etp may use the tp and cp devices too (MoE parallel folding): tp 2 × cp 2 × dp 2 = 8 = ep.
    spec = preset("tiny-moe")
    assert_valid(run(spec, 8, tp=2, cp=2, ep=8, global_batch_size=2))


# ---- ep divides num_experts ---------------------------------------------------------------------


def test_ep_divides_experts(preset):
    spec = preset("tiny-moe")  # 8 experts
    assert_valid(run(spec, 4, ep=4, global_batch_size=4))
    assert_broken(run(spec, 6, ep=3, global_batch_size=6), "ep_divides_experts")


# ---- dense models have ep = etp = 1 -------------------------------------------------------------


def test_dense_model_needs_ep_1(preset):
    spec = preset("tiny-dense")
    assert_broken(run(spec, 2, ep=2, global_batch_size=2), "dense_ep")


def test_dense_model_needs_etp_1(preset):
    spec = preset("tiny-dense")
    assert_broken(run(spec, 2, etp=2, global_batch_size=2), "dense_ep")


# ---- global_batch_size divisible by micro_batch_size·dp -----------------------------------------


def test_global_batch_divisible(preset):
    spec = preset("tiny-dense")
    assert_valid(run(spec, 4, micro_batch_size=2, global_batch_size=16))
    assert_broken(run(spec, 4, micro_batch_size=2, global_batch_size=12), "global_batch_divisible")
    assert_broken(run(spec, 4, micro_batch_size=1, global_batch_size=2), "global_batch_divisible")


# ---- seq_length divisible by tp (SP), 2·cp (CP), both ---------------------------------------------


def test_seq_divisible_by_tp_with_sequence_parallel():
    spec = model_presets.load({"base": "tiny-dense", "seq_length": 510})
    assert_broken(run(spec, 4, tp=4, global_batch_size=1), "seq_divisible")  # SP defaults on for tp > 1
    assert_valid(run(spec, 4, tp=4, sequence_parallel=False, global_batch_size=1))
    assert_valid(run(spec, 2, tp=2, global_batch_size=1))


def test_seq_divisible_by_two_cp():
    spec = model_presets.load({"base": "tiny-dense", "seq_length": 510})  # divisible by 2, not by 4
    assert_broken(run(spec, 2, cp=2, global_batch_size=1), "seq_divisible")
    spec = model_presets.load({"base": "tiny-dense", "seq_length": 516})  # 4 · 129
    assert_valid(run(spec, 2, cp=2, global_batch_size=1))


def test_seq_divisible_by_tp_and_two_cp_together():
    # 516 = 4 · 129: divisible by tp = 4 and by 2·cp = 4, not by both together (the cp shard of
    # 258 tokens does not split over 4 tp ranks).
    spec = model_presets.load({"base": "tiny-dense", "seq_length": 516})
    assert_valid(run(spec, 4, tp=4, global_batch_size=1))
    assert_valid(run(spec, 2, cp=2, global_batch_size=1))
    assert_broken(run(spec, 8, tp=4, cp=2, global_batch_size=1), "seq_divisible")
    assert_valid(run(spec, 8, tp=4, cp=2, sequence_parallel=False, global_batch_size=1))


# ---- every virtual stage holds a layer slot -----------------------------------------------------


def test_every_virtual_stage_needs_a_layer(preset):
    spec = preset("tiny-dense")  # 4 layers
    assert_valid(run(spec, 4, pp=4, global_batch_size=4))
    r = run(spec, 4, pp=4, vpp=2, global_batch_size=4)
    assert_broken(r, "pipeline_split")
    assert "virtual stage" in r["infeasible_reasons"][0]["message"]
    assert_broken(run(spec, 8, pp=8, global_batch_size=4), "pipeline_split")


def test_embedding_and_loss_count_as_slots_when_accounted():
    spec = model_presets.load({"base": "tiny-dense", "num_layers": 6})
    assert_valid(run(spec, 4, pp=4, vpp=2, account_for_embedding_in_pipeline_split=True,
                     account_for_loss_in_pipeline_split=True, global_batch_size=4))
    # 6 layers + 2 slots = 8 < 4 · 3 virtual stages
    assert_broken(run(spec, 4, pp=4, vpp=3, account_for_embedding_in_pipeline_split=True,
                      account_for_loss_in_pipeline_split=True, global_batch_size=4), "pipeline_split")


def test_default_split_with_embedding_only_stage_is_invalid():
    spec = model_presets.load({"base": "tiny-dense", "num_layers": 6})
    # 8 virtual stages, 6 layers to v1..v6: v0 holds only the embedding, v7 only the loss
    assert_broken(run(spec, 4, pp=4, vpp=2, global_batch_size=4), "pipeline_split")


def test_pipeline_layout_errors_are_pipeline_split(preset):
    spec = preset("deepseek-v3-671b")
    ok = run(spec, 1024, tp=1, pp=8, vpp=4, ep=64, global_batch_size=1024,
             pipeline_layout="Et|(tt|)*30mL")
    assert codes(ok) in ([], ["oom"])
    assert_broken(run(spec, 1024, tp=1, pp=16, vpp=2, ep=64, global_batch_size=1024,
                      pipeline_layout="E|t|(tt|)*30mL"), "pipeline_split")  # 33 stages for 32
    assert_broken(run(spec, 1024, tp=1, pp=16, vpp=4, ep=64, global_batch_size=1024,
                      pipeline_layout="Et|(tt|)*30mL"), "pipeline_split")  # 32 for 64


def test_first_last_stage_layers_that_do_not_add_up(preset):
    spec = preset("tiny-dense")  # 4 layers
    assert_valid(run(spec, 2, pp=2, first_stage_layers=1, global_batch_size=2))
    assert_broken(run(spec, 2, pp=2, first_stage_layers=3, last_stage_layers=3, global_batch_size=2),
                  "pipeline_split")


# ---- vpp > 1 needs pp > 1 -----------------------------------------------------------------------


def test_vpp_needs_pp(preset):
    spec = preset("tiny-dense")
    assert_valid(run(spec, 2, pp=2, vpp=2, global_batch_size=2))
    assert_broken(run(spec, 1, pp=1, vpp=2, global_batch_size=1), "vpp_needs_pp")


# ---- fp8 needs an FP8 peak ----------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # see test_vectorised
def test_fp8_needs_fp8_peak(preset):
    spec = preset("tiny-dense")
    assert_valid(run(spec, 1, H100, precision="fp8", global_batch_size=1))
    assert_broken(run(spec, 1, "ascend-910b", precision="fp8", global_batch_size=1), "fp8_unsupported")
    assert_valid(run(spec, 1, "ascend-910b", precision="bf16", global_batch_size=1))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # see test_vectorised
def test_several_broken_rules_are_all_reported(preset):
    spec = preset("tiny-dense")
    r = run(spec, 8, "ascend-910b", tp=8, vpp=2, precision="fp8", global_batch_size=1)
    assert set(codes(r)) == {"tp_divides_heads", "vpp_needs_pp", "fp8_unsupported"}
    json.dumps(r, allow_nan=False)


# ================================================================================================
# input errors


def _field_error(exc: ValidationError, field: str) -> bool:
    return any(field in map(str, e["loc"]) for e in exc.errors())


@pytest.mark.parametrize("field,value", [
    ("tp", 0), ("pp", -1), ("vpp", 0), ("cp", 0), ("ep", -2), ("etp", 0), ("dp", 0),
    ("micro_batch_size", 0), ("global_batch_size", -8), ("recompute_num_layers", 0),
    ("first_stage_layers", -1), ("moe_load_imbalance", 0.5),
])
def test_config_out_of_range(field, value):
    kw = {"global_batch_size": 8, field: value}
    with pytest.raises(ValidationError) as exc:
        TrainingConfig(**kw)
    assert _field_error(exc.value, field)


def test_config_missing_global_batch_size():
    with pytest.raises(ValidationError) as exc:
        TrainingConfig(tp=2)
    assert _field_error(exc.value, "global_batch_size")


def test_config_wrong_type():
    with pytest.raises(ValidationError) as exc:
        TrainingConfig(tp="two", global_batch_size=8)
    assert _field_error(exc.value, "tp")


def test_unknown_recompute_enum():
    with pytest.raises(ValidationError) as exc:
        TrainingConfig(recompute="partial", global_batch_size=8)
    assert _field_error(exc.value, "recompute")


def test_unknown_precision_enum():
    with pytest.raises(ValidationError) as exc:
        TrainingConfig(precision="fp4", global_batch_size=8)
    assert _field_error(exc.value, "precision")


def test_unknown_recompute_module():
    with pytest.raises(ValidationError) as exc:
        TrainingConfig(recompute="selective", recompute_modules=["core_attn", "attention"], global_batch_size=8)
    assert _field_error(exc.value, "recompute_modules")
    assert "attention" in str(exc.value)


def test_known_recompute_modules_accepted():
    from costmodel.spec import RECOMPUTE_MODULES

    assert set(RECOMPUTE_MODULES) == {"core_attn", "layernorm", "mla_up_proj", "moe_act", "mlp", "moe",
                                      "shared_experts"}
    TrainingConfig(recompute="selective", recompute_modules=list(RECOMPUTE_MODULES), global_batch_size=8)


def test_unknown_config_field():
    with pytest.raises(ValidationError) as exc:
        TrainingConfig(global_batch_size=8, tensor_parallel=2)
    assert _field_error(exc.value, "tensor_parallel")


def test_unknown_spec_field(preset):
    data = preset("tiny-dense").model_dump()
    data["num_heads"] = 8
    with pytest.raises(ValidationError) as exc:
        ModelSpec(**data)
    assert _field_error(exc.value, "num_heads")


@pytest.mark.parametrize("field,value", [
    ("num_layers", 0), ("hidden_size", -256), ("num_attention_heads", 0), ("ffn_hidden_size", 0),
    ("vocab_size", -1), ("seq_length", 0), ("num_experts", 0), ("mtp_num_layers", -1),
])
def test_spec_out_of_range(preset, field, value):
    data = preset("tiny-moe").model_dump()
    data[field] = value
    with pytest.raises(ValidationError) as exc:
        ModelSpec(**data)
    assert _field_error(exc.value, field)


def test_spec_missing_required_field(preset):
    data = preset("tiny-dense").model_dump()
    del data["vocab_size"]
    with pytest.raises(ValidationError) as exc:
        ModelSpec(**data)
    assert _field_error(exc.value, "vocab_size")


def test_moe_layer_freq_list_of_wrong_length():
    with pytest.raises(ValidationError) as exc:
        model_presets.load({"base": "tiny-moe", "moe_layer_freq": [0, 1, 1, 1, 1]})  # 5 for 6 layers
    assert "moe_layer_freq" in str(exc.value)
    model_presets.load({"base": "tiny-moe", "moe_layer_freq": [0, 1, 1, 1, 1, 0]})


def test_moe_layer_freq_list_entries_are_0_or_1():
    with pytest.raises(ValidationError) as exc:
        model_presets.load({"base": "tiny-moe", "moe_layer_freq": [0, 1, 2, 1, 1, 1]})
    assert _field_error(exc.value, "moe_layer_freq")

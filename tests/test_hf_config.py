"""Hugging Face config.json as a model (app/formats/hf_config.py): the published files map to the presets' specs.

The config.json contents below are the publishers' files (no network here: their text is reproduced
from the files named in each comment; the fields the mapping reads were cross-checked against copies in
public repositories found with the code search and against the presets' own sources).
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from app.cli import main
from app.formats.hf_config import is_hf_config, to_spec_data
from app.formats.inputs import InputError, load_cluster, load_model
from costmodel import TrainingConfig, evaluate
from search import SearchRequest, run_search

# https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json, less rope_scaling and
# quantization_config (and auto_map / transformers_version, which carry no model shape).
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3,
    "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "moe_intermediate_size": 2048, "moe_layer_freq": 1,
    "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06, "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
    "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
    "v_head_dim": 128, "vocab_size": 129280,
}

# https://huggingface.co/meta-llama/Meta-Llama-3-70B/blob/main/config.json
LLAMA3_70B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 8192,
    "initializer_range": 0.02, "intermediate_size": 28672, "max_position_embeddings": 8192, "model_type": "llama",
    "num_attention_heads": 64, "num_hidden_layers": 80, "num_key_value_heads": 8, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 500000.0, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.40.0.dev0", "use_cache": True, "vocab_size": 128256,
}

# https://huggingface.co/Qwen/Qwen3-235B-A22B/blob/main/config.json
QWEN3_235B = {
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288,
    "max_position_embeddings": 40960, "max_window_layers": 94, "mlp_only_layers": [], "model_type": "qwen3_moe",
    "moe_intermediate_size": 1536, "norm_topk_prob": True, "num_attention_heads": 64, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 94, "num_key_value_heads": 4, "output_router_logits": False,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}

# https://huggingface.co/mistralai/Mixtral-8x22B-v0.1/blob/main/config.json
MIXTRAL_8X22B = {
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 6144, "initializer_range": 0.02, "intermediate_size": 16384,
    "max_position_embeddings": 65536, "model_type": "mixtral", "num_attention_heads": 48,
    "num_experts_per_tok": 2, "num_hidden_layers": 56, "num_key_value_heads": 8, "num_local_experts": 8,
    "output_router_logits": False, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001, "sliding_window": None, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.38.0", "use_cache": True, "vocab_size": 32000,
}

# openPangu-Ultra-MoE-718B (https://ai.gitcode.com/ascend-tribe/openpangu-ultra-moe-718b-model, config.json);
# the field names and values as in its configuration_openpangu_moe.py (OpenPanguMoEConfig defaults, which
# are the 718B model's), found with the code search.
PANGU_ULTRA_MOE = {
    "architectures": ["PanguUltraMoEForCausalLM"], "model_type": "pangu_ultra_moe", "vocab_size": 153600,
    "hidden_size": 7680, "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
    "num_mtp_layers": 1, "num_attention_heads": 128, "num_key_value_heads": 128, "num_shared_experts": 1,
    "num_routed_experts": 256, "routed_scaling_factor": 2.5, "attention_kv_lora_dim": 512,
    "attention_q_lora_dim": 1536, "attention_qk_rope_dim": 64, "attention_v_dim": 128, "attention_qk_dim": 128,
    "num_experts_per_tok": 8, "num_dense_layers": 3, "norm_topk_prob": True, "hidden_act": "silu",
    "max_position_embeddings": 131072, "initializer_range": 0.02, "rms_norm_eps": 1e-5, "use_cache": True,
    "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": False, "rope_theta": 25600000,
    "attention_dropout": 0.0, "torch_dtype": "bfloat16",
}

# Every ModelSpec field the cost model reads (everything but the name).
COST_FIELDS = ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "vocab_size", "seq_length",
               "num_query_groups", "kv_channels", "swiglu", "untie_embeddings_and_output_weights",
               "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim",
               "v_head_dim", "num_experts", "moe_router_topk", "moe_ffn_hidden_size",
               "moe_shared_expert_intermediate_size", "moe_layer_freq", "mtp_num_layers")

CASES = [(DEEPSEEK_V3, "deepseek-v3-671b"), (LLAMA3_70B, "llama3-70b"), (QWEN3_235B, "qwen3-235b-a22b"),
         (MIXTRAL_8X22B, "mixtral-8x22b"), (PANGU_ULTRA_MOE, "pangu-ultra-moe-718b")]


def _write(tmp_path, cfg: dict):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


@pytest.mark.parametrize("hf, preset", CASES, ids=[c[1] for c in CASES])
def test_hf_config_is_the_preset(tmp_path, hf, preset):
    ref = load_model(preset)
    spec = load_model(_write(tmp_path, hf), ref.seq_length)  # a path, as --model takes it
    for f in COST_FIELDS:
        assert getattr(spec, f) == getattr(ref, f), f
    assert spec.moe_layer_pattern() == ref.moe_layer_pattern()
    assert load_model(hf, ref.seq_length) == spec  # a dict, as the API takes it


def test_deepseek_v3_evaluates_as_the_preset(tmp_path):
    ref = load_model("deepseek-v3-671b")
    spec = load_model(_write(tmp_path, DEEPSEEK_V3))
    assert spec.seq_length == 4096  # the contract's default for a config.json
    profile = load_cluster("nvidia-h100-80gb")
    for cfg in ({"tp": 2, "pp": 16, "ep": 64, "global_batch_size": 4096, "recompute": "full"},
                {"tp": 4, "pp": 8, "vpp": 2, "ep": 32, "global_batch_size": 4096, "recompute": "selective",
                 "recompute_modules": ["mla_up_proj", "moe_act"], "moe_a2a_overlap": True}):
        c = TrainingConfig(**cfg)
        a, b = evaluate(spec, profile, 2048, c), evaluate(ref, profile, 2048, c)
        assert a == b
        assert a["step_time_s"] is not None


def test_deepseek_v3_search_runs(tmp_path):
    spec = load_model(_write(tmp_path, DEEPSEEK_V3))
    res = run_search(SearchRequest(spec=spec, profile=load_cluster("nvidia-h100-80gb"), devices=2048,
                                   global_batch_size=4096, sampler="tpe", n_trials=30, seed=1))
    assert res["trials"] == 30
    assert res["best"] is not None


def test_seq_length_and_cli(tmp_path):
    path = _write(tmp_path, DEEPSEEK_V3)
    assert load_model(path, 8192).seq_length == 8192
    assert to_spec_data(DEEPSEEK_V3)["seq_length"] == 4096
    res = CliRunner().invoke(main, ["evaluate", "--model", path, "--cluster", "nvidia-h100-80gb", "--devices",
                                    "2048", "--seq-length", "4096", "--json", "--config",
                                    json.dumps({"tp": 2, "pp": 16, "ep": 64, "global_batch_size": 4096})])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["step_time_s"] > 0


def test_qwen3_moe_sparse_step_and_dense_layers():
    spec = load_model({**QWEN3_235B, "decoder_sparse_step": 2, "mlp_only_layers": [1]})
    pattern = spec.moe_layer_pattern()
    assert pattern[:4] == [0, 0, 0, 1] and sum(pattern) == 46


def test_dense_qwen_and_llama_families():
    qwen3 = {**LLAMA3_70B, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 128}
    qwen2 = {**LLAMA3_70B, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}
    for cfg in (qwen3, qwen2):
        spec = load_model(cfg)
        assert spec.num_experts is None and spec.kv_channels == 128 and spec.num_query_groups == 8


def test_unsupported_architecture(tmp_path):
    assert is_hf_config({"model_type": "x"}) and not is_hf_config({"num_layers": 2})
    with pytest.raises(InputError) as exc:
        load_model({"architectures": ["BertForMaskedLM"], "model_type": "bert", "hidden_size": 768})
    assert exc.value.field == "model" and "unsupported architecture BertForMaskedLM" in exc.value.reason
    assert "DeepseekV3ForCausalLM" in exc.value.reason
    path = _write(tmp_path, {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})
    res = CliRunner().invoke(main, ["evaluate", "--model", path, "--cluster", "nvidia-h100-80gb", "--devices", "8",
                                    "--config", '{"global_batch_size": 8}'])
    assert res.exit_code == 2 and "unsupported architecture GPT2LMHeadModel" in res.output
    with pytest.raises(InputError) as exc:
        load_model({k: v for k, v in LLAMA3_70B.items() if k != "hidden_size"})
    assert exc.value.field == "model.hidden_size"


def test_api_takes_hf_config(tmp_path):
    from service_util import TINY_JOB
    from test_service_api import make_client

    with make_client(tmp_path) as c:
        body = {"model": DEEPSEEK_V3, "cluster": "nvidia-h100-80gb", "devices": 2048,
                "config": {"tp": 2, "pp": 16, "ep": 64, "global_batch_size": 4096}}
        r = c.post("/v1/evaluate", json=body)
        assert r.status_code == 200, r.text
        assert r.json() == evaluate(load_model("deepseek-v3-671b"), load_cluster("nvidia-h100-80gb"), 2048,
                                    TrainingConfig(**body["config"]))
        r = c.post("/v1/evaluate", json={**body, "model": {"architectures": ["BertForMaskedLM"]}})
        assert r.status_code == 422
        detail = r.json()["detail"][0]
        assert detail["loc"] == ["body", "model"] and "unsupported architecture BertForMaskedLM" in detail["msg"]
        r = c.post("/v1/jobs", json={**TINY_JOB, "model": MIXTRAL_8X22B, "devices": 64, "global_batch_size": 512,
                                     "search": {"sampler": "tpe", "n_trials": 5, "seed": 1}})
        assert r.status_code == 202, r.text
        assert r.json()["inputs"]["model"]["num_experts"] == 8

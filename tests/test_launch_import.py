"""Launch import (the inverse of the export), compare and ``search --from-launch``.

* The round trip: for every preset and the ranked configs of its search planned for each framework (the
  searches of tests/test_launch_model.py), importing the export gives the config back (the fields the
  launch states, in their canonical form) and the same evaluation to the last bit; and every flag an
  export writes is in the flag table.
* Fixture scripts written in the form of the frameworks' example scripts (tests/fixtures/launch: MindSpeed-LLM's
  DeepSeek-V3 pretrain script, Megatron-LM's Llama-3 8B script) import to the fields their flags say, checked
  by hand; the Pangu script evaluates as examples/pangu-ultra-moe-6144.json; Megatron-LM's own parse_args
  accepts the Megatron fixture's arguments where it is installed.
* Bad scripts (unbalanced quotes, a flag without its value, unknown, refused and contradictory flags) exit 2
  naming the flag, never a traceback; the API answers 422 naming it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.formats.inputs import load_cluster, load_config, load_model
from app.formats.launch import launch_args
from app.formats.launch_import import read_launch
from app.formats.launch_script import ScriptError, read_script
from app.formats.results import evaluate
from costmodel import TrainingConfig
from search.frameworks import ep_leaves_domain, flags as table, stage_tokens
from search.frameworks.importer import LaunchImportError, read_args

from test_launch_model import RUNS, top_configs

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "launch"
PANGU = FIXTURES / "pangu_ultra_moe_718b_mindspeed.sh"
LLAMA = FIXTURES / "llama3_70b_megatron.sh"
MODELLING = ("moe_load_imbalance", "moe_expert_load", "moe_expert_skew")


def paraplan(*args, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, input=stdin,
                          env=env, cwd=ROOT, timeout=600)


# ---- the round trip ------------------------------------------------------------------------------

def canonical_config(cfg: TrainingConfig, spec, domain: int) -> dict:
    """What a launch states of a config, in one form: the split as its virtual stages, sequence parallelism,
    sharding, schedule, fp8 recipe and weight-gradient delay in force, the dispatch the launch runs."""
    hier = cfg.a2a_hierarchical and ep_leaves_domain(cfg, domain)
    return {
        "tp": cfg.tp, "pp": cfg.pp, "vpp": cfg.vpp, "cp": cfg.cp, "ep": cfg.ep, "etp": cfg.etp if spec.is_moe else 1,
        "mbs": cfg.micro_batch_size, "gbs": cfg.global_batch_size, "sp": cfg.sp, "tp_comm_overlap": cfg.tp_comm_overlap,
        "recompute": cfg.recompute,
        "modules": sorted(cfg.recompute_modules or ["core_attn"]) if cfg.recompute == "selective" else None,
        "offload": sorted(cfg.offload_modules or []), "sharding": cfg.sharding,
        "overlap_grad_reduce": cfg.overlap_grad_reduce,
        "overlap_param_gather": cfg.overlap_param_gather and cfg.sharding != "no_shard",
        "stages": stage_tokens(cfg, spec), "schedule": cfg.schedule, "precision": cfg.precision,
        "fp8_recipe": cfg.fp8_recipe_in_force if cfg.precision == "fp8" else None,
        "a2a_overlap": cfg.moe_a2a_overlap and spec.is_moe, "delays_wgrad": cfg.delays_wgrad and spec.is_moe,
        "dispatch": (cfg.moe_token_dispatcher_type or ("flex" if hier else "alltoall")) if spec.is_moe else None,
        "cp_comm_type": cfg.cp_comm_type if cfg.cp > 1 else None, "attention": cfg.attention_kernel,
        "mla_fa_without_pad": cfg.mla_fa_without_pad,
        "dtypes": (cfg.main_grads_dtype, cfg.main_params_dtype, cfg.exp_avg_dtype, cfg.exp_avg_sq_dtype),
    }


def canonical_spec(spec) -> dict:
    """The model as a launch builds it (derived widths where a flag is left out because it is the default)."""
    d = spec.model_dump(exclude={"name", "kv_channels", "num_query_groups", "activation_func", "rotary_scaling_factor"})
    d.update(head_dim=spec.head_dim if not spec.multi_latent_attention else None, query_groups=spec.query_groups,
             activation=spec.activation, moe_layers=spec.moe_layer_pattern(),
             rotary_scaling_factor=spec.rotary_scaling_factor or 1.0)
    d.pop("moe_layer_freq")
    return d


def _as_launched(cfg: TrainingConfig, spec, domain: int) -> TrainingConfig:
    """The config a launch of its export runs: inside one scale-up domain both frameworks' exports state the
    flat all-to-all dispatcher (options.py ``_moe``), so an unstated hierarchical dispatch is read back flat."""
    if spec.is_moe and cfg.moe_token_dispatcher_type is None and not ep_leaves_domain(cfg, domain):
        return cfg.model_copy(update={"moe_a2a_algorithm": "flat"})
    return cfg


CASES = [(p, f) for p in sorted(RUNS) for f in ("megatron", "mindspeed")]


@pytest.mark.parametrize("preset,fmt", CASES)
def test_import_of_the_export_is_the_config(preset, fmt):
    cluster, devices, _ = RUNS[preset]
    spec, profile = load_model(preset), load_cluster(cluster)
    domain = int(profile.fact("scale_up_domain"))
    configs = top_configs(preset, fmt)
    assert configs
    for raw in configs:
        cfg = _as_launched(TrainingConfig.model_validate(raw), spec, domain)
        tokens = launch_args(cfg, spec, fmt, domain)
        imp = read_args(tokens, fmt)
        assert imp.framework == fmt
        assert canonical_spec(imp.spec) == canonical_spec(spec), preset
        assert canonical_config(imp.config, spec, domain) == canonical_config(cfg, spec, domain), (preset, raw)
        got = imp.config.model_copy(update={k: getattr(cfg, k) for k in MODELLING})
        assert evaluate(imp.spec, profile, devices, got) == evaluate(spec, profile, devices, cfg), (preset, raw)
        assert not imp.warnings, imp.warnings  # an export is what the framework accepts
        assert all(table.known(t) for t in tokens if t.startswith("--")), [t for t in tokens if t.startswith("--")
                                                                            and not table.known(t)]


def test_the_framework_is_guessed_from_the_script():
    spec, cfg = load_model("tiny-moe"), TrainingConfig(global_batch_size=64, ep=2, moe_a2a_algorithm="flat")
    assert read_args(launch_args(cfg, spec, "mindspeed")).framework == "mindspeed"  # --use-fused-rmsnorm
    assert read_args(launch_args(cfg, spec, "megatron")).framework == "megatron"


# ---- the fixtures, checked by hand --------------------------------------------------------------

def test_pangu_script_imports_huaweis_layout_and_evaluates_as_the_example():
    imp = read_launch(PANGU.read_text())
    assert (imp.framework, imp.devices) == ("mindspeed", 768 * 8)
    c = imp.config
    # TP=8 PP=16; EP=4 extended by TP (--moe-tp-extend-ep) is 32 with unsplit experts
    assert (c.tp, c.pp, c.cp, c.ep, c.etp) == (8, 16, 1, 32, 1)
    # 64 slots in virtual stages of 2 (--num-layers-per-virtual-pipeline-stage 2): vpp 64 / (16·2) = 2
    assert c.vpp == 2 and (c.micro_batch_size, c.global_batch_size) == (2, 7680)
    assert c.sp and c.tp_comm_overlap and c.moe_a2a_overlap and c.a2a_hierarchical
    assert c.recompute == "selective" and sorted(c.recompute_modules) == ["layernorm", "mla_up_proj", "moe"]
    assert c.distributed_optimizer and c.overlap_grad_reduce and c.overlap_param_gather
    # no-op layers 1, 62, 63: the first virtual stage holds the embedding and one layer, the last the MTP
    # layer and the loss only
    tokens = stage_tokens(c, imp.spec)
    assert tokens[0] == "Et" and tokens[-1] == "mL" and sum(t.count("t") for t in tokens) == 61
    s = imp.spec
    assert (s.num_layers, s.hidden_size, s.ffn_hidden_size, s.num_attention_heads, s.vocab_size, s.seq_length) == \
        (61, 7680, 18432, 128, 153600, 8192)
    assert (s.q_lora_rank, s.kv_lora_rank, s.qk_head_dim, s.qk_pos_emb_head_dim, s.v_head_dim) == (1536, 512, 128, 64, 128)
    assert (s.num_experts, s.moe_router_topk, s.moe_ffn_hidden_size, s.moe_shared_expert_intermediate_size) == \
        (256, 8, 2048, 2048)
    # --first-k-dense-replace 4 over the padded positions (no-op at 1): real layers 0-2 dense, 58 MoE
    assert s.moe_layer_pattern() == [0, 0, 0] + [1] * 58
    assert s.mtp_num_layers == 1 and s.rotary_base == 25_600_000 and s.moe_router_topk_scaling_factor == 2.5
    assert s.normalization == "RMSNorm" and not s.add_bias_linear and s.qk_layernorm and s.swiglu
    # the same evaluation as the example config of Huawei's run, to the last bit
    profile = load_cluster("ascend-910b")
    example = evaluate(load_model("pangu-ultra-moe-718b"), profile, 6144,
                       load_config(str(ROOT / "examples" / "pangu-ultra-moe-6144.json")))
    assert evaluate(s, profile, imp.devices, c) == example
    # what MindSpeed-LLM itself refuses of Huawei's combination comes back as warnings, not silence
    assert any("MC2" in w for w in imp.warnings)
    assert any(n.startswith("ignored, training hyper-parameters") and "--lr," in n for n in imp.notes)


def test_llama3_script_imports_the_fields_its_flags_say():
    imp = read_launch(LLAMA.read_text())
    assert (imp.framework, imp.devices) == ("megatron", 64 * 8)
    c, s = imp.config, imp.spec
    assert (c.tp, c.pp, c.vpp, c.cp, c.ep) == (8, 4, 4, 1, 1)  # 80 / (4 · 5) = 4 chunks
    assert (c.micro_batch_size, c.global_batch_size) == (1, 1024)
    assert c.sp and c.tp_comm_overlap and c.distributed_optimizer and c.overlap_grad_reduce and c.overlap_param_gather
    assert c.recompute == "selective" and c.recompute_modules == ["core_attn", "mlp"]
    assert c.attention_kernel == "flash"  # --attention-backend fused: cuDNN's fused attention, FlashAttention-class
    assert (s.num_layers, s.hidden_size, s.ffn_hidden_size, s.num_attention_heads, s.query_groups, s.head_dim) == \
        (80, 8192, 28672, 64, 8, 128)
    assert (s.seq_length, s.rotary_base, s.normalization, s.swiglu, s.add_bias_linear) == \
        (8192, 500000, "RMSNorm", True, False)
    # --vocab-size 128256 padded as Megatron pads it: to a multiple of 128 · tp 8 = 1024
    assert s.vocab_size == 129024 and any("padded to 129024" in n for n in imp.notes)


def test_megatron_parses_the_megatron_fixtures():
    from test_megatron_validate import HARNESS, PYTHON, _available

    missing = _available()
    if missing is not None:
        if os.environ.get("CI"):
            pytest.fail(f"Megatron-LM's parse_args needs torch and megatron-core in {PYTHON}: {missing}")
        pytest.skip(f"Megatron-LM's parse_args needs torch and megatron-core in {PYTHON}: {missing}")
    cases = []
    for path in (LLAMA,):
        launch = read_script(path.read_text())
        # the paths and data flags as they would be on a cluster (their values are not the plan's)
        cases.append({"argv": launch.args, "world_size": launch.devices, "env": {}})
    proc = subprocess.run([PYTHON, str(HARNESS)], input=json.dumps(cases), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout)
    assert all(r["ok"] for r in results), results
    imp = read_launch(LLAMA.read_text())
    r = results[0]  # Megatron builds what the import read
    assert (r["vpp"], r["num_layers"], r["normalization"], r["add_bias_linear"], r["gated_linear_unit"],
            r["rotary_base"]) == (imp.config.vpp, imp.spec.num_layers, imp.spec.normalization,
                                  imp.spec.add_bias_linear, imp.spec.swiglu, imp.spec.rotary_base)


# ---- the bash reader ----------------------------------------------------------------------------

def test_the_reader_expands_variables_arrays_blocks_and_launchers():
    text = """#!/bin/bash
NODES=${NODES:-2}
PER=8
WORLD=$(($PER*$NODES))
TP=4
A="--tensor-model-parallel-size ${TP} \\
   --micro-batch-size 1"
A="$A --global-batch-size $WORLD"
B=(--seq-length 4096   # a comment inside an array
   "--hidden-size 1024")
B+=(--bf16)
if [ "$X" -eq 1 ]; then
  A="$A --fp16"
fi
torchrun --nnodes $NODES --nproc-per-node=$PER pretrain_gpt.py $A ${B[@]} | tee log.txt
python3 helper.py --ignored
"""
    launch = read_script(text)
    assert launch.args == ["--tensor-model-parallel-size", "4", "--micro-batch-size", "1", "--global-batch-size", "16",
                           "--seq-length", "4096", "--hidden-size", "1024", "--bf16"]
    assert (launch.launcher, launch.entry, launch.devices) == ("torchrun", "pretrain_gpt.py", 16)
    assert any("if block was not read" in n for n in launch.notes)
    msrun = read_script("msrun --worker_num 64 --local_worker_num 8 posttrain_gpt.py --bf16")
    assert (msrun.launcher, msrun.nnodes, msrun.nproc_per_node, msrun.devices) == ("msrun", 8, 8, 64)
    assert read_script("--a 1 --b 'x y'").args == ["--a", "1", "--b", "x y"]  # a plain argument list
    ev = read_script('CMD="torchrun --nproc_per_node 4 pretrain_gpt.py --bf16"\neval $CMD')
    assert (ev.args, ev.devices) == (["--bf16"], 4)


@pytest.mark.parametrize("text,where", [
    ('--num-layers "2', 'unbalanced double quote'),
    ("GPT_ARGS='--bf16\ntorchrun pretrain_gpt.py $GPT_ARGS", "unbalanced single quote"),
    ("if true; then\n  X=1\n", "block not closed"),
    ("torchrun --nproc_per_node $(nproc) pretrain_gpt.py --seq-length $(cat len.txt)", "command substitution"),
])
def test_unreadable_scripts_are_errors_with_the_line(text, where):
    with pytest.raises(ScriptError, match=where):
        read_script(text)


BASE = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "128",
        "--vocab-size", "1024", "--global-batch-size", "8", "--bf16"]


@pytest.mark.parametrize("extra,flag,reason", [
    (["--frobnicate", "3"], "--frobnicate", "unknown flag"),
    (["--fp16"], "--fp16", "fp16 training is not modelled"),
    (["--swap-optimizer"], "--swap-optimizer", "optimizer-state swapping"),
    (["--tensor-model-parallel-size"], "--tensor-model-parallel-size", "flag without its value"),
    (["--sequence-parallel", "yes"], "--sequence-parallel", "a switch takes no value"),
    (["--micro-batch-size", "2", "--micro-batch-size", "4"], "--micro-batch-size", "given twice"),
    (["--swiglu", "--geglu"], "--geglu", "contradicts --swiglu"),
    (["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-modules", "mlp"],
     "--recompute-granularity", "contradicts the selective modules"),
    (["--num-layers-per-virtual-pipeline-stage", "1", "--num-virtual-stages-per-pipeline-rank", "2"],
     "--num-virtual-stages-per-pipeline-rank", "contradicts"),
    (["--tensor-model-parallel-size", "x"], "--tensor-model-parallel-size", "not an integer"),
    (["--recompute-method", "block"], "--recompute-method", "only with --recompute-granularity full"),
    (["--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank", "3"],
     "--num-virtual-stages-per-pipeline-rank", "but the model has only 4 layer slots"),
])
def test_bad_flags_name_the_flag(extra, flag, reason):
    with pytest.raises(LaunchImportError) as exc:
        read_args(BASE + extra, "megatron")
    assert exc.value.flag == flag and reason in exc.value.reason


# ---- the command line and the API ----------------------------------------------------------------

def test_cli_import_json_and_errors():
    ok = paraplan("import", str(PANGU), "--json")
    assert ok.returncode == 0, ok.stderr
    data = json.loads(ok.stdout)
    assert data["devices"] == 6144 and data["config"]["ep"] == 32 and data["model"]["num_experts"] == 256
    piped = paraplan("import", "-", "--json", stdin=" ".join(BASE + ["--tensor-model-parallel-size", "2"]))
    assert piped.returncode == 0 and json.loads(piped.stdout)["config"]["tp"] == 2
    for stdin, named in ((" ".join(BASE + ["--frobnicate", "1"]), "launch.--frobnicate"),
                         (" ".join(BASE + ["--pipeline-model-parallel-size", "99999999999"]),
                          "launch.--pipeline-model-parallel-size: at most 1,000,000"),
                         ('--num-layers "2', "unbalanced double quote"),
                         (" ".join(BASE + ["--seq-length"]), "launch.--seq-length")):
        bad = paraplan("import", "-", stdin=stdin)
        assert bad.returncode == 2 and named in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
        assert bad.stdout == ""


def test_cli_evaluate_from_launch_is_the_config_evaluated():
    imp = read_launch(LLAMA.read_text())
    via_script = paraplan("evaluate", "--from-launch", str(LLAMA), "--cluster", "nvidia-h100-80gb", "--json")
    assert via_script.returncode == 0, via_script.stderr
    expected = evaluate(imp.spec, load_cluster("nvidia-h100-80gb"), 512, imp.config)
    assert json.loads(via_script.stdout) == json.loads(json.dumps(expected))
    missing = paraplan("evaluate", "--cluster", "nvidia-h100-80gb", "--devices", "8", "--model", "tiny-dense")
    assert missing.returncode == 2 and "--config" in missing.stderr


def test_compare_explains_each_difference_by_size(tmp_path):
    cfg = json.loads((ROOT / "examples" / "pangu-ultra-moe-6144.json").read_text())
    other = tmp_path / "tp4.json"
    other.write_text(json.dumps({**cfg, "tp": 4, "recompute_modules": ["layernorm", "mla_up_proj"]}))
    run = paraplan("compare", str(PANGU), str(other), "--model", "pangu-ultra-moe-718b", "--cluster", "ascend-910b",
                   "--json")
    assert run.returncode == 0, run.stderr
    cmp = json.loads(run.stdout)
    parts = {(r["kind"], r["part"]): r for r in cmp["parts"]}
    for key in (("time", "compute_s"), ("time", "pp_bubble_s"), ("memory", "activations_gib")):
        r = parts[key]
        assert r["delta"] == pytest.approx(r["b"] - r["a"])
    time_diffs = [d for d in cmp["differences"] if d["kind"] == "time"]
    assert [abs(d["delta"]) for d in time_diffs] == sorted((abs(d["delta"]) for d in time_diffs), reverse=True)
    compute = next(d for d in cmp["differences"] if d["part"] == "compute_s")
    # both changes enter compute in the model: TP's GEMM width and the dropped moe recompute
    assert any(c.startswith("tp 8 → 4: the GEMMs are wider") for c in compute["causes"])
    assert any(c.startswith("recompute_modules layernorm,mla_up_proj,moe → layernorm,mla_up_proj")
               for c in compute["causes"])
    assert compute["text"].startswith(f"compute {compute['delta']:+.2f} s".replace("-", "−"))
    bubble = next(d for d in cmp["differences"] if d["part"] == "pp_bubble_s")
    assert any(c.startswith("micro-batches per step 80 → 40") for c in bubble["causes"])
    table = paraplan("compare", str(PANGU), str(other), "--model", "pangu-ultra-moe-718b", "--cluster", "ascend-910b")
    assert table.returncode == 0 and "why they differ" in table.stdout and "tp 8 → 4" in table.stdout


def test_api_import_and_compare(tmp_path):
    from test_service_api import make_client

    client = make_client(tmp_path)
    text = PANGU.read_text()
    r = client.post("/v1/launch/import", json={"text": text})
    assert r.status_code == 200 and r.json()["devices"] == 6144 and r.json()["config"]["tp"] == 8
    bad = client.post("/v1/launch/import", json={"text": " ".join(BASE + ["--frobnicate", "2"])})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "text", "--frobnicate"]
    quote = client.post("/v1/launch/import", json={"text": '--seq-length "12'})
    assert quote.status_code == 422 and "unbalanced double quote" in quote.json()["detail"][0]["msg"]
    cfg = json.loads((ROOT / "examples" / "pangu-ultra-moe-6144.json").read_text())
    cmp = client.post("/v1/compare", json={"cluster": "ascend-910b", "a": {"launch": text, "label": "Huawei"},
                                           "b": {"model": "pangu-ultra-moe-718b", "devices": 6144, "config": cfg}})
    assert cmp.status_code == 200
    assert cmp.json()["differences"] == [] and cmp.json()["gain"] == pytest.approx(0.0)  # the same run
    both = client.post("/v1/compare", json={"cluster": "ascend-910b", "a": {"launch": text, "config": cfg},
                                            "b": {"launch": text}})
    assert both.status_code == 422 and both.json()["detail"][0]["loc"] == ["body", "a"]


TINY_SCRIPT = """#!/bin/bash
GPUS_PER_NODE=8
NNODES=1
MODEL_ARGS=(
    --num-layers 6 --hidden-size 256 --ffn-hidden-size 1024 --num-attention-heads 8 --seq-length 1024
    --vocab-size 1024 --swiglu --normalization RMSNorm --position-embedding-type rope
    --untie-embeddings-and-output-weights --disable-bias-linear
)
TRAIN_ARGS=(--micro-batch-size 1 --global-batch-size 64 --bf16 --tensor-model-parallel-size 4 --lr 1e-4)
torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES pretrain_gpt.py ${MODEL_ARGS[@]} ${TRAIN_ARGS[@]}
"""


@pytest.fixture(scope="module")
def from_launch(tmp_path_factory):
    """``search --from-launch`` of a small dense script (tp 4 on one node), as JSON and as tables."""
    d = tmp_path_factory.mktemp("from_launch")
    script = d / "train.sh"
    script.write_text(TINY_SCRIPT)
    args = ["search", "--from-launch", str(script), "--cluster", "nvidia-h100-80gb", "--sampler", "exhaustive"]
    as_json, tables = paraplan(*args, "--json"), paraplan(*args)
    assert as_json.returncode == 0 and tables.returncode == 0, as_json.stderr + tables.stderr
    return d, json.loads(as_json.stdout), tables.stdout


def test_search_from_launch_reports_the_teams_config_and_the_gain(from_launch):
    _, result, tables = from_launch
    team = read_launch(TINY_SCRIPT)
    assert result["inputs"]["devices"] == 8 and result["inputs"]["global_batch_size"] == 64
    fl = result["from_launch"]
    assert fl["import"]["config"]["tp"] == 4
    expected = evaluate(team.spec, load_cluster("nvidia-h100-80gb"), 8, team.config)
    assert fl["evaluation"]["tokens_per_s_per_device"] == expected["tokens_per_s_per_device"]
    best = result["best"]["evaluation"]["tokens_per_s_per_device"]
    assert fl["gain"] == pytest.approx(best / expected["tokens_per_s_per_device"] - 1.0)
    assert fl["comparison"]["a"]["label"] == "your launch"
    assert "your launch" in tables and "over your launch" in tables and "why they differ" in tables


def test_report_shows_the_comparison_in_chromium(from_launch):
    from service_util import require_chromium

    sys.path.insert(0, str(ROOT / "scripts"))
    import report_screenshot as shot

    sys.path.pop(0)
    d, result, _ = from_launch
    (d / "result.json").write_text(json.dumps(result))
    out = d / "report.html"
    run = paraplan("report", str(d / "result.json"), "-o", str(out))
    assert run.returncode == 0, run.stderr
    page = out.read_text()
    assert "Your launch and the search" in page
    for diff in result["from_launch"]["comparison"]["differences"]:
        assert html_text(diff["text"]) in page
    require_chromium(shot.chromium)  # what a person sees: the section drawn by a real browser
    dom = shot.rendered_dom(out)
    assert 'id="comparison"' in dom and "B over A" in dom


def html_text(text: str) -> str:
    import html

    return html.escape(text)

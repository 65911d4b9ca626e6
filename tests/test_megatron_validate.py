"""Megatron-LM's own argument parsing and validation on the exported flags.

``parse_args`` + ``validate_args`` + ``core_transformer_config_from_args`` (which builds and checks the
``TransformerConfig``) of Megatron-LM core_v0.16.1: the ``megatron-core`` wheel from PyPI (megatron/core)
and the argument module of megatron/training vendored in tests/vendor/megatron_lm (README.md there), run
on torch for CPU in a subprocess (tests/vendor/megatron_lm/validate.py says what it stubs: the device
probes only). Cases: the top configs of a Megatron-planned search of every preset (the read-back test's
searches), one config of each pipeline-split kind, and configs Megatron once rejected.

Needs torch and megatron-core in the interpreter (this one, or ``PARAPLAN_MEGATRON_PYTHON``); .ci/run
installs them (PyPI's torch, whose CUDA libraries it links even on a CPU). Without them the test skips
saying so, and fails under CI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.formats.inputs import load_cluster, load_model
from app.formats.launch import launch_args, launch_env
from costmodel import TrainingConfig

from test_launch_model import RUNS, SPLITS, top_configs

# top_configs' searches are cached in the process that ran tests/test_launch_model.py: one xdist group
# runs both modules on one worker, so they run once (tests/README.md)
pytestmark = pytest.mark.xdist_group("launch-searches")

HARNESS = Path(__file__).resolve().parent / "vendor" / "megatron_lm" / "validate.py"
PYTHON = os.environ.get("PARAPLAN_MEGATRON_PYTHON", sys.executable)


def _available() -> str | None:
    probe = subprocess.run([PYTHON, "-c", "import torch, megatron.core"], capture_output=True, text=True)
    return None if probe.returncode == 0 else probe.stderr.strip().splitlines()[-1:]


@pytest.fixture(scope="module")
def megatron():
    missing = _available()
    if missing is not None:
        msg = (f"Megatron-LM's validation needs torch and megatron-core in {PYTHON} ({missing}): "
               "pip install torch==2.14.1 megatron-core==0.16.1, as .ci/run does")
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)

    def run(cases: list[tuple[str, list[str], int]], env: bool = True) -> dict[str, dict]:
        """Megatron's verdict on each case, launched with the environment the export asks for (``env``)."""
        proc = subprocess.run([PYTHON, str(HARNESS)], input=json.dumps([{"argv": a, "world_size": w,
                                                                        "env": launch_env(a) if env else {}}
                                                                       for _, a, w in cases]),
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return {name: r for (name, _, _), r in zip(cases, json.loads(proc.stdout))}
    return run


def _rejected(results: dict[str, dict]) -> dict[str, str]:
    return {name: r["error"] for name, r in results.items() if not r["ok"]}


def test_megatron_accepts_the_top_configs_of_every_preset(megatron):
    cases, specs = [], {}
    for preset in sorted(RUNS):
        cluster, devices, _ = RUNS[preset]
        domain = int(load_cluster(cluster).fact("scale_up_domain"))
        spec = specs[preset] = load_model(preset)
        for i, cfg in enumerate(top_configs(preset, "megatron")):
            cases.append((f"{preset}#{i + 1}", launch_args(cfg, spec, "megatron", domain), devices, cfg))
    assert {c[0].split("#")[0] for c in cases} == set(RUNS)
    results = megatron([c[:3] for c in cases])
    assert not _rejected(results), _rejected(results)
    for name, _, _, cfg in cases:  # and builds the planned model and schedule
        r, spec, c = results[name], specs[name.split("#")[0]], TrainingConfig.model_validate(cfg)
        assert (r["vpp"] or 1) == c.vpp, name
        assert (r["num_layers"], r["normalization"], r["add_bias_linear"], r["gated_linear_unit"],
                r["qk_layernorm"], r["num_moe_experts"]) == \
            (spec.num_layers, spec.normalization, spec.add_bias_linear, spec.swiglu, spec.qk_layernorm,
             spec.num_experts), name
        assert r["position_embedding_type"] == spec.position_embedding_type, name


def _world(cfg: dict, dp: int = 8) -> int:
    return cfg.get("tp", 1) * cfg.get("pp", 1) * cfg.get("cp", 1) * dp


def test_megatron_accepts_each_pipeline_split_kind(megatron):
    spec = load_model("deepseek-v3-671b")
    cases = []
    for kind, split in SPLITS.items():
        cfg = {"ep": 8, "global_batch_size": 4096, "moe_a2a_algorithm": "flat", **split}
        cases.append((kind, launch_args(cfg, spec, "megatron", 8), _world(cfg)))
    dense = load_model("llama3-70b")
    for name, cfg in {"dense vpp": {"tp": 8, "pp": 4, "vpp": 2},
                      "dense first/last exact, vpp": {"tp": 8, "pp": 4, "vpp": 2, "first_stage_layers": 20,
                                                      "last_stage_layers": 20}}.items():
        cfg = {**cfg, "global_batch_size": 1024}
        cases.append((name, launch_args(cfg, dense, "megatron", 8), _world(cfg)))
    results = megatron(cases)
    assert not _rejected(results), _rejected(results)


# Configs whose export Megatron once rejected (what Megatron refused, and why the export now passes)
ONCE_REJECTED = {
    # interleaved with pp 2: Megatron's p2p overlap is on by default, so pp 2 is allowed
    "llama3-70b tp4 pp2 vpp4": ("llama3-70b", {"tp": 4, "pp": 2, "vpp": 4, "global_batch_size": 1024}, 512),
    # fp8 with layernorm and moe_act recompute: the tensorwise recipe
    "fp8 layernorm/moe_act recompute": ("tiny-moe", {"tp": 2, "ep": 2, "global_batch_size": 64, "precision": "fp8",
                                                     "recompute": "selective",
                                                     "recompute_modules": ["layernorm", "moe_act"]}, 8),
    # MTP needs rope (the model flags), etp 2 needs no biases
    "MTP with etp 2": ("deepseek-v3-671b", {"tp": 2, "pp": 4, "ep": 8, "etp": 2, "global_batch_size": 4096,
                                            "moe_a2a_algorithm": "flat"}, 64),
    # first/last stage layers not divisible by vpp: a layout
    "first/last by vpp": ("deepseek-v3-671b", {"tp": 2, "pp": 8, "vpp": 2, "ep": 8, "first_stage_layers": 7,
                                               "last_stage_layers": 6, "global_batch_size": 4096}, 128),
    # the all-to-all overlap with interleaving and selective recompute
    "a2a overlap, vpp": ("deepseek-v3-671b", {"tp": 2, "pp": 4, "vpp": 2, "ep": 8, "moe_a2a_overlap": True,
                                              "recompute": "selective", "recompute_modules": ["core_attn"],
                                              "account_for_embedding_in_pipeline_split": True,
                                              "account_for_loss_in_pipeline_split": True,
                                              "global_batch_size": 4096}, 64),
    # full recompute of N layers per stage, stated per chunk
    "block recompute": ("deepseek-v3-671b", {"tp": 2, "pp": 16, "ep": 8, "recompute": "full",
                                             "recompute_num_layers": 2, "global_batch_size": 4096}, 256),
}


def test_megatron_accepts_the_configs_it_once_rejected(megatron):
    cases = [(name, launch_args(cfg, load_model(model), "megatron", 8), world)
             for name, (model, cfg, world) in ONCE_REJECTED.items()]
    results = megatron(cases)
    assert not _rejected(results), _rejected(results)


def test_megatron_rejects_what_the_export_refuses(megatron):
    """The harness is no rubber stamp: the flags the export refuses to write are rejected by Megatron."""
    spec = load_model("tiny-moe")
    good = launch_args({"tp": 2, "ep": 2, "global_batch_size": 64}, spec, "megatron", 8)
    bad = {
        "overlap with full recompute": good + ["--overlap-moe-expert-parallel-comm", "--recompute-granularity",
                                               "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"],
        "MTP with learned positions": [t if t != "rope" else "learned_absolute" for t in good],
        "fp8 delayed with layernorm recompute": good + ["--fp8-format", "hybrid", "--fp8-recipe", "delayed",
                                                        "--recompute-granularity", "selective",
                                                        "--recompute-modules", "layernorm"],
    }
    results = megatron([(name, argv, 8) for name, argv in bad.items()])
    assert set(_rejected(results)) == set(bad), results


def test_megatron_accepts_the_offload_export_with_the_environment_it_asks_for(megatron):
    """Activation offload: Megatron-LM accepts the exported flags with NVTE_CPU_OFFLOAD_V1=1, which
    ``paraplan export`` asks for, and rejects them without it (so the note is needed, not decoration);
    it also rejects attn_proj offloaded without core_attn, which the config refuses."""
    spec = load_model("tiny-moe")
    cases = [(" ".join(m), launch_args({"tp": 2, "ep": 2, "global_batch_size": 64, "offload_modules": m}, spec,
                                       "megatron", 8), 8)
             for m in (["attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm"], ["expert_fc1", "moe_act"])]
    assert all(launch_env(argv) == {"NVTE_CPU_OFFLOAD_V1": "1"} for _, argv, _ in cases)
    assert not _rejected(megatron(cases))
    without = _rejected(megatron(cases, env=False))
    assert set(without) == {c[0] for c in cases} and all("NVTE_CPU_OFFLOAD_V1" in e for e in without.values())
    good = cases[0][1]
    i = good.index("--offload-modules") + 1
    j = next(k for k in range(i, len(good)) if good[k].startswith("--"))
    alone = good[:i] + ["attn_proj"] + good[j:]  # the module list replaced by attn_proj alone
    assert "attn_proj cannot be set to offload_modules alone" in _rejected(megatron([("alone", alone, 8)]))["alone"]
    with pytest.raises(ValueError, match="only with core_attn"):
        TrainingConfig(global_batch_size=64, offload_modules=["attn_proj"])

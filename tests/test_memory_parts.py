"""The memory breakdown adds up: params + grads + optimizer + activations + buffers + overhead
= peak_gib for every result, as the time parts add up to step_time_s; the CLI tables show every part."""

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from costmodel.batch import ConfigBatch
from costmodel.evaluate import evaluate_batch
from costmodel.result import evaluate, result_dict
from costmodel.spec import TrainingConfig

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("params_gib", "grads_gib", "optimizer_gib", "activations_gib", "buffers_gib", "overhead_gib")
PANGU = json.loads((ROOT / "examples" / "pangu-ultra-moe-6144.json").read_text())

# (model, cluster, devices, config): dense and MoE, pp 1 and pp > 1 (interleaved, uneven split), every
# recompute mode, FP8, ZeRO off, and the README's Pangu example.
CASES = [
    ("llama3-70b", "nvidia-h100-80gb", 512, dict(tp=4, pp=2, vpp=4, micro_batch_size=1, global_batch_size=1024)),
    ("llama3-70b", "nvidia-h100-80gb", 64, dict(tp=8, pp=1, micro_batch_size=1, global_batch_size=64,
                                                recompute="full")),
    ("gpt3-175b", "nvidia-a100-80gb", 1024, dict(tp=8, pp=16, micro_batch_size=1, global_batch_size=1536,
                                                 recompute="full", recompute_num_layers=2,
                                                 distributed_optimizer=False)),
    ("gpt-1.3b", "nvidia-h100-80gb", 8, dict(tp=1, pp=1, micro_batch_size=4, global_batch_size=64)),
    ("mixtral-8x22b", "nvidia-h100-80gb", 256, dict(tp=2, pp=4, ep=8, micro_batch_size=1, global_batch_size=512,
                                                    recompute="selective", recompute_modules=["moe_act"])),
    ("deepseek-v3-671b", "nvidia-h100-80gb", 2048, dict(tp=2, pp=16, ep=64, micro_batch_size=1,
                                                        global_batch_size=4096, recompute="full",
                                                        precision="fp8", first_stage_layers=3,
                                                        last_stage_layers=3)),
    ("qwen3-235b-a22b", "ascend-910b", 512, dict(tp=4, pp=8, ep=16, micro_batch_size=1, global_batch_size=1024,
                                                 recompute="selective", recompute_modules=["layernorm", "moe"],
                                                 moe_a2a_overlap=True)),
    ("tiny-moe", "nvidia-h100-80gb", 4, dict(tp=2, ep=2, micro_batch_size=2, global_batch_size=8,
                                             recompute="full")),
    ("pangu-ultra-moe-718b", "ascend-910b", 6144, PANGU),
]


def _assert_adds_up(mem: dict, ctx) -> None:
    assert all(mem[k] is not None and mem[k] >= 0 for k in PARTS), (ctx, mem)
    assert sum(mem[k] for k in PARTS) == pytest.approx(mem["peak_gib"], rel=1e-9), (ctx, mem)
    if mem.get("per_stage_peak_gib"):
        assert max(mem["per_stage_peak_gib"]) == pytest.approx(mem["peak_gib"], rel=1e-12), ctx


@pytest.mark.parametrize("model,cluster,devices,cfg", CASES, ids=[c[0] + f"-pp{c[3].get('pp', 1)}" for c in CASES])
def test_memory_parts_add_up_to_the_peak(preset, profile, model, cluster, devices, cfg):
    spec, prof = preset(model), profile(cluster)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        r = evaluate(spec, prof, devices, TrainingConfig(**cfg))
    assert r["step_time_s"] is not None, r["infeasible_reasons"]
    mem = r["memory"]
    _assert_adds_up(mem, model)
    assert mem["overhead_gib"] == prof.facts["framework_overhead_gib"].value
    # the batch path (one stage per distinct composition) reports the same parts
    br = evaluate_batch(spec, prof, devices, ConfigBatch.from_configs([TrainingConfig(**cfg)]))
    batch = result_dict(br, 0, prof, [])["memory"]
    for k in PARTS:
        assert batch[k] == pytest.approx(mem[k], rel=1e-12), (model, k)


def test_buffers_are_the_transient_part(preset, profile):
    """MoE dispatch buffers and a fully recomputed layer's rebuilt activations are buffers, not stored
    activations; a dense model without recompute has none."""
    dense = evaluate(preset("gpt-1.3b"), profile("nvidia-h100-80gb"), 8,
                     TrainingConfig(micro_batch_size=4, global_batch_size=64))
    assert dense["memory"]["buffers_gib"] == 0
    moe = evaluate(preset("tiny-moe"), profile("nvidia-h100-80gb"), 4,
                   TrainingConfig(tp=2, ep=2, global_batch_size=8))
    assert moe["memory"]["buffers_gib"] > 0
    full = evaluate(preset("gpt-1.3b"), profile("nvidia-h100-80gb"), 8,
                    TrainingConfig(micro_batch_size=4, global_batch_size=64, recompute="full"))
    assert full["memory"]["buffers_gib"] > 0
    assert full["memory"]["activations_gib"] < dense["memory"]["activations_gib"]


def test_pangu_example_breakdown():
    """The README's example: the parts the issue found missing (4 GiB overhead, dispatch buffers) are there."""
    proc = subprocess.run([sys.executable, "-m", "app.cli", "evaluate", "--model", "pangu-ultra-moe-718b",
                           "--cluster", "ascend-910b", "--devices", "6144", "--config",
                           str(ROOT / "examples" / "pangu-ultra-moe-6144.json"), "--json"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    mem = json.loads(proc.stdout)["memory"]
    _assert_adds_up(mem, "pangu")
    assert mem["overhead_gib"] > 0 and mem["buffers_gib"] > 0


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})


def _row(stdout: str, header_word: str) -> tuple[list[str], list[list[str]]]:
    """The header and body rows of the table whose header line holds ``header_word``."""
    lines = stdout.splitlines()
    h = next(i for i, ln in enumerate(lines) if header_word in ln and "┃" in ln)
    header = [c.strip() for c in lines[h].strip("┃").split("┃")]
    body = []
    for ln in lines[h + 2:]:
        if not ln.startswith("│"):
            break
        body.append([c.strip() for c in ln.strip("│").split("│")])
    return header, body


def test_evaluate_table_shows_every_part():
    proc = _cli("evaluate", "--model", "tiny-moe", "--cluster", "nvidia-h100-80gb", "--devices", "4",
                "--config", '{"tp": 2, "ep": 2, "global_batch_size": 8}')
    assert proc.returncode == 0, proc.stderr
    header, body = _row(proc.stdout, "buffers")
    assert header == ["peak", "params", "grads", "optimizer", "activations", "buffers", "overhead"]
    values = [float(v) for v in body[0]]
    assert sum(values[1:]) == pytest.approx(values[0], abs=0.05 * len(values))  # rounded to 0.1 each
    assert values[-1] > 0  # the framework overhead


def test_search_table_shows_every_part_and_json_adds_up():
    args = ("search", "--model", "tiny-moe", "--cluster", "nvidia-h100-80gb", "--devices", "16",
            "--global-batch-size", "64", "--top", "3")
    proc = _cli(*args)
    assert proc.returncode == 0, proc.stderr
    header, body = _row(proc.stdout, "buffers")
    assert header == ["rank", "peak", "params", "grads", "optim", "activ", "buffers", "overhead"]
    assert len(body) == 3
    _, layouts = _row(proc.stdout, "headroom GiB")
    assert [b[0] for b in body] == ["#" + lay[0] for lay in layouts]  # one row per listed layout, same ranks
    result = json.loads(_cli(*args, "--json").stdout)
    for entry in result["top"] + result["layouts"] + [result["best"]]:
        _assert_adds_up(entry["evaluation"]["memory"], entry["config"])

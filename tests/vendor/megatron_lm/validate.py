"""Run Megatron-LM's own parse_args + validate_args + TransformerConfig on exported argument lists.

Used by tests/test_megatron_validate.py in a subprocess of an interpreter that has torch (CPU is enough)
and the ``megatron-core`` wheel (PyPI; it ships megatron/core only). Megatron-LM's megatron/training
argument module is the vendored copy beside this file (README.md there: source, tag, commit, licence).
Its package ``__init__`` (which imports the whole trainer) is replaced by a bare package, and what needs a
device or the legacy models is stubbed: ``get_device_arch_version`` answers 9 (an H100), and
``megatron.legacy.model.module.param_is_not_shared`` (imported by utils.py, unused by the arguments) is
defined as in the source.

stdin: a JSON list of ``{"argv": [...], "world_size": int, "env": {...}}`` (``env``: the variables the export
asks the launch to set, ``app.formats.launch.launch_env``; set for that case only); stdout: a JSON list of
``{"ok": bool, "error": str | null, "vpp": int | null, "normalization", "position_embedding_type",
"add_bias_linear", "num_layers", "padded_vocab_size"}``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import types
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
HERE = Path(__file__).resolve().parent
sys.path.append(str(HERE))

import megatron  # noqa: E402 - the megatron-core wheel's namespace, extended by HERE/megatron

training = types.ModuleType("megatron.training")
training.__path__ = [str(HERE / "megatron" / "training")]
for _name in ("get_args", "get_timers", "get_adlr_autoresume", "get_tokenizer", "get_tensorboard_writer",
              "get_wandb_writer", "get_one_logger", "get_signal_handler"):
    setattr(training, _name, lambda *a, **k: None)
sys.modules["megatron.training"] = training
for _name in ("megatron.legacy", "megatron.legacy.model"):
    _m = types.ModuleType(_name)
    _m.__path__ = []
    sys.modules[_name] = _m
_module = types.ModuleType("megatron.legacy.model.module")
_module.param_is_not_shared = lambda param: not hasattr(param, "shared") or not param.shared
sys.modules["megatron.legacy.model.module"] = _module

from megatron.training import arguments  # noqa: E402

# The machine the launch is for: an H100 (sm_90) with a recent Transformer Engine, as NVIDIA's containers
# have. Only the device and library probes are answered; every rule on the arguments runs as written.
import torch  # noqa: E402
from megatron.core.models.common.embeddings import rope_utils  # noqa: E402
from megatron.core.transformer import transformer_config  # noqa: E402

arguments.get_device_arch_version = lambda: 9
torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
for _mod in (arguments, transformer_config):
    _mod.is_te_min_version = lambda *a, **k: True
if rope_utils.fused_apply_rotary_pos_emb is None:  # Transformer Engine's fused RoPE kernel
    rope_utils.fused_apply_rotary_pos_emb = lambda *a, **k: None


def check(argv: list[str], world_size: int, env: dict[str, str] | None = None) -> dict:
    os.environ.update(WORLD_SIZE=str(world_size), RANK="0", LOCAL_RANK="0", CUDA_DEVICE_MAX_CONNECTIONS="1")
    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    sys.argv = ["pretrain_gpt.py", *argv]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            args = arguments.parse_args()
            arguments.validate_args(args)
            cfg = arguments.core_transformer_config_from_args(args)
    except BaseException as exc:  # argparse exits, asserts, ValueErrors: all a rejection
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}" + ("" if str(exc) else out.getvalue()[-2000:])}
    finally:
        for k, v in saved.items():  # the next case starts from the same environment
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return {"ok": True, "error": None, "vpp": args.virtual_pipeline_model_parallel_size,
            "normalization": cfg.normalization, "position_embedding_type": args.position_embedding_type,
            "add_bias_linear": cfg.add_bias_linear, "num_layers": cfg.num_layers,
            "gated_linear_unit": cfg.gated_linear_unit, "qk_layernorm": cfg.qk_layernorm,
            "num_moe_experts": cfg.num_moe_experts, "rotary_base": args.rotary_base}


if __name__ == "__main__":
    cases = json.load(sys.stdin)
    print(json.dumps([check(c["argv"], c["world_size"], c.get("env")) for c in cases]))

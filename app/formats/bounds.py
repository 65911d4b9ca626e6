"""The bounds of every number a user gives ParaPlan, defined once.

The CLI flags (``paraplan evaluate``/``search``/``submit``), model specs and training configs read from
files or inline JSON (``app/formats/inputs.py``) and the HTTP API (the request schemas in ``app/service/schemas`` declare
these same values in the OpenAPI document, ``app/service/services/inputs.py`` checks specs and configs) all check
against this module: a value beyond a bound is bad input (CLI: exit 2 naming the field; HTTP: 422 naming
it), never work. The bounds are far beyond any real model or cluster (the largest published runs use
~10^5 devices and ~10^4 sequences per step); they exist so that a typo cannot make the search enumerate
for hours, overflow the cost model's 64-bit arrays, or rank a config with a step of 10^11 seconds.
The service settings ``PARAPLAN_MAX_*`` may lower some of them (``app/service/core/config.py``), never raise them.
"""

from __future__ import annotations

import math
import re

MAX_DEVICES = 1_000_000
MAX_GLOBAL_BATCH_SIZE = 100_000_000  # sequences per step (also bounds micro_batch_size)
MAX_SEQ_LENGTH = 100_000_000
MAX_TRIALS = 10_000
MAX_TOP_K = 1_000
MAX_TIMEOUT_S = 86_400.0
MAX_SEED = 2**32 - 1  # numpy's and Optuna's seed range
MIN_MOE_LOAD_IMBALANCE, MAX_MOE_LOAD_IMBALANCE = 1.0, 64.0
MAX_LAYERS = 10_000

# Largest values of a model spec ("impossible values" beyond them).
SPEC_CAPS = {"num_layers": MAX_LAYERS, "hidden_size": 1_048_576, "num_attention_heads": 16_384,
             "num_query_groups": 16_384, "ffn_hidden_size": 16_777_216, "vocab_size": 100_000_000,
             "seq_length": MAX_SEQ_LENGTH, "kv_channels": 65_536, "q_lora_rank": 1_048_576,
             "kv_lora_rank": 1_048_576, "qk_head_dim": 65_536, "qk_pos_emb_head_dim": 65_536,
             "v_head_dim": 65_536, "num_experts": 65_536, "moe_router_topk": 65_536,
             "moe_ffn_hidden_size": 16_777_216, "moe_shared_expert_intermediate_size": 16_777_216,
             "moe_layer_freq": MAX_LAYERS, "mtp_num_layers": 100}

# Largest values of a training config's integers (a config file, inline JSON, `--fix`, the API's
# `config` and `search.fixed`); any other integer field is bounded by CONFIG_INT_CAP.
CONFIG_CAPS = {"global_batch_size": MAX_GLOBAL_BATCH_SIZE, "micro_batch_size": MAX_GLOBAL_BATCH_SIZE,
               **{k: MAX_DEVICES for k in ("tp", "pp", "cp", "ep", "etp", "dp")},
               **{k: MAX_LAYERS for k in ("vpp", "first_stage_layers", "last_stage_layers", "recompute_num_layers")}}
CONFIG_INT_CAP = 1_000_000_000
LAYOUT_MAX_CHARS = 10_000
LAYOUT_MAX_SYMBOLS = 100_000


def int_problem(value, cap: int, low: int = 1) -> str | None:
    """Why an integer input is out of bounds, or None."""
    if value is None:
        return None
    if value < low:
        return "must be a positive integer" if low == 1 else f"must be at least {low:,}"
    if value > cap:
        return f"{value} is beyond any real run (at most {cap:,})"
    return None


def number_problem(value, low: float, high: float, low_open: bool = False) -> str | None:
    """Why a float input is out of bounds (NaN and infinities included), or None."""
    if value is None:
        return None
    if not math.isfinite(value):  # NaN misses no bound: it is not a number
        return (f"must be a finite number ({'above' if low_open else 'at least'} {low:g} and at most {high:g}), "
                f"not {value}")
    if value > high or (value <= low if low_open else value < low):
        return f"must be {'above' if low_open else 'between'} {low:g}" + (f" and at most {high:g}" if low_open
                                                                         else f" and {high:g}")
    return None


def config_problems(data: dict):
    """``(key, reason)`` for each integer of a config mapping beyond its bound."""
    for key, v in data.items():
        if isinstance(v, int) and not isinstance(v, bool):
            cap = CONFIG_CAPS.get(key, CONFIG_INT_CAP)
            if abs(v) > cap:
                yield key, f"{v} is beyond any real config (at most {cap:,})"


def layout_problem(layout) -> str | None:
    """Why a pipeline_layout string is unusable (not a string, or an expansion like ``(t|)*1000000000``
    that would be huge), or None."""
    if layout is None:
        return None
    if not isinstance(layout, str):
        return "must be a string"
    if len(layout) > LAYOUT_MAX_CHARS:
        return f"is longer than {LAYOUT_MAX_CHARS:,} characters"
    text = re.sub(r"[\s,]", "", layout)
    if re.search(r"\*\d{10,}", text):  # also keeps int() below Python's 4,300-digit conversion limit
        return f"has a repeat count beyond any real layout (at most {LAYOUT_MAX_SYMBOLS:,} symbols in all)"
    pat = re.compile(r"\(([^()]*)\)\*(\d+)")
    size = len(text)
    for _ in range(100):
        size = len(text) + sum(len(m.group(1)) * (int(m.group(2)) - 1) for m in pat.finditer(text))
        if size > LAYOUT_MAX_SYMBOLS:
            break
        new = pat.sub(lambda m: m.group(1) * int(m.group(2)), text)
        if new == text:
            size = len(text) + sum(int(n) for n in re.findall(r"[EtmL]\*(\d+)", text))
            break
        text = new
    if size > LAYOUT_MAX_SYMBOLS:
        return f"expands to more than {LAYOUT_MAX_SYMBOLS:,} symbols"
    return None


def flag_problems(**values) -> list[tuple[str, str]]:
    """``(field, reason)`` for each out-of-bounds value of the command-line numbers (``None`` = not given):
    devices, global_batch_size, trials, top, seed, seq_length, timeout_s, moe_load_imbalance."""
    caps = {"devices": (MAX_DEVICES, 1), "global_batch_size": (MAX_GLOBAL_BATCH_SIZE, 1), "trials": (MAX_TRIALS, 1),
            "top": (MAX_TOP_K, 1), "seed": (MAX_SEED, 0), "seq_length": (MAX_SEQ_LENGTH, 1)}
    problems = []
    for field, value in values.items():
        if value is None:
            continue
        if field in caps:
            problem = int_problem(value, *caps[field])
        elif field == "timeout_s":
            problem = number_problem(value, 0.0, MAX_TIMEOUT_S, low_open=True)
        elif field == "moe_load_imbalance":
            problem = number_problem(value, MIN_MOE_LOAD_IMBALANCE, MAX_MOE_LOAD_IMBALANCE)
        else:
            raise KeyError(field)
        if problem is not None:
            problems.append((field, problem))
    return problems

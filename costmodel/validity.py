"""The contract's validity rules, vectorised: each rule is a code, a mask of broken configs and a message.

A broken rule makes a config structurally infeasible; it is reported, never raised.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .batch import NO_VALUE, ConfigBatch
from .spec import ModelSpec


@dataclass
class Rule:
    code: str
    broken: np.ndarray  # (N,) bool
    message: Callable[[int], str]  # index of a broken config -> explanation


def check(spec: ModelSpec, b: ConfigBatch, devices: int, has_fp8: bool) -> list[Rule]:
    """Every validity rule of the contract except the pipeline split (see :mod:`costmodel.pipeline`)."""
    heads, groups = spec.num_attention_heads, spec.query_groups
    model_par = b.tp * b.pp * b.cp
    # dp is defined only where the devices divide by tp·pp·cp: the rules that use it say nothing
    # elsewhere (a rounded-down dp would be quoted that no launch could have).
    dp = np.where((model_par > 0) & (devices % np.maximum(model_par, 1) == 0), devices // np.maximum(model_par, 1), 0)
    dense_rank = b.tp * b.cp * dp
    seq = spec.seq_length
    sp, cp = b.sequence_parallel, b.cp
    seq_div = np.where(sp & (cp > 1), b.tp * 2 * cp, np.where(sp, b.tp, np.where(cp > 1, 2 * cp, 1)))
    experts = spec.num_experts or 0
    rules = [
        Rule("tp_divides_heads", (heads % b.tp != 0) | (groups % b.tp != 0),
             lambda i: f"tp={b.tp[i]} must divide num_attention_heads={heads} and num_query_groups={groups}"),
        Rule("devices_divisible", devices % model_par != 0,
             lambda i: f"devices={devices} is not divisible by tp*pp*cp={model_par[i]}"),
        Rule("dp_mismatch", (b.dp != NO_VALUE) & (b.dp != dp) & (devices % model_par == 0),
             lambda i: f"dp={b.dp[i]} does not match devices/(tp*pp*cp)={dp[i]}"),
        Rule("ep_etp_divides", (dp > 0) & (dense_rank % (b.ep * b.etp) != 0),
             lambda i: f"ep*etp={b.ep[i] * b.etp[i]} must divide tp*cp*dp={dense_rank[i]}"),
        Rule("dense_ep", ((b.ep > 1) | (b.etp > 1)) if not experts else np.zeros(len(b), bool),
             lambda i: f"a dense model needs ep=1 and etp=1 (got ep={b.ep[i]}, etp={b.etp[i]})"),
        Rule("ep_divides_experts", (experts % b.ep != 0) if experts else np.zeros(len(b), bool),
             lambda i: f"ep={b.ep[i]} must divide num_experts={experts}"),
        Rule("global_batch_divisible", (dp > 0) & (b.global_batch_size % np.maximum(b.micro_batch_size * dp, 1) != 0),
             lambda i: f"global_batch_size={b.global_batch_size[i]} is not divisible by "
                       f"micro_batch_size*dp={b.micro_batch_size[i] * dp[i]}"),
        Rule("seq_divisible", seq % seq_div != 0,
             lambda i: f"seq_length={seq} must be divisible by {seq_div[i]} "
                       f"(tp with sequence parallel, 2*cp with context parallel)"),
        Rule("vpp_needs_pp", (b.vpp > 1) & (b.pp == 1),
             lambda i: f"vpp={b.vpp[i]} needs pp > 1"),
        Rule("fp8_unsupported", (b.precision == 1) & (not has_fp8),
             lambda i: "precision fp8 needs a profile with an FP8 peak"),
    ]
    return rules

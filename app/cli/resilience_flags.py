"""The checkpoint, hot-spare and objective flags of ``paraplan search`` and ``paraplan plan``
(``costmodel.resilience.ResilienceOptions``; docs/guides/goodput.md). A bad value is an ``InputError`` naming the
field (exit 2)."""

from __future__ import annotations

import click

from app.formats.errors import InputError

# costmodel.resilience.CHECKPOINT_MODES and search.objective.OBJECTIVES, spelled out so that the thin client
# (``paraplan submit``) does not import the cost model to build its flags (tests/test_goodput.py checks they agree)
CHECKPOINT_MODES = ("sync", "async", "in_memory")
OBJECTIVES = ("throughput", "goodput")
FLAG_FIELDS = ("checkpoint_mode", "checkpoint_interval_s", "hot_spare_nodes", "checkpoint_write_gbps_per_node",
               "checkpoint_read_gbps_per_node")


def resilience_flags(with_objective: bool = False):
    """Add the flags to a click command; they arrive as keyword arguments (``resilience_from_flags``)."""
    def wrap(f):
        opts = [
            click.option("--checkpoint-mode", type=click.Choice(CHECKPOINT_MODES), default="sync", show_default=True,
                         help="sync: the step waits for the write; async: only the device-to-host copy stalls "
                              "(Megatron --async-save); in_memory: copies to a peer's host memory (docs/guides/goodput.md)."),
            click.option("--checkpoint-interval-s", type=float, default=None,
                         help="Seconds of training between checkpoints (default: Young: sqrt(2·cost·MTBF))."),
            click.option("--hot-spare-nodes", type=int, default=0, show_default=True,
                         help="Standby nodes: a failure swaps one in instead of rescheduling; paid for while idle."),
            click.option("--checkpoint-write-gbps", "checkpoint_write_gbps_per_node", type=float, default=None,
                         help="Checkpoint write bandwidth per node, GB/s (default: the profile's)."),
            click.option("--checkpoint-read-gbps", "checkpoint_read_gbps_per_node", type=float, default=None,
                         help="Checkpoint read bandwidth per node, GB/s (default: the profile's)."),
        ]
        if with_objective:
            opts.append(click.option("--objective", type=click.Choice(OBJECTIVES), default="throughput",
                                     show_default=True,
                                     help="Rank by tokens/s, or by tokens/s with failures priced (goodput)."))
        for opt in reversed(opts):
            f = opt(f)
        return f
    return wrap


def resilience_from_flags(flags: dict):
    """The options the flags give (``ResilienceOptions``); ``InputError`` naming the first bad field."""
    from pydantic import ValidationError

    from costmodel.resilience import ResilienceOptions

    try:
        return ResilienceOptions(**{k: flags[k] for k in FLAG_FIELDS if k in flags})
    except ValidationError as exc:
        e = exc.errors()[0]
        raise InputError(".".join(str(x) for x in e["loc"]) or "resilience", e["msg"]) from None

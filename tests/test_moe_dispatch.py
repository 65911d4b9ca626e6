"""MoE token dispatchers (``moe_token_dispatcher_type``), the expert-TP communication and the load
imbalance at ep 1, one hand-worked case each.

Hardware: ``round_profile`` (conftest.py): scale-up 400 GB/s × 0.75 = 300 GB/s per device inside a
switched 8-device domain, 5 µs per ring step; HBM 2,000 GB/s × 0.8 = 1,600 GB/s. Model: tiny-mla-moe
(h 512, 16 experts, top-4, seq 1024). Every expected number is written out from the formula here.
"""

from __future__ import annotations

import numpy as np
import pytest

from app.formats.inputs import load_model
from app.formats.launch import InexpressibleError, launch_args
from costmodel import ConfigBatch, TrainingConfig, layers
from costmodel.evaluate import _layer_inputs, _shapes
from costmodel.hardware import Hardware
from costmodel.result import evaluate
from search import SpaceError, build_space, validate_fixed

UP_BW = 300e9  # B/s inside the domain
UP_LAT = 5e-6  # s per ring step / message
HBM = 1600e9


@pytest.fixture(scope="module")
def mla():
    return load_model("tiny-mla-moe")


@pytest.fixture(scope="module")
def hw(round_profile) -> Hardware:
    h = Hardware.from_profile(round_profile)
    assert h.scale_up_bytes_per_s == pytest.approx(UP_BW) and h.scale_up_link_bytes_per_s == 0
    assert h.hbm_bytes_per_s == pytest.approx(HBM) and h.scale_up_latency_s == pytest.approx(UP_LAT)
    return h


def _ctx(spec, hw, **cfg):
    b = ConfigBatch.from_configs([TrainingConfig(global_batch_size=64, **cfg)])
    dp = np.full(1, 64 // (b.tp[0] * b.pp[0] * b.cp[0]))
    shapes = _shapes(spec, b, dp)
    return _layer_inputs(spec, hw, b, shapes)[0]


def _moe(spec, hw, **cfg) -> layers.Cost:
    return layers.moe_block(_ctx(spec, hw, **cfg))


# ---- the allgather dispatcher ---------------------------------------------------------------------

def test_allgather_dispatch_gathers_every_token_of_the_group(mla, hw):
    # tp 1, ep 4: the etp·ep group is 4 ranks in one domain; T_moe = 1·1024 tokens per rank.
    # All-gather of the hidden states 2 B·1024·512·4 = 4,194,304 B plus the routing (int64 index + bf16
    # probability = 10 B per copy) 10·1024·4·4 = 163,840 B: 3/4·4,358,144 / 300e9 + 3·5 µs = 25.89536 µs.
    # Reduce-scatter of the output, 4,194,304 B: 3/4·4,194,304 / 300e9 + 15 µs = 25.48576 µs.
    expected = 25.89536e-6 + 25.48576e-6
    c = _moe(mla, hw, ep=4, moe_token_dispatcher_type="allgather", moe_load_imbalance=1.0)
    assert c.ep_fwd_s[0] == pytest.approx(expected, rel=1e-9)
    assert c.ep_bwd_s[0] == pytest.approx(expected, rel=1e-9)
    assert c.ep_nic_s[0] == 0.0  # inside one domain
    # every rank receives every token whatever the routing: the imbalance does not change the volume
    skewed = _moe(mla, hw, ep=4, moe_token_dispatcher_type="allgather", moe_load_imbalance=1.5)
    assert skewed.ep_fwd_s[0] == pytest.approx(expected, rel=1e-9)


def test_alltoall_dispatch_is_todays_flat_all_to_all(mla, hw):
    # Each rank sends 2 B·1024·4·512·λ(1.5) = 6,291,456 B, 3/4 of it to its 3 peers at 300 GB/s, plus
    # 3 message latencies: 15.72864 + 15 µs, dispatch and combine: 61.45728 µs. The unstated dispatcher
    # with moe_a2a_algorithm flat prices the same.
    c = _moe(mla, hw, ep=4, moe_token_dispatcher_type="alltoall", moe_load_imbalance=1.5)
    assert c.ep_fwd_s[0] == pytest.approx(2 * (15.72864e-6 + 15e-6), rel=1e-9)
    flat = _moe(mla, hw, ep=4, moe_a2a_algorithm="flat", moe_load_imbalance=1.5)
    assert flat.ep_fwd_s[0] == c.ep_fwd_s[0]


def test_permutation_rows_per_dispatcher(mla, hw):
    # ep 4, λ 1.5, etp 1: own copies T_moe·k = 1024·4 = 4,096; received rows λ·T_moe·k·etp = 6,144;
    # 16/4 = 4 local experts (> 1, so the all-to-all sorts the received rows by expert).
    rows = {}
    for d in ("alltoall", "flex", "allgather"):
        ctx = _ctx(mla, hw, ep=4, moe_token_dispatcher_type=d, moe_load_imbalance=1.5)
        rows[d] = layers.permutation_rows(ctx, ctx.shapes.routed * ctx.shapes.etp, np.array([4.0]))[0]
    assert rows == {"alltoall": 4096 + 6144, "flex": 6144, "allgather": 2 * 6144}
    # In the forward time the allgather dispatcher's rows cost 8 B·512 per row over 1,600 GB/s more than
    # the all-to-all's (12,288 − 10,240 rows: 5.24288 µs), plus the zeroed combine buffer of the gathered
    # shape, 2 B·1024·4·512 = 4,194,304 B: 2.62144 µs. Nothing else in the forward differs.
    ag = _moe(mla, hw, ep=4, moe_token_dispatcher_type="allgather", moe_load_imbalance=1.5)
    a2a = _moe(mla, hw, ep=4, moe_token_dispatcher_type="alltoall", moe_load_imbalance=1.5)
    assert ag.fwd_s[0] - a2a.fwd_s[0] == pytest.approx(5.24288e-6 + 2.62144e-6, rel=1e-6)


def test_etp_rows_are_permuted_on_every_etp_member(mla, hw):
    # tp 2 (SP), etp 2, ep 2, λ 1: T_moe = 512, received rows 512·4·1·2 = 4,096 (the etp gather), own 2,048;
    # 8 local experts. Before the fix the permutation counted 2,048 rows (T/tp·k) for the whole pass.
    ctx = _ctx(mla, hw, tp=2, etp=2, ep=2, moe_token_dispatcher_type="alltoall", moe_load_imbalance=1.0)
    got = layers.permutation_rows(ctx, ctx.shapes.routed * ctx.shapes.etp, np.array([8.0]))[0]
    assert got == 2048 + 4096


def test_allgather_buffers(mla, hw):
    # ep 4, λ 1.5: the gathered hidden states 2 B·512·1024·4 = 4,194,304 B beside the local rows and their
    # expert-ordered copy, 2·2 B·512·6,144 = 12,582,912 B: 16,777,216 B. The all-to-all keeps its send and
    # receive buffers of the busiest rank's 6,144 copies: 2·2 B·512·6,144 = 12,582,912 B.
    ag = _moe(mla, hw, ep=4, moe_token_dispatcher_type="allgather", moe_load_imbalance=1.5)
    a2a = _moe(mla, hw, ep=4, moe_token_dispatcher_type="alltoall", moe_load_imbalance=1.5)
    assert ag.transient_bytes[0] == 16_777_216
    assert a2a.transient_bytes[0] == 12_582_912


# ---- expert-TP communication ----------------------------------------------------------------------

def test_etp_communication_is_dispatch_not_tp(mla, hw):
    # tp 2 with SP, etp 2, ep 2 (stride 2: both EP ranks in the domain), λ 1, TP overlap on.
    # ETP gather + scatter of the 4,096 received rows: all-reduce volume of 2 B·4,096·512 = 4,194,304 B
    # over 2 ranks: 2·(1/2·4,194,304 / 300e9 + 5 µs) = 23.98101333 µs.
    # EP all-to-all: each rank sends 2 B·512·4·512 = 2,097,152 B, half to its one peer: 3.49525333 µs
    # + 5 µs, dispatch and combine: 16.99050667 µs.
    # Shared expert (dense TP linears, MC2/TE overlap applies): all-reduce volume 2 B·1024·512 over 2:
    # 2·(1/2·1,048,576 / 300e9 + 5 µs) = 13.49525333 µs, the only TP communication of the block.
    c = _moe(mla, hw, tp=2, etp=2, ep=2, tp_comm_overlap=True, moe_token_dispatcher_type="alltoall",
             moe_load_imbalance=1.0)
    assert c.tp_fwd_s[0] == pytest.approx(13.49525333e-6, rel=1e-8)
    assert c.ep_fwd_s[0] == pytest.approx(23.98101333e-6 + 16.99050667e-6, rel=1e-8)


def test_etp_communication_is_exposed_despite_tp_overlap(mla, round_profile):
    # The whole-model result: with tp_comm_overlap the TP part shrinks, but the expert-TP traffic moved to
    # the EP part stays exposed without moe_a2a_overlap (4 MoE layers × 2 passes × 23.98101333 µs at least).
    base = dict(tp=2, etp=2, ep=2, tp_comm_overlap=True, moe_load_imbalance=1.0, global_batch_size=8,
                micro_batch_size=1, moe_token_dispatcher_type="alltoall")
    r = evaluate(mla, round_profile, 8, TrainingConfig(**base))
    m = r["time"]["ep_comm_s"] / (8 // 4)  # per micro-batch (dp 4, gbs 8, mbs 1: 2 micro-batches)
    assert m >= 4 * 2 * 23.98101333e-6 * (1 - 1e-9)


def test_alltoall_seq_adds_the_sequence_to_hidden_resplit(mla, hw):
    # tp 2: sp->hp before the EP all-to-all and hp->sp after the combine, each rank sending its
    # 2 B·512·512 = 524,288 B half to its TP peer: 2·(0.87381333 µs + 5 µs) = 11.74762667 µs per pass.
    seq = _moe(mla, hw, tp=2, etp=2, ep=2, moe_token_dispatcher_type="alltoall_seq", moe_load_imbalance=1.0)
    a2a = _moe(mla, hw, tp=2, etp=2, ep=2, moe_token_dispatcher_type="alltoall", moe_load_imbalance=1.0)
    assert seq.ep_fwd_s[0] - a2a.ep_fwd_s[0] == pytest.approx(11.74762667e-6, rel=1e-8)


# ---- the field and the a2a algorithm ----------------------------------------------------------------

def test_dispatcher_decides_the_dispatch_and_refuses_a_contradiction():
    assert TrainingConfig(global_batch_size=1, moe_token_dispatcher_type="flex").a2a_hierarchical
    assert not TrainingConfig(global_batch_size=1, moe_token_dispatcher_type="alltoall").a2a_hierarchical
    assert TrainingConfig(global_batch_size=1).a2a_hierarchical  # unstated: moe_a2a_algorithm's default
    assert not TrainingConfig(global_batch_size=1, moe_a2a_algorithm="flat").a2a_hierarchical
    TrainingConfig(global_batch_size=1, moe_token_dispatcher_type="allgather", moe_a2a_algorithm="flat")
    with pytest.raises(ValueError, match="moe_a2a_algorithm"):
        TrainingConfig(global_batch_size=1, moe_token_dispatcher_type="flex", moe_a2a_algorithm="flat")
    with pytest.raises(ValueError, match="moe_a2a_algorithm"):
        TrainingConfig(global_batch_size=1, moe_token_dispatcher_type="alltoall", moe_a2a_algorithm="hierarchical")


def test_flex_prices_as_hierarchical(mla, hw):
    flex = _moe(mla, hw, ep=4, moe_token_dispatcher_type="flex", moe_load_imbalance=1.5)
    hier = _moe(mla, hw, ep=4, moe_a2a_algorithm="hierarchical", moe_load_imbalance=1.5)
    assert flex.ep_fwd_s[0] == hier.ep_fwd_s[0] and flex.fwd_s[0] == hier.fwd_s[0]


# ---- load imbalance at ep 1 --------------------------------------------------------------------------

def test_no_imbalance_at_ep_1(mla, hw):
    # ep 1: the one rank holds all 16 experts and receives all T·k = 1024·4 = 4,096 copies: max = mean.
    assert _ctx(mla, hw).shapes.routed[0] == 4096  # default imbalance (1.15 at ep > 1)
    assert _ctx(mla, hw, moe_load_imbalance=2.0).shapes.routed[0] == 4096  # a stated one too
    assert _ctx(mla, hw, ep=2).shapes.routed[0] == pytest.approx(4096 * 1.15)


# ---- export and search ---------------------------------------------------------------------------------

def _dispatch_flag(cfg: dict, spec, fw: str) -> str:
    args = launch_args({"global_batch_size": 64, "ep": 2, **cfg}, spec, fw, 8)
    i = args.index("--moe-token-dispatcher-type")
    return args[i + 1]


def test_export_flags(mla):
    assert _dispatch_flag({"moe_token_dispatcher_type": "allgather"}, mla, "megatron") == "allgather"
    assert _dispatch_flag({"moe_token_dispatcher_type": "allgather"}, mla, "mindspeed") == "allgather"
    assert _dispatch_flag({"moe_token_dispatcher_type": "alltoall_seq"}, mla, "mindspeed") == "alltoall_seq"
    assert _dispatch_flag({"moe_token_dispatcher_type": "flex"}, mla, "megatron") == "flex"
    for cfg, fw in (({"moe_token_dispatcher_type": "alltoall_seq"}, "megatron"),
                    ({"moe_token_dispatcher_type": "flex"}, "mindspeed"),
                    ({"moe_token_dispatcher_type": "allgather", "moe_a2a_overlap": True}, "megatron")):
        with pytest.raises(InexpressibleError) as exc:
            launch_args({"global_batch_size": 64, "ep": 2, **cfg}, mla, fw, 8)
        assert {r.field for r in exc.value.refusals} & {"moe_token_dispatcher_type", "moe_a2a_overlap"}


def test_search_pin_holds_the_dispatcher(mla, round_profile):
    fixed = validate_fixed({"moe_token_dispatcher_type": "allgather", "ep": 4}, 64)
    space = build_space(mla, round_profile, 8, 64, fixed=fixed, framework="megatron")
    _, opts, batch = next(space.batches())
    assert (batch.moe_dispatcher == 1).all() and not batch.moe_a2a_hierarchical.any()
    assert space.config(0, int(opts[0]))["moe_token_dispatcher_type"] == "allgather"
    with pytest.raises(SpaceError, match="flex"):
        build_space(mla, round_profile, 8, 64, fixed=validate_fixed({"moe_token_dispatcher_type": "flex"}, 64),
                    framework="mindspeed")

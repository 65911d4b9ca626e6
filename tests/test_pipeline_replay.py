"""Peak activation memory of uneven interleaved splits against a replay of Megatron-Core's schedule.

The hand-worked case is pp = 2, vpp = 2, m = 4 (micro-batch group = pp = 2). Megatron-Core's
schedule table runs micro-batches 0, 1 through chunk 0, then chunk 1, then 2, 3 through chunk 0, then
chunk 1; backward i runs chunk 1 − (chunk of forward i):

    forwards  (chunk): 0 0 1 1 0 0 1 1        backwards (chunk): 1 1 0 0 1 1 0 0

Rank 0 warms up (2 − 0 − 1)·2 + (2 − 1)·2 = 4 forwards, rank 1 (2 − 1 − 1)·2 + 2 = 2; then forward
W + k, backward k. Micro-batches held per chunk (chunk 0, chunk 1) after each forward:

    rank 0: (1,0) (2,0) (2,1) (2,2) | F4 (3,2) B0 -> (3,1) | F5 (4,1) B1 -> (4,0) | F6 (4,1) ... F7 (3,2)
    rank 1: (1,0) (2,0) | F2 (2,1) B0 -> (2,0) | F3 (2,1) B1 -> (2,0) | F4 (3,0) B2 -> (2,0) | F5 (3,0)
            B3 -> (1,0) | F6 (1,1) B4 -> (1,0) | F7 (1,1)

so the maximal in-flight sets are rank 0: (3,2) and (4,1); rank 1: (2,1) and (3,0). With chunks of
[3, 1] layers on rank 0 and [1, 3] on rank 1 (a the bytes of one layer, one micro-batch):

    rank 0: max(3·3 + 2·1, 4·3 + 1·1) = 13a   (the even-split formula: 5 chunks / 2 · 4a = 10a)
    rank 1: max(2·1 + 1·3, 3·1 + 0·3) =  5a   (the even-split formula: 3 chunks / 2 · 4a =  6a)
"""

from __future__ import annotations

import numpy as np
import pytest

from costmodel import pipeline
from costmodel.batch import ConfigBatch
from costmodel.evaluate import evaluate_batch
from costmodel.result import evaluate
from costmodel.spec import TrainingConfig

A = np.array


def test_schedule_order_pp2_vpp2_m4():
    for rank, warmup in ((0, 4), (1, 2)):
        w, fwd, bwd = pipeline.schedule_order(2, 2, 4, rank)
        assert w == warmup
        assert fwd == [0, 0, 1, 1, 0, 0, 1, 1]
        assert bwd == [1, 1, 0, 0, 1, 1, 0, 0]


def test_schedule_table_last_group_takes_the_rest():
    # Megatron-Core's own example of get_schedule_table (group 3, M = 5, VP 2): pp = 3 here, so the
    # group is 3; micro-batches 0-2 through chunks 0, 1, then the last group 3-4 through chunks 0, 1.
    _, fwd, bwd = pipeline.schedule_order(3, 2, 5, 0)
    assert fwd == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]
    assert bwd == [1, 1, 1, 0, 0, 0, 1, 1, 0, 0]


def test_alive_counts_by_hand():
    assert sorted(map(tuple, pipeline.alive_counts(2, 2, 4, 0).tolist())) == [(3, 2), (4, 1)]
    assert sorted(map(tuple, pipeline.alive_counts(2, 2, 4, 1).tolist())) == [(2, 1), (3, 0)]


def test_replay_uneven_by_hand():
    a = 10.0
    assert pipeline.replay_peak_activation_bytes(2, 2, 4, 0, [3 * a, 1 * a]) == 13 * a
    assert pipeline.replay_peak_activation_bytes(2, 2, 4, 1, [1 * a, 3 * a]) == 5 * a
    # the even-split formula (chunks held / vpp × stage) says 10a and 6a
    closed = pipeline.microbatches_in_flight(A([2]), A([2]), A([4.0]), np.arange(2)[None, :])[0]
    assert (closed * 4 * a).tolist() == [10 * a, 6 * a]
    # in layers (what evaluate tables per split and m): one kind of layer, [3, 1] and [1, 3] of them
    assert pipeline.in_flight_layers(2, 2, 4, 0, [[3], [1]]).tolist() == [[13]]
    assert pipeline.in_flight_layers(2, 2, 4, 1, [[1], [3]]).tolist() == [[5]]
    # two kinds (dense, MoE): chunk 0 = 3 dense, chunk 1 = 1 MoE; (3,2) -> (9, 2), (4,1) -> (12, 1)
    assert sorted(pipeline.in_flight_layers(2, 2, 4, 0, [[3, 0], [0, 1]]).tolist()) == [[9, 2], [12, 1]]


def test_non_interleaved_replay():
    # 1F1B: rank r holds min(pp − r, m) micro-batches of its only chunk
    for pp, m in ((4, 8), (4, 2), (1, 8)):
        for r in range(pp):
            assert pipeline.replay_peak_activation_bytes(pp, 1, m, r, [7.0]) == 7.0 * min(pp - r, m)


@pytest.mark.parametrize("pp", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("vpp", [1, 2, 3, 4])
def test_closed_form_equals_replay_for_even_chunks(pp, vpp):
    if vpp > 1 and pp == 1:
        return
    for m in sorted({1, pp, 2 * pp, 3 * pp + max(pp - 1, 0), 4 * pp, 7}):
        if vpp > 1 and m < pp:  # Megatron refuses fewer micro-batches than pp when interleaving
            continue
        ranks = np.arange(pp)[None, :]
        closed = pipeline.microbatches_in_flight(A([pp]), A([vpp]), A([float(m)]), ranks)[0]
        for r in range(pp):
            replay = pipeline.replay_peak_activation_bytes(pp, vpp, m, r, [1.0 / vpp] * vpp)
            assert replay == pytest.approx(closed[r]), (pp, vpp, m, r)


# ------------------------------------------------------------------------------------------------
# through evaluate: a dense 8-layer model, layout [3, 1] on rank 0 and [1, 3] on rank 1

LAYOUT = "Ettt|t|t|tttL"  # v0 = rank 0 chunk 0, v1 = rank 1 chunk 0, v2 = rank 0 chunk 1, v3 = rank 1 chunk 1


@pytest.fixture
def spec8(preset):
    return preset("tiny-dense").model_copy(update={"num_layers": 8})


def _br(spec, prof, configs, all_stages=True):
    return evaluate_batch(spec, prof, 2, ConfigBatch.from_configs(configs), all_stages=all_stages)


def test_split_chunks_of_the_layout(spec8):
    chunks = pipeline.split_chunks(spec8, 2, 2, None, None, False, False, LAYOUT)
    assert chunks[:, :, pipeline.DENSE].tolist() == [[3, 1], [1, 3]]
    assert (chunks.sum(axis=1) == pipeline.split_stages(spec8, 2, 2, None, None, False, False, LAYOUT)).all()


def test_evaluate_uneven_layout_per_stage_equals_replay(spec8, round_profile):
    cfg = TrainingConfig(pp=2, vpp=2, micro_batch_size=1, global_batch_size=4, pipeline_layout=LAYOUT)
    br = _br(spec8, round_profile, [cfg])
    assert br.microbatches[0] == 4
    assert br.stage_rank[0].tolist() == [0, 1]
    # both stages hold 4 dense layers: a is the bytes of one layer for one micro-batch
    a = br.stage_act_microbatch_bytes[0] / 4
    assert a[0] == pytest.approx(a[1])
    a = a[0]
    states, fixed = br.stage_states_bytes[0], br.stage_fixed_bytes[0]
    expected = states + fixed + np.array([13 * a, 5 * a])
    assert br.stage_peak_bytes[0] == pytest.approx(expected, rel=1e-12)
    assert br.stage_peaks(0) == pytest.approx(expected, rel=1e-12)
    # what the even-split formula would have said
    even_formula = states + fixed + np.array([10 * a, 6 * a])
    assert br.stage_peak_bytes[0][1] < even_formula[1]  # rank 1 holds less than the formula claims
    assert br.stage_peak_bytes[0][0] > even_formula[0]  # rank 0's big chunk is in flight more often
    assert br.peak_bytes[0] == pytest.approx(expected.max(), rel=1e-12) and br.peak_rank[0] == 0
    assert br.activations_bytes[0] == pytest.approx(13 * a + fixed[0] - round_profile.facts[
        "framework_overhead_gib"].value * 2**30, rel=1e-9)
    # the single-config path reports the same per-stage peaks
    r = evaluate(spec8, round_profile, 2, cfg)
    assert r["memory"]["per_stage_peak_gib"] == pytest.approx((expected / 2**30).tolist(), rel=1e-12)


def test_even_chunks_keep_the_closed_form(spec8, round_profile):
    # default split of 8 layers over 4 virtual stages: 2 per chunk, even on both ranks
    cfg = TrainingConfig(pp=2, vpp=2, micro_batch_size=1, global_batch_size=4)
    br = _br(spec8, round_profile, [cfg])
    held = pipeline.microbatches_in_flight(A([2]), A([2]), A([4.0]), np.arange(2)[None, :])[0]
    expected = br.stage_states_bytes[0] + br.stage_fixed_bytes[0] + br.stage_act_microbatch_bytes[0] * held
    assert br.stage_peak_bytes[0] == pytest.approx(expected, rel=1e-15)


def test_uneven_ranks_sharing_chunks_batch_matches_all_stages(preset, round_profile):
    # tiny-moe (6 layers: 1 dense + 5 MoE, MTP), pp 2 vpp 2 with layouts whose chunks differ in
    # layer count and in dense/MoE mix; the batch path (one candidate per chunk composition) and the
    # every-stage path agree, and so does stage_peaks, for several micro-batch counts.
    spec = preset("tiny-moe")
    configs = [TrainingConfig(pp=2, vpp=2, micro_batch_size=1, global_batch_size=g, pipeline_layout=lay)
               for lay in ("Ettt|t|t|tmL", "Et|tt|tt|tmL", "Et|t|ttt|tmL")
               for g in (2, 4, 6, 8)]
    every = _br(spec, round_profile, configs, all_stages=True)
    some = _br(spec, round_profile, configs, all_stages=False)
    assert some.peak_bytes == pytest.approx(every.peak_bytes, rel=1e-12)
    for i in range(len(configs)):
        assert some.stage_peaks(i) == pytest.approx(every.stage_peaks(i), rel=1e-12)
        assert every.stage_peaks(i) == pytest.approx(every.stage_peak_bytes[i, :2], rel=1e-12)


def test_first_last_stage_layers_middle_ranks_share_uneven_chunks(spec8, round_profile):
    # pp 4, vpp 2, 10 layers, first = last = 2: the middle ranks hold 3 layers each as chunks [2, 1];
    # the batch path keeps rank 1 only, stage_peaks rebuilds rank 2 by replaying rank 2's schedule.
    spec = spec8.model_copy(update={"num_layers": 10})
    cfg = TrainingConfig(pp=4, vpp=2, micro_batch_size=1, global_batch_size=8, first_stage_layers=2,
                         last_stage_layers=2)
    chunks = pipeline.split_chunks(spec, 4, 2, 2, 2, False, False, None)
    assert chunks[:, :, pipeline.DENSE].tolist() == [[1, 1], [2, 1], [2, 1], [1, 1]]
    every = evaluate_batch(spec, round_profile, 4, ConfigBatch.from_configs([cfg]), all_stages=True)
    some = evaluate_batch(spec, round_profile, 4, ConfigBatch.from_configs([cfg]))
    assert some.stage_rank[0].tolist()[:2] == [0, 1]  # rank 2 shares rank 1's chunks
    assert some.stage_peaks(0) == pytest.approx(every.stage_peaks(0), rel=1e-12)
    a = every.stage_act_microbatch_bytes[0, 1] / 3
    for r in (1, 2):
        replay = pipeline.replay_peak_activation_bytes(4, 2, 8, r, [2 * a, a])
        assert every.stage_peaks(0)[r] == pytest.approx(
            every.stage_states_bytes[0, r] + every.stage_fixed_bytes[0, r] + replay, rel=1e-12)


def test_in_flight_layers_keep_every_possible_peak():
    # Pruning to the convex hull never changes the peak: compare with a brute-force replay on random
    # per-layer bytes, for mixed dense/MoE/MTP chunks.
    rng = np.random.default_rng(0)
    for pp, vpp, m in ((4, 2, 8), (4, 3, 12), (3, 4, 7), (8, 2, 16), (2, 4, 6)):
        for r in range(pp):
            chunk_layers = rng.integers(0, 4, size=(vpp, 3))
            table = pipeline.in_flight_layers(pp, vpp, m, r, chunk_layers)
            for _ in range(20):
                per_layer = rng.random(3) * rng.integers(0, 2, size=3)
                brute = pipeline.replay_peak_activation_bytes(pp, vpp, m, r, chunk_layers @ per_layer)
                assert (table @ per_layer).max() == pytest.approx(brute, rel=1e-12, abs=1e-12)


def _full_replay_peak(pp: int, vpp: int, m: int, rank: int, chunk_bytes: np.ndarray) -> float:
    """The peak by brute force: every forward of the whole schedule, no state dropped or shortened."""
    warmup, fwd, bwd = pipeline.schedule_order(pp, vpp, m, rank)
    held, freed, peak = np.zeros(vpp), 0, 0.0
    for i, chunk in enumerate(fwd):
        if i >= warmup + 1:  # forward W + k runs after backward k - 1
            held[bwd[freed]] -= 1
            freed += 1
        held[chunk] += 1
        peak = max(peak, float(held @ chunk_bytes))
    return peak


@pytest.mark.parametrize("pp,vpp", [(2, 1), (3, 1), (2, 2), (3, 2), (4, 3), (5, 2), (3, 4), (6, 3)])
def test_replay_of_many_micro_batches_equals_the_full_schedule(pp, vpp):
    """The replay shortens m beyond a few groups of pp micro-batches (``steady_microbatches``: 10^6
    micro-batches took 13 s and 180 MB) and keeps only maximal states: neither may change a peak,
    checked against the whole schedule replayed forward by forward, for m far past the cut."""
    rng = np.random.default_rng(pp * 10 + vpp)
    for m in sorted({1, pp, 2 * pp + 1, 4 * pp - 1, 4 * pp, 4 * pp + 1, 7 * pp + 2, 13 * pp + pp - 1, 50, 97}):
        for rank in range(pp):
            for _ in range(3):
                chunk_bytes = rng.integers(0, 9, size=vpp).astype(np.float64)
                assert pipeline.replay_peak_activation_bytes(pp, vpp, m, rank, chunk_bytes) == \
                    _full_replay_peak(pp, vpp, m, rank, chunk_bytes), (m, rank, chunk_bytes)


def test_steady_microbatches_keeps_the_residue_and_the_short_schedules():
    assert [pipeline.steady_microbatches(4, m) for m in (1, 8, 15)] == [1, 8, 15]
    for m in (16, 17, 1_000_003, 10**8):
        short = pipeline.steady_microbatches(4, m)
        assert 12 <= short < 16 and short % 4 == m % 4


@pytest.mark.parametrize("block_cells", [pipeline.DOMINANCE_BLOCK_CELLS, 7])
def test_maximal_rows_are_the_rows_no_other_row_dominates(block_cells, monkeypatch):
    """``_maximal_rows`` against the definition, pair by pair: the distinct rows that no other distinct row
    is >= everywhere, in np.unique order; one varying column, two (the staircase) and more (the blocks of
    pairs, several per call with a small block), with constant columns among them."""
    monkeypatch.setattr(pipeline, "DOMINANCE_BLOCK_CELLS", block_cells)
    rng = np.random.default_rng(3)
    for _ in range(400):
        rows = rng.integers(0, int(rng.integers(2, 9)), (int(rng.integers(1, 60)), int(rng.integers(1, 6))))
        if rows.shape[1] > 1 and rng.random() < 0.3:
            rows[:, int(rng.integers(rows.shape[1]))] = 5
        distinct = np.unique(rows, axis=0)
        expected = [r for r in distinct if not any((o >= r).all() and (o != r).any() for o in distinct)]
        got = pipeline._maximal_rows(rows)
        assert got.tolist() == [r.tolist() for r in expected]

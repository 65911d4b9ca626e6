"""Pipeline splits balanced by cost: the split is the most even contiguous one by the
contract's FLOP count, the search offers it, and it moves the heavy LM head and MTP off the even rule."""

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

import hardware_profiles
import model_presets
from costmodel import TrainingConfig, evaluate
from costmodel.pipeline import _slot_flops, balanced_tokens, parse_layout, split_chunks
from costmodel.batch import NO_VALUE
from search.frameworks import layout_string
from search.space import SPLIT_BALANCED, build_space

ROOT = Path(__file__).resolve().parents[1]


def _stage_costs(costs, cuts):
    return [sum(costs[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]


@pytest.mark.parametrize("model,pp,vpp", [("tiny-dense", 2, 1), ("tiny-moe", 2, 2), ("tiny-mla-moe", 3, 1),
                                          ("tiny-mla-moe", 2, 2)])
def test_balanced_split_is_the_most_even_contiguous_split(model, pp, vpp):
    """Against every contiguous split of the slots into pp·vpp non-empty stages (brute force)."""
    spec = model_presets.load(model)
    costs, symbols = _slot_flops(spec)
    tokens = balanced_tokens(spec, pp, vpp)
    assert "".join(tokens) == "".join(symbols)  # every slot once, in model order
    assert len(tokens) == pp * vpp and all(tokens)
    # slot boundaries of our split: every slot is one t (the first with E), m or L
    cuts = np.cumsum([0] + [t.count("t") + t.count("m") + t.count("L") for t in tokens]).tolist()
    ours_sq = sum(c ** 2 for c in _stage_costs(costs, cuts))
    n, S = len(costs), pp * vpp
    best = min(sum(c ** 2 for c in _stage_costs(costs, [0, *cut, n]))
               for cut in itertools.combinations(range(1, n), S - 1))
    assert ours_sq == pytest.approx(best, rel=1e-9)


def test_pangu_head_and_mtp_leave_the_last_stages_lighter():
    """Pangu's 153K-vocabulary head and its MTP module weigh more than a decoder layer: the balanced
    split gives them stages of their own and the three dense layers share the first stage."""
    spec = model_presets.load("pangu-ultra-moe-718b")
    tokens = balanced_tokens(spec, 16, 2)
    assert tokens[0] == "Ettt" and tokens[-2:] == ["m", "L"]
    assert sum(t.count("t") for t in tokens) == spec.num_layers
    chunks = split_chunks(spec, 16, 2, NO_VALUE, NO_VALUE, False, False, layout_string(tokens))
    assert chunks.shape == (16, 2, 5)
    assert parse_layout(layout_string(tokens)) == tokens


def test_balanced_split_of_huaweis_layout_is_faster_and_fits():
    """Huawei's tp 8 · pp 16 · vpp 2 · ep 32 with its embedding/loss slot split against the same layout
    balanced by cost: the slowest virtual stage no longer carries a layer slot plus the head."""
    spec = model_presets.load("pangu-ultra-moe-718b")
    profile = hardware_profiles.load("ascend-910b")
    published = json.loads((ROOT / "examples" / "pangu-ultra-moe-6144.json").read_text())
    balanced = {k: v for k, v in published.items() if not k.startswith("account_for_")}
    balanced["pipeline_layout"] = layout_string(balanced_tokens(spec, published["pp"], published["vpp"]))
    before = evaluate(spec, profile, 6144, TrainingConfig.model_validate(published))
    after = evaluate(spec, profile, 6144, TrainingConfig.model_validate(balanced))
    assert before["feasible"] and after["feasible"]
    assert after["tokens_per_s_per_device"] > 1.05 * before["tokens_per_s_per_device"]


def test_search_offers_the_balanced_split_only_where_it_differs_from_the_even_one():
    spec, profile = model_presets.load("tiny-moe"), hardware_profiles.load("nvidia-h100-80gb")
    space = build_space(spec, profile, 8, 16)
    assert SPLIT_BALANCED in space.values["split"]
    p = space.parallel
    with_layout = p["layout_id"] != NO_VALUE
    assert with_layout.any()
    for i in np.flatnonzero(with_layout)[:50]:
        pp, vpp, layout = int(p["pp"][i]), int(p["vpp"][i]), space.layouts[p["layout_id"][i]]
        assert pp > 1
        assert layout == layout_string(balanced_tokens(spec, pp, vpp))
        try:
            even = split_chunks(spec, pp, vpp, NO_VALUE, NO_VALUE, False, False, None)
        except ValueError:
            continue  # no even split exists: only the balanced one is offered
        assert not np.array_equal(even, split_chunks(spec, pp, vpp, NO_VALUE, NO_VALUE, False, False, layout))


def _rank_and_stage_loads(spec, tokens, pp):
    costs, _ = _slot_flops(spec)
    cuts = np.cumsum([0] + [t.count("t") + t.count("m") + t.count("L") for t in tokens])
    stage = np.diff(np.concatenate([[0.0], np.cumsum(costs)])[cuts])
    return np.bincount(np.arange(len(stage)) % pp, stage), stage


def test_ties_between_stage_sizes_are_spread_over_the_ranks(monkeypatch):
    """Llama-3 70B over pp 3 · vpp 5: 80 layers in 15 virtual stages of 5 and 6 can sit in any order at
    the same per-stage balance; rank r runs stages r, r + 3, ..., so the order decides the ranks' loads.
    The split keeps the least sum of squared stage costs and lowers the busiest rank's load."""
    import costmodel.pipeline as pipeline

    spec = model_presets.load("llama3-70b")
    ranks, stages = _rank_and_stage_loads(spec, balanced_tokens(spec, 3, 5), 3)
    monkeypatch.setattr(pipeline, "_balance_ranks", lambda cuts, prefix, pp: cuts)
    ranks_dp, stages_dp = _rank_and_stage_loads(spec, balanced_tokens(spec, 3, 5), 3)
    assert (stages ** 2).sum() == pytest.approx((stages_dp ** 2).sum(), rel=1e-12)
    assert ranks.max() < ranks_dp.max()
    assert ranks.max() / ranks.mean() < 1.01

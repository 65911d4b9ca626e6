"""The exhaustive engine's pruning is exact: the plain full scan stays the reference.

With ``prune=True`` (the default) the engine decides rows whose throughput bound cannot reach the
K-th best layout's best config, or whose model states alone overflow the device, without scoring them.
On real preset spaces, small enough for a full scan in a test, the top-K configs, the top-K layouts and
their ranks (and, where nothing fits, the smallest peak) must equal the plain scan's; the throughput
bound must hold above every config's throughput and the memory bound below every config's peak; and
the pruned configs are counted.
"""

from __future__ import annotations

import numpy as np
import pytest

import hardware_profiles
import model_presets
from costmodel import evaluate_batch
from search.exhaustive import _row_bounds, run_exhaustive
from search.space import build_space

CASES = [  # (model, cluster, devices, global batch, framework, top K, memory margin GiB): MoE
    # with and without a framework, MLA on Ascend, a dense model with a margin; 74,000-514,000 configs each
    ("tiny-moe", "nvidia-h100-80gb", 16, 64, None, 10, 0.0),
    ("tiny-mla-moe", "ascend-910b", 32, 128, "mindspeed", 5, 0.0),
    ("gpt-1.3b", "nvidia-a100-80gb", 64, 512, "megatron", 10, 2.0),
]


def _space(model, cluster, devices, gbs, framework):
    return build_space(model_presets.load(model), hardware_profiles.load(cluster), devices, gbs, framework=framework)


def _key(ranked):
    return ([c for c in ranked.configs],
            [(lay["layout"], lay["best_rank"], lay["config"]) for lay in ranked.layouts])


@pytest.mark.parametrize("model,cluster,devices,gbs,framework,k,margin", CASES)
def test_pruned_scan_ranks_as_the_plain_scan(model, cluster, devices, gbs, framework, k, margin):
    space = _space(model, cluster, devices, gbs, framework)
    # small chunks, so that the cut is known after the first and later chunks are pruned
    plain = run_exhaustive(space, k, batch_size=500, margin_gib=margin, prune=False)
    pruned = run_exhaustive(space, k, batch_size=500, margin_gib=margin, prune=True)
    assert plain.configs, "the case must have feasible configs to rank"
    assert _key(pruned) == _key(plain)
    assert pruned.trials == plain.trials == space.size
    assert plain.extra["configs_pruned"] == 0
    for ranked in (plain, pruned):  # every config of the space is decided one way, and counted once
        extra = ranked.extra
        assert extra["configs_scored"] + extra["configs_pruned"] + extra["configs_dominated"] == space.size
    assert pruned.extra["configs_scored"] < plain.extra["configs_scored"]  # the bound did rule some out


@pytest.mark.parametrize("model,cluster,devices,gbs,framework,k,margin", CASES)
def test_row_bound_is_above_every_option_of_the_row(model, cluster, devices, gbs, framework, k, margin):
    space = _space(model, cluster, devices, gbs, framework)
    bounds, _ = _row_bounds(space)
    rows, opts = np.nonzero(space._option_mask())
    br = evaluate_batch(space.spec, space.profile, space.devices, space.make_batch(rows, opts), keep_stages=False)
    assert (br.tokens_per_s <= bounds[rows]).all()
    # and it is a useful bound: within a factor of 2 of the row's best option for most rows
    best = np.zeros(len(bounds))
    np.maximum.at(best, rows, br.tokens_per_s)
    assert np.median(best / bounds) > 0.5


MEMORY_CASES = [  # (model, cluster, devices, global batch, framework): most rows' states alone overflow the
    # device; the first still has configs that fit, in the second nothing fits
    ("llama3-70b", "nvidia-a100-80gb", 16, 64, "megatron"),
    ("llama3-70b", "nvidia-a100-80gb", 8, 32, None),
]


@pytest.mark.parametrize("model,cluster,devices,gbs,framework", MEMORY_CASES)
def test_rows_that_cannot_fit_are_decided_as_the_plain_scan(model, cluster, devices, gbs, framework):
    space = _space(model, cluster, devices, gbs, framework)
    _, lower = _row_bounds(space)
    capacity = hardware_profiles.load(cluster).fact("memory_gib") * 2**30
    assert (lower > capacity).mean() > 0.5, "the case must have rows the memory bound rules out"
    plain = run_exhaustive(space, 5, batch_size=500, prune=False)
    pruned = run_exhaustive(space, 5, batch_size=500, prune=True)
    assert _key(pruned) == _key(plain)
    # where nothing fits, the smallest peak (and the config that has it) is still the full scan's
    assert (pruned.smallest_peak_gib, pruned.smallest_peak_config) == (plain.smallest_peak_gib,
                                                                       plain.smallest_peak_config)
    extra = pruned.extra
    assert extra["configs_scored"] + extra["configs_pruned"] + extra["configs_dominated"] == space.size
    assert extra["configs_scored"] < plain.extra["configs_scored"] / 2


@pytest.mark.parametrize("model,cluster,devices,gbs,framework", MEMORY_CASES + [c[:5] for c in CASES])
def test_memory_bound_is_below_every_option_of_the_row(model, cluster, devices, gbs, framework):
    space = _space(model, cluster, devices, gbs, framework)
    _, lower = _row_bounds(space)
    rows, opts = np.nonzero(space._option_mask())
    br = evaluate_batch(space.spec, space.profile, space.devices, space.make_batch(rows, opts), keep_stages=False)
    assert (br.peak_bytes[br.valid] >= lower[rows[br.valid]]).all()
    assert (lower > 0).any()

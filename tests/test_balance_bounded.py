"""The cost-balanced split is bounded in time and memory by construction and gives the split of the full
dynamic programme over every (start, end) pair (kept here as the reference) wherever that one finishes."""

import time
import tracemalloc

import numpy as np
import pytest

import model_presets
from app.formats.bounds import MAX_LAYERS
from costmodel.pipeline import (BALANCE_MAX_WORK, _balance_ranks, _least_squares_cuts, _slot_flops,
                                balanced_tokens)
from costmodel.spec import ModelSpec


def full_dp_cuts(prefix: np.ndarray, S: int) -> list[int]:
    """The reference: the (n+1)^2 programme the bounded one replaces, unchanged."""
    n = len(prefix) - 1
    sq = (prefix[None, :] - prefix[:, None]) ** 2
    sq[np.tril_indices(n + 1)] = np.inf
    best = sq[0].copy()
    back = np.zeros((S, n + 1), dtype=np.int64)
    for stage in range(1, S):
        total = best[:, None] + sq
        back[stage] = np.argmin(total, axis=0)
        best = total[back[stage], np.arange(n + 1)]
    cuts, j = [n], n
    for stage in range(S - 1, 0, -1):
        j = int(back[stage, j])
        cuts.append(j)
    return [0] + cuts[::-1]


def _prefix(costs) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(costs)]) / sum(costs)


def _cases(rng, count):
    """Slot costs of the kinds real specs give: all even (exact ties everywhere), two kinds of layer
    (dense and MoE patterns), a heavy last slot (a big LM head), MTP modules, and random costs."""
    for _ in range(count):
        n = int(rng.integers(2, 60))
        kind = rng.integers(5)
        if kind == 0:
            costs = [3.0] * n
        elif kind == 1:
            costs = [float(rng.choice([5.0, 8.0])) for _ in range(n)]
        elif kind == 2:
            costs = [7.0] * (n - 1) + [float(rng.uniform(1, 40))]
        elif kind == 3:
            costs = [11.0] * max(n - 3, 1) + [13.0, 13.0, float(rng.uniform(5, 30))]
        else:
            costs = rng.uniform(0.1, 10, size=n).tolist()
        S = int(rng.integers(1, len(costs) + 1))
        yield costs, S


def test_bounded_split_is_the_full_programmes_split_on_many_small_cases():
    rng = np.random.default_rng(20261207)
    checked = 0
    for costs, S in _cases(rng, 3000):
        prefix = _prefix(costs)
        ours = _least_squares_cuts(prefix, S, max(costs) / sum(costs))
        assert ours == full_dp_cuts(prefix, S), (costs, S)
        for pp in {1, S} | ({S // 2} if S % 2 == 0 and S > 2 else set()):
            assert _balance_ranks(ours, prefix, pp) == _balance_ranks(full_dp_cuts(prefix, S), prefix, pp)
        checked += 1
    assert checked == 3000


@pytest.mark.parametrize("model", ["tiny-dense", "tiny-moe", "tiny-mla-moe", "llama3-70b", "deepseek-v3-671b"])
def test_bounded_split_is_the_full_programmes_split_on_presets(model):
    spec = model_presets.load(model)
    costs, symbols = _slot_flops(spec)
    prefix = _prefix(costs)
    for pp in (2, 3, 4, 8):
        for vpp in (1, 2, 3, 5):
            S = pp * vpp
            if S > len(costs):
                continue
            cuts = _balance_ranks(full_dp_cuts(prefix, S), prefix, pp)
            expected = ["".join(symbols[cuts[k]:cuts[k + 1]]) for k in range(S)]
            assert balanced_tokens(spec, pp, vpp) == expected, (model, pp, vpp)


def _widest(num_layers: int, **kw) -> ModelSpec:
    return ModelSpec(name="x", num_layers=num_layers, hidden_size=256, num_attention_heads=8,
                     ffn_hidden_size=1024, vocab_size=1024, seq_length=512, **kw)


@pytest.mark.parametrize("pp,vpp", [(2, 1), (8, 8), (64, 1), (1250, 4), (5000, 2), (10_000, 1)])
def test_the_schemas_most_layers_split_within_seconds_and_megabytes(pp, vpp):
    """10,000 layers (the schema's cap) over few and over as many stages as slots: each split in under 3 s
    of CPU and 100 MiB of Python allocations (the (n+1)^2 programme took 57 s and 465 MiB at 4,000
    layers over 8 stages, and gave no answer at 10,000)."""
    spec = _widest(MAX_LAYERS)
    tracemalloc.start()
    started = time.process_time()
    tokens = balanced_tokens(spec, pp, vpp)
    took = time.process_time() - started
    peak_mib = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    assert len(tokens) == pp * vpp and all(tokens)
    assert "".join(tokens).count("t") == MAX_LAYERS
    sizes = [t.count("t") + t.count("L") for t in tokens]
    assert max(sizes) - min(sizes) <= 2  # even layers: as even as the LM head allows
    assert took < 3, f"{took:.1f} s of CPU"
    assert peak_mib < 100, f"{peak_mib:.0f} MiB"


def test_heavy_head_and_mtp_at_the_caps_stay_bounded():
    """A head as heavy as the bounds allow beside light layers makes the window as wide as the slots: the
    work bound holds and the fallback still gives a valid split."""
    spec = ModelSpec(name="x", num_layers=MAX_LAYERS, hidden_size=256, num_attention_heads=8,
                     ffn_hidden_size=1024, vocab_size=100_000_000, seq_length=512, mtp_num_layers=100)
    started = time.process_time()
    tokens = balanced_tokens(spec, 100, 8)
    assert time.process_time() - started < 3
    assert len(tokens) == 800 and all(tokens) and tokens[-1].endswith("L")


def test_the_work_bound_keeps_the_programme_where_it_is_cheap():
    """Up to the bound the programme runs (1,000 layers over 64 stages); 10,000 layers over 8 stages would
    score more than the bound and take the prefix targets."""
    small = _prefix(_slot_flops(_widest(1000))[0])
    assert _least_squares_cuts(small, 64, small[1]) is not None
    big = _prefix(_slot_flops(_widest(MAX_LAYERS))[0])
    assert 7 * (2 * len(big) // 8) * len(big) > BALANCE_MAX_WORK
    assert _least_squares_cuts(big, 8, big[1]) is None

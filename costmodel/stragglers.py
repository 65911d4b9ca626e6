"""Stragglers and jitter: the step waits for its slowest data-parallel replica.

Every replica's step time varies a little from step to step and from device to device (host jitter,
the data loader, thermal clocks, a slower node: Jiang et al., MegaScale, NSDI 2024 §4 and §6.1). The
replicas meet at each step's gradient synchronisation, so a step lasts as long as the slowest of the
``dp`` replicas. With replica times normal around the modelled step t with coefficient of variation
cv, the expected slowest of N is t · (1 + cv · E[max of N standard normals]), which grows like
√(2 ln N): nothing for one replica, about 2.3 cv at 64 replicas, 3.9 cv at 12,288.

Ranks inside a replica (tensor, context, pipeline, expert parallel) meet at every layer or
micro-batch; their jitter is a constant share of each layer's time, already inside the fitted
efficiencies, so only the data-parallel count enters here. cv is the profile's calibrated
``straggler_cv`` (``scripts/calibrate.py``: the published runs of one model at several scales).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

# Standard-normal grid for the expected maximum: beyond 9 σ lies 1e-19 of each sample's mass, so
# the grid holds the maximum of up to 1e15 samples, and 1/64 σ steps keep the trapezoid within 1e-5.
_X = np.linspace(-9.0, 9.0, 1153)
_PHI = 0.5 * (1.0 + np.vectorize(math.erf)(_X / np.sqrt(2.0)))


_trapezoid = getattr(np, "trapezoid", None) or np.trapz  # numpy 2 renamed it


@lru_cache(maxsize=4096)
def _expected_max(n: int) -> float:
    # E[max] = ∫₀^∞ (1 − Φ(x)ᴺ) dx − ∫_{−∞}^0 Φ(x)ᴺ dx, by parts on the maximum's CDF Φᴺ.
    cdf = _PHI ** n
    pos, neg = _X >= 0, _X <= 0
    return float(_trapezoid(1.0 - cdf[pos], _X[pos]) - _trapezoid(cdf[neg], _X[neg]))


def expected_max_normal(n: np.ndarray) -> np.ndarray:
    """Expected maximum of ``n`` independent standard normals (0 for n = 1, 1/√π for 2, 1.163 for 5,
    3.852 for 10,000), element-wise over an integer array of counts ≥ 1."""
    n = np.maximum(np.asarray(n, dtype=np.int64), 1)
    top = int(n.max()) if n.size else 1
    if top > max(4 * n.size, 1 << 16):  # counts too spread for a table over 1..max: sort them
        counts, inverse = np.unique(n, return_inverse=True)
        values = np.array([_expected_max(int(c)) if c > 1 else 0.0 for c in counts])
        return values[inverse].reshape(n.shape)
    # A table over 1..max holding the counts present: one pass, no sort (searches score ~16,000 configs
    # at a time with a few distinct dp).
    present = np.zeros(top + 1, dtype=bool)
    present[n] = True
    counts = np.flatnonzero(present)
    table = np.zeros(top + 1)
    table[counts] = [_expected_max(int(c)) if c > 1 else 0.0 for c in counts]
    return table[n]


def straggler_s(step_s: np.ndarray, dp: np.ndarray, cv: float) -> np.ndarray:
    """Seconds a step of ``step_s`` waits for the slowest of ``dp`` data-parallel replicas whose
    step times vary with coefficient of variation ``cv`` (a fraction)."""
    return step_s * cv * expected_max_normal(dp)

"""Expert load from a routing distribution, and the placement of experts on expert-parallel ranks.

A config may state the router's per-expert token shares (``moe_expert_load``) or a one-parameter skew
(``moe_expert_skew``) instead of guessing ``moe_load_imbalance``. The imbalance the cost model uses,
max/mean routed tokens per EP rank, then follows from where the experts sit:

* ``contiguous``: expert e on rank e // (E / ep), as Megatron-Core assigns local experts;
* ``balanced``: the hottest expert first on the least loaded rank that has a free slot (greedy
  longest-processing-time placement, each rank keeping E / ep experts), as Huawei's "EDP Balance"
  places experts for Pangu Ultra MoE so that hot experts do not share a rank. With
  ``moe_expert_replicas`` = r, each rank has r more slots, filled with copies of the experts whose
  tokens per copy are the most (one more copy at a time, at most one copy per rank), each copy taking an
  equal part of its expert's tokens, and the copies are placed the same greedy way, never two of one
  expert on a rank: the replication and packing of DeepSeek's EPLB (deepseek-ai/EPLB), for training.

The expected shares are what the placement sees; the per-micro-batch noise of routing around them is
not modelled (it adds to max/mean in practice; ``moe_load_imbalance`` states a measured value).
"""

from __future__ import annotations

import numpy as np

from .spec import ModelSpec, TrainingConfig

# The skew model: the k-th hottest expert gets a share ∝ (k + 1) ** -skew (Zipf), and the ranks of
# heat are spread over expert ids by a fixed permutation, since a router's hot experts sit anywhere in
# the id range; a fixed seed keeps every evaluation of a config the same.
SKEW_PERMUTATION_SEED = 0


def effective_imbalance(ep, imbalance) -> np.ndarray:
    """The imbalance (max/mean routed tokens per EP rank) the times use: the config's (stated, default or
    from its routing), except at ep 1, where one rank holds every expert and receives every routed token,
    so max = mean = 1 exactly (the stated or default figure describes ranks that do not exist there)."""
    return np.where(np.asarray(ep) == 1, 1.0, imbalance)


def expert_shares(spec: ModelSpec, config: TrainingConfig) -> np.ndarray | None:
    """Per-expert token shares (sum 1, by expert id), or None where the config states no routing."""
    if config.moe_expert_load is not None:
        load = np.asarray(config.moe_expert_load, dtype=np.float64)
        return load / load.sum()
    if config.moe_expert_skew is None or not spec.is_moe:
        return None
    E = spec.num_experts
    heat = (np.arange(E) + 1.0) ** -config.moe_expert_skew
    shares = np.empty(E)
    shares[np.random.default_rng(SKEW_PERMUTATION_SEED).permutation(E)] = heat / heat.sum()
    return shares


def placement(shares: np.ndarray, ep: int, how: str) -> np.ndarray:
    """The EP rank of each expert (E / ep experts per rank)."""
    E = len(shares)
    per_rank = E // ep
    if how == "contiguous":
        return np.arange(E) // per_rank
    rank_of = np.empty(E, dtype=np.int64)
    load, free = np.zeros(ep), np.full(ep, per_rank)
    for e in np.argsort(-shares, kind="stable"):
        open_ranks = np.flatnonzero(free > 0)
        r = open_ranks[np.argmin(load[open_ranks])]
        rank_of[e] = r
        load[r] += shares[e]
        free[r] -= 1
    return rank_of


def copies(shares: np.ndarray, ep: int, replicas: int) -> np.ndarray:
    """Copies of each expert: one each, then ``ep · replicas`` more, each to the expert with the most
    tokens per copy that has fewer than ``ep`` (a copy per rank at most); slots left when every expert
    has ``ep`` copies stay empty."""
    n = np.ones(len(shares), dtype=np.int64)
    for _ in range(ep * replicas):
        per_copy = np.where(n < ep, shares / n, -1.0)
        e = int(np.argmax(per_copy))
        if per_copy[e] < 0:
            break
        n[e] += 1
    return n


def _replicated_loads(shares: np.ndarray, ep: int, replicas: int) -> np.ndarray:
    """Token share per rank with ``replicas`` extra slots per rank (balanced placement of the copies)."""
    n = copies(shares, ep, replicas)
    experts = np.repeat(np.arange(len(shares)), n)
    load_of = (shares / n)[experts]
    slots = len(shares) // ep + replicas
    load, free = np.zeros(ep), np.full(ep, slots)
    holds = np.zeros((ep, len(shares)), dtype=bool)
    for j in np.argsort(-load_of, kind="stable"):
        open_ranks = np.flatnonzero((free > 0) & ~holds[:, experts[j]])
        r = open_ranks[np.argmin(load[open_ranks])]
        load[r] += load_of[j]
        free[r] -= 1
        holds[r, experts[j]] = True
    return load


def rank_loads(shares: np.ndarray, ep: int, how: str, replicas: int = 0) -> np.ndarray:
    """Tokens each EP rank receives, relative to the mean (1.0 each when perfectly balanced)."""
    if replicas and how == "balanced":
        loads = _replicated_loads(shares, ep, replicas)
    else:
        loads = np.bincount(placement(shares, ep, how), weights=shares, minlength=ep)
    return loads / loads.mean()


def rank_imbalance(shares: np.ndarray, ep: int, how: str, replicas: int = 0) -> float:
    """max/mean of the tokens each EP rank receives (1.0: perfectly balanced)."""
    return float(rank_loads(shares, ep, how, replicas).max())


def routing_problem(spec: ModelSpec, config: TrainingConfig) -> tuple[str, str] | None:
    """(field, reason) where the routing fields do not fit the model or the layout, else None."""
    if config.moe_expert_load is None and config.moe_expert_skew is None:
        return None
    field = "moe_expert_load" if config.moe_expert_load is not None else "moe_expert_skew"
    if not spec.is_moe:
        return field, "a dense model has no experts to route to"
    if config.moe_expert_load is not None and len(config.moe_expert_load) != spec.num_experts:
        return field, f"has {len(config.moe_expert_load)} shares for num_experts={spec.num_experts}"
    return None


def resolved(spec: ModelSpec, config: TrainingConfig) -> tuple[TrainingConfig, dict | None]:
    """The config with ``moe_load_imbalance`` set from its routing (unchanged without one), and for the
    result (None without routing) the imbalance (max/mean) and the tokens per EP rank (relative to the
    mean, by rank) of each placement. Raises ValueError naming the field
    where the routing does not fit (``routing_problem``)."""
    if (problem := routing_problem(spec, config)) is not None:
        raise ValueError(f"{problem[0]}: {problem[1]}")
    shares = expert_shares(spec, config)
    if shares is None:
        return config, None
    if spec.num_experts % config.ep:  # structurally infeasible (validity: ep_divides_experts): no placement
        return config.model_copy(update={"moe_load_imbalance": 1.0}), None
    report: dict = {"expert_placement": config.expert_placement, "moe_expert_replicas": config.moe_expert_replicas}
    for how in ("contiguous", "balanced"):  # both placements, so a result shows what placement buys
        loads = rank_loads(shares, config.ep, how, config.moe_expert_replicas)
        report[f"imbalance_{how}"] = float(loads.max())
        report[f"tokens_per_rank_{how}"] = [float(x) for x in loads]
    report["imbalance"] = report[f"imbalance_{config.expert_placement}"]
    return config.model_copy(update={"moe_load_imbalance": report["imbalance"]}), report

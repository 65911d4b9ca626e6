"""Communication: where a group sits in the cluster, and the time of each collective.

Ranks follow Megatron-Core's default order ``tp-cp-ep-dp-pp`` (tp innermost). A group of ``size``
ranks spaced ``stride`` apart has ``members_per_domain`` ranks inside one scale-up domain. A group
that fits in one domain runs at scale-up bandwidth. A group that spans domains runs its ring or
hierarchical collective at the NIC bandwidth of the members that share a domain (each device has
its own NIC: DGX, Atlas 800T A2), capped by the scale-up link: the bus-bandwidth model of
nccl-tests' PERFORMANCE.md. All sizes are bytes, all times seconds, arrays one entry per config.
"""

from __future__ import annotations

import numpy as np

from .hardware import Hardware


def members_per_domain(stride, size, hw: Hardware) -> np.ndarray:
    """Ranks of the group inside one scale-up domain (at least 1, at most the group size)."""
    per_domain = np.maximum(hw.scale_up_domain // np.maximum(stride, 1), 1)
    return np.minimum(per_domain, size)


def switched_scale_up(hw: Hardware) -> bool:
    """Whether the scale-up domain is switched (NVSwitch, UB: the profile states no pair link)."""
    return bool(np.all(hw.scale_up_link_bytes_per_s <= 0))


def scale_up_bandwidth(peers_in_domain, hw: Hardware) -> np.ndarray:
    """Scale-up bandwidth a device reaches towards ``peers_in_domain`` other group members: all of it
    behind a switch (NVSwitch, UB), one pair link per peer in a full mesh (HCCS on Atlas 800T A2)."""
    if hw.derived(switched_scale_up):
        return np.full(np.shape(peers_in_domain), hw.scale_up_bytes_per_s)
    return np.minimum(hw.scale_up_bytes_per_s, np.maximum(peers_in_domain, 1) * hw.scale_up_link_bytes_per_s)


def group_bus_bandwidth(stride, size, hw: Hardware) -> tuple[np.ndarray, np.ndarray]:
    """Achievable bus bandwidth (B/s) and per-step latency (s) of a ring collective over the group."""
    inside = members_per_domain(stride, size, hw)
    in_domain = inside >= size
    up = scale_up_bandwidth(inside - 1, hw)
    bw = np.where(in_domain, up, np.minimum(up, inside * hw.scale_out_bytes_per_s))
    lat = np.where(in_domain, hw.scale_up_latency_s, hw.scale_out_latency_s)
    return bw, lat


def all_gather_s(nbytes, stride, size, hw: Hardware, bus: tuple | None = None) -> np.ndarray:
    """All-gather (or reduce-scatter) of a ``nbytes`` buffer (the full, gathered size): each rank moves
    (n−1)/n of it, in n−1 ring steps. ``bus``: the group's ``group_bus_bandwidth``, where the caller
    runs several collectives over one group."""
    bw, lat = group_bus_bandwidth(stride, size, hw) if bus is None else bus
    steps = size - 1
    return np.where(size > 1, steps / np.maximum(size, 1) * nbytes / bw + steps * lat, 0.0)


reduce_scatter_s = all_gather_s


def all_reduce_s(nbytes, stride, size, hw: Hardware) -> np.ndarray:
    """Ring all-reduce = reduce-scatter + all-gather: 2(n−1)/n of the buffer per rank."""
    return 2.0 * all_gather_s(nbytes, stride, size, hw)


def all_to_all_s(send_bytes, stride, size, hw: Hardware) -> np.ndarray:
    """All-to-all where each rank sends ``send_bytes`` spread evenly over the group (itself included).

    Traffic to peers in the same domain moves at scale-up bandwidth, the rest through the rank's own
    NIC; hierarchical all-to-all (DeepEP, Huawei's hierarchical EP on Atlas 800T A2 / CloudMatrix)
    runs both phases concurrently, so the slower one sets the time."""
    inside = members_per_domain(stride, size, hw)
    n = np.maximum(size, 1)
    intra = send_bytes * (inside - 1) / n / scale_up_bandwidth(inside - 1, hw)
    inter = send_bytes * (size - inside) / n / hw.scale_out_bytes_per_s
    lat = np.where(size > inside, hw.scale_out_latency_s, hw.scale_up_latency_s)
    return np.where(size > 1, np.maximum(intra, inter) + lat, 0.0)


def distinct_domains(k, domains) -> np.ndarray:
    """Expected number of distinct scale-up domains (nodes) that a token's ``k`` experts fall in, experts
    spread uniformly over ``domains`` domains: N·(1 − (1 − 1/N)^k)."""
    n = np.maximum(domains, 1.0)
    return n * (1.0 - (1.0 - 1.0 / n) ** k)


def _expert_all_to_all_parts(send_bytes, k, stride, size, hierarchical, hw: Hardware):
    """Scale-up time, NIC time and message latencies of one expert dispatch (see expert_all_to_all_s)."""
    inside = members_per_domain(stride, size, hw)
    n = np.maximum(size, 1)
    domains = n / inside
    remote_share = (size - inside) / n
    copies_remote = np.where(hierarchical, distinct_domains(k, domains) * remote_share / k, remote_share)
    intra = send_bytes * (inside - 1) / n / scale_up_bandwidth(inside - 1, hw)
    inter = send_bytes * copies_remote / hw.scale_out_bytes_per_s
    remote_peers = np.where(hierarchical, domains - 1, size - inside)
    lat = (inside - 1) * hw.scale_up_latency_s + remote_peers * hw.scale_out_latency_s
    return intra, inter, lat


def expert_all_to_all_s(send_bytes, k, stride, size, hierarchical, hw: Hardware) -> np.ndarray:
    """MoE dispatch (or combine) over an EP group of ``size`` ranks ``stride`` apart: ``send_bytes`` are
    the ``k`` routed copies of this rank's tokens.

    Flat dispatch (Megatron's alltoall) sends one copy per destination expert rank: the share of copies
    bound for other domains crosses the NIC, and each of the size − 1 peers costs a message latency.
    Hierarchical dispatch (DeepSeek-V3 §3.2 and DeepEP's normal kernels; Huawei's hierarchical
    all-to-all on Atlas 800T A2) sends a token once per destination node, where it fans out over the
    scale-up links: the inter-node volume drops from k copies to the expected number of distinct
    remote nodes, and messages go to one peer per node plus the peers inside the own domain."""
    intra, inter, lat = _expert_all_to_all_parts(send_bytes, k, stride, size, hierarchical, hw)
    return np.where(size > 1, np.maximum(intra, inter) + lat, 0.0)


def expert_all_to_all_nic_s(send_bytes, k, stride, size, hierarchical, hw: Hardware) -> np.ndarray:
    """The time one expert dispatch keeps this device's NIC busy: what data-parallel traffic that runs
    at the same time (overlapped gradient reduce-scatter, parameter all-gather) cannot use."""
    return np.where(size > 1, _expert_all_to_all_parts(send_bytes, k, stride, size, hierarchical, hw)[1], 0.0)


def spans_domains(stride, size, hw: Hardware) -> np.ndarray:
    """Whether a group of ``size`` ranks ``stride`` apart crosses the scale-up domain (uses the NIC)."""
    return members_per_domain(stride, size, hw) < size


def p2p_s(nbytes, stride, hw: Hardware) -> np.ndarray:
    """One point-to-point transfer between ranks ``stride`` apart (pipeline neighbours): one link."""
    in_domain = stride < hw.scale_up_domain
    bw = np.where(in_domain, scale_up_bandwidth(np.ones_like(stride), hw), hw.scale_out_bytes_per_s)
    lat = np.where(in_domain, hw.scale_up_latency_s, hw.scale_out_latency_s)
    return nbytes / bw + lat


def exposed_s(comm_s, window_s, overlap_fraction) -> np.ndarray:
    """What stays on the critical path when ``comm_s`` runs beside ``window_s`` of independent compute:
    at most ``overlap_fraction`` of the communication hides, and never more than the window."""
    return np.maximum(comm_s * (1.0 - overlap_fraction), comm_s - window_s)

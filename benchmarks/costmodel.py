"""Throughput of the vectorised cost model: configs scored per second on one core.

Measures ``costmodel.evaluate_batch(spec, profile, devices, batch, keep_stages=False)`` (the path
the searches call) on batches of 1, 1,000 and 100,000 random configs, for a MoE model
(``pangu-ultra-moe-718b`` on ``ascend-910b``, 6144 devices, global batch 7680) and a dense one
(``llama3-405b`` on ``nvidia-h100-80gb``, 16384 devices, global batch 2048). Configs are a realistic
random mix (tp 1/2/4/8, pp among the device count's divisors up to 16, vpp 1-4, cp 1/2, ep for MoE,
mbs 1-4, recompute none / selective (a few module sets) / full with or without recompute_num_layers,
random flags; the MoE load imbalance is the default, as it is an input of a search, not a searched
column) built directly as numpy columns of a :class:`costmodel.ConfigBatch`, without pydantic; that
build time is reported separately.
Each cell is the median of several repeats within one run; BLAS/OpenMP are pinned to one thread,
and the allocator is tuned as ParaPlan's entry points tune it (``costmodel.runtime.tune_allocator``).

Beside each case, in the same run, the peer: llm-analysis (PyPI ``llm-analysis``, the ``bench`` extra:
``pip install -e ".[bench]"``), which scores one config per call (``LLMAnalysis(...).training(...)``), timed
on the first 200 configs of the same random mix (tp, pp, dp, ep, micro-batch, recompute none/full) that it
accepts (it refuses a config that does not fit; where it refuses most, on its leanest config: tp 8, the
deepest pipeline, full recompute) on its
closest GPU (A100/H100 SXM 80 GB: it has no Ascend; its FFN width rounded to a multiple of the hidden
size, as it requires), as configs/s; the ratios say how many times it
ParaPlan's batch path and its single ``evaluate`` (batch 1) are. Without the package the peer columns read
"not installed".

A batch of 4,096 configs and more scores only its structurally valid configs (the others get
placeholders, masked by ``valid``): the "valid" column is their share of the mix and "valid configs/s"
the valid configs scored per second, so that the table shows how much of the rate is the skipping.

Run from the repository root:

    .venv/bin/python benchmarks/costmodel.py [--repeats N] [--seed S] [--clock wall|cpu] [--profile N]

``--clock cpu`` times both sides (ParaPlan and the peer) in this process's CPU seconds instead of wall
seconds: on a machine shared with other work, wall time counts the waits for a core, CPU time only
what the scoring itself spent. ``--profile N`` then prints, per case and batch size, the N costmodel
functions with the largest cumulative time under cProfile (where the scorer's time goes).

The targets: >= 3,000,000 configs/s at batch 100,000 (MoE and dense), and batch 1 no slower than the peer's
one config.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hardware_profiles  # noqa: E402
from costmodel.runtime import tune_allocator  # noqa: E402
import model_presets  # noqa: E402
from costmodel import ConfigBatch, DEFAULT_MOE_LOAD_IMBALANCE, evaluate_batch  # noqa: E402
from costmodel.batch import MODULE_BITS, NO_VALUE  # noqa: E402

CASES = [  # (label, model preset, cluster profile, devices, global batch size)
    ("MoE", "pangu-ultra-moe-718b", "ascend-910b", 6144, 7680),
    ("dense", "llama3-405b", "nvidia-h100-80gb", 16384, 2048),
]
SIZES = (1, 1_000, 100_000)
TARGET = 3_000_000  # configs/s at batch 100,000
PEER_CONFIGS = 200
PEER_GPU = {"nvidia-h100-80gb": "h100-sxm-80gb", "nvidia-a100-80gb": "a100-sxm-80gb"}
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = CLOCKS["wall"]  # what every cell is timed with (--clock)


def random_batch(rng: np.random.Generator, n: int, spec, devices: int, gbs: int) -> ConfigBatch:
    """``n`` random configs as numpy columns, the mix a search would hand the model."""
    ints = lambda choices: rng.choice(np.asarray(choices, dtype=np.int64), n)  # noqa: E731
    flag = lambda p=0.5: rng.random(n) < p  # noqa: E731
    pp_choices = [p for p in range(1, 17) if devices % p == 0]
    tp = ints([1, 2, 4, 8])
    pp = ints(pp_choices)
    vpp = np.where(pp > 1, ints([1, 2, 3, 4]), 1)
    cp = ints([1, 1, 1, 2])
    ep = (ints([e for e in (1, 2, 4, 8, 16, 32, 64) if spec.num_experts % e == 0]) if spec.is_moe
          else np.ones(n, np.int64))
    recompute = ints([0, 1, 2])
    # Selective recompute: Megatron's default (core_attn) or one of a few common module sets.
    module_sets = [("core_attn",), ("core_attn",), ("core_attn", "layernorm"), ("core_attn", "mlp"),
                   ("moe_act",), ("mla_up_proj", "core_attn"), ("layernorm", "moe_act", "shared_experts")]
    modules = ints([sum(MODULE_BITS[m] for m in ms) for ms in module_sets])
    rnl = np.where(flag(0.7), NO_VALUE, rng.integers(1, 9, n, dtype=np.int64))
    no = np.full(n, NO_VALUE, np.int64)
    return ConfigBatch(
        tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, etp=np.ones(n, np.int64), dp=no.copy(),
        micro_batch_size=ints([1, 2, 3, 4]), global_batch_size=np.full(n, gbs, np.int64),
        sequence_parallel=(tp > 1) & flag(0.9), tp_comm_overlap=flag(), recompute=recompute,
        recompute_modules=modules, recompute_num_layers=rnl, distributed_optimizer=flag(0.9),
        overlap_grad_reduce=flag(0.8), overlap_param_gather=flag(0.8), first_stage_layers=no.copy(),
        last_stage_layers=no.copy(), account_for_embedding=flag(0.2), account_for_loss=flag(0.2),
        layout_id=no.copy(), precision=np.zeros(n, np.int64), moe_a2a_overlap=flag() & spec.is_moe,
        # The imbalance is an input of a search (--moe-load-imbalance), not a searched column.
        moe_load_imbalance=np.full(n, DEFAULT_MOE_LOAD_IMBALANCE), layouts=[])


def peer_rate(spec, cluster: str, batch: ConfigBatch, devices: int, gbs: int) -> float | None:
    """llm-analysis's configs/s scoring the first ``PEER_CONFIGS`` configs of ``batch`` one call each
    (None when it is not installed)."""
    import logging
    try:
        from llm_analysis.analysis import ActivationRecomputation, LLMAnalysis
        from llm_analysis.config import ModelConfig, ParallelismConfig, get_gpu_config_by_name
    except ImportError:
        return None
    logging.getLogger("llm_analysis").setLevel(logging.ERROR)
    logging.disable(logging.WARNING)
    gpu = get_gpu_config_by_name(PEER_GPU.get(cluster, "h100-sxm-80gb"))
    model = ModelConfig(name=spec.name if hasattr(spec, "name") else "model", num_layers=spec.num_layers,
                        n_head=spec.num_attention_heads, hidden_dim=spec.hidden_size, vocab_size=spec.vocab_size,
                        max_seq_len=spec.seq_length, num_key_value_heads=spec.query_groups,
                        # a multiple of the hidden size, as it requires
                        ffn_embed_dim=spec.hidden_size * max(1, round((spec.moe_ffn_hidden_size if spec.is_moe
                                                                        else spec.ffn_hidden_size) / spec.hidden_size)),
                        moe_num_experts=spec.num_experts or 1, moe_top_k=spec.moe_router_topk or 1)
    def one(tp: int, pp: int, ep: int, mbs: int, full: bool) -> float | None:
        """Seconds of one call, None where it refuses the config (it asserts that the config fits)."""
        dp = max(devices // (tp * pp), 1)
        t0 = clock()
        try:
            la = LLMAnalysis(model, gpu, parallelism_config=ParallelismConfig(tp_size=tp, pp_size=pp, dp_size=dp,
                                                                              ep_size=ep),
                             flops_efficiency=0.5, hbm_memory_efficiency=0.9)
            la.training(batch_size_per_gpu=mbs, gradient_accumulation_steps=max(1, gbs // (mbs * dp)),
                        seq_len=spec.seq_length,
                        activation_recomputation=ActivationRecomputation.FULL if full else ActivationRecomputation.NONE)
        except AssertionError:
            return None
        return clock() - t0

    times = [one(int(batch.tp[i]), int(batch.pp[i]), int(batch.ep[i]), int(batch.micro_batch_size[i]),
                 bool(batch.recompute[i] == 2)) for i in range(min(PEER_CONFIGS, len(batch)))]
    times = [t for t in times if t is not None]
    if len(times) < PEER_CONFIGS // 4:  # it refuses most of the mix (memory): time the leanest config instead
        pp = max(p for p in range(1, 17) if devices % p == 0 and spec.num_layers % p == 0)
        ep = max(e for e in (1, 2, 4, 8, 16, 32, 64) if (spec.num_experts or 1) % e == 0)
        times += [t for t in (one(8, pp, ep, 1, True) for _ in range(PEER_CONFIGS)) if t is not None]
    return len(times) / sum(times) if times else None


def median_time(fn, repeats: int, min_total_s: float = 0.2) -> float:
    """Median seconds per call over ``repeats`` samples; tiny calls are looped within each sample."""
    fn()  # warm-up
    t0 = clock()
    fn()
    once = clock() - t0
    inner = max(1, int(min_total_s / repeats / max(once, 1e-9)))
    samples = []
    for _ in range(repeats):
        t0 = clock()
        for _ in range(inner):
            fn()
        samples.append((clock() - t0) / inner)
    return statistics.median(samples)


def print_profile(spec, profile, devices: int, batch: ConfigBatch, top: int, title: str) -> None:
    """cProfile of ``evaluate_batch`` on ``batch``: the ``top`` costmodel functions by cumulative time,
    per evaluate (ms), with their own time and calls."""
    import cProfile
    import pstats

    calls = max(1, 300 // len(batch)) if len(batch) < 1000 else 3
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        evaluate_batch(spec, profile, devices, batch, keep_stages=False)
    prof.disable()
    rows = [(ct / calls * 1e3, tt / calls * 1e3, nc / calls, f"{Path(fn).stem}.{name}")
            for (fn, _, name), (_, nc, tt, ct, _) in pstats.Stats(prof).stats.items()
            if f"{os.sep}costmodel{os.sep}" in fn]
    print(f"\n{title}: cProfile, {calls} evaluate_batch calls, per call")
    print(f"{'function':<40} {'calls':>7} {'cumulative ms':>14} {'own ms':>8}")
    for ct, tt, nc, name in sorted(rows, reverse=True)[:top]:
        print(f"{name:<40} {nc:>7g} {ct:>14.2f} {tt:>8.2f}")


def main() -> int:
    tune_allocator()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7, help="timed samples per cell (median reported)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                    help="time in wall seconds or in this process's CPU seconds (a shared machine)")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="then print the N costmodel functions with the most cumulative time per case and size")
    args = ap.parse_args()
    global clock
    clock = CLOCKS[args.clock]

    rows = []
    for label, model, cluster, devices, gbs in CASES:
        spec, profile = model_presets.load(model), hardware_profiles.load(cluster)
        per_cfg = {}
        for n in SIZES:
            rng = np.random.default_rng(args.seed)
            build_s = median_time(lambda: random_batch(np.random.default_rng(args.seed), n, spec, devices, gbs),
                                  args.repeats)
            batch = random_batch(rng, n, spec, devices, gbs)
            eval_s = median_time(lambda: evaluate_batch(spec, profile, devices, batch, keep_stages=False), args.repeats)
            per_cfg[n] = eval_s / n
            br = evaluate_batch(spec, profile, devices, batch, keep_stages=False)
            rows.append(dict(case=f"{label}: {model} / {cluster} / {devices} dev / gbs {gbs}", n=n,
                             build_ms=build_s * 1e3, eval_ms=eval_s * 1e3, us_per_cfg=eval_s / n * 1e6,
                             rate=n / eval_s, feasible=br.feasible.mean(), valid=br.valid.mean(),
                             valid_rate=br.valid.sum() / eval_s))
        rows[-1]["ratio"] = per_cfg[SIZES[0]] / per_cfg[SIZES[-1]]
        peer = peer_rate(spec, cluster, random_batch(np.random.default_rng(args.seed), PEER_CONFIGS, spec, devices, gbs),
                         devices, gbs)
        for r in rows[-len(SIZES):]:
            r["peer"] = peer

    header = ["case", "batch", "build ms", "eval ms (median)", "µs / config", "configs/s", "valid",
              "valid configs/s", "feasible",
              "per-config speed-up vs batch 1", "llm-analysis configs/s (same run)", "× llm-analysis"]
    table = [[r["case"] if r["n"] == SIZES[0] else "", f"{r['n']:,}", f"{r['build_ms']:.3f}",
              f"{r['eval_ms']:.3f}", f"{r['us_per_cfg']:.3f}", f"{r['rate']:,.0f}", f"{r['valid']:.1%}",
              f"{r['valid_rate']:,.0f}", f"{r['feasible']:.1%}",
              f"{r['ratio']:,.0f}×" if "ratio" in r else "",
              ("not installed" if r["peer"] is None else f"{r['peer']:,.0f}") if r["n"] == SIZES[0] else "",
              "" if r["peer"] is None else f"{r['rate'] / r['peer']:,.2f}×"] for r in rows]
    title = (f"costmodel.evaluate_batch, one thread, median of {args.repeats}, {args.clock} time "
             f"(numpy {np.__version__}, target ≥ {TARGET:,} configs/s at batch {SIZES[-1]:,})")
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(title)
        widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(header)]
        print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
        for row in table:
            print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))))
    else:
        t = Table(title=title)
        for i, h in enumerate(header):
            t.add_column(h, justify="left" if i == 0 else "right")
        for row in table:
            t.add_row(*row)
        Console(width=230).print(t)
    big = [r for r in rows if r["n"] == SIZES[-1]]
    ok = all(r["rate"] >= TARGET for r in big)
    print(("target met: " if ok else "target missed: ")
          + ", ".join(f"{r['case'].split(':')[0]} {r['rate']:,.0f}/s" for r in big))
    single = [r for r in rows if r["n"] == 1 and r["peer"] is not None]
    if single:
        ok = all(r["rate"] >= r["peer"] for r in single)
        print(("one evaluate no slower than llm-analysis's one config: " if ok else
               "one evaluate slower than llm-analysis's one config: ")
              + ", ".join(f"{r['case'].split(':')[0]} {r['rate']:,.0f}/s vs {r['peer']:,.0f}/s" for r in single))
    for label, model, cluster, devices, gbs in CASES if args.profile else ():
        spec, profile = model_presets.load(model), hardware_profiles.load(cluster)
        for n in (SIZES[0], SIZES[-1]):
            print_profile(spec, profile, devices, random_batch(np.random.default_rng(args.seed), n, spec, devices, gbs),
                          args.profile, f"{label}, batch {n:,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

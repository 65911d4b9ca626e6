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

Run from the repository root:

    .venv/bin/python benchmarks/costmodel.py [--repeats N] [--seed S]

The target is >= 1,000,000 configs/s at batch 100,000.
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
TARGET = 1_000_000  # configs/s at batch 100,000


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


def median_time(fn, repeats: int, min_total_s: float = 0.2) -> float:
    """Median seconds per call over ``repeats`` samples; tiny calls are looped within each sample."""
    fn()  # warm-up
    t0 = time.perf_counter()
    fn()
    once = time.perf_counter() - t0
    inner = max(1, int(min_total_s / repeats / max(once, 1e-9)))
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - t0) / inner)
    return statistics.median(samples)


def main() -> int:
    tune_allocator()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7, help="timed samples per cell (median reported)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

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
            feasible = evaluate_batch(spec, profile, devices, batch, keep_stages=False).feasible.mean()
            rows.append(dict(case=f"{label}: {model} / {cluster} / {devices} dev / gbs {gbs}", n=n,
                             build_ms=build_s * 1e3, eval_ms=eval_s * 1e3, us_per_cfg=eval_s / n * 1e6,
                             rate=n / eval_s, feasible=feasible))
        rows[-1]["ratio"] = per_cfg[SIZES[0]] / per_cfg[SIZES[-1]]

    header = ["case", "batch", "build ms", "eval ms (median)", "µs / config", "configs/s", "feasible",
              "per-config speed-up vs batch 1"]
    table = [[r["case"] if r["n"] == SIZES[0] else "", f"{r['n']:,}", f"{r['build_ms']:.3f}",
              f"{r['eval_ms']:.3f}", f"{r['us_per_cfg']:.3f}", f"{r['rate']:,.0f}", f"{r['feasible']:.1%}",
              f"{r['ratio']:,.0f}×" if "ratio" in r else ""] for r in rows]
    title = (f"costmodel.evaluate_batch, one thread, median of {args.repeats} "
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
        Console(width=200).print(t)
    big = [r for r in rows if r["n"] == SIZES[-1]]
    ok = all(r["rate"] >= TARGET for r in big)
    print(("target met: " if ok else "target missed: ")
          + ", ".join(f"{r['case'].split(':')[0]} {r['rate']:,.0f}/s" for r in big))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Validation of the failure model (costmodel/resilience.py) against published reliability figures.

    .venv/bin/python benchmarks/goodput.py

Prints three tables:
1. Llama 3 405B on 16,384 H100s (arXiv 2407.21783 §3.3.4): unexpected interruptions in 54 days from the
   H100 profile's rates against the 419 reported (±20 % asked), by category against Table 5's counts, and the
   effective training time of Meta's layout (TP 8, PP 16, DP 128 at 8K sequence) against the report's "higher
   than 90 %".
2. Kokolis et al. (HPCA 2025, arXiv 2410.21680): MTTF against job size from the A100 profile's rate against
   the paper's points (projected 1.8 h at 16,384 GPUs and 0.23 h at 131,072; 7.9 h observed at 1,024).
3. Goodput against device count for the same Llama layout: the share of time lost growing with scale.
"""

from __future__ import annotations

import sys
from pathlib import Path

# the repository first: this directory's costmodel.py (a benchmark) must not shadow the package
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hardware_profiles  # noqa: E402
import model_presets  # noqa: E402
from costmodel import TrainingConfig, evaluate  # noqa: E402
from costmodel import resilience as r  # noqa: E402

H100 = hardware_profiles.load("nvidia-h100-80gb")
A100 = hardware_profiles.load("nvidia-a100-80gb")
LLAMA = model_presets.load("llama3-405b")
# Llama 3 §3.3.2 Table 4: 16,384 GPUs at TP 8, CP 1, PP 16, DP 128 for the 8K-context stage, 16M-token batch
LAYOUT = dict(tp=8, pp=16, vpp=1, micro_batch_size=1, recompute="full", sequence_parallel=True)
TABLE5 = {"gpu": 196, "hbm": 72, "network": 42, "host": 46, "software": 63}
REPORTED_UNEXPECTED, DAYS, GPUS = 419, 54, 16_384
KOKOLIS = [(1_024, 7.9, "observed"), (16_384, 1.8, "projected"), (131_072, 0.23, "projected")]


def llama_eval(devices: int, **opts) -> dict:
    dp = devices // 128
    cfg = TrainingConfig(**LAYOUT, global_batch_size=dp * 16)
    spec = LLAMA.model_copy(update={"seq_length": 8192})
    return evaluate(spec, H100, devices, cfg, r.ResilienceOptions(**opts))


def llama3_table() -> None:
    print("1. Llama 3 405B, 16,384 H100, 54-day snapshot (arXiv 2407.21783 §3.3.4)")
    print(f"{'category':<12}{'model':>10}{'reported':>10}{'ratio':>8}")
    hours = GPUS * DAYS * 24
    total = 0.0
    for cat, n in TABLE5.items():
        m = r.reliability(H100, f"failure_rate_{cat}_per_device_hour") * hours
        total += m
        print(f"{cat:<12}{m:>10.1f}{n:>10}{m / n:>8.3f}")
    ok = abs(total / REPORTED_UNEXPECTED - 1) <= 0.20
    print(f"{'unexpected':<12}{total:>10.1f}{REPORTED_UNEXPECTED:>10}{total / REPORTED_UNEXPECTED:>8.3f}  "
          f"{'within' if ok else 'OUTSIDE'} ±20 %")
    print(f"{'mode':<12}{'ckpt GiB':>10}{'stall s':>9}{'every min':>10}{'down s':>8}{'goodput':>9}  report: > 0.90")
    for mode in ("sync", "async"):
        g = llama_eval(GPUS, checkpoint_mode=mode)["goodput"]
        band = "in band" if g["goodput_fraction"] > 0.90 else "BELOW"
        print(f"{mode:<12}{g['checkpoint_gib']:>10.0f}{g['checkpoint_stall_s']:>9.2f}"
              f"{g['checkpoint_interval_s'] / 60:>10.1f}{g['downtime_per_failure_s']:>8.0f}"
              f"{g['goodput_fraction']:>9.3f}  {band}")
    print()


def kokolis_table() -> None:
    print("2. MTTF against job size, A100 profile (Kokolis et al., arXiv 2410.21680)")
    print(f"{'GPUs':>8}{'model h':>10}{'paper h':>10}{'ratio':>8}  paper's point")
    rate = r.unexpected_rate_per_device_hour(A100)
    for gpus, paper, kind in KOKOLIS:
        m = 1 / (gpus * rate)
        print(f"{gpus:>8,}{m:>10.2f}{paper:>10.2f}{m / paper:>8.2f}  {kind}")
    print("   the projected points follow the paper's fitted rate (6.50 per 1000 node-days), which the profile states;")
    print("   the observed 1,024-GPU point lies below that fit line; the model follows the fit, not the point.")
    print()


def scale_table() -> None:
    print("3. Llama 3 405B layout on H100: goodput against devices (sync checkpoints, Young's interval)")
    print(f"{'devices':>8}{'interrupt./day':>15}{'MTBF h':>8}{'every min':>10}{'ckpt %':>8}{'lost %':>8}"
          f"{'restart %':>10}{'goodput':>9}")
    for devices in (1_024, 2_048, 4_096, 8_192, 16_384):
        g = llama_eval(devices)["goodput"]
        print(f"{devices:>8,}{g['interruptions_per_day']:>15.2f}{g['mtbf_h']:>8.2f}"
              f"{g['checkpoint_interval_s'] / 60:>10.1f}{100 * g['checkpoint_overhead']:>8.2f}"
              f"{100 * g['lost_fraction']:>8.2f}{100 * g['restart_fraction']:>10.2f}{g['goodput_fraction']:>9.3f}")


if __name__ == "__main__":
    llama3_table()
    kokolis_table()
    scale_table()

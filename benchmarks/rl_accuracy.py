"""Predict the published RL runs of ``benchmarks/rl_runs.json`` (fixed plans, no search) and print the
error of each: ``python -m benchmarks.rl_accuracy [RUNS.json]``.

error = predicted throughput / reported − 1, throughput = samples per second (1 / step time for a fixed
workload), as ``paraplan validate`` defines it for training runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from app.formats.inputs import load_cluster, load_model
from costmodel import rl
from search.rl import RLRequest, evaluate_plan

RUNS = Path(__file__).with_name("rl_runs.json")


def predict(run: dict) -> dict:
    """The plan of one published run, scored."""
    spec = load_model(run["model"])
    profile = load_cluster(run["cluster"])
    req = RLRequest(spec=spec, profile=profile, devices=run["devices"], workload=rl.Workload(**run["workload"]))
    ro = run["rollout"]
    return evaluate_plan(req, run["mode"], run["config"], ro["tp"], ro["ep"], ro["offload"], ro["rollout_devices"])


def score(runs: list[dict]) -> list[dict]:
    """One row per run: predicted and reported step time, error on throughput, feasibility."""
    rows = []
    for run in runs:
        plan = predict(run)
        reported = run["reported"]["step_time_s"]
        rows.append({"name": run["name"], "predicted_step_s": plan["step_time_s"], "reported_step_s": reported,
                     "error": reported / plan["step_time_s"] - 1.0, "feasible": plan["feasible"], "plan": plan})
    return rows


def main() -> None:
    runs = json.loads(Path(sys.argv[1] if len(sys.argv) > 1 else RUNS).read_text())
    print(f"{'run':52} {'predicted s':>11} {'reported s':>10} {'error':>7}  fits  rollout/logprob/train/switch s")
    for r in score(runs):
        t = r["plan"]["phases_s"]
        roll = t["prefill_s"] + t["decode_s"]
        lp = t["actor_logprob_s"] + t["reference_logprob_s"]
        hand = t.get("switch_s", t.get("weight_sync_s"))
        print(f"{r['name']:52} {r['predicted_step_s']:11.1f} {r['reported_step_s']:10.1f} {r['error']:+7.1%}  "
              f"{'yes' if r['feasible'] else 'NO ':4}  {roll:.1f}/{lp:.1f}/{t['actor_train_s']:.1f}/{hand:.2f}")


if __name__ == "__main__":
    main()

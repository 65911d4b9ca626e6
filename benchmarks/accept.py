"""Seconds from ``POST /v1/jobs`` to its 202, over real HTTP on ``paraplan serve --no-worker`` (a temporary
SQLite database, loopback): a Pangu Ultra MoE 718B job on 6,144 Ascend 910B (whose search space takes
seconds to build, in the worker that runs the job) against a tiny model's job. Each job is posted
``--repeat`` times (5 by default, each with a new seed so none is an idempotent replay); the table gives
the first post, the median and the worst, and the Pangu/tiny ratio of the medians. Run from the
repository root:

    .venv/bin/python benchmarks/accept.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from service_util import PANGU_JOB, TINY_JOB, Server  # noqa: E402


def _post_times(client, body: dict, repeat: int) -> list[float]:
    times = []
    for seed in range(repeat):
        started = time.perf_counter()
        r = client.post("/v1/jobs", json={**body, "search": {**body["search"], "seed": seed}})
        times.append(time.perf_counter() - started)
        if r.status_code != 202:
            raise SystemExit(f"POST answered {r.status_code}: {r.text[:300]}")
    return times


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        srv = Server(Path(d) / "accept.db", Path(d) / "serve.log", "--no-worker").start()
        try:
            with httpx.Client(base_url=srv.url, timeout=300) as c:  # the old accept took seconds
                rows = {name: _post_times(c, body, args.repeat) for name, body in
                        (("pangu-ultra-moe-718b on 6,144 ascend-910b", PANGU_JOB),
                         ("tiny-moe on 8 nvidia-h100-80gb", {**TINY_JOB, "search": {"sampler": "tpe"}}))}
        finally:
            srv.stop()
    print(f"{'job':<44} {'first s':>9} {'median s':>9} {'worst s':>9}")
    for name, t in rows.items():
        print(f"{name:<44} {t[0]:>9.3f} {statistics.median(t):>9.3f} {max(t):>9.3f}")
    pangu, tiny = (statistics.median(t) for t in rows.values())
    print(f"ratio of medians (Pangu / tiny): {pangu / tiny:.2f}")


if __name__ == "__main__":
    main()

"""HTTP API latency under a fixed offered load: ``GET /v1/jobs/{id}/configs`` and ``POST /v1/evaluate``.

Open loop: after a one-second warm-up at the same load (not counted), requests are sent on a fixed
schedule (``--rate`` per second, 200 by default) whatever the server's answers, over ``--connections``
keep-alive connections (50); a request waits for a free connection when all are busy, and its latency
is measured from its scheduled time, so a slow server shows up in the numbers instead of slowing the
load (no coordinated omission). Each phase lasts ``--duration`` seconds (10 by default, at most 60),
and the target must be a loopback address.

Without ``--server`` it starts ``paraplan serve`` on a free loopback port with a temporary SQLite
database, runs one small search job (whose ranked configs are read), measures, and stops the server.
With ``--server URL`` it uses that server (``--job ID`` for its configs, else it submits one). Run
from the repository root:

    .venv/bin/python benchmarks/api.py [--server http://127.0.0.1:8000] [--rate 200] [--duration 10]
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
MAX_DURATION_S = 60.0
EVALUATE_BODY = {"model": "pangu-ultra-moe-718b", "cluster": "ascend-910b", "devices": 6144,
                 "config": json.loads((ROOT / "examples" / "pangu-ultra-moe-6144.json").read_text())}
JOB_BODY = {"model": "tiny-moe", "cluster": "nvidia-h100-80gb", "devices": 8, "global_batch_size": 64,
            "search": {"sampler": "exhaustive", "top_k": 10}}


def loopback_target(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise SystemExit(f"--server must be an http:// URL on loopback, not {url!r}")
    port = parts.port or 80
    for info in socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM):
        if not ipaddress.ip_address(info[4][0]).is_loopback:
            raise SystemExit(f"refusing to load {parts.hostname}: it is not a loopback address")
    return parts.hostname, port


class Connection:
    """One keep-alive HTTP/1.1 connection (just enough HTTP for this benchmark)."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader = self.writer = None

    async def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self.writer.write(head.encode() + b"\r\n" + (body or b""))
        await self.writer.drain()
        status_line = await self.reader.readline()
        status = int(status_line.split()[1])
        length, close = 0, False
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "content-length":
                length = int(value)
            elif name.lower() == "connection" and value.strip().lower() == "close":
                close = True
        data = await self.reader.readexactly(length)
        if close:
            await self.close()
        return status, data

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


async def open_loop(host: str, port: int, method: str, path: str, body: bytes | None, rate: float,
                    duration: float, connections: int, warmup: float = 1.0) -> dict:
    pool: asyncio.Queue[Connection] = asyncio.Queue()
    conns = [Connection(host, port) for _ in range(connections)]
    for c in conns:
        pool.put_nowait(c)
    latencies: list[float] = []
    errors = 0

    async def one(scheduled: float) -> None:
        nonlocal errors
        conn = await pool.get()
        try:
            status, _ = await conn.request(method, path, body)
            if status != 200:
                errors += 1
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
            errors += 1
            await conn.close()
        finally:
            pool.put_nowait(conn)
        latencies.append(time.perf_counter() - scheduled)

    async def schedule(seconds: float) -> tuple[int, float]:
        start = time.perf_counter() + 0.05
        n = int(rate * seconds)
        tasks = []
        for i in range(n):
            scheduled = start + i / rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(scheduled)))
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=seconds + 30)
        return n, time.perf_counter() - start

    if warmup > 0:  # open the connections and warm the server up; not counted
        await schedule(warmup)
        latencies.clear()
        errors = 0
    n, elapsed = await schedule(duration)
    for c in conns:
        await c.close()
    lat = sorted(latencies)
    return {"requests": n, "errors": errors, "achieved_rps": n / elapsed,
            "median_ms": 1e3 * statistics.median(lat), "p99_ms": 1e3 * lat[min(len(lat) - 1, int(0.99 * len(lat)))],
            "max_ms": 1e3 * lat[-1]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(tmp: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp}/bench.db"}
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--no-access-log",
                             "--log-level", "warning"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    import httpx

    for _ in range(300):
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("the server did not become healthy")


def seed_job(url: str) -> str:
    import httpx

    job = httpx.post(f"{url}/v1/jobs", json=JOB_BODY, timeout=30).raise_for_status().json()
    for _ in range(600):
        job = httpx.get(f"{url}/v1/jobs/{job['id']}", timeout=10).json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(0.1)
    if job["status"] != "succeeded":
        raise SystemExit(f"the seed job ended {job['status']}: {job.get('error')}")
    return job["id"]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", help="Base URL of a running server on loopback (default: start one).")
    ap.add_argument("--job", help="Job whose configs are read (default: submit a small one).")
    ap.add_argument("--rate", type=float, default=200.0, help="Offered requests per second.")
    ap.add_argument("--duration", type=float, default=10.0, help="Seconds per endpoint (at most 60).")
    ap.add_argument("--connections", type=int, default=50)
    ap.add_argument("--json", action="store_true", help="Print the results as JSON.")
    args = ap.parse_args(argv)
    duration = min(max(args.duration, 0.5), MAX_DURATION_S)
    proc = tmp = None
    if args.server is None:
        tmp = tempfile.TemporaryDirectory()
        proc, url = start_server(tmp.name)
    else:
        url = args.server.rstrip("/")
    host, port = loopback_target(url)
    try:
        job_id = args.job or seed_job(url)
        phases = {
            "GET /v1/jobs/{id}/configs": ("GET", f"/v1/jobs/{job_id}/configs", None),
            "POST /v1/evaluate (Pangu 718B, 6,144 NPUs)": ("POST", "/v1/evaluate", json.dumps(EVALUATE_BODY).encode()),
        }
        results = {}
        for name, (method, path, body) in phases.items():
            results[name] = asyncio.run(open_loop(host, port, method, path, body, args.rate, duration,
                                                  args.connections))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=15)
            tmp.cleanup()
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"offered load {args.rate:g} req/s for {duration:g} s per endpoint, {args.connections} connections, "
              f"{os.cpu_count()} cores")
        print("| endpoint | requests | errors | achieved req/s | median ms | p99 ms | max ms |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for name, r in results.items():
            print(f"| {name} | {r['requests']} | {r['errors']} | {r['achieved_rps']:.0f} | {r['median_ms']:.1f} | "
                  f"{r['p99_ms']:.1f} | {r['max_ms']:.1f} |")
    return results


if __name__ == "__main__":
    main()

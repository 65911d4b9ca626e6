"""Helpers of the service tests and benchmarks: a real `paraplan serve` on a free loopback port, workers,
job bodies, raw HTTP requests for bursts, a database outage, and the biggest inputs the bounds allow."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

from app.formats.bounds import SPEC_CAPS

ROOT = Path(__file__).resolve().parents[1]
HEALTHY_WITHIN_S = 10.0
TINY_JOB = {"model": "tiny-moe", "cluster": "nvidia-h100-80gb", "devices": 8, "global_batch_size": 64,
            "search": {"sampler": "exhaustive", "top_k": 5}}
PANGU_JOB = {"model": "pangu-ultra-moe-718b", "cluster": "ascend-910b", "devices": 6144, "global_batch_size": 7680,
             "search": {"sampler": "tpe", "n_trials": 200, "seed": 7}}


# .ci/run exports CI=true (as CI services do); a test that needs a system package fails there instead of skipping.
CI_ENV = "CI"


def require_chromium(find) -> str:
    """The headless browser ``find()`` returns, else a skip naming the package (a failure under CI).

    Never installs anything: tests do not change the machine. .ci/run installs Debian's ``chromium``; the
    README's test command says so for a developer."""
    import pytest

    exe = find()
    if exe is None:
        msg = ("Debian's chromium package is not installed (install it as root: apt-get install chromium; "
               ".ci/run does)")
        if os.environ.get(CI_ENV):
            pytest.fail(f"{msg}; under CI ({CI_ENV}={os.environ[CI_ENV]}) the browser tests must run", pytrace=False)
        pytest.skip(msg)
    return exe


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`python -m app.cli serve` as a subprocess, with its own DATABASE_URL and a log file."""

    def __init__(self, db_path: Path | str, log_path: Path, *extra: str, env: dict | None = None):
        """``db_path``: a SQLite file, or a database URL."""
        self.db_path, self.log_path, self.extra = db_path, log_path, extra
        url = db_path if isinstance(db_path, str) and "://" in db_path else f"sqlite:///{db_path}"
        self.env = {**os.environ, "DATABASE_URL": url, **(env or {})}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.ready_after_s: float | None = None

    def start(self) -> "Server":
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        log = open(self.log_path, "a")
        started = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--port", str(self.port),
                                      "--no-access-log", *self.extra], cwd=ROOT, env=self.env, stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        while time.monotonic() - started < 30:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    self.ready_after_s = time.monotonic() - started
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        self.proc.kill()
        raise RuntimeError(f"server not healthy after 30 s:\n{self.log()}")

    def stop(self, timeout: float = 15.0) -> float:
        """SIGTERM; returns the seconds until the process exited."""
        if self.proc is None or self.proc.poll() is not None:
            return 0.0
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return time.monotonic() - started

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def client(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30, **kw)



@contextmanager
def running_server(tmp_path_factory, name: str, *extra: str, env: dict | None = None):
    """A `paraplan serve` on a fresh SQLite file in its own temporary directory, stopped on exit: the body of
    the module-scoped ``server`` fixtures (``with running_server(f, "edges") as srv: yield srv``)."""
    d = tmp_path_factory.mktemp(name)
    srv = Server(d / "paraplan.db", d / "serve.log", *extra, env=env).start()
    try:
        yield srv
    finally:
        srv.stop()


ENDED = ("succeeded", "failed", "cancelled")


def _progress(job: dict) -> tuple:
    """What moves when a job makes progress: its status and its finished trials."""
    return job["status"], (job.get("progress") or {}).get("trials_done")


def wait_for(client: httpx.Client, job_id: str, until=ENDED, timeout: float | None = 60.0, seen: list | None = None,
             stall: float | None = None) -> dict:
    """Poll job ``job_id`` (every 0.1 s) until ``until(job)`` holds and return the job. ``until`` is a
    predicate on the job's JSON, or a collection of statuses (the job's status in it). A job that ends
    without meeting it, or a timeout, is an AssertionError; ``seen`` collects ``(seconds, job)`` polls.

    ``timeout`` bounds the whole wait (None: no bound); ``stall`` bounds the time without progress: the
    wait fails only when neither the job's status nor its ``trials_done`` has moved for ``stall`` seconds.
    A wait on a long job on a busy machine should use ``stall`` (with ``timeout=None``): how long the job
    takes depends on the machine, whether it still advances does not. Progress is a new status or more
    trials done than ever seen, so a finite job cannot keep the wait alive for ever.
    The one job poller of the tests and ``benchmarks/jobs.py``."""
    met = until if callable(until) else (lambda job: job["status"] in until)
    started = last_move = time.monotonic()
    statuses: set = set()
    most_done = -1
    while True:
        job = client.get(f"/v1/jobs/{job_id}").raise_for_status().json()
        now = time.monotonic()
        if seen is not None:
            seen.append((now - started, job))
        if met(job):
            return job
        if job["status"] in ENDED:
            raise AssertionError(f"job ended {job['status']} without meeting the wait: {job}")
        status, done = _progress(job)
        if status not in statuses or (done is not None and done > most_done):
            statuses.add(status)
            most_done = max(most_done, done if done is not None else -1)
            last_move = now
        if timeout is not None and now - started > timeout:
            raise AssertionError(f"job still {job['status']} after {timeout} s: {job}")
        if stall is not None and now - last_move > stall:
            raise AssertionError(f"job {job['status']} made no progress for {stall} s (at {most_done} trials done, "
                                 f"{now - started:.0f} s into the wait): {job}")
        time.sleep(0.1)


def run_cli(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout, stdin=subprocess.DEVNULL)


class WorkerProcess:
    """`python -m app.cli worker` as a subprocess on ``database_url``, logging to ``log_path``."""

    def __init__(self, database_url: str, log_path: Path, env: dict | None = None):
        self.log_path = log_path
        self.env = {**os.environ, "DATABASE_URL": database_url, **(env or {})}
        self.proc = subprocess.Popen([sys.executable, "-m", "app.cli", "worker"], cwd=ROOT,
                                     env=self.env, stdout=open(log_path, "a"), stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_started(self, timeout: float = 30.0) -> "WorkerProcess":
        """Until the worker polls for jobs (its log says it started)."""
        started = time.monotonic()
        while "started on" not in self.log():
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited with {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"worker not started after {timeout} s:\n{self.log()}")
            time.sleep(0.05)
        return self

    def kill(self) -> None:
        """SIGKILL: no cleanup of any kind."""
        self.proc.kill()
        self.proc.wait()

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""


async def raw_request(port: int, method: str, path: str, body: dict | None = None,
                      headers: dict | None = None) -> tuple[int, dict, bytes]:
    """One HTTP/1.1 request on a new connection; (status, headers, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        payload = json.dumps(body).encode() if body is not None else b""
        head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close",
                f"Content-Length: {len(payload)}", "Content-Type: application/json",
                *(f"{k}: {v}" for k, v in (headers or {}).items())]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
        await writer.drain()
        data = await reader.read()
    finally:
        writer.close()
    head, _, content = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    fields = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), fields, content


def set_connections(admin_url: str, database: str, allow: bool) -> None:
    """Let nobody connect to ``database`` and end its sessions (an outage of that database), or let
    connections in again."""
    from sqlalchemy import create_engine, text

    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS {"true" if allow else "false"}'))
        if not allow:
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :d"),
                         {"d": database})
    engine.dispose()


# A model at every upper bound of app/formats/bounds.py (MLA left out: its dimensions replace the heads'),
# on 1,000,000 devices: a 10,000-stage pipeline, and 100 stages of 50 uneven chunks each, which replays
# the 1F1B schedule of every rank over ~10^5 micro-batches.
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
BIGGEST_SPEC = {**{k: v for k, v in SPEC_CAPS.items() if k not in MLA_FIELDS},
                "name": "at-every-bound", "moe_layer_freq": 1}
BIGGEST_EVALUATES = [
    {"model": BIGGEST_SPEC, "cluster": "nvidia-h100-80gb", "devices": 1_000_000,
     "config": {"tp": 1, "pp": 10_000, "micro_batch_size": 1, "global_batch_size": 100_000_000}},
    {"model": BIGGEST_SPEC, "cluster": "nvidia-h100-80gb", "devices": 1_000_000,
     "config": {"tp": 8, "pp": 100, "vpp": 50, "first_stage_layers": 149, "last_stage_layers": 149,
                "micro_batch_size": 1, "global_batch_size": 100_000_000 // 1250 * 1250}},
]
MEMORY_BOUND_MIB = 512  # docs/guides/service.md, "Heavy evaluates": the API process stays under this resident


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident memory so far (VmHWM), MiB."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def read_pty(master: int) -> bytes:
    """Everything a child process wrote to the pseudo-terminal whose master end is ``master``, until the
    child closes it (Linux answers EIO then); closes ``master``."""
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return b"".join(chunks)

"""Helpers of the service tests: a real `paraplan serve` on a free loopback port, and small job bodies."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

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
    README says so for a developer."""
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

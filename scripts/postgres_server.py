"""A throwaway PostgreSQL server on loopback, for the test suite and the load benchmark.

    python scripts/postgres_server.py [--durable] -- COMMAND ...

initialises a cluster in a temporary directory, starts it on a free port, runs COMMAND with
``PARAPLAN_TEST_POSTGRES_URL`` (a superuser URL of the ``postgres`` database) and
``PARAPLAN_REQUIRE_POSTGRES=1`` in its environment, stops the server, removes the directory and exits
with COMMAND's status. The server runs as its own unprivileged user: ``paraplan-pg`` (created if
missing) when started by root, the caller otherwise, since PostgreSQL refuses to run as root.

Uses the server binaries of Debian's ``postgresql`` package (``/usr/lib/postgresql/<v>/bin``) or those
on PATH. Without ``--durable`` the cluster skips fsync (tests do not survive power loss, they only
need speed); the load benchmark keeps PostgreSQL's defaults.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PG_USER = "paraplan-pg"  # the OS user the server runs as when we are root
DB_SUPERUSER = "paraplan"
START_TIMEOUT_S = 60


def bin_dir() -> Path:
    """The directory holding initdb and pg_ctl (newest Debian version first, then PATH)."""
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                      key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0)
    if versions:
        return Path(versions[-1]).parent
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    raise SystemExit("PostgreSQL server binaries (initdb, pg_ctl) not found: install Debian's `postgresql` "
                     "package (apt-get install postgresql), as .ci/run does")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ensure_user() -> str | None:
    """The user to run the server as (None: ourselves)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(PG_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", PG_USER],
                       check=True)
    return PG_USER


def _ppid(proc: Path) -> int | None:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


class PostgresServer:
    """``with PostgresServer() as pg: pg.url`` — a running server for the ``with`` block."""

    def __init__(self, durable: bool = False, max_connections: int = 300):
        self.durable = durable
        self.max_connections = max_connections
        self.bin = bin_dir()
        self.user = _ensure_user()
        self.port = _free_port()
        self.root = Path(tempfile.mkdtemp(prefix="paraplan-pg-"))
        self.data = self.root / "data"
        self.url = f"postgresql+psycopg://{DB_SUPERUSER}@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, **kw) -> subprocess.CompletedProcess:
        cmd = [str(self.bin / args[0]), *args[1:]]
        if self.user is not None:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)

    def start(self) -> "PostgresServer":
        if self.user is not None:
            shutil.chown(self.root, self.user, self.user)
        self.root.chmod(0o700)
        self._run("initdb", "-D", str(self.data), "-U", DB_SUPERUSER, "--auth=trust", "-E", "UTF8",
                  "--no-instructions")
        options = [f"-p {self.port}", "-c listen_addresses=127.0.0.1", f"-k {self.root}",
                   f"-c max_connections={self.max_connections}"]
        if not self.durable:
            options += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        self._options = " ".join(options)
        self._pg_ctl_start()
        return self

    def _pg_ctl_start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-o", self._options,
                  "-w", "-t", str(START_TIMEOUT_S), "start")

    def restart(self, down_s: float) -> None:
        """Stop the server (fast shutdown: sessions are ended), keep it down ``down_s`` seconds, start it
        again on the same port and data."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        time.sleep(down_s)
        self._pg_ctl_start()

    def _pids(self) -> list[int]:
        """The postmaster and its children (backends, checkpointer, ...)."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        children = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _ppid(p) == postmaster]
        return [postmaster, *children]

    def freeze(self) -> None:
        """SIGSTOP the server and every one of its processes: connections stay open and nothing answers
        (a frozen database, not a refused one)."""
        for pid in self._pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        for pid in self._pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError, FileNotFoundError):
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def log(self) -> str:
        path = self.root / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def __enter__(self) -> "PostgresServer":
        try:
            return self.start()
        except subprocess.CalledProcessError as exc:
            self.stop()
            raise SystemExit(f"PostgreSQL did not start: {exc.stderr or exc.stdout}") from None

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str]) -> int:
    durable = "--durable" in argv[: argv.index("--")] if "--" in argv else False
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    command = argv[argv.index("--") + 1:]
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the server on SIGTERM too
    with PostgresServer(durable=durable) as pg:
        print(f"postgres_server: PostgreSQL running on 127.0.0.1:{pg.port} as "
              f"{pg.user or pwd.getpwuid(os.geteuid()).pw_name} ({pg.bin})", file=sys.stderr, flush=True)
        env = {**os.environ, "PARAPLAN_TEST_POSTGRES_URL": pg.url, "PARAPLAN_REQUIRE_POSTGRES": "1"}
        started = time.monotonic()
        code = subprocess.call(command, env=env)
        print(f"postgres_server: command exited {code} after {time.monotonic() - started:.0f} s; stopping "
              "PostgreSQL", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

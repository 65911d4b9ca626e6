"""CPU time and peak memory of a benchmark's process tree, pool processes included (Linux ``/proc``).

A ``search.pool`` process is a child of the forkserver, not of the benchmark, so ``RUSAGE_CHILDREN`` never
sees it: its CPU time is read from ``/proc`` while it runs, and from the forkserver's reaped-children
time once it has ended."""

from __future__ import annotations

import os
import resource
from pathlib import Path


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state, ppid, …), None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (st := _stat(int(entry.name))) is not None and int(st[1]) == pid:
            out.append(int(entry.name))
    return out


def cpu_s() -> float:
    """CPU seconds of this process, its reaped children, and each live child with its own children (live
    and reaped): the forkserver and the pool processes."""
    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
    if not Path("/proc/self/stat").exists():
        return total
    tick = os.sysconf("SC_CLK_TCK")
    for child in _children(os.getpid()):
        if (st := _stat(child)) is not None:
            total += sum(int(x) for x in st[11:15]) / tick  # utime, stime, cutime, cstime
        for grandchild in _children(child):
            if (st := _stat(grandchild)) is not None:
                total += sum(int(x) for x in st[11:13]) / tick
    return total


def pool_peak_gib() -> float:
    """The largest peak resident memory (VmHWM) among this process's live grandchildren: the pool processes."""
    peak_kib = 0
    for child in _children(os.getpid()):
        for grandchild in _children(child):
            try:
                status = Path(f"/proc/{grandchild}/status").read_text()
            except OSError:
                continue
            peak_kib = max(peak_kib, next((int(line.split()[1]) for line in status.splitlines()
                                           if line.startswith("VmHWM:")), 0))
    return peak_kib / 2**20

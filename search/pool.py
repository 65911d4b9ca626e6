"""The process pool behind ``--jobs N`` (and the worker's ``PARAPLAN_WORKER_JOBS``): N processes that
score chunks of one exhaustive search, or run a plan's device counts and an RL search's training
searches side by side.

The standard library's ``ProcessPoolExecutor`` under the ``forkserver`` start method (``spawn`` where
the platform has no forkserver): a child starts from a clean server process, never by forking the
caller, so a threaded caller (the service's embedded worker, the API's threads) is safe, and the server
imports numpy and the cost model once (``set_forkserver_preload``), so each child starts in tens of
milliseconds. ``jobs == 1`` never creates a pool: the callers run in-process as they always have.

Cancellation: the caller's ``check`` runs in the parent between results (and every ``POLL_S`` while it
waits); when it raises, queued tasks are cancelled and a shared event tells the running ones to stop
(``worker_check`` raises in the child at its next check), so a cancelled job frees its processes within
one check interval.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from typing import Callable, Iterator

POLL_S = 0.2  # how often the parent runs the caller's check while it waits for a result
PRELOAD = ["numpy", "costmodel", "search.engine", "search.capacity", "search.rl"]  # what the forkserver imports once

_stop = None  # the child's stop event (set by ``_init``)


class Stopped(RuntimeError):
    """Raised in a child whose pool was told to stop (its caller's check raised)."""


def _init(stop) -> None:
    """A pool process's start: the stop event, and the allocator tuned as the ``paraplan`` entry point tunes
    it (large numpy temporaries reused, not faulted in afresh for every batch)."""
    from costmodel.runtime import tune_allocator

    global _stop
    _stop = stop
    tune_allocator()


def _ready() -> None:
    """A task that does nothing (``Pool.warm``)."""


def worker_check() -> None:
    """The ``check`` a task passes to ``run_search`` inside a child: raises once the pool is told to stop."""
    if _stop is not None and _stop.is_set():
        raise Stopped("the pool was stopped")


def _context():
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    if ctx.get_start_method() == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)
    return ctx


class Pool:
    """N processes and the stop event they share; use as a context manager (``pool(jobs)``)."""

    def __init__(self, jobs: int):
        ctx = _context()
        self.jobs = jobs
        self.stop = ctx.Event()
        self.executor = ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_init,
                                            initargs=(self.stop,))

    def warm(self) -> None:
        """Start the processes now (the forkserver's imports included) without waiting for them, so that they
        start while the caller does other work (a search building its space)."""
        for _ in range(self.jobs):
            self.executor.submit(_ready)

    def submit(self, fn: Callable, *args) -> Future:
        return self.executor.submit(fn, *args)

    def wait_any(self, futures, check: Callable[[], None] | None) -> set[Future]:
        """The futures of ``futures`` that are done, waiting until one is; ``check()`` runs every ``POLL_S``."""
        while True:
            if check is not None:
                check()
            done, _ = wait(futures, timeout=POLL_S if check is not None else None, return_when=FIRST_COMPLETED)
            if done:
                return done

    def result(self, future: Future, check: Callable[[], None] | None):
        """``future``'s result, running ``check()`` every ``POLL_S`` while it waits."""
        self.wait_any([future], check)
        return future.result()

    def close(self) -> None:
        """Cancel what is queued, tell what still runs to stop (``worker_check``), wait for the processes."""
        self.stop.set()
        self.executor.shutdown(wait=True, cancel_futures=True)


@contextmanager
def pool(jobs: int) -> Iterator[Pool]:
    """A pool of ``jobs`` processes. On exit, normal or by an exception (a check or progress callback that
    raised), the caller has every result it needs: queued tasks are cancelled and running ones (work
    started ahead of need, or a stopped search) told to stop; the exit waits for them to."""
    p = Pool(jobs)
    try:
        yield p
    finally:
        p.close()


def map_ordered(jobs: int, fn: Callable, items: list, check: Callable[[], None] | None = None,
                on_result: Callable[[int], None] | None = None) -> list:
    """``[fn(item) for item in items]`` on ``jobs`` processes: results in the order of ``items``;
    ``on_result(done)`` as each finishes (``done``: results so far) and ``check()`` between them.
    ``fn`` must be a module-level function (it is pickled by name)."""
    out: list = [None] * len(items)
    with pool(jobs) as p:
        pending = {p.submit(fn, item): i for i, item in enumerate(items)}
        done = 0
        while pending:
            for fut in p.wait_any(list(pending), check):
                out[pending.pop(fut)] = fut.result()
                done += 1
                if on_result is not None:
                    on_result(done)
    return out


def validate_jobs(jobs) -> int:
    """``jobs`` as a process count: an integer ≥ 1 (ValueError otherwise). More than the machine's cores is
    allowed (the processes then share cores; nothing breaks, nothing is faster)."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"must be an integer of at least 1 (got {jobs!r})")
    return jobs


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where the platform reports it, else the count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1

"""The process pool behind ``--jobs N`` (and the worker's ``PARAPLAN_WORKER_JOBS``): N processes that
score chunks of one exhaustive search, or run a plan's device counts and an RL search's training
searches side by side. The caller is one of the N: it works beside N − 1 pool processes (its imports and
caches are already warm, and a pool process starts with empty ones), so ``--jobs 2`` starts one process.

The standard library's ``ProcessPoolExecutor`` under the ``forkserver`` start method (``spawn`` where
the platform has no forkserver): a child starts from a clean server process, never by forking the
caller, so a threaded caller (the service's embedded worker, the API's threads) is safe. The server
preloads nothing: a child imports numpy and the cost model itself (about 0.3 s) while the caller works,
where a preload made the caller wait for the server's imports before its first process could start.
``jobs == 1`` never creates a pool: the callers run in-process as they always have.

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

_stop = None  # the child's stop event (set by ``_init``)
_claims = None  # the child's view of ``Pool.claims`` (set by ``_init``)


class Stopped(RuntimeError):
    """Raised in a child whose pool was told to stop (its caller's check raised)."""


def _init(stop, claims) -> None:
    """A pool process's start: the stop event, the claims of ``Pool.map_shared``, and the allocator tuned as
    the ``paraplan`` entry point tunes it (large numpy temporaries reused, not faulted in afresh for every
    batch)."""
    from costmodel.runtime import tune_allocator

    global _stop, _claims
    _stop, _claims = stop, claims
    tune_allocator()


def _claimed(i: int, fn: Callable, arg):
    """``fn(arg)`` for item ``i`` of a ``Pool.map_shared``, unless the caller has taken that item (None then):
    a task queued to a process can no longer be cancelled, though no process has started it."""
    with _claims.get_lock():
        if i >= _claims[1]:
            return None
        _claims[0] = max(_claims[0], i + 1)
    return fn(arg)


def _ready() -> None:
    """A task that does nothing (``Pool.warm``)."""


def worker_check() -> None:
    """The ``check`` a task passes to ``run_search`` inside a child: raises once the pool is told to stop."""
    if _stop is not None and _stop.is_set():
        raise Stopped("the pool was stopped")


def _context():
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


class Pool:
    """``jobs`` workers: the caller and ``jobs − 1`` processes, with the stop event they share; use as a context
    manager (``pool(jobs)``, ``jobs`` ≥ 2)."""

    def __init__(self, jobs: int):
        ctx = _context()
        self.jobs = jobs
        self.stop = ctx.Event()
        # map_shared's meeting point: [the items up to which a process has started one, the first item the
        # caller has taken]; a process starts an item below the second, the caller takes one from the first
        self.claims = ctx.Array("q", 2)
        self.executor = ProcessPoolExecutor(max_workers=jobs - 1, mp_context=ctx, initializer=_init,
                                            initargs=(self.stop, self.claims))

    def warm(self) -> None:
        """Start the processes now (the forkserver's imports included) without waiting for them, so that they
        start while the caller does other work (a search building its space)."""
        for _ in range(self.jobs - 1):
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

    def map_shared(self, remote: Callable, local: Callable, items: list, check: Callable[[], None] | None = None,
                   on_result: Callable[[int], None] | None = None, pack: Callable | None = None,
                   ahead: int | None = None) -> list:
        """``[local(item) for item in items]``, the work shared between the pool's processes, which run
        ``remote(item)`` (a module-level function: it is pickled by name) from the first item on, and the
        caller, which runs ``local(item)`` from the last item back while the processes have not started it:
        they meet in the middle, so nobody waits while work is left. ``remote`` and ``local`` must give the
        same result; ``pack(item)``, where given, is what a process is sent for an item instead. ``ahead``:
        at most that many items sent to the processes and not yet finished (all at once when None), so that
        large packed items are made and held only shortly before a process takes them; the caller sends
        more between its own items. ``check()`` runs between the caller's items and while it waits; when it
        (or anything) raises, the processes skip every item they have not started. ``on_result(done)`` runs
        as each result arrives (``done``: results so far)."""
        n = len(items)
        out: list = [None] * n
        with self.claims.get_lock():
            self.claims[0], self.claims[1] = 0, n
        futures: dict[Future, int] = {}
        by_index: dict[int, Future] = {}
        mine: set[int] = set()  # the items the caller took (a process that gets one skips it)
        done = sent = 0
        lowest = n  # the caller's lowest item: nothing from it on is sent

        def send() -> None:
            nonlocal sent
            while sent < lowest and (ahead is None or len(futures) < ahead):
                future = self.submit(_claimed, sent, remote, items[sent] if pack is None else pack(items[sent]))
                futures[future], by_index[sent] = sent, future
                sent += 1

        def record(i: int, result) -> None:
            nonlocal done
            out[i] = result
            done += 1
            if on_result is not None:
                on_result(done)

        def collect(finished) -> None:
            for f in finished:
                i = futures.pop(f)
                result = f.result()
                if i not in mine:  # a process that got an item the caller took returned None for it
                    record(i, result)

        try:
            send()
            for i in range(n - 1, -1, -1):
                if check is not None:
                    check()
                collect([f for f in futures if f.done()])
                send()
                if not self._claim(i):  # a process has started it or a later item: the rest are theirs
                    break
                mine.add(i)
                lowest = i
                # not yet queued to a process (a queued one is skipped there)
                if i in by_index and by_index[i].cancel():
                    futures.pop(by_index[i])
                record(i, local(items[i]))
            while futures:  # every item below the caller's was sent: a process has started one above them
                collect(self.wait_any(list(futures), check))
        except BaseException:
            with self.claims.get_lock():
                self.claims[1] = 0  # a process skips every item it has not started
            for f in futures:
                f.cancel()
            raise
        return out

    def _claim(self, i: int) -> bool:
        """Take item ``i`` of ``map_shared`` for the caller, unless a process has started it or a later item."""
        with self.claims.get_lock():
            if i < self.claims[0]:
                return False
            self.claims[1] = i
            return True

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
                on_result: Callable[[int], None] | None = None, local: Callable | None = None) -> list:
    """``[fn(item) for item in items]`` on ``jobs`` workers, this process one of them (``Pool.map_shared``;
    ``local``: what this process runs for an item, ``fn`` itself when None): results in the order of
    ``items``; ``on_result(done)`` as each finishes (``done``: results so far) and ``check()`` between them.
    ``fn`` must be a module-level function (it is pickled by name)."""
    with pool(jobs) as p:
        return p.map_shared(fn, fn if local is None else local, items, check, on_result)


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

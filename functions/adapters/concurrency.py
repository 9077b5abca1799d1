"""Bounded concurrency for the calls one invocation makes (engines, status writes, reads).

Threads, not asyncio: every client underneath is blocking (the transport, boto3) and the
calls wait on the network, where the GIL is released.

Every invocation runs its calls on one process-wide pool of threads, kept between events, so
no event pays for starting threads. Each invocation keeps its own width: `width` slots, the asking
thread (the request's own) one of them, each running one call at a time and taking the next
as its last one ends, so one tenant's 50-pod fan-out does not take the slots of another's
event. Tasks on the pool never wait for other tasks on it (only the asking thread waits), so a
full pool queues work but cannot deadlock: the asking thread's own slot runs every call alone
if need be.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from queue import SimpleQueue
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")
Task = Callable[[], None]

POOL_THREADS = 256
"""Above what the steps ask for at once (the server's request threads, 4 per CPU, x 2 pools of
LORAFLOW_LOAD_CONCURRENCY each); threads start only when none is idle, so this is a ceiling,
not a cost."""


class _Workers:
    """Threads kept between events, fed from one queue; a thread starts only when none is idle.

    What concurrent.futures' ThreadPoolExecutor does, without its Futures, waiters and
    conditions: a load event makes three groups of side-by-side calls (its reads, pods and
    config, listings), and a hand-over here is a queue put and a lock.
    """

    def __init__(self, ceiling: int) -> None:
        self._jobs: SimpleQueue[Task] = SimpleQueue()
        self._lock = threading.Lock()
        self._ceiling = ceiling
        self._threads = 0
        self._idle = 0  # threads waiting for a job that no submit has claimed yet

    def submit(self, job: Task) -> None:
        """Run `job` on a thread of its own (it must not raise: jobs keep their own outcome)."""
        with self._lock:
            if self._idle > 0:
                self._idle -= 1
            elif self._threads < self._ceiling:
                self._threads += 1
                threading.Thread(
                    target=self._work, name=f"loraflow-call-{self._threads}", daemon=True
                ).start()
            # else: at the ceiling, it waits for the next thread to finish (none waits on another)
        self._jobs.put(job)

    def _work(self) -> None:
        while True:
            self._jobs.get()()
            with self._lock:
                self._idle += 1


_workers = _Workers(POOL_THREADS)


class _Outcome(Generic[R]):
    """One call's value or exception."""

    __slots__ = ("error", "value")

    def __init__(self) -> None:
        self.value: R | None = None
        self.error: BaseException | None = None

    def result(self) -> R:
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]  # set by the call, which returned R


class _CountDown:
    """Released once every `add()` has had its `done()`, and the creator's own `wait()`."""

    def __init__(self) -> None:
        self._count = 1  # the creator's: slots that finish before it waits do not release it
        self._lock = threading.Lock()
        self._released = threading.Lock()
        self._released.acquire()

    def add(self) -> None:
        with self._lock:
            self._count += 1

    def done(self) -> None:
        with self._lock:
            self._count -= 1
            last = self._count == 0
        if last:
            self._released.release()

    def wait(self) -> None:
        self.done()
        self._released.acquire()


class _InFlight:
    """How many requests this process is handling now (the shell counts them)."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    @contextmanager
    def one(self) -> Iterator[None]:
        with self._lock:
            self.count += 1
        try:
            yield
        finally:
            with self._lock:
                self.count -= 1


_in_flight = _InFlight()
serving = _in_flight.one
"""Around the handling of one request: `side_by_side` asks how many are in flight."""


def side_by_side(reads: Sequence[Callable[[], Any]], width: int) -> list[Any]:
    """Each read's answer, in order: at most `width` at a time while the request making them
    is the process's only one, else one after the other on the asking thread.

    Side by side, an event's reads take as long as the slowest (what one event alone waits
    for: an upload's way to serving, a fan-out's start). With other requests in flight the
    process is busy already, every thread's wait being another's turn, and side by side only
    adds two thread hand-overs per group (a load event makes three groups): then the reads go
    inline. Engine calls never do (`bounded_map`): an engine may take its whole timeout.
    """
    if _in_flight.count > 1:
        return [read() for read in reads]
    return [answer for _, answer in bounded_map(reads, lambda read: read(), width)]


def bounded_map(items: Iterable[T], call: Callable[[T], R], width: int) -> list[tuple[T, R]]:
    """`call` over `items`, at most `width` at a time; results in input order. Every call runs;
    the first failure in input order is raised once all have finished."""
    work = list(items)
    if len(work) <= 1 or width <= 1:
        return [(item, call(item)) for item in work]
    outcomes = _windowed((partial(call, item) for item in work), width)
    return [(item, outcome.result()) for item, outcome in zip(work, outcomes, strict=True)]


def run_tasks(tasks: Iterable[Task], width: int) -> None:
    """Run `tasks` as they come, at most `width` at a time (the caller plans the next one while
    the first run); a lone task runs inline, on the caller's thread. Every task runs; the first
    failure in order is raised once all have finished."""
    pending = iter(tasks)
    first = next(pending, None)
    second = next(pending, None) if first is not None else None
    if first is None:
        return
    if second is None:
        first()
        return
    for outcome in _windowed(itertools.chain((first, second), pending), width):
        outcome.result()


def _windowed(calls: Iterable[Callable[[], R]], width: int) -> list[_Outcome[R]]:
    """Run `calls` as they come, at most `width` at a time, and return their outcomes, in order,
    once all have finished.

    Each of the `width` slots is one pool thread that takes the next call itself as soon as its
    last one ended: a finished engine call goes straight on to the next pod's, with no wake-up
    of the asking thread and of another pool thread in between (each waits for the GIL behind
    the other slots' answers, so each hand-over would add a wait to the fan-out).
    The next call is taken from `calls` under a lock, so a generator plans one call at a time.
    One of the slots is the asking thread itself (it would only wait otherwise): two calls cost
    one hand-over to the pool, not two and a wake-up.
    """
    source = iter(calls)
    lock = threading.Lock()
    outcomes: list[_Outcome[R]] = []
    planning: list[BaseException] = []  # the generator raised: no further call is taken
    finished = _CountDown()

    def take() -> tuple[_Outcome[R], Callable[[], R]] | None:
        with lock:
            if planning:
                return None
            try:
                call = next(source, None)
            except BaseException as err:  # raised by the caller once every call has run
                planning.append(err)
                return None
            if call is None:
                return None
            outcome: _Outcome[R] = _Outcome()
            outcomes.append(outcome)
            return outcome, call

    def slot(item: tuple[_Outcome[R], Callable[[], R]] | None) -> None:
        while item is not None:
            outcome, call = item
            try:
                outcome.value = call()
            except BaseException as err:  # the caller raises it, once every call has run
                outcome.error = err
            item = take()

    def pool_slot(item: tuple[_Outcome[R], Callable[[], R]]) -> None:
        try:
            slot(item)
        finally:
            finished.done()

    started = 0
    item = take()
    while item is not None and started < max(1, width) - 1:
        finished.add()
        _workers.submit(partial(pool_slot, item))
        started += 1
        item = take()
    slot(item)  # the last slot is the asking thread's own: one hand-over less, and it never idles
    finished.wait()
    if planning:
        raise planning[0]
    return outcomes


def pipeline(items: Iterable[T], observe: Callable[[T], list[Task]], width: int) -> None:
    """Run `observe(item)` (a listing) over `items`, and the tasks (loads) each returns.

    Listings and loads have `width` slots each: a listing (a dictionary read in the engine)
    never waits behind a load (weights read, GPU memory allocated, ~100 ms to seconds), so the
    load slots stay busy back to back, and a pod's loads start as soon as its own listing is
    in. Wider listing bursts measured slower (docs/benchmarks.md). Returns when everything has
    finished, re-raising the first exception to have been raised (a failed listing queues no load).
    """
    width = max(1, width)
    to_list = deque(items)
    to_load: deque[Task] = deque()
    # each finished call reports (was it a listing, the loads it queues, its exception)
    reports: SimpleQueue[tuple[bool, list[Task], BaseException | None]] = SimpleQueue()
    listing = loading = 0
    errors: list[BaseException] = []

    def report(is_listing: bool, run: Callable[[], list[Task]]) -> None:
        try:
            reports.put((is_listing, run(), None))
        except BaseException as err:
            reports.put((is_listing, [], err))

    while to_list or to_load or listing or loading:
        while to_list and listing < width:
            _workers.submit(partial(report, True, partial(observe, to_list.popleft())))
            listing += 1
        while to_load and loading < width:
            _workers.submit(partial(report, False, partial(_as_step, to_load.popleft())))
            loading += 1
        is_listing, queued, error = reports.get()
        if is_listing:
            listing -= 1
            to_load.extend(queued)
        else:
            loading -= 1
        if error is not None:
            errors.append(error)
    if errors:
        raise errors[0]


def _as_step(task: Task) -> list[Task]:
    """A load on the pool, typed as a listing is: it queues nothing further."""
    task()
    return []

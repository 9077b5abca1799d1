"""Bounded concurrency for the calls one invocation makes (engines, status writes, reads).

Threads, not asyncio: every client underneath is blocking (httpx, urllib3, boto3) and the
calls wait on the network, where the GIL is released.

Every invocation runs its calls on one process-wide pool of threads, kept between events: a
pool built per call started its threads anew each time, ~0.15 ms of CPU per thread (a load
event with 3 pods started ~6). Each invocation keeps its own width: `width` slots, the asking
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
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from functools import partial
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")
Task = Callable[[], None]

POOL_THREADS = 256
"""Above what the steps ask for at once (the server's request threads, 4 per CPU, x 2 pools of
LORAFLOW_LOAD_CONCURRENCY each); threads start only when none is idle, so this is a ceiling,
not a cost."""

_pool = ThreadPoolExecutor(max_workers=POOL_THREADS, thread_name_prefix="loraflow-call")


def bounded_map(items: Iterable[T], call: Callable[[T], R], width: int) -> list[tuple[T, R]]:
    """`call` over `items`, at most `width` at a time; results in input order. Every call runs;
    the first failure in input order is raised once all have finished."""
    work = list(items)
    if len(work) <= 1 or width <= 1:
        return [(item, call(item)) for item in work]
    futures = _windowed((partial(call, item) for item in work), width)
    return [(item, future.result()) for item, future in zip(work, futures, strict=True)]


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
    for future in _windowed(itertools.chain((first, second), pending), width):
        future.result()


def _windowed(calls: Iterable[Callable[[], R]], width: int) -> list[Future[R]]:
    """Run `calls` as they come, at most `width` at a time, and return their futures, in order,
    once all have finished.

    Each of the `width` slots is one pool thread that takes the next call itself as soon as its
    last one ended: a finished engine call goes straight on to the next pod's, with no wake-up
    of the asking thread and of another pool thread in between (each waits for the GIL behind
    the other slots' answers; a fan-out's waves measured 2-4 ms apart at every hand-over).
    The next call is taken from `calls` under a lock, so a generator plans one call at a time.
    One of the slots is the asking thread itself (it would only wait otherwise): two calls cost
    one hand-over to the pool, not two and a wake-up.
    """
    source = iter(calls)
    lock = threading.Lock()
    futures: list[Future[R]] = []

    def take() -> tuple[Future[R], Callable[[], R]] | None:
        with lock:
            call = next(source, None)
            if call is None:
                return None
            future: Future[R] = Future()
            futures.append(future)
            return future, call

    def slot(item: tuple[Future[R], Callable[[], R]] | None) -> None:
        while item is not None:
            future, call = item
            try:
                future.set_result(call())
            except BaseException as err:  # the caller raises it, once every call has run
                future.set_exception(err)
            item = take()

    slots: list[Future[None]] = []
    item = take()
    while item is not None and len(slots) < max(1, width) - 1:
        slots.append(_pool.submit(slot, item))
        item = take()
    slot(item)  # the last slot is the asking thread's own: one hand-over less, and it never idles
    wait(slots)
    for finished in slots:
        finished.result()  # a planning failure (the generator raised) surfaces here
    return futures


def pipeline(items: Iterable[T], observe: Callable[[T], list[Task]], width: int) -> None:
    """Run `observe(item)` (a listing) over `items`, and the tasks (loads) each returns.

    Listings and loads have `width` slots each: a listing (a dictionary read in the engine)
    never waits behind a load (weights read, GPU memory allocated, ~100 ms to seconds), so the
    load slots stay busy back to back, and a pod's loads start as soon as its own listing is
    in. Wider listing bursts measured slower on 2 cores (bench/fanout.py: 4x wide 650-700 ms,
    as wide 580-615 ms for 50 pods). Returns when everything has finished, re-raising the
    first exception to have been raised (a failed listing queues no load).
    """
    width = max(1, width)
    to_list = deque(items)
    to_load: deque[Task] = deque()
    listing: set[Future[list[Task]]] = set()
    loading: set[Future[list[Task]]] = set()
    finished: list[Future[list[Task]]] = []
    while to_list or to_load or listing or loading:
        while to_list and len(listing) < width:
            listing.add(_pool.submit(observe, to_list.popleft()))
        while to_load and len(loading) < width:
            loading.add(_pool.submit(_as_step, to_load.popleft()))
        done, _ = wait(listing | loading, return_when=FIRST_COMPLETED)
        for future in done:
            finished.append(future)
            if future in listing:
                listing.discard(future)
                if future.exception() is None:
                    to_load.extend(future.result())
            else:
                loading.discard(future)
    errors = [error for future in finished if (error := future.exception()) is not None]
    if errors:
        raise errors[0]


def _as_step(task: Task) -> list[Task]:
    """A load on the pool, typed as a listing is: it queues nothing further."""
    task()
    return []

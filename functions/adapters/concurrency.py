"""Bounded concurrency for the calls one invocation makes (engines, status writes, reads).

Threads, not asyncio: every client underneath is blocking (httpx, urllib3, boto3) and the
calls wait on the network, where the GIL is released.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")
Task = Callable[[], None]


def bounded_map(items: Iterable[T], call: Callable[[T], R], width: int) -> list[tuple[T, R]]:
    """`call` over `items`, at most `width` at a time; results in input order."""
    work = list(items)
    if len(work) <= 1 or width <= 1:
        return [(item, call(item)) for item in work]
    with ThreadPoolExecutor(max_workers=min(width, len(work))) as pool:
        return list(zip(work, pool.map(call, work), strict=True))


def pipeline(items: Iterable[T], observe: Callable[[T], list[Task]], width: int) -> None:
    """Run `observe(item)` (a listing) over `items`, and the tasks (loads) each returns.

    Listings and loads run on two pools of `width` workers each: a listing (a dictionary read in
    the engine) never waits behind a load (weights read, GPU memory allocated, ~100 ms to
    seconds), so the load slots stay busy back to back, and a pod's loads start as soon as its
    own listing is in. Wider listing bursts measured slower on 2 cores (bench/fanout.py: 4x wide
    650-700 ms, as wide 580-615 ms for 50 pods). Returns when everything has finished,
    re-raising the first exception of a task.
    """
    work = list(items)
    if not work:
        return
    with (
        ThreadPoolExecutor(max_workers=width) as loads,
        ThreadPoolExecutor(max_workers=min(len(work), width)) as listings,
    ):

        def observe_then_queue(item: T) -> list[Future[None]]:
            return [loads.submit(task) for task in observe(item)]

        queued = [listings.submit(observe_then_queue, item) for item in work]
        for load in [future for listed in queued for future in listed.result()]:
            load.result()

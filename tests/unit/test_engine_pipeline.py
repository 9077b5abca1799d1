"""Engines.pipeline: listings wide, loads bounded by LORAFLOW_LOAD_CONCURRENCY, every task run."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from functions.adapters.engines import LISTING_WIDTH, Engines
from functions.settings import Settings


class InFlight:
    def __init__(self) -> None:
        self.now = self.most = 0
        self.lock = threading.Lock()

    def __enter__(self) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def __exit__(self, *_: object) -> None:
        with self.lock:
            self.now -= 1


def test_listings_are_not_bounded_by_the_load_concurrency_but_loads_are() -> None:
    concurrency, pods = 2, 2 * LISTING_WIDTH
    engines = Engines(Settings(load_concurrency=concurrency))
    # every listing waits for all the others: with listings bounded at 2 this would time out
    all_listing = threading.Barrier(pods, timeout=10)
    loads, done = InFlight(), []

    def load(pod: int, n: int) -> None:
        with loads:
            time.sleep(0.005)
        done.append((pod, n))

    def observe(pod: int) -> list[Callable[[], None]]:
        all_listing.wait()
        return [lambda pod=pod, n=n: load(pod, n) for n in range(3)]

    engines.pipeline(range(pods), observe)
    assert sorted(done) == [(p, n) for p in range(pods) for n in range(3)]
    assert loads.most <= concurrency


def test_a_failing_task_is_raised_after_the_others_ran() -> None:
    engines = Engines(Settings(load_concurrency=1))
    ran: list[int] = []

    def observe(pod: int) -> list[Callable[[], None]]:
        def task() -> None:
            ran.append(pod)
            if pod == 0:
                raise RuntimeError("engine exploded")

        return [task]

    with pytest.raises(RuntimeError, match="exploded"):
        engines.pipeline(range(3), observe)
    assert sorted(ran) == [0, 1, 2]

"""Engines.pipeline: listings on their own pool (never behind loads), both bounded by
LORAFLOW_LOAD_CONCURRENCY, every task run."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from functions.adapters.engines import Engines
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


def test_listings_never_wait_behind_loads_and_both_are_bounded() -> None:
    concurrency, pods = 2, 6
    engines = Engines(Settings(load_concurrency=concurrency))
    listed, all_listed = [], threading.Event()
    listings, loads, done = InFlight(), InFlight(), []

    def load(pod: int) -> None:
        with loads:
            # holds its slot until every pod was listed: with one shared pool the listings left
            # would have no worker, and this would time out
            assert all_listed.wait(10), "listings were queued behind the loads"
        done.append(pod)

    def observe(pod: int) -> list[Callable[[], None]]:
        with listings:
            time.sleep(0.002)
        listed.append(pod)
        if len(listed) == pods:
            all_listed.set()
        return [lambda pod=pod: load(pod)]

    engines.pipeline(range(pods), observe)
    assert sorted(done) == list(range(pods))
    assert listings.most <= concurrency and loads.most <= concurrency


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

"""concurrency.pipeline: listings on their own pool (never behind loads), both bounded by the
width (LORAFLOW_LOAD_CONCURRENCY in the steps), every task run."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from functions.adapters.concurrency import bounded_map, pipeline, run_tasks, serving, side_by_side


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

    pipeline(range(pods), observe, concurrency)
    assert sorted(done) == list(range(pods))
    assert listings.most <= concurrency and loads.most <= concurrency


def test_a_failing_task_is_raised_after_the_others_ran() -> None:
    ran: list[int] = []

    def observe(pod: int) -> list[Callable[[], None]]:
        def task() -> None:
            ran.append(pod)
            if pod == 0:
                raise RuntimeError("engine exploded")

        return [task]

    with pytest.raises(RuntimeError, match="exploded"):
        pipeline(range(3), observe, 1)
    assert sorted(ran) == [0, 1, 2]


def test_bounded_map_keeps_input_order_and_its_width() -> None:
    in_flight = InFlight()

    def call(item: int) -> int:
        with in_flight:
            time.sleep(0.001 * (5 - item))
        return item * item

    assert bounded_map(range(5), call, 2) == [(i, i * i) for i in range(5)]
    assert in_flight.most <= 2


def test_the_threads_are_kept_between_calls() -> None:
    """One process-wide pool: later invocations run on the threads earlier ones left idle
    (a pool per call started 4 new threads every time: 24 over these 6 rounds). Counted as the
    pool's threads alive, not the threads each call ran on: earlier tests may have left more
    idle threads than one call needs, and any of them may take a task."""

    def call(item: int) -> int:
        time.sleep(0.002)
        return item

    def pool_threads() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name.startswith("loraflow-call")}

    bounded_map(range(4), call, 4)  # at least 4 idle threads from here on
    before = pool_threads()
    for _ in range(6):
        bounded_map(range(4), call, 4)
    assert len(before) >= 4
    assert pool_threads() == before


def test_each_invocation_keeps_its_own_width() -> None:
    """Two invocations at once: each gets its own `width` slots, neither waits for the other's."""
    in_flight, both_in, done = InFlight(), threading.Barrier(4, timeout=10), []

    def call(item: int) -> int:
        with in_flight:
            both_in.wait()  # all four at once: 2 of each invocation, or this times out
        return item

    other = threading.Thread(target=lambda: done.append(bounded_map(range(2), call, 2)))
    other.start()
    done.append(bounded_map(range(10, 12), call, 2))
    other.join(10)
    assert sorted(done) == [[(0, 0), (1, 1)], [(10, 10), (11, 11)]]
    assert in_flight.most == 4


def test_bounded_map_runs_every_call_before_raising_the_first_failure() -> None:
    ran: list[int] = []

    def call(item: int) -> int:
        time.sleep(0.001 * item)
        ran.append(item)
        if item in (1, 3):
            raise ValueError(f"call {item} failed")
        return item

    with pytest.raises(ValueError, match="call 1 failed"):
        bounded_map(range(6), call, 2)
    assert sorted(ran) == list(range(6))


def test_a_failed_listing_queues_no_load_and_the_rest_run() -> None:
    loaded: list[int] = []

    def observe(pod: int) -> list[Callable[[], None]]:
        if pod == 1:
            raise ConnectionError("engine gone")
        return [lambda pod=pod: loaded.append(pod)]

    with pytest.raises(ConnectionError):
        pipeline(range(4), observe, 2)
    assert sorted(loaded) == [0, 2, 3]


def test_run_tasks_starts_calls_while_the_rest_is_still_being_planned() -> None:
    """The first task runs while the generator is still planning the others (a fan-out's first
    loads start before its 50th pod is planned); the width holds and every task runs."""
    in_flight, started, ran = InFlight(), threading.Event(), []

    def task(index: int) -> None:
        with in_flight:
            started.set()
            time.sleep(0.005)
        ran.append(index)

    def planned() -> Iterator[Callable[[], None]]:
        for index in range(8):
            if index == 5:
                assert started.wait(5), "no task started before the plan was complete"
            yield lambda index=index: task(index)

    run_tasks(planned(), 3)
    assert sorted(ran) == list(range(8))
    assert in_flight.most <= 3


def test_run_tasks_runs_a_lone_task_on_the_callers_thread_and_raises_failures_last() -> None:
    where: list[str] = []
    run_tasks([lambda: where.append(threading.current_thread().name)], 10)
    assert where == [threading.current_thread().name]
    ran: list[int] = []

    def failing(index: int) -> None:
        ran.append(index)
        if index == 0:
            raise RuntimeError("engine exploded")

    with pytest.raises(RuntimeError, match="exploded"):
        run_tasks([lambda i=i: failing(i) for i in range(4)], 2)
    assert sorted(ran) == [0, 1, 2, 3]
    run_tasks([], 4)  # nothing planned: nothing runs, nothing raised


def test_a_plan_that_fails_is_raised_once_the_calls_it_made_have_run() -> None:
    ran: list[int] = []

    def plan() -> Iterator[Callable[[], None]]:
        for n in range(3):
            yield lambda n=n: (time.sleep(0.01), ran.append(n))[0]
        raise ValueError("planning failed")

    with pytest.raises(ValueError, match="planning failed"):
        run_tasks(plan(), 2)
    assert sorted(ran) == [0, 1, 2]


def test_reads_go_side_by_side_only_while_their_request_is_the_only_one() -> None:
    def where() -> str:
        time.sleep(0.002)
        return threading.current_thread().name

    me = threading.current_thread().name
    with serving():
        alone = side_by_side([where, where, where], 3)
        other_started, other_done = threading.Event(), threading.Event()

        def other_request() -> None:
            with serving():
                other_started.set()
                other_done.wait(10)

        other = threading.Thread(target=other_request)
        other.start()
        assert other_started.wait(10)
        busy = side_by_side([where, where, where], 3)
        other_done.set()
        other.join(10)
    assert alone[-1] == me and {alone[0], alone[1]} & {me} == set()  # two on the pool, one here
    assert busy == [me, me, me]  # another request in flight: inline, in order

"""devstack/connection_threads.py: a connection's thread is one an earlier connection left
waiting, never one still serving, and a thread idle past its time ends."""

from __future__ import annotations

import threading

from devstack.connection_threads import ConnectionThreads
from tests.support.wait import eventually


def _alive(name: str) -> int:
    return sum(1 for t in threading.enumerate() if t.name == name)


def test_jobs_that_block_each_get_a_thread_of_their_own() -> None:
    threads = ConnectionThreads("test-blocking")
    release = threading.Event()
    started = threading.Barrier(6, timeout=10)

    def held() -> None:
        started.wait()  # all five must be running at once for the barrier to open
        release.wait(10)

    for _ in range(5):
        threads.run(held)
    started.wait()
    assert _alive("test-blocking") == 5
    release.set()


def test_a_waiting_thread_serves_the_next_job() -> None:
    threads = ConnectionThreads("test-reuse")
    seen: list[int] = []
    done = threading.Event()

    def job() -> None:
        seen.append(threading.get_ident())
        done.set()

    for _ in range(20):  # one after the other: each finds the last one's thread waiting
        done.clear()
        threads.run(job)
        assert done.wait(10)
        eventually(lambda: threads.waiting == 1, timeout=5, what="the thread waiting again")
    assert len(set(seen)) == 1
    assert _alive("test-reuse") == 1


def test_a_thread_idle_past_its_time_ends() -> None:
    threads = ConnectionThreads("test-idle", idle_s=0.2)
    finished = threading.Barrier(4, timeout=10)

    def job() -> None:
        finished.wait()

    for _ in range(3):
        threads.run(job)
    finished.wait()
    eventually(lambda: _alive("test-idle") == 0, timeout=5, what="idle threads ended")
    ran = threading.Event()
    threads.run(ran.set)  # none waits now: a new thread takes it
    assert ran.wait(10)

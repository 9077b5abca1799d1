"""PodConnections: a small stack of keep-alive connections per engine pod, over real HTTP on
loopback.

The servers count the TCP connections they accept and hold open, so reuse and closing are seen
from the server's side, as an engine would see them.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from functions.transport import Deadline
from functions.transport.pods import PodConnections


class _Ok(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: Any) -> None:
        return


class CountingServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, host: str) -> None:
        super().__init__((host, 0), _Ok)
        self.accepted = 0
        self.open = 0
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            self.accepted += 1
            self.open += 1
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._lock:
            self.open -= 1
            self._open.discard(request)
        super().shutdown_request(request)

    def stop(self) -> None:
        """Stop serving, end each connection still open (its handler sees EOF and closes it; the
        clients' teardown has closed theirs unless a test failed first) and join the handlers."""
        self.shutdown()
        with self._lock:
            still_open = list(self._open)
        for request in still_open:
            with contextlib.suppress(OSError):  # closed by its handler meanwhile
                request.shutdown(socket.SHUT_RDWR)
        self.server_close()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"


@pytest.fixture
def servers() -> Iterator[list[CountingServer]]:
    started: list[CountingServer] = []
    threads: list[threading.Thread] = []
    try:
        for n in (1, 1, 2):  # two ports on .1, one on .2
            server = CountingServer(f"127.0.0.{n}")
            started.append(server)
            thread = threading.Thread(
                target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
            )
            threads.append(thread)
            thread.start()
        yield started
    finally:
        for server in started:
            server.stop()
        for thread in threads:
            thread.join(5)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def until(check: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def get(pods: PodConnections, url: str) -> bytes:
    return pods.to(url).request("GET", "/v1/models", {}, None).body


Connections = Callable[..., PodConnections]


@pytest.fixture
def connections() -> Iterator[Connections]:
    """Makes PodConnections (keepalive_per_pod=2, max_pods=100, clock=time.monotonic unless
    given), each closed at teardown with every pod's connections, also when the test failed."""
    made: list[PodConnections] = []

    def make(keepalive_per_pod: int = 2, max_pods: int = 100, clock: Clock | None = None) -> PodConnections:
        pods = PodConnections(
            keepalive_per_pod=keepalive_per_pod,
            idle_after_s=60,
            max_pods=max_pods,
            timeout=5,
            clock=clock or time.monotonic,
        )
        made.append(pods)
        return pods

    yield make
    for pods in made:
        pods.close()


def test_each_pod_has_its_own_stack_and_keeps_its_connection(
    servers: list[CountingServer], connections: Connections
) -> None:
    pods = connections()
    for _ in range(3):
        for server in servers:
            assert get(pods, server.url) == b"ok"
    assert [s.accepted for s in servers] == [1, 1, 1]  # one connection per pod, reused
    assert pods.pods() == [s.url for s in servers]
    pods.close()


def test_a_burst_into_one_pod_keeps_at_most_keepalive_per_pod(
    servers: list[CountingServer], connections: Connections
) -> None:
    """Three exchanges in flight at once on one pod: three connections, two kept afterwards."""
    pods = connections(keepalive_per_pod=2)
    server = servers[0]
    pod = pods.to(server.url)
    deadline = Deadline(time.monotonic() + 5, time.monotonic)
    with contextlib.ExitStack() as in_flight:  # each exchange ends, also when an assertion fails
        answers = [in_flight.enter_context(pod.exchange("GET", "/", {}, None, deadline)) for _ in range(3)]
        assert [a.read(16) for a in answers] == [b"ok"] * 3
    assert server.accepted == 3
    assert until(lambda: server.open == 2)  # the third was closed as it came back
    pods.close()


def test_a_pod_idle_too_long_is_dropped_when_a_new_pod_arrives(
    servers: list[CountingServer], connections: Connections
) -> None:
    clock = Clock()
    pods = connections(clock=clock)
    old, kept, new = servers
    get(pods, old.url)
    clock.now += 50
    get(pods, kept.url)
    clock.now += 20  # old: idle 70 s, kept: 20 s
    assert old.open == 1  # nothing is closed until a new pod arrives
    get(pods, new.url)
    assert until(lambda: old.open == 0)  # its keep-alive connection was closed
    assert kept.open == 1 and new.open == 1
    assert pods.pods() == [kept.url, new.url]
    assert get(pods, old.url) == b"ok"  # a pod that comes back gets a new stack
    assert old.accepted == 2


def test_a_call_marks_its_pod_called(servers: list[CountingServer], connections: Connections) -> None:
    clock = Clock()
    pods = connections(clock=clock)
    busy, _, new = servers
    for _ in range(3):
        get(pods, busy.url)
        clock.now += 45  # never 60 s without a call
    get(pods, new.url)
    assert busy.open == 1 and busy.accepted == 1


def test_at_most_max_pods_keep_connections(servers: list[CountingServer], connections: Connections) -> None:
    """A resync meets thousands of pods: beyond max_pods the least recently called makes way,
    however recently it was called."""
    pods = connections(max_pods=2)
    first, second, third = servers
    get(pods, first.url)
    get(pods, second.url)
    get(pods, first.url)  # second is now the least recently called
    get(pods, third.url)
    assert until(lambda: second.open == 0)
    assert first.open == 1 and third.open == 1
    assert pods.pods() == [first.url, third.url]


def test_a_pod_dropped_during_a_call_closes_that_connection_as_it_comes_back(
    servers: list[CountingServer], connections: Connections
) -> None:
    pods = connections(max_pods=1)
    busy, other, _ = servers
    deadline = Deadline(time.monotonic() + 5, time.monotonic)
    with pods.to(busy.url).exchange("GET", "/", {}, None, deadline) as answer:
        get(pods, other.url)  # busy's stack is dropped while its call is in flight
        assert answer.read(16) == b"ok"
    assert until(lambda: busy.open == 0)  # not kept by a stack nobody will use again
    assert other.open == 1


def test_only_http_engine_addresses(servers: list[CountingServer], connections: Connections) -> None:
    with pytest.raises(ValueError, match="not an engine address"):
        connections().to("https://" + servers[0].url.removeprefix("http://"))


def test_close_closes_every_pod(servers: list[CountingServer], connections: Connections) -> None:
    pods = connections()
    for server in servers:
        get(pods, server.url)
    pods.close()
    assert until(lambda: all(s.open == 0 for s in servers))
    assert pods.pods() == []

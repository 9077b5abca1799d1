"""PodPools: one keep-alive pool per pod behind one httpx client, over real HTTP on loopback.

The servers count the TCP connections they accept, so reuse and closing are seen from the
server's side, as an engine would see them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from functions.adapters.pod_pools import PodPools


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

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            self.accepted += 1
            self.open += 1
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._lock:
            self.open -= 1
        super().shutdown_request(request)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"


@pytest.fixture
def servers() -> Iterator[list[CountingServer]]:
    started = [CountingServer(f"127.0.0.{n}") for n in (1, 1, 2)]  # two ports on .1, one on .2
    for server in started:
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield started
    for server in started:
        server.shutdown()
        server.server_close()


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


def test_each_pod_has_its_own_pool_and_keeps_its_connection(servers: list[CountingServer]) -> None:
    pools = PodPools(keepalive_per_pod=2, idle_after_s=60)
    with httpx.Client(transport=pools) as http:
        for _ in range(3):
            for server in servers:
                assert http.get(server.url + "/v1/models").text == "ok"
        assert [s.accepted for s in servers] == [1, 1, 1]  # one connection per pod, reused
        assert sorted(pools.origins()) == sorted(
            ("http", s.server_address[0], s.server_address[1]) for s in servers
        )


def test_a_pool_idle_too_long_is_closed_when_a_new_pod_arrives(servers: list[CountingServer]) -> None:
    clock = Clock()
    pools = PodPools(keepalive_per_pod=2, idle_after_s=60, clock=clock)
    old, kept, new = servers
    with httpx.Client(transport=pools) as http:
        http.get(old.url)
        clock.now += 50
        http.get(kept.url)
        clock.now += 20  # old: idle 70 s, kept: 20 s
        assert old.open == 1  # nothing is closed until a new pod needs a pool
        http.get(new.url)
        assert until(lambda: old.open == 0)  # its keep-alive connection was closed
        assert kept.open == 1 and new.open == 1
        assert len(pools.origins()) == 2
        assert http.get(old.url).text == "ok"  # a pod that comes back gets a new pool
        assert old.accepted == 2


def test_a_call_marks_its_pool_used(servers: list[CountingServer]) -> None:
    clock = Clock()
    pools = PodPools(keepalive_per_pod=2, idle_after_s=60, clock=clock)
    busy, _, new = servers
    with httpx.Client(transport=pools) as http:
        for _ in range(3):
            http.get(busy.url)
            clock.now += 45  # never 60 s without a call
        http.get(new.url)
        assert busy.open == 1 and busy.accepted == 1


def test_close_closes_every_pool(servers: list[CountingServer]) -> None:
    pools = PodPools(keepalive_per_pod=2, idle_after_s=60)
    http = httpx.Client(transport=pools)
    for server in servers:
        http.get(server.url)
    http.close()
    assert until(lambda: all(s.open == 0 for s in servers))
    assert pools.origins() == []

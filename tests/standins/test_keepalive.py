"""devstack.keepalive: connections are reused, and one the server closed while idle is never
written on (as Go's transport and httpcore discard theirs), so no request is lost to it."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from devstack.keepalive import Pools, SendError


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    close_after_answer = False
    peers: list[int]
    closed: threading.Semaphore


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.peers.append(self.client_address[1])
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Twice", "a")
        self.send_header("X-Twice", "b")
        self.end_headers()
        self.wfile.write(body)
        if self.server.close_after_answer:  # an idle timeout right after the answer, unannounced
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            self.server.closed.release()


@pytest.fixture
def server() -> Iterator[_Server]:
    running = _Server(("127.0.0.1", 0), _Handler)
    running.peers = []
    running.closed = threading.Semaphore(0)
    thread = threading.Thread(target=running.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield running
    running.shutdown()
    running.server_close()


def _url(server: _Server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/x?y=1"


def test_the_answer_and_a_kept_alive_connection(server: _Server) -> None:
    pools = Pools(5.0)
    first = pools.post(_url(server), {"Content-Type": "text/plain"}, b"one")
    second = pools.post(_url(server), {}, b"two")
    pools.close()
    assert (first.status, first.body, second.body) == (200, b"one", b"two")
    assert first.headers["x-twice"] == "a, b"
    assert server.peers[0] == server.peers[1]  # the same client port: one connection, reused


def test_a_connection_closed_while_idle_is_replaced_before_anything_is_sent(server: _Server) -> None:
    server.close_after_answer = True
    pools = Pools(5.0)
    answers = []
    for i in range(5):
        answers.append(pools.post(_url(server), {}, str(i).encode()).body)
        assert server.closed.acquire(timeout=5)  # closed before the next request takes it
    pools.close()
    assert answers == [b"0", b"1", b"2", b"3", b"4"]
    assert len(set(server.peers)) == 5  # each on a new connection, none lost to a stale one


def test_no_server_is_a_send_error() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    with pytest.raises(SendError):
        Pools(1.0).post(f"http://127.0.0.1:{port}/", {}, b"")

"""functions.transport.keepalive over real sockets: connections kept and reused, a kept one the
server closed is replaced without failing the request, and every failure arrives as the
transport's one error type (what the clients translate). TLS against the real kube-apiserver:
tests/kubernetes."""

from __future__ import annotations

import contextlib
import gc
import http.client
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from functions.transport import Deadline, KeepAlive, TransportError, TransportTimeout
from functions.transport.keepalive import may_send_again

ATTEMPTS = 2000
"""Connections reset under a TLS connect: enough that some are reset between its TCP connect and
its TLS wrap."""


class Counting(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, close_after_answer: bool = False) -> None:
        self.connections = 0
        self.close_after_answer = close_after_answer
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._lock:
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


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Counting

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        body = f"{self.path} {self.headers.get('X-Test', '')}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()
        if self.server.close_after_answer:
            # gone without saying so (no Connection: close): an idle timeout, a restart
            self.close_connection = True


@pytest.fixture
def server() -> Iterator[Counting]:
    running = Counting()
    thread = threading.Thread(target=running.serve_forever, daemon=True)
    thread.start()
    try:
        yield running
    finally:
        running.stop()
        thread.join(5)


@pytest.fixture
def keepalive() -> Iterator[Callable[..., KeepAlive]]:
    """Makes KeepAlive clients (its arguments: KeepAlive's), each closed at teardown with every
    connection it kept, also when the test failed."""
    made: list[KeepAlive] = []

    def make(base_url: str, **options: Any) -> KeepAlive:
        client = KeepAlive(base_url, **options)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


class Listener:
    """A listening socket on loopback and the server side a test runs on it in threads. `close`
    (at teardown) closes the listener and every connection it accepted, which ends those
    threads, and joins them."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.accepted: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closing = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def accept(self) -> socket.socket:
        """The next connection, kept for `close` (OSError once the listener is closed)."""
        conn, _ = self.sock.accept()
        with self._lock:
            if not self._closing:
                self.accepted.append(conn)
                return conn
        conn.close()
        raise OSError("the listener is closed")

    def serve(self, target: Callable[[], object]) -> threading.Thread:
        """Run `target` in a thread, ended by `close` (its OSError then is the end it expects)."""

        def run() -> None:
            try:
                target()
            except OSError:
                if not self._closing:
                    raise

        thread = threading.Thread(target=run, daemon=True)
        self._threads.append(thread)
        thread.start()
        return thread

    def close(self) -> None:
        with self._lock:
            self._closing = True
        for sock in (self.sock, *self.accepted):
            with contextlib.suppress(OSError):  # already closed, or never connected
                sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked on it (close alone does not)
            sock.close()
        for thread in self._threads:
            thread.join(5)


@pytest.fixture
def listener() -> Iterator[Listener]:
    opened = Listener()
    try:
        yield opened
    finally:
        opened.close()


def test_one_connection_carries_request_after_request(
    server: Counting, keepalive: Callable[..., KeepAlive]
) -> None:
    client = keepalive(server.url + "/base/")
    answers = [client.request("GET", f"/p{i}?q=1", {"X-Test": str(i)}, None) for i in range(20)]
    assert [a.body for a in answers] == [f"/base/p{i}?q=1 {i}".encode() for i in range(20)]
    assert {a.status for a in answers} == {200}
    assert server.connections == 1
    client.close()


def test_a_header_the_wire_refuses_takes_no_connection_and_keeps_the_kept_one(
    server: Counting, keepalive: Callable[..., KeepAlive]
) -> None:
    """A header that would split the request (a newline in its value) is a ValueError before
    any connection is taken: the kept one stays kept, for request and exchange alike."""
    client = keepalive(server.url)
    assert client.request("GET", "/a", {}, None).status == 200
    with pytest.raises(ValueError):
        client.request("GET", "/b", {"X-Test": "x\r\nInjected: 1"}, None)
    deadline = Deadline(time.monotonic() + 5, time.monotonic)
    with pytest.raises(ValueError), client.exchange("GET", "/c", {"X-Test": "x\ny"}, None, deadline):
        pass
    assert client.request("GET", "/d", {}, None).body == b"/d "
    assert server.connections == 1


def test_a_kept_connection_the_server_closed_is_replaced(
    server: Counting, keepalive: Callable[..., KeepAlive]
) -> None:
    server.close_after_answer = True
    client = keepalive(server.url)
    for i in range(5):
        assert client.request("GET", f"/{i}", {}, None).body == f"/{i} ".encode()
        time.sleep(0.02)  # the server's close reaches us: the next request sees a readable socket
    assert server.connections == 5


def serve_each(listener: Listener, handle: Callable[[socket.socket], None]) -> None:
    """Accept connections until the listener is closed (counted in `listener.accepted`), and
    `handle` each."""
    while True:
        try:
            conn = listener.accept()
        except OSError:
            return
        handle(conn)


def one_answer_per_connection(listener: Listener, reset: bool) -> None:
    """Answer one request on each connection, then close it (`reset`: abortively, an RST)."""

    def answer_once(conn: socket.socket) -> None:
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        if reset:
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()

    serve_each(listener, answer_once)


@pytest.mark.parametrize("reset", [False, True], ids=["fin", "rst"])
def test_an_idle_connection_the_server_closed_is_never_sent_on(
    reset: bool, listener: Listener, keepalive: Callable[..., KeepAlive]
) -> None:
    """Found out before reuse, not by sending: with replay off, a request sent on the stale
    socket would fail. A server's close (FIN) and its abortive close (RST) alike."""
    listener.serve(lambda: one_answer_per_connection(listener, reset))
    client = keepalive(listener.url, replay=False)
    for _ in range(3):
        assert client.request("POST", "/", {}, b"{}").body == b"ok"
        time.sleep(0.05)  # the close reaches us while the connection is idle
    assert len(listener.accepted) == 3


def test_a_request_the_server_never_reads_is_a_timeout(
    listener: Listener, keepalive: Callable[..., KeepAlive]
) -> None:
    """The send side is bounded too: a server that stops reading cannot hold a sender."""
    listener.serve(listener.accept)  # held open, never read, until teardown
    client = keepalive(listener.url, read_timeout=0.3)
    started = time.monotonic()
    with pytest.raises(TransportTimeout):
        client.request("POST", "/", {}, b"x" * (64 << 20))  # more than the kernel's buffers hold
    assert time.monotonic() - started < 5


def test_a_round_trip_after_an_exchange_has_its_own_bound(
    listener: Listener, keepalive: Callable[..., KeepAlive]
) -> None:
    """An exchange bounds each call by what is left of its deadline; the next round trip on the
    same connection is bounded by its own timeout again, not by that remainder."""

    def serve() -> None:
        conn = listener.accept()
        with conn:
            for delay in (0.0, 0.6):
                conn.recv(65536)
                time.sleep(delay)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    listener.serve(serve)
    client = keepalive(listener.url, read_timeout=5)
    deadline = Deadline(time.monotonic() + 0.3, time.monotonic)
    with client.exchange("GET", "/", {}, None, deadline) as answer:
        assert answer.read(16) == b"ok"
    assert client.request("GET", "/", {}, None).body == b"ok"  # answered 0.6 s later: within 5 s
    assert len(listener.accepted) == 1  # on the connection the exchange kept


def test_a_connection_closed_right_under_the_request_is_retried_once(
    listener: Listener, keepalive: Callable[..., KeepAlive]
) -> None:
    """The close races the next request (nothing readable yet when it is sent): one retry on a
    new connection, and the caller never sees the stale socket."""
    answered = []

    def serve() -> None:
        for index in range(3):
            conn = listener.accept()
            conn.recv(65536)
            if index == 0:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                conn.recv(65536)  # the second request arrives on the kept connection...
                conn.close()  # ...and is dropped unanswered
            else:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nagain")
                answered.append(index)
                conn.close()
                return

    thread = listener.serve(serve)
    client = keepalive(listener.url)
    assert client.request("GET", "/", {}, None).body == b"ok"
    assert client.request("GET", "/", {}, None).body == b"again"
    thread.join(5)
    assert answered == [1]


def test_a_new_connection_that_fails_is_a_transport_error_not_a_retry_loop(
    listener: Listener, keepalive: Callable[..., KeepAlive]
) -> None:
    listener.serve(lambda: serve_each(listener, socket.socket.close))
    with pytest.raises(TransportError):
        keepalive(listener.url).request("GET", "/", {}, None)
    assert len(listener.accepted) == 1


RESETTING_SERVER = """
import socket, struct
listener = socket.create_server(("127.0.0.1", 0), backlog=512)
print(listener.getsockname()[1], flush=True)
while True:
    conn, _ = listener.accept()
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()
"""


@pytest.fixture
def resetting() -> Iterator[str]:
    """The address of a server that resets each connection as it accepts it, as a stopping
    kube-apiserver does: in its own process, so its resets race the client's steps."""
    server = subprocess.Popen([sys.executable, "-c", RESETTING_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        yield f"https://127.0.0.1:{int(server.stdout.readline())}"
    finally:
        server.kill()
        server.wait()
        assert server.stdout is not None
        server.stdout.close()


def test_tls_connections_a_stopping_server_resets_are_each_closed(
    resetting: str, keepalive: Callable[..., KeepAlive]
) -> None:
    client = keepalive(resetting, context=ssl.create_default_context())
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        for _ in range(ATTEMPTS):
            with pytest.raises(TransportError):
                client.request("GET", "/", {}, None)
        gc.collect()
    assert [str(w.message) for w in warned if issubclass(w.category, ResourceWarning)] == []


def test_nobody_listening_is_a_transport_error(keepalive: Callable[..., KeepAlive]) -> None:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    with pytest.raises(TransportError):
        keepalive(f"http://127.0.0.1:{port}").request("GET", "/", {}, None)


@pytest.fixture
def silent(listener: Listener) -> str:
    """The address of a server that accepts a connection and never answers on it (closed, with
    the listener, at teardown)."""
    listener.serve(listener.accept)
    return listener.url


def test_an_answer_that_never_comes_is_a_timeout(silent: str, keepalive: Callable[..., KeepAlive]) -> None:
    client = keepalive(silent, read_timeout=0.3)
    started = time.monotonic()
    with pytest.raises(TransportTimeout):
        client.request("GET", "/", {}, None)
    assert time.monotonic() - started < 5


def test_a_request_can_bound_itself_tighter_than_the_client(
    silent: str, keepalive: Callable[..., KeepAlive]
) -> None:
    """ingest gives each attempt what is left of its deadline: that bound holds, though the
    client's own timeout is far longer."""
    client = keepalive(silent, read_timeout=30)
    started = time.monotonic()
    with pytest.raises(TransportTimeout):
        client.request("POST", "/", {}, b"{}", timeout=0.2)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    ("method", "written", "error", "again"),
    [
        ("POST", 0, BrokenPipeError(), True),  # not one byte left: the server never saw it
        ("POST", 0, ConnectionResetError(), True),
        ("POST", 120, http.client.RemoteDisconnected("closed"), False),  # it may have been read
        ("POST", 120, ConnectionResetError(), False),
        ("GET", 80, http.client.RemoteDisconnected("closed"), True),  # idempotent, closed before an answer
        ("GET", 80, ConnectionResetError(), True),
        ("GET", 80, http.client.IncompleteRead(b""), False),  # an answer had begun
        ("GET", 0, TimeoutError(), False),  # the deadline is spent, not the connection
        ("POST", 120, TimeoutError(), False),
    ],
)
def test_a_request_is_sent_again_after_a_kept_connection_failed_by_gos_rule(
    method: str, written: int, error: Exception, again: bool
) -> None:
    """net/http shouldRetryRequest: nothing written, or a replayable request the server closed
    on before answering (exchange only asks this after a kept connection failed)."""
    assert may_send_again(method, written, error) is again

"""HTTP/1.1 keep-alive connections to one server: http.client's sockets, http1's framing.

The Kubernetes API is every step's busiest peer (a load event makes three to six requests), and
httpx's client and connection pool cost ~0.7-1.2 ms of CPU per request on top of the socket
work (request building, cookie extraction, the pool's scan of its connections): more than the
handler's own decisions. Here a request is one round trip (written and read by
functions/adapters/http1.py as http.client would) on a connection taken from a small
last-in-first-out stack of idle ones, so the hottest connection (and its TLS
session) is reused and at most `max_idle` stay open.

A kept connection the server has closed meanwhile (its idle timeout, a restart) shows as
readable before it is reused and is dropped (as httpcore and Go's transport check theirs); one
that fails before any answer arrived is retried once on a new connection, as a stale
keep-alive socket is not the server's answer (`replay=False`: reported instead). Failures are
raised as httpx's transport errors, so callers handle both transports alike. The embedded
stack's stand-ins send through the same connections (devstack/keepalive.py).

`exchange` is the engines' round trip (functions/adapters/engines.py): a pod is another
tenant's process, so the whole call has one wall-clock deadline (every connect, send and
receive, the headers' included, bounded by what is left of it), the caller reads the body
under its own byte cap (`http1.Body.read1`), and a connection whose answer was not read to its
end is closed, never reused. A request is sent again on a new connection as Go's transport decides it
(`persistConn.shouldRetryRequest`, net/http/transport.go): only after a kept connection failed,
and only when not one byte of the request had been written, or when the request is a GET and
the server closed or reset the connection before the first byte of an answer. A POST that may
have reached the engine is never sent twice (a vLLM load sent again answers "already loaded").
"""

from __future__ import annotations

import http.client
import io
import select
import socket
import ssl
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import httpx

from functions.adapters import http1

STALE = (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine, ssl.SSLEOFError)
"""What a kept connection the server closed raises on its next use (before any answer)."""


class Answer(NamedTuple):
    status: int
    body: bytes
    headers: Mapping[str, str]
    """Lower-cased names; a repeated header's values joined by ", " (RFC 9110 5.3)."""


class Streamed(NamedTuple):
    """An exchange's answer: status and headers read, the body left for the caller to read."""

    status: int
    headers: Mapping[str, str]
    """Lower-cased names; a repeated header's values joined by ", " (RFC 9110 5.3)."""
    will_close: bool
    body: http1.Body


class Deadline(NamedTuple):
    """The wall-clock moment one exchange must be over by, on `clock`'s scale."""

    at: float
    clock: Callable[[], float]

    def left(self) -> float:
        """What is left of it; TimeoutError once it has passed."""
        left = self.at - self.clock()
        if left <= 0:
            raise TimeoutError("deadline passed")
        return left


class _DeadlineReader(io.RawIOBase):
    """A socket's receive side with each receive bounded by what is left of the deadline, so
    that a server trickling its status line, headers or body one byte at a time is still cut
    off at the deadline (a per-read timeout alone would wait for it forever)."""

    def __init__(self, raw: io.RawIOBase, sock: socket.socket, deadline: Deadline) -> None:
        super().__init__()
        self._raw = raw  # the socket's own file (it keeps the socket open until it is closed)
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        self._sock.settimeout(self._deadline.left())
        return self._raw.readinto(buffer)

    def close(self) -> None:
        self._raw.close()
        super().close()


class _Connection(http.client.HTTPConnection):
    """TCP (http.client's own, TCP_NODELAY), then TLS with SNI and the certificate check on
    `server_name` when given (a kubeconfig's tls-server-name), else on the host."""

    def __init__(
        self,
        host: str,
        port: int,
        connect_timeout: float,
        read_timeout: float,
        context: ssl.SSLContext | None,
        server_name: str | None,
    ) -> None:
        super().__init__(host, port, timeout=connect_timeout)
        self._connect_timeout = connect_timeout
        self._default_read_timeout = self._read_timeout = read_timeout
        self._context = context
        self._server_name = server_name
        self.written = 0
        """Bytes of the current exchange's request handed to the kernel (0: none can have left)."""

    def connect(self) -> None:
        super().connect()
        if self._context is not None:
            self.sock = self._context.wrap_socket(self.sock, server_hostname=self._server_name or self.host)
        self.sock.settimeout(self._read_timeout)

    def bound(self, timeout: float | None) -> None:
        """Each socket operation of the next round trip takes at most `timeout` (None: the
        connection's read timeout); a connection made for it connects within that too."""
        self.timeout = min(timeout, self._connect_timeout) if timeout else self._connect_timeout
        self._read_timeout = timeout or self._default_read_timeout
        if self.sock is not None:
            self.sock.settimeout(self._read_timeout)


class KeepAlive:
    def __init__(
        self,
        base_url: str,
        context: ssl.SSLContext | None = None,
        server_name: str | None = None,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        max_idle: int = 16,
        replay: bool = True,
    ) -> None:
        """`replay`: send a request again, once, when a kept connection fails before any answer
        (False: report it, as Go's transport does for a POST)."""
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) server address: {base_url[:100]!r}")
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        host = f"[{self._host}]" if ":" in self._host else self._host
        # the Host header as http.client writes it (its default port is 80 for TLS too)
        default = self._port == http.client.HTTPConnection.default_port
        self._authority = host if default else f"{host}:{self._port}"
        self._prefix = parts.path.rstrip("/")
        self._context = context if parts.scheme == "https" else None
        self._server_name = server_name
        self._timeouts = (connect_timeout, read_timeout)
        self._max_idle = max_idle
        self._replay = replay
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()
        self._closed = False

    def request(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: float | None = None,
    ) -> Answer:
        """One round trip; `target` is the path and query under the base URL; `timeout` bounds
        each socket operation of this one (default: the read timeout)."""
        connection, reused = self._take()
        try:
            try:
                answer = self._round_trip(connection, method, target, headers, body, timeout)
            except STALE:
                if not (reused and self._replay):
                    raise
                connection.close()  # the server closed it while it was idle: once more, anew
                connection = self._new()
                answer = self._round_trip(connection, method, target, headers, body, timeout)
        except TimeoutError as err:
            connection.close()
            raise httpx.TimeoutException(f"{method} {target[:200]}: timed out") from err
        except (OSError, http.client.HTTPException) as err:
            connection.close()
            detail = str(err) or type(err).__name__
            raise httpx.TransportError(f"{method} {target[:200]}: {detail}") from err
        self._give_back(connection)
        return answer

    @contextmanager
    def exchange(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: bytes | None,
        deadline: Deadline,
    ) -> Iterator[Streamed]:
        """One round trip ending by `deadline`: the answer with its status and headers read, for
        the caller to read the body from (`body.read1`: each receive bounded by what is left).
        The connection is kept for the next one only when the body was read to its end inside
        the block. Failures are the standard library's (TimeoutError, OSError, HTTPException)."""
        connection, reused = self._take()
        try:
            answer = self._send_within(connection, method, target, headers, body, deadline)
        except (OSError, http.client.HTTPException) as err:
            if not (reused and may_send_again(method, connection.written, err)):
                raise
            connection = self._new()  # the kept one failed under it: once more, anew
            answer = self._send_within(connection, method, target, headers, body, deadline)
        kept = False
        try:
            yield answer
            # read to its end (what is left would garble the next answer on this connection)
            kept = answer.body.done and not answer.will_close
        finally:
            answer.body.close()
            if kept:
                self._give_back(connection)
            else:
                connection.close()

    def close(self) -> None:
        """Close the idle connections, and each one in use as it comes back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def _send_within(
        self,
        connection: _Connection,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: bytes | None,
        deadline: Deadline,
    ) -> Streamed:
        wire = http1.request_bytes(method, self._prefix + target or "/", self._authority, headers, body)
        connection.written = 0
        try:
            if connection.sock is None:
                connection.timeout = min(deadline.left(), self._timeouts[0])
                connection.connect()
            sock = connection.sock
            view = memoryview(wire)
            while view:  # counted, so that a failure knows whether any byte left (sendall does not say)
                sock.settimeout(deadline.left())
                sent = sock.send(view)
                connection.written += sent
                view = view[sent:]
            answer = io.BufferedReader(_DeadlineReader(sock.makefile("rb", buffering=0), sock, deadline))
            try:
                head = http1.read_head(answer, method)
            except BaseException:
                answer.close()
                raise
        except BaseException:
            connection.close()
            raise
        return Streamed(head.status, head.headers, head.will_close, http1.Body(answer, head))

    def _round_trip(
        self,
        connection: _Connection,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: float | None,
    ) -> Answer:
        connection.bound(timeout)
        if connection.sock is None:
            connection.connect()
        wire = http1.request_bytes(method, self._prefix + target or "/", self._authority, headers, body)
        connection.sock.sendall(wire)
        with connection.sock.makefile("rb") as answer:
            head, content = http1.read_answer(answer, method)
        if head.will_close:
            connection.close()
        return Answer(head.status, content, head.headers)

    def _take(self) -> tuple[_Connection, bool]:
        while True:
            with self._lock:
                connection = self._idle.pop() if self._idle else None
            if connection is None:
                return self._new(), False
            if connection.sock is not None and not _readable(connection.sock):
                return connection, True
            connection.close()  # closed by the server (or sent what nobody asked for)

    def _new(self) -> _Connection:
        connect_timeout, read_timeout = self._timeouts
        return _Connection(
            self._host, self._port, connect_timeout, read_timeout, self._context, self._server_name
        )

    def _give_back(self, connection: _Connection) -> None:
        if connection.sock is None:
            return
        with self._lock:
            if not self._closed and len(self._idle) < self._max_idle:
                self._idle.append(connection)
                return
        connection.close()


def may_send_again(method: str, written: int, err: Exception) -> bool:
    """After a kept connection failed: Go's rule (net/http `shouldRetryRequest`) for sending
    the request again on a new one."""
    if isinstance(err, TimeoutError):
        return False  # the deadline is spent, not the connection
    if written == 0:
        return True  # not one byte of it left this process: the server cannot have seen it
    return method == "GET" and isinstance(err, STALE)  # closed before any answer; GET is idempotent


def _readable(sock: socket.socket) -> bool:
    """An idle keep-alive socket has nothing to read; readable means EOF (closed) or garbage."""
    try:
        ready, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(ready)

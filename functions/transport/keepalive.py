"""HTTP/1.1 keep-alive connections to one server: http.client's sockets, wire.py's framing.

The one `Transport` of functions/ (functions/transport/base.py), for http and https. A
request is one round trip on a connection taken from a small last-in-first-out stack of idle
ones, so the hottest connection (and its TLS session) is reused and at most `max_idle` stay
open; the per-request work of a general client (its pool's scan, its request and cookie
models) is left out because the API server is every step's busiest peer.

A kept connection the server has closed meanwhile (its idle timeout, a restart) is dropped
before it is reused (as httpcore and Go's transport check theirs). `request` sends again, once,
when a kept connection fails before any answer arrived (`replay=False`: reported instead).

`exchange` is the round trip with a peer that may be hostile (an engine pod) or slow to read
(a file's bytes): the whole call has one wall-clock deadline (every connect, send and receive,
the headers' included, bounded by what is left of it, so a trickled answer is cut off), the
caller reads the body under its own cap, and a connection whose answer was not read to its end
is closed, never reused. It sends a request again on a new connection only as Go's transport
decides it (`persistConn.shouldRetryRequest`, net/http/transport.go): after a kept connection
failed, when not one byte of the request had been written, or for a GET the server closed before
answering. A POST that may have reached the engine is never sent twice (a vLLM load sent again
answers "already loaded").

Every socket call releases the GIL, and a Python socket timeout adds a `poll` before each send
and receive; so on Linux a plain socket stays blocking with the kernel's own per-call timeouts
(SO_SNDTIMEO, SO_RCVTIMEO, set without a release), and an idle connection is checked by its TCP
state (TCP_INFO) rather than a `select`. TLS sockets keep Python's timeouts: CPython's SSL read
retries a blocking socket's EAGAIN forever instead of raising.
"""

from __future__ import annotations

import http.client
import io
import select
import socket
import ssl
import struct
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from functions.transport import wire
from functions.transport.base import Answer, Body, Deadline, Streamed, TransportError, TransportTimeout

STALE = (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine, ssl.SSLEOFError)
"""What a kept connection the server closed raises on its next use (before any answer)."""
KERNEL_TIMEOUTS = sys.platform.startswith("linux")
"""Plain sockets blocking, bounded by SO_SNDTIMEO / SO_RCVTIMEO (a struct timeval of two C
longs on Linux); elsewhere Python's socket timeouts, as TLS sockets everywhere."""
_TCP_ESTABLISHED = 1
"""tcpi_state, the first byte of Linux's struct tcp_info (include/net/tcp_states.h)."""
RECEIVE_BYTES = 64 << 10
"""What one receive may bring: a page of pods or adapters in one receive (one let-go of the
GIL), where io's default of 8 KiB takes several."""


class _Receiver(io.RawIOBase):
    """A socket's receive side for one answer, read straight from the socket (`makefile`'s
    SocketIO reads a kernel timeout's EAGAIN as "no data yet"). With a deadline each receive is
    bounded by what is left of it, so that a server trickling its status line, headers or body
    one byte at a time is still cut off at the deadline (a per-read timeout alone would wait
    for it forever); without one, by the timeout the round trip set (`_Connection.bound`)."""

    def __init__(self, sock: socket.socket, deadline: Deadline | None = None) -> None:
        super().__init__()
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._deadline is not None:
            _bound(self._sock, self._deadline.left(), socket.SO_RCVTIMEO)
        try:
            return self._sock.recv_into(buffer)
        except BlockingIOError as err:  # the kernel's SO_RCVTIMEO ran out
            raise TimeoutError("timed out") from err


def _bound(sock: socket.socket, seconds: float, option: int) -> None:
    """Bound the socket's next send (SO_SNDTIMEO) or receive (SO_RCVTIMEO) by `seconds`: by
    the kernel on a blocking plain socket, else by Python's socket timeout."""
    if sock.gettimeout() is not None:
        sock.settimeout(seconds)
        return
    micros = max(1, int(seconds * 1e6))  # 0 would mean no timeout at all
    sock.setsockopt(socket.SOL_SOCKET, option, struct.pack("@ll", micros // 1_000_000, micros % 1_000_000))


def _send_all(sock: socket.socket, data: bytes) -> None:
    try:
        sock.sendall(data)
    except BlockingIOError as err:  # the kernel's SO_SNDTIMEO ran out
        raise TimeoutError("timed out") from err


def _send_counted(connection: _Connection, sock: socket.socket, data: bytes, deadline: Deadline) -> None:
    """Send `data` within the deadline, counting what left (sendall does not say), so that a
    failure knows whether the server can have seen any of the request."""
    view = memoryview(data)
    while view:
        _bound(sock, deadline.left(), socket.SO_SNDTIMEO)
        try:
            sent = sock.send(view)
        except BlockingIOError as err:  # the kernel's SO_SNDTIMEO ran out
            raise TimeoutError("timed out") from err
        connection.written += sent
        view = view[sent:]


def connect_tls(
    context: ssl.SSLContext, host: str, port: int, server_name: str, timeout: float | None
) -> ssl.SSLSocket:
    """A TLS connection, its socket wrapped before it connects and closed on any failure.

    `wrap_socket` of a socket already connected leaks the socket it makes when the peer resets
    in between (`SSLSocket._create` raises its probe's ECONNRESET without closing it before
    Python 3.11.8, python/cpython#113280), as a stopping server does to each connection it had
    not accepted yet."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    raw = socket.socket(family, kind, proto)
    try:
        sock = context.wrap_socket(raw, server_hostname=server_name)
    except BaseException:
        raw.close()
        raise
    try:
        sock.settimeout(timeout)
        sock.connect(address)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except BaseException:
        sock.close()
        raise
    return sock


def failure(method: str, target: str, err: BaseException) -> TransportError:
    """The transport's error for a failed round trip (a timeout: TransportTimeout)."""
    if isinstance(err, TransportError):
        return err
    detail = str(err) or type(err).__name__
    kind = TransportTimeout if isinstance(err, TimeoutError) else TransportError
    return kind(f"{method} {target[:200]}: {detail}")


class _Pieces:
    """An exchange's body for its Streamed: wire.Body's reads, their failures the transport's."""

    def __init__(self, body: wire.Body, method: str, target: str) -> None:
        self._body = body
        self._what = (method, target)

    def read1(self, size: int = 1 << 16) -> bytes:
        try:
            return self._body.read1(size)
        except (OSError, http.client.HTTPException) as err:
            raise failure(*self._what, err) from err

    def readinto(self, buffer: memoryview) -> int:
        try:
            return self._body.readinto(buffer)
        except (OSError, http.client.HTTPException) as err:
            raise failure(*self._what, err) from err


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
        self.bounded: float | None = None
        """The bound every socket call has now (None: each is bounded as it is made)."""

    def connect(self) -> None:
        if self._context is not None:
            self.sock = connect_tls(
                self._context, self.host, self.port, self._server_name or self.host, self.timeout
            )
        else:
            super().connect()
            if KERNEL_TIMEOUTS:
                self.sock.settimeout(None)  # blocking: each call is bounded by the kernel (`_bound`)
        self.per_call(self._read_timeout)

    def bound(self, timeout: float | None) -> None:
        """Each socket operation of the next round trip takes at most `timeout` (None: the
        connection's read timeout); a connection made for it connects within that too."""
        self.timeout = min(timeout, self._connect_timeout) if timeout else self._connect_timeout
        self._read_timeout = timeout or self._default_read_timeout
        if self.sock is not None and self.bounded != self._read_timeout:
            self.per_call(self._read_timeout)

    def per_call(self, seconds: float | None) -> None:
        """Bound every send and receive by `seconds` from now on (None: an exchange bounds each
        call itself, by what is left of its deadline)."""
        if seconds is not None:
            _bound(self.sock, seconds, socket.SO_RCVTIMEO)
            _bound(self.sock, seconds, socket.SO_SNDTIMEO)
        self.bounded = seconds


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
        # built before a connection is taken: a header it refuses (ValueError) leaves none behind
        request = wire.request_bytes(method, self._prefix + target or "/", self._authority, headers, body)
        connection, reused = self._take()
        try:
            try:
                answer = self._round_trip(connection, method, request, timeout)
            except STALE:
                if not (reused and self._replay):
                    raise
                connection.close()  # the server closed it while it was idle: once more, anew
                connection = self._new()
                answer = self._round_trip(connection, method, request, timeout)
        except (OSError, http.client.HTTPException) as err:
            connection.close()
            raise failure(method, target, err) from err
        self._give_back(connection)
        return answer

    @contextmanager
    def exchange(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: Body,
        deadline: Deadline,
    ) -> Iterator[Streamed]:
        """One round trip ending by `deadline`: the answer with its status and headers read, for
        the caller to read the body from (each receive bounded by what is left). The connection
        is kept for the next one only when the body was read to its end inside the block."""
        whole, pieces = (body, ()) if isinstance(body, bytes | None) else (None, body)
        # built before a connection is taken: a header it refuses (ValueError) leaves none behind
        request = wire.request_bytes(method, self._prefix + target or "/", self._authority, headers, whole)
        connection, reused = self._take()
        try:
            try:
                sent = self._send_within(connection, method, request, pieces, deadline)
            except (OSError, http.client.HTTPException) as err:
                if not (reused and may_send_again(method, connection.written, err)):
                    raise
                connection = self._new()  # the kept one failed under it: once more, anew
                sent = self._send_within(connection, method, request, pieces, deadline)
        except (OSError, http.client.HTTPException) as err:
            raise failure(method, target, err) from err
        head, content = sent
        kept = False
        try:
            yield Streamed(head.status, head.headers, _Pieces(content, method, target))
            # read to its end (what is left would garble the next answer on this connection)
            kept = content.done and not head.will_close
        finally:
            content.close()
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
        request: bytes,
        pieces: Iterable[bytes],
        deadline: Deadline,
    ) -> tuple[wire.Head, wire.Body]:
        connection.written = 0
        try:
            if connection.sock is None:
                connection.timeout = min(deadline.left(), self._timeouts[0])
                connection.connect()
            connection.per_call(None)  # each call below is bounded by what is left of the deadline
            sock = connection.sock
            _send_counted(connection, sock, request, deadline)
            for piece in pieces:  # a streamed body: its length is in the caller's headers
                _send_counted(connection, sock, piece, deadline)
            answer = io.BufferedReader(_Receiver(sock, deadline), RECEIVE_BYTES)
            try:
                found = wire.read_head(answer, method)
            except BaseException:
                answer.close()
                raise
        except BaseException:
            connection.close()
            raise
        return found, wire.Body(answer, found)

    def _round_trip(
        self,
        connection: _Connection,
        method: str,
        request: bytes,
        timeout: float | None,
    ) -> Answer:
        connection.bound(timeout)
        if connection.sock is None:
            connection.connect()
        _send_all(connection.sock, request)
        with io.BufferedReader(_Receiver(connection.sock), RECEIVE_BYTES) as answer:
            head, content = wire.read_answer(answer, method)
        if head.will_close:
            connection.close()
        return Answer(head.status, content, head.headers)

    def _take(self) -> tuple[_Connection, bool]:
        while True:
            with self._lock:
                connection = self._idle.pop() if self._idle else None
            if connection is None:
                return self._new(), False
            if connection.sock is not None and not _closed_or_unread(connection.sock):
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


def _closed_or_unread(sock: socket.socket) -> bool:
    """Whether an idle keep-alive socket is unfit for the next request: the server closed it
    (its FIN or RST took it out of ESTABLISHED), or, where TCP_INFO is missing, it is readable
    (EOF or bytes nobody asked for). On Linux bytes sent unasked on a connection the server
    keeps open are read as the next answer's start: a malformed answer, that server's own
    failure (a pod's connections are its own, and its answers untrusted anyway)."""
    if KERNEL_TIMEOUTS:
        try:
            return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] != _TCP_ESTABLISHED
        except OSError:
            return True
    try:
        ready, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(ready)

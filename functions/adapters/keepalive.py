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

Every socket call releases the GIL, and in a busy function process each release hands the
interpreter to another request thread and takes it back: two context switches, ~8 us each on
this machine's VM (`perf bench sched pipe`), whether the call waited or not. A Python socket
timeout adds a `poll` before every send and receive, and an idle connection's check was a
`select`: three releases per exchange that never wait. So on Linux a plain (not TLS) socket
stays in blocking mode with the kernel's own per-call timeouts (SO_SNDTIMEO, SO_RCVTIMEO, set
from what is left before each call; set without releasing the GIL), and an idle connection is
checked by its TCP state (TCP_INFO: the server's FIN or RST moved it out of ESTABLISHED), also
without a release. TLS sockets keep Python's timeouts: CPython's SSL read retries a blocking
socket's EAGAIN forever instead of raising.
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
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, NamedTuple
from urllib.parse import urlsplit

import httpx

from functions.adapters import http1

STALE = (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine, ssl.SSLEOFError)
"""What a kept connection the server closed raises on its next use (before any answer)."""
KERNEL_TIMEOUTS = sys.platform.startswith("linux")
"""Plain sockets blocking, bounded by SO_SNDTIMEO / SO_RCVTIMEO (a struct timeval of two C
longs on Linux); elsewhere Python's socket timeouts, as TLS sockets everywhere."""
_TCP_ESTABLISHED = 1
"""tcpi_state, the first byte of Linux's struct tcp_info (include/net/tcp_states.h)."""
RECEIVE_BYTES = 64 << 10
"""What one receive may bring: an engine's listing of 20 adapters is 9.4 KB, a page of pods
or adapters tens of KB, each one receive (and one let-go of the GIL) where io's default of
8 KiB took two or more."""


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
        super().connect()
        if self._context is not None:
            self.sock = self._context.wrap_socket(self.sock, server_hostname=self._server_name or self.host)
        elif KERNEL_TIMEOUTS:
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
            connection.per_call(None)  # each call below is bounded by what is left of the deadline
            sock = connection.sock
            view = memoryview(wire)
            while view:  # counted, so that a failure knows whether any byte left (sendall does not say)
                _bound(sock, deadline.left(), socket.SO_SNDTIMEO)
                try:
                    sent = sock.send(view)
                except BlockingIOError as err:  # the kernel's SO_SNDTIMEO ran out
                    raise TimeoutError("timed out") from err
                connection.written += sent
                view = view[sent:]
            answer = io.BufferedReader(_Receiver(sock, deadline), RECEIVE_BYTES)
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
        _send_all(connection.sock, wire)
        with io.BufferedReader(_Receiver(connection.sock), RECEIVE_BYTES) as answer:
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

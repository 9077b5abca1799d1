"""HTTP/1.1 keep-alive connections to one server over the standard library's http.client.

The Kubernetes API is every step's busiest peer (a load event makes three to six requests), and
httpx's client and connection pool cost ~0.7-1.2 ms of CPU per request on top of the socket
work (request building, cookie extraction, the pool's scan of its connections): more than the
handler's own decisions. Here a request is a `http.client` round trip on a connection taken
from a small last-in-first-out stack of idle ones, so the hottest connection (and its TLS
session) is reused and at most `max_idle` stay open.

A kept connection the server has closed meanwhile (its idle timeout, a restart) shows as
readable before it is reused and is dropped (as httpcore and Go's transport check theirs); one
that fails before any answer arrived is retried once on a new connection, as a stale
keep-alive socket is not the server's answer (`replay=False`: reported instead). Failures are
raised as httpx's transport errors, so callers handle both transports alike. The embedded
stack's stand-ins send through the same connections (devstack/keepalive.py).
"""

from __future__ import annotations

import http.client
import select
import socket
import ssl
import threading
from collections.abc import Mapping
from typing import NamedTuple
from urllib.parse import urlsplit

import httpx

STALE = (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine, ssl.SSLEOFError)
"""What a kept connection the server closed raises on its next use (before any answer)."""


class Answer(NamedTuple):
    status: int
    body: bytes
    headers: Mapping[str, str]
    """Lower-cased names; a repeated header's values joined by ", " (RFC 9110 5.3)."""


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
        self._prefix = parts.path.rstrip("/")
        self._context = context if parts.scheme == "https" else None
        self._server_name = server_name
        self._timeouts = (connect_timeout, read_timeout)
        self._max_idle = max_idle
        self._replay = replay
        self._idle: list[_Connection] = []
        self._lock = threading.Lock()

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

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

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
        connection.request(method, self._prefix + target or "/", body=body, headers=dict(headers))
        response = connection.getresponse()
        content = response.read()
        if response.will_close:
            connection.close()
        return Answer(response.status, content, _headers(response.msg))

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
            if len(self._idle) < self._max_idle:
                self._idle.append(connection)
                return
        connection.close()


def _headers(message: http.client.HTTPMessage) -> dict[str, str]:
    found: dict[str, str] = {}
    for name, value in message.items():
        key = name.lower()
        found[key] = f"{found[key]}, {value}" if key in found else value
    return found


def _readable(sock: socket.socket) -> bool:
    """An idle keep-alive socket has nothing to read; readable means EOF (closed) or garbage."""
    try:
        ready, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(ready)

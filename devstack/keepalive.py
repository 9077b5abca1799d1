"""Keep-alive HTTP/1.1 requests to any loopback origin with the standard library's http.client:
the broker's deliveries, the sources' sends, the webhook relay's forwards (POSTs) and the upload
storm's PUTs. Written apart from the functions' own transport, so the two ends of every exchange
in the embedded stack are independent code.

One request at a time per connection, kept alive, as Go's `http.Transport` under Knative's
broker and adapters. An idle connection the server closed is discarded before reuse; a GET that
fails on a kept connection is sent once more on a new one, a POST is not (Go's transport replays
only idempotent requests, and these POSTs are the broker's to retry).
"""

from __future__ import annotations

import http.client
import select
import threading
import urllib.parse
from collections.abc import Callable
from typing import NamedTuple

__all__ = ["Answer", "Pools", "SendError"]

IDLE_PER_ORIGIN = 64
"""Idle connections kept per host:port (the broker here has 32 delivery threads, so this never
throttles)."""


PIECE = 1 << 20
IDEMPOTENT = frozenset({"GET", "HEAD"})
"""Sent again, once, when a kept connection fails under them (Go's transport does the same)."""


class Answer(NamedTuple):
    status: int
    body: bytes
    headers: dict[str, str]
    """Lower-cased names."""


class SendError(Exception):
    """No response: the connection failed, or the server closed it before answering."""


class Pools:
    """Idle connections per origin (scheme http only: every subscriber here is on loopback)."""

    def __init__(self, timeout_s: float = 30.0) -> None:
        self._timeout_s = timeout_s
        self._idle: dict[tuple[str, int], list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def post(self, url: str, headers: dict[str, str], body: bytes, timeout: float | None = None) -> Answer:
        """POST `body` to `url`; the whole answer, or SendError when there was none."""
        return self.request("POST", url, headers, body, timeout)

    def request(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        body: bytes | None,
        timeout: float | None = None,
        sink: Callable[[bytes], None] | None = None,
    ) -> Answer:
        """`method` with `body` to `url`; the whole answer, or SendError when there was none.
        With `sink`, a 2xx answer's body goes to it in pieces instead (never held whole)."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise SendError(f"unsupported URL {url!r}")
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        origin = (parts.hostname, parts.port or 80)
        connection, reused = self._take(origin)
        try:
            response, content = self._exchange(connection, method, target, headers, body, timeout, sink)
        except (OSError, http.client.HTTPException) as err:
            connection.close()
            if not (reused and method in IDEMPOTENT):
                raise SendError(f"{method} {url}: {err or type(err).__name__}") from err
            # a kept connection the server closed under the request: a GET once more, anew
            connection = http.client.HTTPConnection(*origin, timeout=self._timeout_s)
            try:
                response, content = self._exchange(connection, method, target, headers, body, timeout, sink)
            except (OSError, http.client.HTTPException) as again:
                connection.close()
                raise SendError(f"{method} {url}: {again or type(again).__name__}") from again
        answer = Answer(response.status, content, _joined(response.getheaders()))
        if response.will_close:
            connection.close()
        else:
            self._give_back(origin, connection)
        return answer

    def _exchange(
        self,
        connection: http.client.HTTPConnection,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes | None,
        timeout: float | None,
        sink: Callable[[bytes], None] | None,
    ) -> tuple[http.client.HTTPResponse, bytes]:
        connection.timeout = timeout or self._timeout_s
        if connection.sock is not None:
            connection.sock.settimeout(connection.timeout)
        connection.request(method, target, body=body, headers=headers)
        response = connection.getresponse()
        if sink is not None and 200 <= response.status < 300:
            while piece := response.read(PIECE):
                sink(piece)
            return response, b""
        return response, response.read()

    def _take(self, origin: tuple[str, int]) -> tuple[http.client.HTTPConnection, bool]:
        """A kept connection to `origin` (True) or a new one (False)."""
        with self._lock:
            if self._closed:
                raise SendError("client closed")
            idle = self._idle.setdefault(origin, [])
            while idle:
                connection = idle.pop()
                if connection.sock is not None and not _readable(connection):
                    return connection, True
                connection.close()  # closed by the server while idle
        return http.client.HTTPConnection(*origin, timeout=self._timeout_s), False

    def _give_back(self, origin: tuple[str, int], connection: http.client.HTTPConnection) -> None:
        with self._lock:
            idle = self._idle.setdefault(origin, [])
            if not self._closed and len(idle) < IDLE_PER_ORIGIN:
                idle.append(connection)
                return
        connection.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pools, self._idle = list(self._idle.values()), {}
        for idle in pools:
            for connection in idle:
                connection.close()


def _joined(headers: list[tuple[str, str]]) -> dict[str, str]:
    """Lower-cased names; a repeated header's values joined by ", " (RFC 9110 5.3)."""
    found: dict[str, str] = {}
    for name, value in headers:
        key = name.lower()
        found[key] = f"{found[key]}, {value}" if key in found else value
    return found


def _readable(connection: http.client.HTTPConnection) -> bool:
    """An idle connection with something to read was closed (or written to) by the server."""
    try:
        ready, _, _ = select.select([connection.sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(ready)

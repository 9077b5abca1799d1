"""Keep-alive HTTP/1.1 requests on pooled `http.client` connections: the broker's deliveries,
the sources' sends, the webhook relay's forwards (POSTs) and bench 15's uploads (PUTs).

Why not httpx: every stand-in of the embedded stack shares one interpreter (in a cluster the
broker, the sources and the API server are processes of their own), and an upload storm of
1,000 adapters makes ~11,000 deliveries and ~10,000 sends. httpx's layers cost several times
what the request itself does, and its pool checks every idle connection it holds on each
request (a `poll` per connection); in bench/upload_storm.py the broker's httpx deliveries were
the largest share of the stand-ins' CPU. The wire is the same: one request at a time per
connection, kept alive, as Go's `http.Transport` under Knative's broker and adapters.

A connection taken from the pool is first checked the way Go's transport and httpcore check
theirs: an idle connection that is readable has been closed by the server (or sent something
unasked), and is discarded before anything is written on it.
"""

from __future__ import annotations

import http.client
import select
import threading
import urllib.parse
from dataclasses import dataclass

IDLE_PER_ORIGIN = 64
"""Idle connections kept per host:port (Go's MaxIdleConnsPerHost in Knative's transports is
larger; the broker here has 32 delivery threads, so this never throttles)."""


class SendError(Exception):
    """No response: the connection failed, or the server closed it before answering."""


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    """Lower-cased names; a repeated header keeps its values joined by ", " (RFC 9110 5.3)."""
    body: bytes


def _headers(message: http.client.HTTPMessage) -> dict[str, str]:
    found: dict[str, str] = {}
    for name, value in message.items():
        key = name.lower()
        found[key] = f"{found[key]}, {value}" if key in found else value
    return found


def _stale(conn: http.client.HTTPConnection) -> bool:
    """An idle keep-alive connection with something to read is closed (EOF) or broken."""
    sock = conn.sock
    if sock is None:
        return True
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


class Pools:
    """Idle connections per origin (scheme http only: every subscriber here is on loopback)."""

    def __init__(self, timeout_s: float = 30.0) -> None:
        self._timeout_s = timeout_s
        self._idle: dict[tuple[str, int], list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def _take(self, origin: tuple[str, int], timeout: float) -> http.client.HTTPConnection:
        while True:
            with self._lock:
                if self._closed:
                    raise SendError("client closed")
                idle = self._idle.get(origin)
                conn = idle.pop() if idle else None
            if conn is None:
                return http.client.HTTPConnection(*origin, timeout=timeout)
            if not _stale(conn):
                if conn.sock is not None:
                    conn.sock.settimeout(timeout)
                return conn
            conn.close()

    def _give(self, origin: tuple[str, int], conn: http.client.HTTPConnection) -> None:
        with self._lock:
            idle = self._idle.setdefault(origin, [])
            if not self._closed and len(idle) < IDLE_PER_ORIGIN:
                idle.append(conn)
                return
        conn.close()

    def post(self, url: str, headers: dict[str, str], body: bytes, timeout: float | None = None) -> Answer:
        """POST `body` to `url`; the whole answer, or SendError when there was none."""
        return self.request("POST", url, headers, body, timeout)

    def request(
        self, method: str, url: str, headers: dict[str, str], body: bytes, timeout: float | None = None
    ) -> Answer:
        """`method` with `body` to `url`; the whole answer, or SendError when there was none."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise SendError(f"unsupported URL {url!r}")
        origin = (parts.hostname, parts.port or 80)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn = self._take(origin, self._timeout_s if timeout is None else timeout)
        try:
            conn.request(method, target, body=body, headers=headers)
            response = conn.getresponse()
            content = response.read()
        except (OSError, http.client.HTTPException) as err:
            conn.close()
            raise SendError(f"{type(err).__name__}: {err}") from err
        if response.will_close:
            conn.close()
        else:
            self._give(origin, conn)
        return Answer(response.status, _headers(response.msg), content)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()

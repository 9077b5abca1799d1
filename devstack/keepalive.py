"""Keep-alive HTTP/1.1 requests to any loopback origin: the broker's deliveries, the sources'
sends, the webhook relay's forwards (POSTs) and bench 15's uploads (PUTs).

Why not httpx: every stand-in of the embedded stack shares one interpreter (in a cluster the
broker, the sources and the API server are processes of their own), and an upload storm of
1,000 adapters makes ~11,000 deliveries and ~10,000 sends. httpx's layers cost several times
what the request itself does, and its pool checks every idle connection it holds on each
request (a `poll` per connection); in bench/upload_storm.py the broker's httpx deliveries were
the largest share of the stand-ins' CPU. The wire is the same: one request at a time per
connection, kept alive, as Go's `http.Transport` under Knative's broker and adapters.

The connections are the functions' own (`functions.adapters.keepalive.KeepAlive`, one per
origin): an idle connection found readable was closed by the server and is discarded before
anything is written on it. A request that fails on a kept connection is not sent again: Go's
transport replays only idempotent requests, and these POSTs are the broker's to retry.
"""

from __future__ import annotations

import threading
import urllib.parse

import httpx

from functions.adapters.keepalive import Answer, KeepAlive

__all__ = ["Answer", "Pools", "SendError"]

IDLE_PER_ORIGIN = 64
"""Idle connections kept per host:port (Go's MaxIdleConnsPerHost in Knative's transports is
larger; the broker here has 32 delivery threads, so this never throttles)."""


class SendError(Exception):
    """No response: the connection failed, or the server closed it before answering."""


class Pools:
    """Idle connections per origin (scheme http only: every subscriber here is on loopback)."""

    def __init__(self, timeout_s: float = 30.0) -> None:
        self._timeout_s = timeout_s
        self._origins: dict[tuple[str, int], KeepAlive] = {}
        self._lock = threading.Lock()
        self._closed = False

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
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        origin = self._origin(parts.hostname, parts.port or 80)
        try:
            return origin.request(method, target, headers, body, timeout)
        except httpx.HTTPError as err:
            raise SendError(str(err)) from err

    def _origin(self, host: str, port: int) -> KeepAlive:
        with self._lock:
            if self._closed:
                raise SendError("client closed")
            found = self._origins.get((host, port))
            if found is None:
                found = self._origins[(host, port)] = KeepAlive(
                    f"http://{host}:{port}",
                    connect_timeout=self._timeout_s,
                    read_timeout=self._timeout_s,
                    max_idle=IDLE_PER_ORIGIN,
                    replay=False,
                )
            return found

    def close(self) -> None:
        with self._lock:
            self._closed = True
            origins, self._origins = self._origins, {}
        for origin in origins.values():
            origin.close()

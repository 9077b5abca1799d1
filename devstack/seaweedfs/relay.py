"""Where a shared filer's webhook posts: forwards each delivery to the ingest functions that
subscribed, as they are.

A filer reads its webhook endpoint once, at start; the test session starts one filer and many
stacks (one after the other), so the filer posts here and each stack subscribes its own ingest
for its lifetime. The body and the `Content-Type` and `Authorization` headers are forwarded
unchanged; the filer gets the worst answer of the subscribers (503 when none is subscribed:
nobody would have received it), and like the filer this relay never retries.

`await_key(key)` is the barrier `Stack.settle()` stands on: the filer's webhook queue runs one
worker (devstack.seaweedfs.server.Webhook), so once a marker written after some uploads has
been delivered, so has every notification of those uploads.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import deque
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from devstack.http_handler import StandInHandler
from devstack.keepalive import Pools, SendError

FORWARDED = ("Content-Type", "Authorization", "User-Agent")


class WebhookRelay:
    def __init__(self, host: str = "127.0.0.1", timeout: float = 10.0) -> None:
        self._subscribers: list[str] = []
        self._lock = threading.Lock()
        # pooled http.client, not httpx: the relay shares its interpreter with every stand-in,
        # and an upload storm forwards two notifications per adapter (devstack.keepalive)
        self._http = Pools(timeout)
        self.delivered = 0
        self._seen: deque[str] = deque(maxlen=256)
        self._seen_changed = threading.Condition(self._lock)
        self._server = ThreadingHTTPServer((host, 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[0], self._server.server_address[1]
        host = host.decode() if isinstance(host, bytes) else host
        return f"http://{host}:{port}/"

    @contextlib.contextmanager
    def subscribed(self, url: str) -> Iterator[None]:
        with self._lock:
            self._subscribers.append(url)
        try:
            yield
        finally:
            with self._lock:
                self._subscribers.remove(url)

    def start(self) -> WebhookRelay:
        self._thread = threading.Thread(target=self._server.serve_forever, name="webhook-relay", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._http.close()

    def deliveries(self, key: str) -> int:
        """How many of the last 256 deliveries were for `key` (the filer's attempts)."""
        with self._lock:
            return sum(1 for seen in self._seen if seen == key)

    def await_key(self, key: str, timeout: float) -> bool:
        """Wait until a notification for `key` went through (True) or `timeout` passed."""
        deadline = time.monotonic() + timeout
        with self._seen_changed:
            while key not in self._seen:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._seen_changed.wait(left)
        return True

    def _deliver(self, body: bytes, headers: dict[str, str]) -> int:
        with self._lock:
            targets = list(self._subscribers)
        worst = 503 if not targets else 0
        for url in targets:
            try:
                status = self._http.post(url, headers, body).status
            except SendError:
                status = 502
            worst = max(worst, status)
        with self._seen_changed:
            self.delivered += 1
            self._seen.append(_key_of(body))
            self._seen_changed.notify_all()
        return worst

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        relay = self

        class Handler(StandInHandler):  # the stand-ins' cheaper head (two posts an upload)
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k in FORWARDED if (v := self.headers.get(k)) is not None}
                self.respond(relay._deliver(body, headers), [("Content-Length", "0")])

        return Handler


def _key_of(body: bytes) -> str:
    try:
        message = json.loads(body)
    except ValueError:
        return ""
    return str(message.get("key", "")) if isinstance(message, dict) else ""

"""A hostile pod: an HTTP server that answers like no engine does, for the hostile tier.

Not a stand-in of anything real: it is the attacker (or the broken pod) that loraflow must
survive. It answers every path with the same chosen misbehaviour:
- `garbage`:      200 `{"data": 5}`
- `no-id`:        200, an adapter card without `id`
- `deep`:         200, JSON nested 100,000 levels deep
- `huge`:         200, a well-formed listing of `size` bytes (Content-Length declared)
- `endless`:      200, chunked, never ends (bytes keep coming as fast as they are read)
- `trickle`:      200, one byte per `interval` seconds, forever
- `gzip-bomb`:    200, `Content-Encoding: gzip`, 254 KiB that inflate to ~256 MiB
- `silent`:       accepts the connection and never answers
It counts the requests it got, so a test can say it was never called.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def _bomb() -> bytes:
    return gzip.compress(b"\0" * (256 << 20), compresslevel=9)


class HostilePod:
    def __init__(self, host: str, mode: str, size: int = 20 << 20, interval: float = 1.0) -> None:
        self.mode = mode
        self.size = size
        self.interval = interval
        self.requests: list[tuple[str, str]] = []
        self._stop = threading.Event()
        self._bomb = _bomb() if mode == "gzip-bomb" else b""
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                owner.answer(self)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(min(length, 1 << 20))
                owner.answer(self)

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self.host, self.port = host, self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> HostilePod:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> HostilePod:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        self.requests.append((handler.command, handler.path))
        # the client hanging up is exactly what a bounded client does
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            getattr(self, "_" + self.mode.replace("-", "_"))(handler)

    def _send(self, handler: BaseHTTPRequestHandler, body: bytes, **headers: str) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        for key, value in headers.items():
            handler.send_header(key.replace("_", "-"), value)
        handler.end_headers()
        handler.wfile.write(body)

    def _garbage(self, handler: BaseHTTPRequestHandler) -> None:
        self._send(handler, b'{"data": 5}')

    def _no_id(self, handler: BaseHTTPRequestHandler) -> None:
        self._send(handler, json.dumps({"data": [{"root": "/x", "parent": "base"}]}).encode())

    def _deep(self, handler: BaseHTTPRequestHandler) -> None:
        self._send(handler, b'{"data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")

    def _huge(self, handler: BaseHTTPRequestHandler) -> None:
        card = b'{"id": "x", "root": "/x", "parent": "base"}, '
        cards = card * (self.size // len(card))
        self._send(handler, b'{"data": [' + cards + b'{"id": "y", "parent": "base"}]}')

    def _gzip_bomb(self, handler: BaseHTTPRequestHandler) -> None:
        self._send(handler, self._bomb, Content_Encoding="gzip")

    def _chunked(self, handler: BaseHTTPRequestHandler, piece: bytes, pause: float) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        handler.wfile.write(b"1\r\n{\r\n")
        while not self._stop.is_set():
            handler.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            handler.wfile.flush()
            if pause:
                time.sleep(pause)

    def _endless(self, handler: BaseHTTPRequestHandler) -> None:
        self._chunked(handler, b" " * 65536, 0.0)

    def _trickle(self, handler: BaseHTTPRequestHandler) -> None:
        self._chunked(handler, b" ", self.interval)

    def _silent(self, handler: BaseHTTPRequestHandler) -> None:
        self._stop.wait()

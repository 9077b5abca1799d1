"""A small HTTP proxy in front of the real filer that injects the faults the suites need.

Every request is forwarded to the filer unchanged (method, path and query as sent, headers but
the hop-by-hop ones, the body: a chunked upload is re-framed with its length) and the filer's
answer is streamed back, unless a fault matches first:

- `status`: answer that status (with the filer's JSON error shape) instead of forwarding;
- `delay_s`: wait, then forward (a slow filer; `listing=True` slows only directory listings);
- `reset`: close the connection without answering (TCP RST), as a crashed pod does;
- `stall`: read the request and answer nothing until the client gives up (or the fault is
  cleared), as a filer wedged on its store does;
- `cut_after`: forward, then reset the connection once that many bytes of the answer's body
  went out, as a filer that crashes mid-download does.

A fault matches by method, path prefix (compared on the decoded path) and kind of request
(`listing`: a GET that asks for `Accept: application/json`, which is how the filer tells a
listing from a download), and fires `times` times (None: until `clear_faults()`).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import struct
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "host",
}
CHUNK = 1 << 16


@dataclass
class Fault:
    status: int | None = None
    delay_s: float = 0.0
    reset: bool = False
    stall: bool = False
    cut_after: int | None = None
    times: int | None = 1
    methods: tuple[str, ...] | None = None
    path_prefix: str | None = None
    listing: bool | None = None
    fired: int = field(default=0, init=False)

    def matches(self, method: str, path: str, listing: bool) -> bool:
        if self.methods is not None and method not in self.methods:
            return False
        if self.path_prefix is not None and not path.startswith(self.path_prefix):
            return False
        return self.listing is None or self.listing == listing


class FaultProxy:
    """`url` is what clients use; `upstream` is the real filer behind it."""

    def __init__(self, upstream: str, host: str = "127.0.0.1", port: int = 0, stall_s: float = 60.0) -> None:
        parts = urllib.parse.urlsplit(upstream)
        self.upstream = upstream.rstrip("/")
        self._target = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._faults: list[Fault] = []
        self._lock = threading.Lock()
        self._released = threading.Event()
        self.stall_s = stall_s
        self.requests = 0
        self.faults_fired = 0
        self._server = ThreadingHTTPServer((host, port), self._handler_class())
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[0], self._server.server_address[1]
        host = host.decode() if isinstance(host, bytes) else host
        return f"{self.scheme}://{host}:{port}"

    scheme = "http"

    # -- faults ----------------------------------------------------------------------------------
    def inject(
        self,
        status: int | None = None,
        *,
        delay_s: float = 0.0,
        reset: bool = False,
        stall: bool = False,
        cut_after: int | None = None,
        times: int | None = 1,
        methods: tuple[str, ...] | None = None,
        path_prefix: str | None = None,
        listing: bool | None = None,
    ) -> Fault:
        if status is None and cut_after is None and not (delay_s or reset or stall):
            raise ValueError("a fault needs a status, a delay, a reset, a stall or a cut")
        fault = Fault(status, delay_s, reset, stall, cut_after, times, methods, path_prefix, listing)
        with self._lock:
            self._faults.append(fault)
            self._released.clear()
        return fault

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()
            self._released.set()  # stalled requests give up now

    def _take(self, method: str, path: str, listing: bool) -> Fault | None:
        with self._lock:
            self.requests += 1
            for fault in self._faults:
                if fault.matches(method, path, listing):
                    fault.fired += 1
                    self.faults_fired += 1
                    if fault.times is not None and fault.fired >= fault.times:
                        self._faults.remove(fault)
                    return fault
        return None

    # -- server ----------------------------------------------------------------------------------
    def start(self) -> FaultProxy:
        self._thread = threading.Thread(target=self._server.serve_forever, name="filer-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.clear_faults()
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # the head and the body go out as separate writes: with Nagle the body would wait
            # for the client's delayed ACK of the head
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _any(self) -> None:
                proxy._serve(self)

            def finish(self) -> None:
                with contextlib.suppress(OSError):  # a reset fault closed the socket already
                    super().finish()

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = do_PATCH = do_OPTIONS = _any

        return Handler

    def _serve(self, request: BaseHTTPRequestHandler) -> None:
        body = _read_body(request)
        path = urllib.parse.unquote(urllib.parse.urlsplit(request.path).path)
        listing = request.command == "GET" and request.headers.get("Accept", "") == "application/json"
        fault = self._take(request.command, path, listing)
        if fault is not None:
            if fault.reset:
                _reset(request)
                return
            if fault.stall:
                self._released.wait(self.stall_s)
                _reset(request)
                return
            if fault.delay_s:
                time.sleep(fault.delay_s)
            if fault.status is not None:
                _answer(request, fault.status, {"error": f"injected fault: HTTP {fault.status}"})
                return
        self._forward(request, body, None if fault is None else fault.cut_after)

    def _forward(self, request: BaseHTTPRequestHandler, body: bytes, cut_after: int | None = None) -> None:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        connection = self._connect()
        try:
            connection.request(request.command, request.path, body=body or None, headers=headers)
            upstream = connection.getresponse()
        except OSError as err:
            self._unreachable(request, err)
            connection.close()
            return
        try:
            request.send_response(upstream.status, upstream.reason)
            for key, value in upstream.getheaders():
                if key.lower() not in HOP_BY_HOP:
                    request.send_header(key, value)
            length = upstream.getheader("Content-Length")
            if request.command == "HEAD" or upstream.status in (204, 304):
                if length is not None:
                    request.send_header("Content-Length", length)
                request.end_headers()
                return
            if length is not None:
                request.send_header("Content-Length", length)
                request.end_headers()
                for chunk in _chunks(upstream, cut_after):
                    request.wfile.write(chunk)
            else:
                request.send_header("Transfer-Encoding", "chunked")
                request.end_headers()
                for chunk in _chunks(upstream, cut_after):
                    request.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            if cut_after is not None:
                request.wfile.flush()
                _reset(request)
            elif length is None:
                request.wfile.write(b"0\r\n\r\n")
        except OSError:
            request.close_connection = True  # the client went away mid-answer
        finally:
            connection.close()

    def _connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(*self._target, timeout=120)

    def _unreachable(self, request: BaseHTTPRequestHandler, err: OSError) -> None:
        _answer(request, 502, {"error": f"filer unreachable behind the proxy: {err}"})


def _read_body(request: BaseHTTPRequestHandler) -> bytes:
    if request.headers.get("Transfer-Encoding", "").lower() == "chunked":
        parts: list[bytes] = []
        while True:
            size = int(request.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while request.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(parts)
            parts.append(request.rfile.read(size))
            request.rfile.readline()
    length = int(request.headers.get("Content-Length") or 0)
    return request.rfile.read(length) if length else b""


def _chunks(response: http.client.HTTPResponse, cut_after: int | None = None) -> Iterator[bytes]:
    """What has arrived, as soon as it arrives (a watch's events must not wait for a full
    buffer); with `cut_after`, no more than that many bytes in all."""
    left = cut_after
    while (left is None or left > 0) and (
        chunk := response.read1(CHUNK if left is None else min(CHUNK, left))
    ):
        if left is not None:
            left -= len(chunk)
        yield chunk


def _answer(request: BaseHTTPRequestHandler, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    request.send_response(status)
    request.send_header("Content-Type", "application/json")
    request.send_header("Content-Length", str(len(data)))
    request.end_headers()
    request.wfile.write(data)


def _reset(request: BaseHTTPRequestHandler) -> None:
    """Close with SO_LINGER 0: the peer sees a connection reset, not an orderly end."""
    request.close_connection = True
    with contextlib.suppress(OSError):
        request.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        request.connection.close()

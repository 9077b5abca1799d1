"""HTTP/1.1 keep-alive transport: a threading server that tracks its connections."""

from __future__ import annotations

import contextlib
import json
import select
import socket
import ssl
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from typing import Any

from devstack.http_handler import StandInHandler
from devstack.standins.kube.api import Api, Response
from devstack.standins.kube.routing import Request

_DISCARD_CHUNK = 64 * 1024


class KubeHTTPServer(ThreadingHTTPServer):
    """Handler threads are joined on close; open sockets are shut down to unblock them."""

    daemon_threads = False
    block_on_close = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], api: Api, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(address, Handler)
        self.api = api
        if tls is not None:
            self.socket = tls.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()

    def track(self, connection: socket.socket, add: bool) -> None:
        with self.connections_lock:
            if add:
                self.connections.add(connection)
            else:
                self.connections.discard(connection)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client gone away (reset, broken pipe) is its own doing, not the server's failure:
        the apiserver drops such a connection silently. Anything else is printed as before."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)

    def close_connections(self) -> None:
        with self.connections_lock:
            for connection in self.connections:
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)


class Handler(StandInHandler):
    """Translates HTTP requests to `Api.handle` and writes JSON or chunked watch streams."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: KubeHTTPServer

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, True)

    def finish(self) -> None:
        self.server.track(self.connection, False)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        """Silence per-request logging (benchmarks)."""

    def _request(self) -> Request:
        """A body over the apiserver's limit is never held: its Content-Length says so up front."""
        length = int(self.headers.get("Content-Length") or 0)
        headers = dict(self.headers.items())
        limit = self.server.api.max_request_body_bytes
        if length > limit:
            self._discard(length)
            return Request.parse(self.command, self.path, headers, b"", body_limit_exceeded=limit)
        body = self.rfile.read(length) if length else b""
        return Request.parse(self.command, self.path, headers, body)

    def _discard(self, length: int) -> None:
        """Read and drop `length` body bytes a chunk at a time. Left unread, they would be parsed
        as the next keep-alive request, or closing on them would reset the connection before the
        client (which sends its whole body first) reads the 413; kubectl speaks HTTP/2, where the
        apiserver just resets the stream."""
        while length > 0:
            chunk = self.rfile.read(min(length, _DISCARD_CHUNK))
            if not chunk:
                self.close_connection = True
                return
            length -= len(chunk)

    def _serve(self) -> None:
        started = time.thread_time()  # this thread's CPU: a client slow to read costs none
        api = self.server.api
        api.counters.current.key = None
        response = api.handle(self._request())
        if response.stream is not None:
            self._stream(response)
        else:
            self._send(response)
            api.counters.spent(time.thread_time() - started)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

    def _send(self, response: Response) -> None:
        payload = (
            response.raw
            if response.raw is not None
            else json.dumps(response.body, separators=(",", ":")).encode()
        )
        head = [("Content-Type", response.content_type), ("Content-Length", str(len(payload)))]
        self.respond(response.status, head + list(response.headers.items()), payload)
        self.wfile.flush()  # now, not after `_serve`: the request's CPU includes its write

    def _alive(self) -> bool:
        """The client has not closed its end (a readable socket with no data = EOF)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return True
            if isinstance(self.connection, ssl.SSLSocket):
                return False  # a watching client only sends a TLS close_notify
            return bool(self.connection.recv(1, socket.MSG_PEEK))
        except (OSError, ValueError):
            return False

    def _stream(self, response: Response) -> None:
        """Chunked transfer encoding, one watch event per chunk (like the apiserver)."""
        assert response.stream is not None
        lines = response.stream.lines(self._alive)
        self.send_response(200)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Transfer-Encoding", "chunked")
        # The connection ends with the stream: say so, or a pooled client (urllib3, shared by
        # watches and plain requests in the kubernetes client) reuses it and sees
        # RemoteDisconnected on its next request (RFC 9112 section 9.6).
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        try:
            self.wfile.flush()
            for line in lines:
                self._chunk(line)
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            return

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

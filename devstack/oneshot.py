"""A response's status line, headers and body in one socket write.

`BaseHTTPRequestHandler` writes unbuffered by default (`wbufsize = 0`): the header block is one
`send` and the body another, so each response is two syscalls and, over TLS (the Kubernetes
stand-in), two TLS records. The stand-ins share one interpreter here, so that doubled cost is
paid by all of them. Buffering the writer changes nothing on the wire but the segmenting (TCP
is a byte stream): `handle_one_request` flushes after every request, `finish()` at the end of a
connection, and a streamed response (a watch) flushes each chunk itself.
"""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler

WRITE_BUFFER = 64 * 1024
"""Larger bodies go out in writes of this size (io.BufferedWriter writes through what exceeds it)."""


class OneWriteHandler(BaseHTTPRequestHandler):
    wbufsize = WRITE_BUFFER

    def handle_expect_100(self) -> bool:
        """The interim `100 Continue` must reach the client before it sends the body."""
        answered = super().handle_expect_100()
        self.wfile.flush()
        return answered

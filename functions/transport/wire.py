"""One HTTP/1.1 request written and its answer read, as http.client does, without its layers.

functions/transport/keepalive.py sends every request of functions/ through it. http.client
builds a request header by header and reads the answer's headers through the email package's
parser; here the request is one join and the answer is read line by line.

What `read_answer` returns equals what http.client's `HTTPResponse.begin` and `read` give for
the same bytes: status, body, headers, and whether the connection must close
(tests/unit/test_wire.py holds them equal over generated answers). Its limits are
http.client's: 65,536 bytes per line, 100 headers. A header line without a colon, which
http.client passes to the email parser as a defect, is refused here (`BadStatusLine`): the
API server and the filer never send one. An engine that does fails that call, as any other
malformed answer does.
"""

from __future__ import annotations

import http.client
import re
from collections.abc import Mapping
from typing import NamedTuple, Protocol

MAX_LINE = 65536
MAX_HEADERS = 100
_NO_BODY = frozenset({204, 304})
_NOT_IN_TARGET = re.compile("[\x00-\x20\x7f]")
"""What http.client refuses in a request target (controls and space: no request splitting)."""


class Reader(Protocol):
    """A buffered binary file, as `socket.makefile("rb")` gives (io.BufferedReader)."""

    def readline(self, size: int = -1, /) -> bytes: ...
    def read(self, size: int = -1, /) -> bytes: ...
    def read1(self, size: int = -1, /) -> bytes: ...
    def readinto(self, buffer: memoryview, /) -> int: ...
    def close(self) -> None: ...


class Head(NamedTuple):
    status: int
    headers: dict[str, str]
    """Lower-cased names; a repeated header's values joined by ", " (RFC 9110 5.3)."""
    will_close: bool
    chunked: bool = False
    length: int | None = None
    """The body's length when declared (0: none); None: chunked, or to the end."""


def request_bytes(
    method: str, target: str, authority: str, headers: Mapping[str, str], body: bytes | None
) -> bytes:
    """The request as http.client sends it: `Host` and `Accept-Encoding: identity` unless given,
    `Content-Length` for a body (0 for a POST, PUT or PATCH without one)."""
    if _NOT_IN_TARGET.search(target) or _NOT_IN_TARGET.search(method):
        raise http.client.InvalidURL(f"a control character or space in {method} {target[:200]!r}")
    given = {name.lower() for name in headers}
    lines = [f"{method} {target} HTTP/1.1"]
    if "host" not in given:
        lines.append(f"Host: {authority}")
    if "accept-encoding" not in given:
        lines.append("Accept-Encoding: identity")
    if "content-length" not in given and "transfer-encoding" not in given:
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        elif method in ("POST", "PUT", "PATCH"):
            lines.append("Content-Length: 0")
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
            raise ValueError(f"invalid header {name!r}")  # http.client refuses these too
        lines.append(f"{name}: {value}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + body if body else head


def read_answer(fp: Reader, method: str) -> tuple[Head, bytes]:
    """The answer on `fp` to a `method` request: its head and its whole body."""
    head = read_head(fp, method)
    return head, Body(fp, head).read()


def read_head(fp: Reader, method: str) -> Head:
    """The status line and headers of the answer on `fp` (a 100 Continue skipped), and its
    body's framing; the body is left on `fp` for `Body`."""
    while True:
        line = _line(fp, "status line")
        if not line:
            raise http.client.RemoteDisconnected("Remote end closed connection without response")
        version, status = _status(line)
        headers, first = _read_headers(fp)
        if status != 100:  # http.client skips a 100 Continue (and only that) to the next answer
            break
    encoding = first.get("transfer-encoding")
    chunked = encoding is not None and encoding.lower() == "chunked"
    length = None if chunked else _length(first.get("content-length"))
    if status in _NO_BODY or 100 <= status < 200 or method == "HEAD":
        length = 0  # http.client still reads a chunked body after a 204 or 304
    will_close = _will_close(version, first) or (not chunked and length is None)
    if method == "HEAD":
        chunked = False
    return Head(status, headers, will_close, chunked, length)


class Body:
    """An answer's body on `fp` within its framing (Content-Length, chunked, or to the end),
    whole (`read`), as each receive brings it (`read1`, for a caller that caps it), or into
    the caller's buffer (`readinto`, for a caller that streams it)."""

    def __init__(self, fp: Reader, head: Head) -> None:
        self._fp = fp
        self._chunked = head.chunked
        self._left = head.length
        """Bytes left of the body (chunked: of the current chunk); None: to the end."""
        self._chunks = 0
        self.done = not head.chunked and head.length == 0
        """Read to its end: the connection is where the next answer starts."""

    def close(self) -> None:
        """Let go of `fp` (a socket's file holds its socket open until it is closed)."""
        self._fp.close()

    def read(self) -> bytes:
        if self.done:
            return b""
        if self._chunked:
            return b"".join(iter(self.read1, b""))
        if self._left is None:
            self.done = True
            return self._fp.read()  # to the end: the server closes the connection
        body = self._fp.read(self._left)
        if len(body) < self._left:
            raise http.client.IncompleteRead(body, self._left - len(body))
        self._left, self.done = 0, True
        return body

    def read1(self, size: int = 1 << 16) -> bytes:
        """The next piece, at most `size` bytes and at most one receive; b"" at the end."""
        if self.done:
            return b""
        if self._chunked and not self._left and not self._next_chunk():
            return b""
        want = size if self._left is None else min(size, self._left)
        piece = self._fp.read1(want)
        if self._left is None:
            self.done = not piece
            return piece
        if not piece:
            raise http.client.IncompleteRead(b"", self._left)
        self._left -= len(piece)
        self.done = not self._chunked and not self._left
        return piece

    def readinto(self, buffer: memoryview) -> int:
        """Fill `buffer` with the body's next bytes, received straight into it (no piece made
        and joined); fewer only at the body's end, 0 past it."""
        filled = 0
        while filled < len(buffer) and not self.done:
            if self._chunked and not self._left and not self._next_chunk():
                break
            room = len(buffer) - filled
            want = room if self._left is None else min(room, self._left)
            got = self._fp.readinto(buffer[filled : filled + want])
            if self._left is None:
                self.done = got < want  # to the end: the server closed the connection
            elif got < want:
                raise http.client.IncompleteRead(b"", self._left - got)
            else:
                self._left -= got
                self.done = not self._chunked and not self._left
            filled += got
        return filled

    def _next_chunk(self) -> bool:
        """Past the CRLF that ends a chunk, the next one's size line; False (and the trailers
        read and dropped, as http.client does) at the last chunk."""
        if self._chunks and len(self._fp.read(2)) < 2:
            raise http.client.IncompleteRead(b"", 2)
        self._chunks += 1
        line = _line(self._fp, "chunk size")
        try:
            size = int(line.split(b";", 1)[0], 16)
        except ValueError:
            raise http.client.IncompleteRead(b"") from None
        if size < 0:
            raise http.client.IncompleteRead(b"")  # http.client would read to the end
        if size == 0:
            while _line(self._fp, "trailer line") not in (b"\r\n", b"\n", b""):
                pass
            self.done = True
            return False
        self._left = size
        return True


def _line(fp: Reader, what: str) -> bytes:
    line = fp.readline(MAX_LINE + 1)
    if len(line) > MAX_LINE:
        raise http.client.LineTooLong(what)
    return line


def _status(line: bytes) -> tuple[int, int]:
    text = line.decode("iso-8859-1")
    parts = text.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/"):
        raise http.client.BadStatusLine(text)
    try:
        status = int(parts[1])
    except ValueError:
        raise http.client.BadStatusLine(text) from None
    if not 100 <= status <= 999:
        raise http.client.BadStatusLine(text)
    if parts[0] == "HTTP/1.0":
        return 10, status
    if parts[0].startswith("HTTP/1."):
        return 11, status
    raise http.client.UnknownProtocol(parts[0])


def _read_headers(fp: Reader) -> tuple[dict[str, str], dict[str, str]]:
    """The headers joined, and each name's first value (what http.client's framing reads)."""
    found: dict[str, str] = {}
    first: dict[str, str] = {}
    count = 0
    while True:
        line = _line(fp, "header line")
        if line in (b"\r\n", b"\n", b""):
            return found, first
        count += 1
        if count > MAX_HEADERS:
            raise http.client.HTTPException(f"got more than {MAX_HEADERS} headers")
        name, colon, value = line.decode("iso-8859-1").partition(":")
        if not colon or name[:1] in (" ", "\t"):
            raise http.client.BadStatusLine(line.decode("iso-8859-1"))  # no header: see above
        key = name.lower()
        value = value.lstrip(" \t").rstrip("\r\n")  # the email parser's own trimming
        if key in found:
            found[key] = f"{found[key]}, {value}"
        else:
            found[key] = first[key] = value


def _will_close(version: int, first: dict[str, str]) -> bool:
    connection = first.get("connection")
    if version == 11:
        return bool(connection) and "close" in (connection or "").lower()
    return not (
        (connection and "keep-alive" in connection.lower())
        or first.get("keep-alive")
        or "keep-alive" in first.get("proxy-connection", "").lower()
    )


def _length(value: str | None) -> int | None:
    if not value:
        return None
    try:
        length = int(value)
    except ValueError:
        return None
    return length if length >= 0 else None

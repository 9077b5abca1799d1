"""The HTTP/1.1 request handler the embedded stack's servers share (the engine stand-ins, the
broker, the webhook relay): `http.server`'s, with the request head held to RFC 9112 as Go's
`net/http` holds it (Knative's broker and the SeaweedFS filer are Go servers).

- **In: the request head read line by line, strictly.** A request line of exactly method,
  target and HTTP/1.x; header lines `name: value` with a token for a name and no control
  character but a tab in the value, its surrounding whitespace trimmed; an obsolete line
  folding replaced by a space (RFC 9112 section 5.2); a line over MAX_LINE or more than
  MAX_HEADERS headers is a 431 (the limits `http.client` keeps); anything else malformed is a
  400 and the connection is closed. The headers land in a `RequestHeaders`: an `HTTPMessage`
  whose lookups are one dict read.
- **Out: a response in one write.** The head (status line, Server and Date, the headers, the
  blank line) is formatted at once and buffered with the body; `handle_one_request` flushes
  after every request, `finish()` at the end of a connection, and a streamed response flushes
  each chunk itself.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Iterator
from email.utils import formatdate
from http import HTTPStatus
from http.client import HTTPMessage
from http.server import BaseHTTPRequestHandler
from io import BufferedIOBase
from typing import Any, TypeVar

_T = TypeVar("_T")

WRITE_BUFFER = 64 * 1024
"""Larger bodies go out in writes of this size (io.BufferedWriter writes through what exceeds it)."""
MAX_LINE = 65536
MAX_HEADERS = 100
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""RFC 9110 section 5.1: a field name is a token."""
_VERSION = re.compile(r"HTTP/1\.[0-9]")
_END = (b"\r\n", b"\n", b"")
_OWS = " \t"
"""RFC 9110 section 5.6.3: optional whitespace around a field value, not part of it."""
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
"""RFC 9110 section 5.5: no control character but HTAB in a field value (a bare CR or a NUL is
how a header is smuggled past one parser into another)."""


class BadHead(Exception):
    """The request head breaks RFC 9112: answered with `status`, the connection then closed."""

    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class RequestHeaders(HTTPMessage):
    """A request's header block as read: `HTTPMessage`'s answers, from a dict of each name's
    first value (what `Message.get` returns) rather than a scan that re-parses every header.
    The values are `str` decoded from ISO-8859-1 with no surrogates, so the `compat32` policy
    would return them unchanged. Built once by `read_headers`; not meant to be changed after
    (a change through `Message`'s other methods would not reach the index)."""

    def __init__(self, fields: list[tuple[str, str]]) -> None:
        super().__init__()
        self._headers = fields  # Message's own list: everything else it offers still works
        first: dict[str, str] = {}
        for name, value in fields:
            first.setdefault(name.lower(), value)
        self._first = first

    def get(self, name: str, failobj: Any = None) -> Any:
        return self._first.get(name.lower(), failobj)

    def __getitem__(self, name: str) -> Any:
        return self._first.get(name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._first

    def __len__(self) -> int:
        return len(self._headers)

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in self._headers)

    def keys(self) -> list[str]:
        return [name for name, _ in self._headers]

    def values(self) -> list[str]:
        return [value for _, value in self._headers]

    def items(self) -> list[tuple[str, str]]:
        return list(self._headers)

    def get_all(self, name: str, failobj: _T | None = None) -> list[str] | _T | None:  # type: ignore[override]
        lowered = name.lower()
        found = [value for key, value in self._headers if key.lower() == lowered]
        return found or failobj


_date: tuple[int, str] = (0, "")


def http_date() -> str:
    """`Date` as `date_time_string` renders it (RFC 9110 IMF-fixdate), formatted once a second."""
    global _date
    now = int(time.time())
    if _date[0] != now:
        _date = (now, formatdate(now, usegmt=True))
    return _date[1]


class StandInHandler(BaseHTTPRequestHandler):
    wbufsize = WRITE_BUFFER
    raw_requestline: bytes  # set by `handle_one_request` before it calls `parse_request`

    def parse_request(self) -> bool:
        """Sets `command`, `path`, `request_version`, `headers` and `close_connection` as the
        stdlib's does; on a malformed head answers its error (the connection then closes)."""
        self.command = ""  # no method read yet (send_error then writes its body)
        # an answer to a malformed request line has a status line too (as Go's has), not the
        # stdlib's bare HTTP/0.9 body
        self.request_version = "HTTP/1.1"
        self.close_connection = True
        self.requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        if not self.requestline:
            return False  # a blank line between requests: the stdlib closes quietly too
        try:
            self.command, self.path, self.request_version = request_line(self.requestline)
            self.headers = read_headers(self.rfile)
        except BadHead as bad:
            self.send_error(bad.status, str(bad))
            return False
        persistent = self.protocol_version >= "HTTP/1.1"
        connection = self.headers.get("Connection", "").lower()
        wanted = self.request_version != "HTTP/1.0" or connection == "keep-alive"
        self.close_connection = connection == "close" or not (persistent and wanted)
        expect = self.headers.get("Expect", "").lower()
        if expect == "100-continue" and persistent and self.request_version != "HTTP/1.0":
            return self.handle_expect_100()
        return True

    def respond(
        self, status: int, headers: Iterable[tuple[str, str]], body: bytes = b"", *, stamped: bool = True
    ) -> None:
        """The answer as `send_response` (`send_response_only` unless `stamped`), `send_header`
        for each of `headers`, `end_headers` and one write of `body` would send it, the
        request logged and `Connection` honoured as they do; the writer is flushed after the
        request (by `handle_one_request`)."""
        self.log_request(status)
        phrase = self.responses[status][0] if status in self.responses else ""
        head = [f"{self.protocol_version} {int(status)} {phrase}\r\n"]
        if stamped:
            head.append(f"Server: {self.version_string()}\r\nDate: {http_date()}\r\n")
        for name, value in headers:
            head.append(f"{name}: {value}\r\n")
            if name.lower() == "connection":
                if value.lower() == "close":
                    self.close_connection = True
                elif value.lower() == "keep-alive":
                    self.close_connection = False
        head.append("\r\n")
        self.wfile.write("".join(head).encode("latin-1", "strict"))
        if body:
            self.wfile.write(body)

    def handle_expect_100(self) -> bool:
        """The interim `100 Continue` must reach the client before it sends the body."""
        answered = super().handle_expect_100()
        self.wfile.flush()
        return answered


def request_line(line: str) -> tuple[str, str, str]:
    """Method, target and version of `line` (RFC 9112 section 3); a target starting with `//`
    is reduced to one slash, as the stdlib does (gh-87389: never an absolute URI here)."""
    words = line.split(" ")
    if len(words) != 3 or not _TOKEN.fullmatch(words[0]) or not words[1]:
        raise BadHead(HTTPStatus.BAD_REQUEST, f"Bad request syntax ({line[:200]!r})")
    method, target, version = words
    if not _VERSION.fullmatch(version):
        if version.startswith("HTTP/") and version[5:6].isdigit() and version[5:6] != "1":
            raise BadHead(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, f"Invalid HTTP version ({version[:20]})")
        raise BadHead(HTTPStatus.BAD_REQUEST, f"Bad request version ({version[:20]!r})")
    if target.startswith("//"):
        target = "/" + target.lstrip("/")
    return method, target, version


def read_headers(rfile: BufferedIOBase) -> RequestHeaders:
    """The header block up to its empty line, as an `HTTPMessage` (names kept as sent, looked up
    without regard to case, repeats kept in order)."""
    readline = rfile.readline
    fields: list[tuple[str, str]] = []
    last: tuple[str, str] | None = None
    count = 0
    while True:
        raw = readline(MAX_LINE + 1)
        if len(raw) > MAX_LINE:
            raise BadHead(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Line too long")
        if raw in _END:
            if last is not None:
                fields.append(last)
            return RequestHeaders(fields)
        line = raw.decode("iso-8859-1").rstrip("\r\n")
        if line[:1] in (" ", "\t"):  # obs-fold: part of the value before it
            if last is None or _CONTROL.search(line):
                raise BadHead(HTTPStatus.BAD_REQUEST, f"Malformed header line ({line[:100]!r})")
            last = (last[0], (last[1] + " " + line.strip(_OWS)).strip(_OWS))
            continue
        name, colon, value = line.partition(":")
        if not colon or not _TOKEN.fullmatch(name) or _CONTROL.search(value):
            raise BadHead(HTTPStatus.BAD_REQUEST, f"Malformed header line ({line[:100]!r})")
        count += 1
        if count > MAX_HEADERS:
            raise BadHead(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Too many headers")
        if last is not None:
            fields.append(last)
        last = (name, value.strip(_OWS))

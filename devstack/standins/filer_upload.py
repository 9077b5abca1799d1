"""Streaming request-body readers for the filer stand-in: Content-Length, chunked transfer coding
and ``multipart/form-data`` (the filer's ``POST`` form upload, field ``file``). Nothing here holds
a whole file in memory: bodies are yielded in blocks of at most 1 MiB.
"""

from __future__ import annotations

from collections.abc import Iterator
from email.message import Message
from typing import Protocol

_BLOCK = 1 << 20


class Reader(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...

    def readline(self, size: int = -1, /) -> bytes: ...


class BodyError(ValueError):
    """A malformed request body (bad chunk framing, truncated multipart...)."""


def read_length(rfile: Reader, length: int) -> Iterator[bytes]:
    remaining = length
    while remaining > 0:
        block = rfile.read(min(remaining, _BLOCK))
        if not block:
            raise BodyError(f"request body truncated: {remaining} of {length} bytes missing")
        remaining -= len(block)
        yield block


def read_chunked(rfile: Reader) -> Iterator[bytes]:
    """RFC 9112 section 7.1 chunked transfer coding (trailers are read and ignored)."""
    while True:
        line = rfile.readline(1024)
        if not line.endswith(b"\n"):
            raise BodyError("chunked body: truncated chunk-size line")
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError as exc:
            raise BodyError(f"chunked body: bad chunk size {line[:40]!r}") from exc
        if size == 0:
            while rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                pass
            return
        yield from read_length(rfile, size)
        if rfile.readline(16) not in (b"\r\n", b"\n"):
            raise BodyError("chunked body: missing CRLF after chunk data")


def boundary_of(content_type: str) -> str | None:
    msg = Message()
    msg["Content-Type"] = content_type
    if msg.get_content_type() != "multipart/form-data":
        return None
    boundary = msg.get_param("boundary")
    return boundary if isinstance(boundary, str) and boundary else None


class _Buffered:
    def __init__(self, blocks: Iterator[bytes]) -> None:
        self._blocks = blocks
        self.buf = b""
        self.eof = False

    def fill(self) -> bool:
        if self.eof:
            return False
        for block in self._blocks:
            if block:
                self.buf += block
                return True
        self.eof = True
        return False


class FilePart:
    """The first form part named ``file`` or carrying a filename; ``content`` streams its bytes."""

    def __init__(self, name: str, filename: str, content_type: str, content: Iterator[bytes]):
        self.name = name
        self.filename = filename
        self.content_type = content_type
        self.content = content


def multipart_file(blocks: Iterator[bytes], boundary: str) -> FilePart | None:
    """Find the upload part of a ``multipart/form-data`` body and stream it. Parts before it are
    skipped; the rest of the body after it is drained when its content is exhausted."""
    src = _Buffered(blocks)
    delim = b"--" + boundary.encode("latin-1")
    marker = b"\r\n" + delim
    # preamble up to the first delimiter
    while True:
        i = src.buf.find(delim)
        if i >= 0:
            src.buf = src.buf[i + len(delim) :]
            break
        if not src.fill():
            raise BodyError("multipart body: no boundary found")
    while True:
        while len(src.buf) < 2 and src.fill():
            pass
        if src.buf.startswith(b"--"):
            return None  # closing delimiter: no file part
        while True:
            j = src.buf.find(b"\r\n\r\n")
            if j >= 0:
                break
            if not src.fill() or len(src.buf) > 65536:
                raise BodyError("multipart body: truncated part headers")
        raw_headers = src.buf[:j].decode("utf-8", "replace").strip("\r\n")
        src.buf = src.buf[j + 4 :]
        headers = Message()
        for line in raw_headers.split("\r\n"):
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip()] = v.strip()
        disposition = Message()
        disposition["Content-Disposition"] = headers.get("Content-Disposition", "")
        name = disposition.get_param("name", header="Content-Disposition")
        filename = disposition.get_param("filename", header="Content-Disposition")
        name_s = name if isinstance(name, str) else ""
        filename_s = filename if isinstance(filename, str) else ""
        content = _part_content(src, marker)
        if name_s == "file" or filename_s:
            ctype = headers.get("Content-Type", "")
            return FilePart(name_s, filename_s, ctype, _then_drain(content, src))
        for _ in content:  # skip a non-file field
            pass


def _part_content(src: _Buffered, marker: bytes) -> Iterator[bytes]:
    keep = len(marker) - 1
    while True:
        i = src.buf.find(marker)
        if i >= 0:
            if i:
                yield src.buf[:i]
            src.buf = src.buf[i + len(marker) :]
            return
        if len(src.buf) > keep:
            out, src.buf = src.buf[:-keep], src.buf[-keep:]
            yield out
        if not src.fill():
            raise BodyError("multipart body: truncated part (closing boundary missing)")


def _then_drain(content: Iterator[bytes], src: _Buffered) -> Iterator[bytes]:
    yield from content
    while src.fill():  # epilogue / further parts: consume so the connection stays usable
        src.buf = b""
    src.buf = b""

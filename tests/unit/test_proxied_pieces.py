"""The proxied transport's body (httpx's raw pieces, as they come) read as every `Streamed` is:
`read1` never past the size asked, `readinto` filling the buffer across pieces."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx

from functions.transport import Deadline
from functions.transport.proxied import _Pieces

PIECES = [b"abcde", b"", b"fgh", b"ijklmnop"]


class Stream(httpx.SyncByteStream):
    def __iter__(self) -> Iterator[bytes]:
        yield from PIECES


def body() -> _Pieces:
    response = httpx.Response(200, stream=Stream())
    return _Pieces(response, Deadline(time.monotonic() + 60, time.monotonic))


def test_read1_gives_at_most_the_size_asked() -> None:
    pieces = body()
    got = list(iter(lambda: pieces.read1(3), b""))
    assert all(len(piece) <= 3 for piece in got)
    assert b"".join(got) == b"".join(PIECES)


def test_readinto_fills_the_buffer_across_pieces() -> None:
    pieces = body()
    buffer = bytearray(7)
    taken: list[bytes] = []
    while got := pieces.readinto(memoryview(buffer)):
        taken.append(bytes(buffer[:got]))
    assert taken == [b"abcdefg", b"hijklmn", b"op"]

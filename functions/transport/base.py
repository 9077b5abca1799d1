"""The one interface every client of functions/ sends through, and its one family of errors.

A `Transport` talks to one server: `request` for an answer read whole (the API server, the
Broker, the filer's listings), `exchange` for an answer the caller reads under a wall-clock
deadline and a byte cap (an engine pod, a file's bytes). Every failure to get an answer is a
`TransportError` (`TransportTimeout` when the time ran out); an answer of any status is not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from typing import NamedTuple, Protocol

Headers = Mapping[str, str]
Body = bytes | Iterable[bytes] | None
"""A request's body: whole, or streamed in pieces (then the caller sets Content-Length)."""


class TransportError(OSError):
    """No answer: the connection failed, was refused or broke, or the answer was malformed."""


class TransportTimeout(TransportError, TimeoutError):
    """No answer in time: a timeout or an exchange's deadline."""


class BodyTooLarge(ValueError):
    """An answer longer than the cap its reader set."""


class BodyEncoded(ValueError):
    """An answer in a content encoding although identity was asked: its size cannot be bounded."""


class Answer(NamedTuple):
    status: int
    body: bytes
    headers: Headers
    """Lower-cased names; a repeated header's values joined by ", " (RFC 9110 5.3)."""


class Deadline(NamedTuple):
    """The wall-clock moment one exchange must be over by, on `clock`'s scale."""

    at: float
    clock: Callable[[], float]

    def left(self) -> float:
        """What is left of it; TransportTimeout once it has passed."""
        left = self.at - self.clock()
        if left <= 0:
            raise TransportTimeout("deadline passed")
        return left


class Pieces(Protocol):
    """An answer's body as the network brings it."""

    def read1(self, size: int = ..., /) -> bytes:
        """The next piece, at most `size` bytes and at most one receive; b"" at the end."""
        ...

    def readinto(self, buffer: memoryview, /) -> int:
        """Fill `buffer` with the next bytes; fewer only at the end, 0 past it."""
        ...


class Streamed:
    """An exchange's answer: status and headers read, the body left for the caller to read."""

    def __init__(self, status: int, headers: Headers, pieces: Pieces) -> None:
        self.status = status
        self.headers = headers
        """Lower-cased names; a repeated header's values joined by ", " (RFC 9110 5.3)."""
        self._pieces = pieces

    def read1(self, size: int = 1 << 16) -> bytes:
        """The next piece of the body (one receive, bounded by what is left of the deadline)."""
        return self._pieces.read1(size)

    def readinto(self, buffer: memoryview) -> int:
        """Fill `buffer` with the body's next bytes (each receive bounded as `read1`'s is);
        fewer only at its end, 0 past it."""
        return self._pieces.readinto(buffer)

    def read(self, cap: int) -> bytes:
        """The whole body: BodyTooLarge once it passes `cap` bytes (declared or received),
        BodyEncoded when it came compressed; checked per receive, so a long answer costs
        at most one receive beyond the cap."""
        encoding = self.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise BodyEncoded(f"the answer came compressed ({encoding}) although identity was asked")
        declared = self.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > cap:
            raise BodyTooLarge(f"an answer of {declared} bytes exceeds {cap}")
        body = bytearray()
        while chunk := self.read1():  # one receive: a fixed size would wait for it to fill
            body += chunk
            if len(body) > cap:
                raise BodyTooLarge(f"the answer exceeds {cap} bytes")
        return bytes(body)


class Transport(Protocol):
    """Connections to one server (its base URL given when made); safe to share between threads."""

    def request(
        self, method: str, target: str, headers: Headers, body: bytes | None, timeout: float | None = None
    ) -> Answer:
        """One round trip, the answer read whole; `target` is the path and query under the base
        URL, `timeout` bounds each send and receive (default: the transport's)."""
        ...

    def exchange(
        self, method: str, target: str, headers: Headers, body: Body, deadline: Deadline
    ) -> AbstractContextManager[Streamed]:
        """One round trip over by `deadline`; the body is read inside the block, and a
        connection whose answer was not read to its end is not used again."""
        ...

    def close(self) -> None: ...

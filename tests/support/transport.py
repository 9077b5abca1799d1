"""FakeTransport: the `Transport` of functions/transport/ in memory, so that a unit test runs a
client's one production path (its requests as sent, its answers as parsed) without a server."""

from __future__ import annotations

import json as jsonlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from functions.transport import Answer, Body, Deadline, Headers, Streamed


@dataclass(frozen=True)
class Sent:
    """One request as the client sent it."""

    method: str
    target: str
    headers: dict[str, str]
    """Lower-cased names."""
    body: bytes

    @property
    def path(self) -> str:
        return urlsplit(self.target).path

    @property
    def params(self) -> dict[str, str]:
        return dict(parse_qsl(urlsplit(self.target).query))

    def json(self) -> Any:
        return jsonlib.loads(self.body)


def reply(status: int, json: Any = None, text: str = "", headers: dict[str, str] | None = None) -> Answer:
    """An answer as a server would send it: a JSON body when `json` is given, else `text`."""
    body = jsonlib.dumps(json).encode() if json is not None else text.encode()
    kind = {"content-type": "application/json"} if json is not None else {}
    return Answer(status, body, {**kind, "content-length": str(len(body)), **(headers or {})})


@dataclass
class FakeTransport:
    """Answers each request with `answer(sent)` (which may raise TransportError); records them."""

    answer: Callable[[Sent], Answer]
    sent: list[Sent] = field(default_factory=list)
    piece: int = 1 << 16
    """What one receive of an exchange's body brings."""

    def request(
        self, method: str, target: str, headers: Headers, body: bytes | None, timeout: float | None = None
    ) -> Answer:
        return self.answer(self._record(method, target, headers, body))

    @contextmanager
    def exchange(
        self, method: str, target: str, headers: Headers, body: Body, deadline: Deadline
    ) -> Iterator[Streamed]:
        whole = body if isinstance(body, bytes | None) else b"".join(_pieces(body))
        answer = self.answer(self._record(method, target, headers, whole))
        yield Streamed(answer.status, answer.headers, _Pieces(answer.body, self.piece))

    def close(self) -> None:
        pass

    def _record(self, method: str, target: str, headers: Headers, body: bytes | None) -> Sent:
        sent = Sent(method, target, {k.lower(): v for k, v in headers.items()}, body or b"")
        self.sent.append(sent)
        return sent


def _pieces(body: Iterable[bytes]) -> Iterator[bytes]:
    yield from body


class _Pieces:
    def __init__(self, body: bytes, piece: int) -> None:
        self._body = body
        self._piece = piece

    def read1(self, size: int = 1 << 16) -> bytes:
        taken = self._body[: min(size, self._piece)]
        self._body = self._body[len(taken) :]
        return taken

    def readinto(self, buffer: memoryview) -> int:
        taken = self._body[: len(buffer)]
        self._body = self._body[len(taken) :]
        buffer[: len(taken)] = taken
        return len(taken)

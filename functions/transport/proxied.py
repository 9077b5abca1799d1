"""The `Transport` through an HTTP(S) or SOCKS proxy, for a kubeconfig's `proxy-url`: the one
place functions/ uses a general HTTP client, since proxying is that client's feature (httpx's),
not one worth writing again. Imported only when a kubeconfig names a proxy."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from functions.transport.base import (
    Answer,
    Body,
    Deadline,
    Headers,
    Streamed,
    TransportError,
    TransportTimeout,
)


class Proxied:
    def __init__(
        self,
        base_url: str,
        proxy: str,
        context: ssl.SSLContext | None,
        server_name: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        self._base = base_url.rstrip("/")
        self._extensions = {"sni_hostname": server_name} if server_name else None
        self._client = httpx.Client(
            transport=httpx.HTTPTransport(
                verify=context if context is not None else True, proxy=httpx.Proxy(proxy), retries=1
            ),
            timeout=timeout,
            trust_env=False,
        )

    def request(
        self, method: str, target: str, headers: Headers, body: bytes | None, timeout: float | None = None
    ) -> Answer:
        try:
            response = self._client.request(
                method,
                self._base + target,
                headers=dict(headers),
                content=body,
                timeout=timeout if timeout else httpx.USE_CLIENT_DEFAULT,
                extensions=self._extensions,
            )
        except httpx.TimeoutException as err:
            raise TransportTimeout(f"{method} {target[:200]}: {err}") from err
        except httpx.HTTPError as err:
            raise TransportError(f"{method} {target[:200]}: {err}") from err
        return Answer(response.status_code, response.content, response.headers)

    @contextmanager
    def exchange(
        self, method: str, target: str, headers: Headers, body: Body, deadline: Deadline
    ) -> Iterator[Streamed]:
        request = self._client.build_request(
            method,
            self._base + target,
            headers=dict(headers),
            content=body,
            timeout=deadline.left(),
            extensions=self._extensions,
        )
        try:
            response = self._client.send(request, stream=True)
        except httpx.TimeoutException as err:
            raise TransportTimeout(f"{method} {target[:200]}: {err}") from err
        except httpx.HTTPError as err:
            raise TransportError(f"{method} {target[:200]}: {err}") from err
        try:
            yield Streamed(response.status_code, response.headers, _Pieces(response, deadline))
        finally:
            response.close()

    def close(self) -> None:
        self._client.close()


class _Pieces:
    def __init__(self, response: httpx.Response, deadline: Deadline) -> None:
        self._raw = response.iter_raw()
        self._deadline = deadline
        self._rest = b""
        """What the last piece held beyond the size asked for."""

    def read1(self, size: int = 1 << 16) -> bytes:
        if self._rest:
            piece, self._rest = self._rest[:size], self._rest[size:]
            return piece
        self._deadline.left()  # each piece is bounded by the client's timeout, the whole by this
        try:
            piece = next(self._raw, b"")
        except httpx.TimeoutException as err:
            raise TransportTimeout(str(err)) from err
        except httpx.HTTPError as err:
            raise TransportError(str(err)) from err
        self._rest = piece[size:]
        return piece[:size]

    def readinto(self, buffer: memoryview) -> int:
        filled = 0
        while filled < len(buffer) and (piece := self.read1(len(buffer) - filled)):
            buffer[filled : filled + len(piece)] = piece
            filled += len(piece)
        return filled

"""The network's ground floor: one `Transport` interface and its implementation (keep-alive
HTTP/1.1 over http.client's sockets, for http and https), chosen once where the clients are
built. It imports nothing else of functions/, so every floor above may use it."""

from __future__ import annotations

import ssl

from functions.transport.base import (
    Answer,
    Body,
    BodyEncoded,
    BodyTooLarge,
    Deadline,
    Headers,
    Streamed,
    Transport,
    TransportError,
    TransportTimeout,
)
from functions.transport.keepalive import KeepAlive

__all__ = [
    "Answer",
    "Body",
    "BodyEncoded",
    "BodyTooLarge",
    "Deadline",
    "Headers",
    "KeepAlive",
    "Streamed",
    "Transport",
    "TransportError",
    "TransportTimeout",
    "connect",
]


def connect(
    base_url: str,
    context: ssl.SSLContext | None = None,
    server_name: str | None = None,
    proxy: str | None = None,
    timeout: float = 30.0,
    max_idle: int = 16,
) -> Transport:
    """The transport to the server at `base_url`; for https, `context` (default: the system's
    trusted CAs) checks its certificate against `server_name` or the URL's host."""
    if base_url.lower().startswith("https:") and context is None:
        context = ssl.create_default_context()
    if proxy:
        from functions.transport.proxied import Proxied  # its client is imported only here

        return Proxied(base_url, proxy, context, server_name, timeout)
    return KeepAlive(base_url, context, server_name, read_timeout=timeout, max_idle=max_idle)

"""The `verify` argument of the functions' httpx clients, chosen by the URL's scheme.

httpx builds a verifying SSL context for every client it creates, and loading certifi's CA
bundle into it costs ~50 ms: on a cold start, for nothing when the URL is plain http, as the
engines (pod IPs), the filer and the broker ingress are inside a cluster.
"""

from __future__ import annotations

import ssl
from functools import cache


@cache
def never_used() -> ssl.SSLContext:
    """For plain-http clients: a bare context (no CA bundle loaded), which http never touches."""
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


def verify_for(url: str) -> ssl.SSLContext | bool:
    """True (httpx's default verified context) for https, else the cheap unused context."""
    return True if url.lower().startswith("https:") else never_used()

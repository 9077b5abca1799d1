"""Publishing our own events to the Broker (resync's nudges; replies go back in the response).

A plain-http ingress (the Broker's, inside a cluster) is posted to over keep-alive http.client
connections (functions/adapters/keepalive.py: a resync tick publishes a nudge per drifted
adapter, ingest one event per notification); an https one through httpx, with its CA bundle.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx
from cloudevents.http import CloudEvent

from functions.adapters.keepalive import KeepAlive
from functions.adapters.tls import verify_for
from functions.edge import binary_mode
from functions.errors import Retryable
from functions.tracing import TRACEPARENT, TRACESTATE


def trace_headers(event: CloudEvent) -> dict[str, str]:
    """The event's trace context as W3C HTTP headers."""
    return {name: str(event[name]) for name in (TRACEPARENT, TRACESTATE) if event.get(name)}


class Broker:
    def __init__(self, url: str | None, timeout: float = 10.0) -> None:
        self._url = url
        self._direct: KeepAlive | None = None
        self._http: httpx.Client | None = None
        self._target = "/"
        if url and url.lower().startswith("http:"):
            parts = urlsplit(url)
            self._direct = KeepAlive(f"http://{parts.netloc}", read_timeout=timeout)
            self._target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        else:
            self._http = httpx.Client(timeout=timeout, verify=verify_for(url or ""))

    def publish(self, event: CloudEvent, timeout: float | None = None) -> None:
        """POST the event to the Broker; `timeout` caps this attempt (default: the client's)."""
        if not self._url:
            raise Retryable("no broker URL configured (K_SINK or LORAFLOW_BROKER_URL)")
        headers, body = binary_mode.write(event)
        # Knative's ingress reads trace context from the W3C headers, not from ce-traceparent.
        headers.update(trace_headers(event))
        try:
            if self._direct is not None:
                status = self._direct.request("POST", self._target, headers, body, timeout).status
            else:
                assert self._http is not None  # one of the two, set in __init__
                status = self._http.post(
                    self._url,
                    headers=headers,
                    content=body,
                    timeout=timeout if timeout else httpx.USE_CLIENT_DEFAULT,
                ).status_code
        except httpx.HTTPError as err:
            raise Retryable(f"broker unreachable: {err}") from err
        if status >= 300:
            raise Retryable(f"broker answered {status}")

"""Publishing our own events to the Broker (resync's nudges, ingest's notifications; replies go
back in the response), in binary mode over the one transport."""

from __future__ import annotations

from urllib.parse import urlsplit

from cloudevents.http import CloudEvent

from events import binary_mode
from functions import transport
from functions.errors import Retryable
from functions.tracing import TRACEPARENT, TRACESTATE


def trace_headers(event: CloudEvent) -> dict[str, str]:
    """The event's trace context as W3C HTTP headers."""
    return {name: str(event[name]) for name in (TRACEPARENT, TRACESTATE) if event.get(name)}


class Broker:
    def __init__(
        self, url: str | None, timeout: float = 10.0, through: transport.Transport | None = None
    ) -> None:
        """`through`: the transport to send on (default: one made for `url`)."""
        self._url = url
        self._transport: transport.Transport | None = through
        self._target = "/"
        if url:
            parts = urlsplit(url)
            self._target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            if through is None:
                self._transport = transport.connect(f"{parts.scheme}://{parts.netloc}", timeout=timeout)

    def publish(self, event: CloudEvent, timeout: float | None = None) -> None:
        """POST the event to the Broker; `timeout` caps this attempt (default: the client's)."""
        if self._transport is None:
            raise Retryable("no broker URL configured (K_SINK or LORAFLOW_BROKER_URL)")
        headers, body = binary_mode.write(event)
        # Knative's ingress reads trace context from the W3C headers, not from ce-traceparent.
        headers.update(trace_headers(event))
        try:
            status = self._transport.request("POST", self._target, headers, body, timeout).status
        except transport.TransportError as err:
            raise Retryable(f"broker unreachable: {err}") from err
        if status >= 300:
            raise Retryable(f"broker answered {status}")

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

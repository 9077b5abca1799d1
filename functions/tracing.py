"""W3C Trace Context through every step: in from the request, out on every event a step emits.

Knative's data plane propagates trace context as the W3C `traceparent`/`tracestate` HTTP
headers (its brokers preserve them on delivery and on replies); producers that follow the
CloudEvents Distributed Tracing extension carry the same values as the event's `traceparent`
and `tracestate` attributes. A step takes the header first, then the attribute, and carries the
context onto everything it emits:
- its reply, as headers of the 2xx response and as attributes of the reply event;
- every event it publishes itself (resync's nudges, ingest's webhook events, admit's
  re-admissions), as headers of the POST to the broker and as attributes of the event.

Without OpenTelemetry the step passes the context through unchanged (the W3C "forward as is"
case: no span of ours sits in between). With the `otel` extra enabled (see `functions.otel`)
each step opens a span whose id becomes the parent-id of what it emits.

An event that arrives without a (valid) traceparent starts a trace here, so that every log
line and every event of a chain has a trace id to be followed by. Its sampled flag is off: no
span of ours records it unless OpenTelemetry is on (which then decides for itself).

The current trace lives in a context variable set by the edge for the length of one event.
"""

from __future__ import annotations

import contextvars
import os
import random
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, NamedTuple, Protocol

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"

# version-traceid-parentid-flags, lowercase hex (https://www.w3.org/TR/trace-context/#traceparent-header).
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_INVALID_TRACE_ID = "0" * 32
_INVALID_PARENT_ID = "0" * 16
# list-member = key "=" value; key: simple or tenant@system; value: printable ASCII but , and =
_MEMBER = re.compile(
    r"[a-z0-9][_0-9a-z\-*/]{0,255}(@[a-z][_0-9a-z\-*/]{0,13})?=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
)
TRACESTATE_MAX_MEMBERS = 32
TRACESTATE_MAX_CHARS = 512
"""W3C: at most 32 list-members; a vendor must propagate at least 512 characters, and may drop
members beyond that. Bounded either way: a hostile header never grows our events or logs."""


class Lookup(Protocol):
    """What `incoming` reads from: HTTP headers (case-insensitive), a CloudEvent, a dict."""

    def get(self, key: str, /) -> Any: ...


class Trace(NamedTuple):
    """One hop's trace context: the trace, the span we act under (its id), flags, state."""

    trace_id: str
    parent_id: str
    flags: str = "00"
    state: str | None = None
    ours: bool = False
    """Started here, for an event that came without a trace (no caller's span to be a child of)."""

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.parent_id}-{self.flags}"

    @property
    def sampled(self) -> bool:
        return bool(int(self.flags, 16) & 1)

    def attributes(self) -> dict[str, str]:
        """As CloudEvent attributes (and, the same names, as HTTP headers)."""
        found = {TRACEPARENT: self.traceparent}
        if self.state:
            found[TRACESTATE] = self.state
        return found


def parse(traceparent: object, tracestate: object = None) -> Trace | None:
    """A valid traceparent (and its tracestate), or None: the W3C parsing rules, lenient only
    where the spec asks it to be (a future version may append fields after a `-`)."""
    if not isinstance(traceparent, str) or len(traceparent) > 512:
        return None
    match = _TRACEPARENT.fullmatch(traceparent.strip())
    if match is None:
        return None
    version, trace_id, parent_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    if trace_id == _INVALID_TRACE_ID or parent_id == _INVALID_PARENT_ID:
        return None
    # sampled (Level 1) and random (Level 2) are the defined bits; unknown ones are not propagated.
    return Trace(trace_id, parent_id, f"{int(flags, 16) & 0x03:02x}", _tracestate(tracestate))


def _tracestate(value: object) -> str | None:
    """Well-formed list-members only, in order, first occurrence of a key, within the bounds."""
    if not isinstance(value, str) or not value.strip():
        return None
    kept: list[str] = []
    keys: set[str] = set()
    length = 0
    for member in value.split(",")[: TRACESTATE_MAX_MEMBERS * 4]:
        member = member.strip(" \t")
        if not _MEMBER.fullmatch(member):
            continue
        key = member.partition("=")[0]
        cost = len(member) + (1 if kept else 0)
        if key in keys or length + cost > TRACESTATE_MAX_CHARS:
            continue
        kept.append(member)
        keys.add(key)
        length += cost
        if len(kept) == TRACESTATE_MAX_MEMBERS:
            break
    return ",".join(kept) or None


def new_span_id() -> str:
    return _random_hex(64)


def new_trace() -> Trace:
    """The root of a trace that arrived without one."""
    return Trace(_random_hex(128), new_span_id(), ours=True)


def _random_hex(bits: int) -> str:
    """A random id, never the all-zero one the W3C calls invalid. Unpredictable enough for a
    trace id, as OpenTelemetry's own generator makes them (random.getrandbits): os.urandom's
    getrandom call let go of the interpreter, two hand-overs per event in a busy process."""
    return f"{random.getrandbits(bits) or 1:0{bits // 4}x}"


def incoming(headers: Lookup, attributes: Lookup | None = None) -> Trace | None:
    """The caller's context: the HTTP headers (Knative's data plane), else the event's
    Distributed Tracing attributes. The state always comes with its own traceparent."""
    found = parse(headers.get(TRACEPARENT), headers.get(TRACESTATE))
    if found is None and attributes is not None:
        found = parse(attributes.get(TRACEPARENT), attributes.get(TRACESTATE))
    return found


# -- the current trace ---------------------------------------------------------------------------
_current: contextvars.ContextVar[Trace | None] = contextvars.ContextVar("loraflow_trace", default=None)


def current() -> Trace | None:
    return _current.get()


def use(trace: Trace | None) -> None:
    """`trace` is current from now on in this context (the edge's per-request context)."""
    _current.set(trace)


@contextmanager
def active(trace: Trace | None) -> Iterator[Trace | None]:
    """`trace` is the current one inside the block (for logs and for what the step emits)."""
    token = _current.set(trace)
    try:
        yield trace
    finally:
        _current.reset(token)


def outgoing() -> dict[str, str]:
    """Attributes / headers for what is emitted now: the current context, or nothing."""
    trace = _current.get()
    return trace.attributes() if trace is not None else {}


# -- OpenTelemetry (the `otel` extra; functions.otel) ---------------------------------------------
_tracer: Any = None
"""An opentelemetry Tracer once `configure` found traces asked for; None: no spans (the default)."""
_provider: Any = None
_configured = False


def configure(function: str, env: Mapping[str, str] | None = None, span_exporter: Any = None) -> bool:
    """Spans on when the environment asks for them (functions.otel.wanted); False when off. Only
    then is the OpenTelemetry SDK imported. `span_exporter` stands in for the named one (tests)."""
    global _tracer, _provider, _configured
    from functions import otel

    _configured = True
    env = os.environ if env is None else env
    exporter = otel.wanted(env)
    if _provider is not None:
        _provider.shutdown()  # flushes what the previous configuration still holds
    if exporter is None and span_exporter is None:
        _tracer = _provider = None
        return False
    _provider = otel.provider(exporter or "otlp", otel.service_name(function, env), span_exporter)
    _tracer = _provider.get_tracer("loraflow")
    return True


def flush(timeout_s: float = 5.0) -> bool:
    """Export the spans still batched (True when there were none to wait for)."""
    return bool(_provider.force_flush(int(timeout_s * 1000))) if _provider is not None else True


def configure_once(function: str) -> None:
    """`configure` from the environment at a process's first event (never at import)."""
    if not _configured:
        configure(function)


@contextmanager
def span(function: str, attributes: Mapping[str, Any]) -> Iterator[None]:
    """The step's own span around its work, when spans are on. From its start on, the current
    trace is this span's context, for the rest of the request (the edge's per-request context
    ends with it): what the step emits, and every later log line, name this span. A trace we
    started ourselves is no parent: the span is a root, and the SDK's sampler decides on it.
    Nothing at all when off."""
    if _tracer is None:
        yield
        return
    from functions import otel

    parent = _current.get()
    under = parent[:4] if parent is not None and not parent.ours else None
    state = parent.state if under is not None and parent is not None else None
    with otel.span(_tracer, function, under, attributes) as (trace_id, span_id, flags):
        _current.set(Trace(trace_id, span_id, flags, state))
        yield


def span_attributes(event: Lookup | None, adapter: str | None) -> dict[str, str]:
    """The CloudEvents semantic-convention attributes of the span of one event."""
    found: dict[str, str] = {}
    if event is not None:
        for attribute, key in (("id", "event_id"), ("source", "event_source"), ("type", "event_type")):
            value = event.get(attribute)
            if isinstance(value, str):
                found[f"cloudevents.{key}"] = value[:256]
        subject = event.get("subject")
        if isinstance(subject, str):
            found["cloudevents.event_subject"] = subject[:512]
    if adapter:
        found["loraflow.adapter"] = adapter
    return found

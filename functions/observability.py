"""Prometheus metrics (`functions.metrics`) and JSON logs shared by every function.

Metric names follow Prometheus conventions (`loraflow_` prefix, `_total` counters,
`_seconds` histograms). Each function process exposes them at `GET /metrics`.

Log lines are one JSON object each: `time` in RFC 3339, UTC, with milliseconds; the current
trace id (`functions.tracing`) and, on every line about one adapter, `adapter`
(`namespace/name`), both from context variables the edge sets for the length of one event.
"""

from __future__ import annotations

import contextvars
import functools
import json
import logging
import math
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from functions import tracing
from functions.metrics import Counter, Histogram, ProcessCollector, Registry

REGISTRY = Registry()

EVENTS = Counter(
    "loraflow_events_total",
    "CloudEvents handled, by function, type and outcome",
    ["function", "type", "outcome"],
    registry=REGISTRY,
)
STEP_SECONDS = Histogram(
    "loraflow_step_duration_seconds",
    "Time to handle one event, by function",
    ["function"],
    registry=REGISTRY,
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
ENGINE_SECONDS = Histogram(
    "loraflow_engine_request_duration_seconds",
    "Engine load/unload/list latency",
    ["runtime", "operation"],
    registry=REGISTRY,
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
ENGINE_FAILURES = Counter(
    "loraflow_engine_failures_total",
    "Engine calls that failed, by runtime, operation and reason",
    ["runtime", "operation", "reason"],
    registry=REGISTRY,
)
ENGINE_EVICTIONS = Counter(
    "loraflow_engine_evictions_total",
    "Adapters an engine evicted to make room while we loaded into it (another writer loaded there "
    "meanwhile), by runtime",
    ["runtime"],
    registry=REGISTRY,
)
FROZEN_BYTES = Counter(
    "loraflow_frozen_bytes_total",
    "Bytes of verified file sets frozen and of retired ones deleted (taken = frozen - deleted)",
    ["op"],
    registry=REGISTRY,
)
HASHED_BYTES = Counter(
    "loraflow_hashed_bytes_total",
    "Bytes read from storage to hash a file (one storage keeps no MD5 for, or an S3 copy being "
    "checked), by storage backend",
    ["backend"],
    registry=REGISTRY,
)
KUBE_REQUESTS = Counter(
    "loraflow_kube_requests_total",
    "Kubernetes API requests, by verb and resource",
    ["verb", "resource"],
    registry=REGISTRY,
)
KUBE_CONFLICTS = Counter(
    "loraflow_kube_conflicts_total",
    "409 Conflict answers to our writes, by resource",
    ["resource"],
    registry=REGISTRY,
)

EVENT_AGE_SECONDS = Histogram(
    "loraflow_event_age_seconds",
    "Time from an event's `time` attribute (set by its producer) to the step handling it, by function "
    "and type: the broker's queueing and retries, and for file.changed the notification's way",
    ["function", "type"],
    registry=REGISTRY,
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
)
WARNING_EVENTS = Counter(
    "loraflow_warning_events_total",
    "Warning Events recorded on adapters (a transition into a failing reason), by function and reason",
    ["function", "reason"],
    registry=REGISTRY,
)
DEAD_LETTERS = Counter(
    "loraflow_dead_letters_total",
    "Events the Broker gave up on (delivered to the dead-letter sink), by type (ours or `other`) and "
    "the subscriber's last HTTP status",
    ["type", "code"],
    registry=REGISTRY,
)
PROCESS = ProcessCollector(REGISTRY)
"""process_cpu_seconds_total, process_resident_memory_bytes, ... as prometheus_client names them."""


def observe_age(function: str, event_type: str, time: object, now: float) -> None:
    """The age of an event at its handling; an absent or unreadable `time` is not observed, and a
    producer's clock ahead of ours counts as no age at all."""
    if not isinstance(time, str) or len(time) > 64:
        return
    try:
        sent = datetime.fromisoformat(time)
    except ValueError:
        return
    if sent.tzinfo is None:
        sent = sent.replace(tzinfo=UTC)  # RFC 3339 requires an offset; a missing one is read as UTC
    EVENT_AGE_SECONDS.labels(function, event_type).observe(max(0.0, now - sent.timestamp()))


_SECRET_KEYS = ("token", "authorization", "password", "secret", "credential")


# -- which adapter a line is about -------------------------------------------------------------
_adapter: contextvars.ContextVar[str | None] = contextvars.ContextVar("loraflow_adapter", default=None)

# /apis/<group>/<version>/namespaces/<ns>/loraadapters/<name> (our events' subject)
_ADAPTER_SUBJECT = re.compile(r"^/apis/[^/]+/[^/]+/namespaces/([^/]+)/loraadapters/([^/]+)$")
# /loraadapters/<ns>/<model>/<name>/... (file.changed: a storage path)
_STORAGE_PATH = re.compile(r"^/loraadapters/([^/]+)/[^/]+/([^/]+)(/|$)")
_NAME_MAX = 253


def adapter_of(attributes: tracing.Lookup) -> str | None:
    """`namespace/name` of the one adapter an event is about, from its attributes only: our
    events' subject, an ApiServerSource event of a LoRAAdapter, a storage path; else None."""
    subject = attributes.get("subject")
    if attributes.get("kind") == "LoRAAdapter":
        namespace, name = attributes.get("namespace"), attributes.get("name")
        if isinstance(namespace, str) and isinstance(name, str) and namespace and name:
            return f"{namespace}/{name}"[: 2 * _NAME_MAX]
    if isinstance(subject, str) and len(subject) <= 4096:
        match = _ADAPTER_SUBJECT.match(subject) or _STORAGE_PATH.match(subject)
        if match is not None:
            return f"{match.group(1)}/{match.group(2)}"[: 2 * _NAME_MAX]
    return None


def enter(headers: tracing.Lookup, attributes: tracing.Lookup | None = None) -> None:
    """Set the context of the event being handled (the edge runs each request in a copied
    context, so this lasts exactly as long as the request): the caller's trace, else the one
    already set for this request, else a new one; the adapter, once the event is parsed."""
    trace = tracing.incoming(headers, attributes) or tracing.current() or tracing.new_trace()
    tracing.use(trace)
    if attributes is not None:
        _adapter.set(adapter_of(attributes))


@contextmanager
def step_span(function: str, event: tracing.Lookup | None) -> Iterator[None]:
    """The step's OpenTelemetry span around its handler, when the `otel` extra is switched on
    (functions.otel); a no-op otherwise."""
    tracing.configure_once(function)
    with tracing.span(function, tracing.span_attributes(event, _adapter.get())):
        yield


@contextmanager
def about(adapter: str | None) -> Iterator[None]:
    """Log lines inside the block are about `adapter` (`namespace/name`)."""
    token = _adapter.set(adapter)
    try:
        yield
    finally:
        _adapter.reset(token)


def rfc3339_millis(timestamp: float) -> str:
    """`2026-12-01T09:20:00.123Z`: RFC 3339, UTC, milliseconds (what log stores parse)."""
    fraction, whole = math.modf(timestamp)
    micros = round(fraction * 1e6)  # as datetime.fromtimestamp rounds it (half to even)
    if micros >= 1_000_000:
        whole, micros = whole + 1, micros - 1_000_000
    return f"{_second(int(whole))}.{micros // 1000:03d}Z"


@functools.lru_cache(maxsize=4)
def _second(seconds: int) -> str:
    """The date and time of one second: every line of that second shares it (a log line per
    event would otherwise format it anew)."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")


@functools.lru_cache(maxsize=256)
def _redacted(key: str) -> bool:
    """Whether a field's name looks like a credential's (names come from the code: few)."""
    lowered = key.lower()
    return any(secret in lowered for secret in _SECRET_KEYS)


class JsonFormatter(logging.Formatter):
    """One JSON object per line; extra fields from `logger.info(..., extra={...})` included,
    and the current trace id and adapter.

    Values under keys that look like credentials are replaced, so a token can never reach
    the logs by accident.
    """

    _STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
        "message",
        "asctime",
    }

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": rfc3339_millis(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        trace = tracing.current()
        if trace is not None:
            entry["trace_id"] = trace.trace_id
            entry["span_id"] = trace.parent_id
        adapter = _adapter.get()
        if adapter is not None:
            entry["adapter"] = adapter
        for key, value in record.__dict__.items():
            if key not in self._STANDARD and not key.startswith("_"):
                entry[key] = "[redacted]" if _redacted(key) else value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(level: int = logging.INFO) -> None:
    root = logging.getLogger("loraflow")
    if any(isinstance(h.formatter, JsonFormatter) for h in root.handlers):
        return
    # A JSON line never prints where it was logged from, nor the thread or process: records
    # skip gathering them (the stack walk, the thread's name, getpid), as the logging HOWTO's
    # "Optimization" section describes. Every event logs one line.
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False

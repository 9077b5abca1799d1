"""OpenTelemetry spans per step, for the `otel` extra (`pip install 'loraflow[otel]'`).

Off unless asked for, and then only: nothing here imports opentelemetry at module level, and
`functions.tracing.configure` imports this wiring only when the environment asks for traces, so
a step's cold start without it does not pay for importing the SDK and the OTLP exporter.

Asked for by the standard variables: OTEL_TRACES_EXPORTER (`otlp`, `console`; `none` = off), or
an OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT / OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, which then
means `otlp`); OTEL_SDK_DISABLED=true wins over both. The SDK reads the rest itself
(OTEL_TRACES_SAMPLER, OTEL_EXPORTER_OTLP_HEADERS, ...). The service name is OTEL_SERVICE_NAME,
else Knative's K_SERVICE, else `loraflow-<function>`.

Each event handled is one span of kind CONSUMER named `<function> process`, child of the
incoming trace context (W3C, `functions.tracing`), with the CloudEvents semantic-convention
attributes; what the step emits then carries this span's id as its parent-id.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

EXPORTERS = ("otlp", "console")


def wanted(env: Mapping[str, str]) -> str | None:
    """The exporter the environment asks for, or None (off)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    named = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if named:
        return named if named in EXPORTERS else None
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return "otlp" if endpoint else None


def provider(exporter: str, service: str, span_exporter: Any = None) -> Any:
    """A TracerProvider exporting in batches (`span_exporter` replaces the named one: tests)."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    if span_exporter is None:
        if exporter == "console":
            span_exporter = ConsoleSpanExporter()
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            span_exporter = OTLPSpanExporter()
    tracer_provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service}))
    tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
    return tracer_provider


def service_name(function: str, env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get("OTEL_SERVICE_NAME") or env.get("K_SERVICE") or f"loraflow-{function}"


@contextmanager
def span(
    tracer: Any,
    function: str,
    parent: tuple[str, str, str, str | None] | None,
    attributes: Mapping[str, Any],
) -> Iterator[tuple[str, str, str]]:
    """One CONSUMER span under `parent` (trace id, parent id, flags, state); yields the span's
    own (trace id, span id, flags) for what the step emits."""
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags, TraceState

    context = None
    if parent is not None:
        trace_id, parent_id, flags, state = parent
        remote = SpanContext(
            int(trace_id, 16),
            int(parent_id, 16),
            is_remote=True,
            trace_flags=TraceFlags(int(flags, 16)),
            trace_state=TraceState.from_header([state]) if state else TraceState(),
        )
        context = trace.set_span_in_context(NonRecordingSpan(remote))
    with tracer.start_as_current_span(
        f"{function} process", context=context, kind=SpanKind.CONSUMER, attributes=dict(attributes)
    ) as current:
        own = current.get_span_context()
        yield (
            format(own.trace_id, "032x"),
            format(own.span_id, "016x"),
            format(int(own.trace_flags), "02x"),
        )

"""The `otel` extra: one CONSUMER span per event handled, child of the incoming W3C context, whose
id is the parent-id of what the step emits; exported over real OTLP/HTTP to a collector; and
without the environment asking for it, opentelemetry is never imported."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import flask
import pytest
from cloudevents.conversion import to_binary
from cloudevents.http import CloudEvent, from_http
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from events.domain import ADAPTER_READY, AdapterReady, AdapterRef
from functions import otel, tracing
from functions.edge import messages, shell

ROOT = Path(__file__).resolve().parents[2]
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT}-01"
SUBJECT = "/apis/rackai.rackspace.com/v1alpha1/namespaces/team-a/loraadapters/finance"


@pytest.mark.parametrize(
    ("env", "exporter"),
    [
        ({}, None),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, "otlp"),
        ({"OTEL_TRACES_EXPORTER": "console"}, "console"),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, None),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, "otlp"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, "otlp"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, None),
    ],
)
def test_spans_are_on_only_when_asked_for(env: dict[str, str], exporter: str | None) -> None:
    assert otel.wanted(env) == exporter


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    assert tracing.configure("otel_test", {}, span_exporter=exporter)
    yield exporter
    tracing.configure("otel_test", {})  # off again for the other tests


def replying(name: str) -> Any:
    def handle(event: CloudEvent, deps: Any) -> CloudEvent:
        ref = AdapterRef.model_validate(
            {"apiVersion": "rackai.rackspace.com/v1alpha1", "namespace": "team-a", "name": "finance"}
        )
        return messages.reply(ADAPTER_READY, name, SUBJECT, AdapterReady(adapter=ref))

    return shell.function(name, ["io.loraflow.test.v1"], handle)


def call(view: Any, headers: dict[str, str]) -> CloudEvent:
    event = CloudEvent({"type": "io.loraflow.test.v1", "source": "/t", "id": "e-1", "subject": SUBJECT}, {})
    wire, body = to_binary(event)
    with flask.Flask("t").test_request_context("/", method="POST", headers={**wire, **headers}, data=body):
        response: flask.Response = view(flask.request)
    assert response.status_code == 200, response.get_data(as_text=True)
    return from_http(dict(response.headers), response.get_data())


def test_one_consumer_span_per_event_and_the_reply_names_it_as_parent(spans: InMemorySpanExporter) -> None:
    reply = call(replying("otel_reply"), {"traceparent": TRACEPARENT, "tracestate": "rojo=1"})
    assert tracing.flush()
    (span,) = spans.get_finished_spans()
    assert span.name == "otel_reply process" and span.kind is SpanKind.CONSUMER
    assert span.parent is not None and format(span.parent.span_id, "016x") == PARENT
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert span.attributes is not None
    assert span.attributes["cloudevents.event_type"] == "io.loraflow.test.v1"
    assert span.attributes["loraflow.adapter"] == "team-a/finance"
    assert reply["traceparent"] == f"00-{TRACE_ID}-{format(span.context.span_id, '016x')}-01"
    assert reply["tracestate"] == "rojo=1"


def test_a_failing_handler_ends_its_span_as_an_error(spans: InMemorySpanExporter) -> None:
    def handle(event: CloudEvent, deps: Any) -> None:
        raise RuntimeError("boom")

    view = shell.function("otel_crash", ["io.loraflow.test.v1"], handle)
    event = CloudEvent({"type": "io.loraflow.test.v1", "source": "/t", "id": "e-2"}, {})
    wire, body = to_binary(event)
    with flask.Flask("t").test_request_context("/", method="POST", headers=wire, data=body):
        assert view(flask.request).status_code == 500
    assert tracing.flush()
    (span,) = spans.get_finished_spans()
    assert span.status.status_code.name == "ERROR"
    assert [e.name for e in span.events] == ["exception"]


class Collector(ThreadingHTTPServer):
    bodies: list[tuple[str, bytes]]


@pytest.fixture
def collector() -> Iterator[Collector]:
    """An OTLP/HTTP receiver: records each POST (path, protobuf body) and answers 200."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            server.bodies.append((self.path, body))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = Collector(("127.0.0.1", 0), Handler)
    server.bodies = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def test_spans_reach_an_otlp_collector(collector: Collector, monkeypatch: pytest.MonkeyPatch) -> None:
    host, port = collector.server_address[:2]
    env = {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://{host!s}:{port}/v1/traces",
        "K_SERVICE": "loraflow-x",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert tracing.configure("otel_export", env)
    try:
        call(replying("otel_export"), {"traceparent": TRACEPARENT})
        assert tracing.flush()
    finally:
        tracing.configure("otel_export", {})
    ((path, body),) = collector.bodies
    assert path == "/v1/traces"
    request = ExportTraceServiceRequest.FromString(body)
    (resource_spans,) = request.resource_spans
    attributes = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
    assert attributes["service.name"] == "loraflow-x"
    (span,) = [s for scope in resource_spans.scope_spans for s in scope.spans]
    assert span.name == "otel_export process"
    assert span.trace_id.hex() == TRACE_ID and span.parent_span_id.hex() == PARENT


def test_without_the_environment_opentelemetry_is_never_imported() -> None:
    """A cold start pays nothing for the extra: a real function handles an event, in a process
    whose environment names no exporter, and no opentelemetry module was loaded."""
    script = textwrap.dedent(
        """
        import json, os, sys
        for key in [k for k in os.environ if k.startswith("OTEL_")]:
            del os.environ[key]
        import functions_framework
        from cloudevents.conversion import to_binary
        from cloudevents.http import CloudEvent
        app = functions_framework.create_app("dead_letters", "main.py", "http")
        event = CloudEvent({"type": "io.loraflow.adapter.ready.v1", "source": "/t", "id": "1"}, {})
        headers, body = to_binary(event)
        status = app.test_client().post("/", headers=headers, data=body).status_code
        print(json.dumps([status, sorted(m for m in sys.modules if m.startswith("opentelemetry"))]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [204, []]


def test_without_an_incoming_trace_the_span_is_a_root_and_the_reply_names_it(
    spans: InMemorySpanExporter,
) -> None:
    reply = call(replying("otel_root"), {})
    assert tracing.flush()
    (span,) = spans.get_finished_spans()
    assert span.parent is None  # the sampler decided (always on by default), not our made-up parent
    context = span.context
    own = f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
    assert context.trace_flags.sampled
    assert reply["traceparent"] == own

"""functions.tracing: W3C Trace Context parsed by the spec's rules, bounded, and carried from an
incoming request onto the reply, every published event and every log line (through the real
functions-framework edge and real HTTP)."""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import flask
import pytest
from cloudevents.conversion import to_binary, to_structured
from cloudevents.http import CloudEvent, from_http

from events.domain import ADAPTER_READY, AdapterReady, AdapterRef
from events.schema_urls import schema_url
from functions import tracing
from functions.adapters.broker import Broker
from functions.edge import messages, shell
from functions.observability import rfc3339_millis

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT}-01"
OTHER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
SUBJECT = "/apis/rackai.rackspace.com/v1alpha1/namespaces/team-a/loraadapters/finance"


# -- parsing ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "header",
    [
        pytest.param(TRACEPARENT.upper(), id="uppercase"),
        pytest.param(f"00-{'0' * 32}-{PARENT}-01", id="zero-trace-id"),
        pytest.param(f"00-{TRACE_ID}-{'0' * 16}-01", id="zero-parent-id"),
        pytest.param(f"ff-{TRACE_ID}-{PARENT}-01", id="version-ff"),
        pytest.param(f"{TRACEPARENT}-extra", id="version-00-with-more"),
        pytest.param(f"00-{TRACE_ID[:-1]}-{PARENT}-01", id="short-trace-id"),
        pytest.param(f"00-{TRACE_ID}-{PARENT}-1", id="short-flags"),
        pytest.param(f"00_{TRACE_ID}_{PARENT}_01", id="wrong-separator"),
        pytest.param("", id="empty"),
        pytest.param(None, id="absent"),
        pytest.param(42, id="not-a-string"),
        pytest.param(f"01-{TRACE_ID}-{PARENT}-01-" + "x" * 600, id="oversized"),
    ],
)
def test_invalid_traceparent_is_ignored(header: object) -> None:
    assert tracing.parse(header) is None


def test_valid_traceparent() -> None:
    trace = tracing.parse(TRACEPARENT, "congo=t61rcWkgMzE")
    assert trace == tracing.Trace(TRACE_ID, PARENT, "01", "congo=t61rcWkgMzE")
    assert trace.traceparent == TRACEPARENT and trace.sampled


def test_a_future_version_is_read_by_its_first_four_fields_and_unknown_flags_dropped() -> None:
    """W3C: a higher version may append fields; sampled and random are the flags defined."""
    trace = tracing.parse(f"cc-{TRACE_ID}-{PARENT}-ff-what-ever")
    assert trace is not None and trace.traceparent == f"00-{TRACE_ID}-{PARENT}-03"  # sampled, random


def test_tracestate_keeps_valid_members_once_within_the_bounds() -> None:
    state = "rojo=00f067aa0ba902b7, congo=t61rcWkgMzE,bad member,rojo=again,tenant@vendor=x,=novalue"
    trace = tracing.parse(TRACEPARENT, state)
    assert trace is not None and trace.state == "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE,tenant@vendor=x"

    many = ",".join(f"k{i}=v{i}" for i in range(100))
    bounded = tracing.parse(TRACEPARENT, many)
    assert bounded is not None and bounded.state is not None
    assert len(bounded.state.split(",")) == tracing.TRACESTATE_MAX_MEMBERS

    long = ",".join(f"k{i}={'v' * 200}" for i in range(10))
    capped = tracing.parse(TRACEPARENT, long)
    assert capped is not None and capped.state is not None
    assert len(capped.state) <= tracing.TRACESTATE_MAX_CHARS and capped.state.startswith("k0=")

    injected = tracing.parse(TRACEPARENT, "a=b\r\nX-Evil: 1")
    assert injected is not None and injected.state is None


def test_header_wins_over_the_event_attribute() -> None:
    assert tracing.incoming({"traceparent": OTHER}, {"traceparent": TRACEPARENT}) == tracing.parse(OTHER)
    assert tracing.incoming({}, {"traceparent": TRACEPARENT}) == tracing.parse(TRACEPARENT)
    # an invalid header does not hide a valid attribute
    assert tracing.incoming({"traceparent": "garbage"}, {"traceparent": TRACEPARENT}) == tracing.parse(
        TRACEPARENT
    )


def test_new_traces_are_valid_and_distinct() -> None:
    first, second = tracing.new_trace(), tracing.new_trace()
    assert tracing.parse(first.traceparent) == first._replace(ours=False)
    assert first.ours and not first.sampled
    assert first.trace_id != second.trace_id


# -- through the edge ----------------------------------------------------------------------------------
def records(stream: io.StringIO, function: str) -> list[dict[str, Any]]:
    parsed = [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]
    return [r for r in parsed if r.get("function") == function]


def ready() -> AdapterReady:
    ref = AdapterRef.model_validate(
        {"apiVersion": "rackai.rackspace.com/v1alpha1", "namespace": "team-a", "name": "finance"}
    )
    return AdapterReady(adapter=ref)


def replying(name: str) -> Any:
    """A step that replies with one event and logs a line of its own on the way."""

    def handle(event: CloudEvent, deps: Any) -> CloudEvent:
        logging.getLogger("loraflow.test").info("working", extra={"function": name})
        return messages.reply(ADAPTER_READY, name, SUBJECT, ready())

    return shell.function(name, ["io.loraflow.test.v1"], handle)


def incoming(**attributes: str) -> CloudEvent:
    return CloudEvent(
        {"type": "io.loraflow.test.v1", "source": "/tests", "id": "e-1", "subject": SUBJECT, **attributes},
        {"k": "v"},
    )


def call(
    view: Any, event: CloudEvent, headers: dict[str, str] | None = None, structured: bool = False
) -> Any:
    wire_headers, body = (to_structured if structured else to_binary)(event)
    app = flask.Flask("t")
    with app.test_request_context("/", method="POST", headers={**wire_headers, **(headers or {})}, data=body):
        response: flask.Response = view(flask.request)
    return response


def reply_of(response: flask.Response) -> CloudEvent:
    assert response.status_code == 200, response.get_data(as_text=True)
    return from_http(dict(response.headers), response.get_data())


def test_reply_carries_the_w3c_headers_trace(lines: io.StringIO) -> None:
    view = replying("trace_headers")
    response = call(view, incoming(), {"traceparent": TRACEPARENT, "tracestate": "rojo=1"})
    out = reply_of(response)
    assert out["traceparent"] == TRACEPARENT and out["tracestate"] == "rojo=1"
    assert out["dataschema"] == schema_url(ADAPTER_READY)
    handled = records(lines, "trace_headers")
    assert {r["trace_id"] for r in handled} == {TRACE_ID}
    assert {r["adapter"] for r in handled} == {"team-a/finance"}
    assert [r["msg"] for r in handled] == ["working", "Handled event"]


@pytest.mark.parametrize("structured", [False, True], ids=["binary", "structured"])
def test_reply_carries_the_event_attributes_trace(structured: bool) -> None:
    """The CloudEvents Distributed Tracing extension: `ce-traceparent`, or in the JSON envelope."""
    out = reply_of(call(replying("trace_attr"), incoming(traceparent=TRACEPARENT), structured=structured))
    assert out["traceparent"] == TRACEPARENT and "tracestate" not in out


def test_an_event_without_trace_starts_one_per_event(lines: io.StringIO) -> None:
    view = replying("trace_new")
    first, second = (reply_of(call(view, incoming())) for _ in range(2))
    traces = [tracing.parse(first["traceparent"]), tracing.parse(second["traceparent"])]
    assert all(t is not None and not t.sampled for t in traces)
    assert traces[0] != traces[1]
    logged = [r["trace_id"] for r in records(lines, "trace_new") if r["msg"] == "Handled event"]
    assert logged == [t.trace_id for t in traces if t is not None]


def test_a_rejected_event_is_logged_with_its_trace(lines: io.StringIO) -> None:
    view = replying("trace_rejected")
    bad = CloudEvent({"type": "io.loraflow.other.v1", "source": "/tests", "id": "e-2"}, {})
    assert call(view, bad, {"traceparent": TRACEPARENT}).status_code == 400
    (line,) = records(lines, "trace_rejected")
    assert line["trace_id"] == TRACE_ID and "adapter" not in line


def test_the_trace_does_not_leak_into_the_next_request_or_outside() -> None:
    view = replying("trace_leak")
    reply_of(call(view, incoming(), {"traceparent": TRACEPARENT}))
    assert tracing.current() is None
    assert reply_of(call(view, incoming()))["traceparent"].split("-")[1] != TRACE_ID


def test_log_time_is_rfc3339_utc_with_milliseconds() -> None:
    assert rfc3339_millis(1796110010.0456) == "2026-12-01T07:26:50.045Z"
    assert rfc3339_millis(0) == "1970-01-01T00:00:00.000Z"


# -- published events -------------------------------------------------------------------------------------
class Received(ThreadingHTTPServer):
    requests: list[tuple[dict[str, str], bytes]]


@pytest.fixture
def broker_ingress() -> Iterator[Received]:
    """A plain HTTP server that records what the Broker ingress would receive."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            server.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
            self.send_response(202)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = Received(("127.0.0.1", 0), Handler)
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_a_published_event_carries_the_trace_as_headers_and_attributes(broker_ingress: Received) -> None:
    host, port = broker_ingress.server_address[:2]
    broker = Broker(f"http://{host!s}:{port}/")
    with tracing.active(tracing.parse(TRACEPARENT, "rojo=1")):
        broker.publish(messages.reply(ADAPTER_READY, "test", SUBJECT, ready()))
    ((headers, body),) = broker_ingress.requests
    assert headers["traceparent"] == TRACEPARENT and headers["tracestate"] == "rojo=1"
    event = from_http(headers, body)
    assert event["traceparent"] == TRACEPARENT and event["dataschema"] == schema_url(ADAPTER_READY)


@pytest.mark.parametrize(
    ("attributes", "adapter"),
    [
        pytest.param({"subject": SUBJECT}, "team-a/finance", id="our-subject"),
        pytest.param(
            {"subject": "/apis/inference.rackai.rackspace.com/v1alpha1/namespaces/b/loraadapters/x"},
            "b/x",
            id="sglang-subject",
        ),
        pytest.param(
            {"kind": "LoRAAdapter", "namespace": "team-a", "name": "finance", "subject": "/apis/..."},
            "team-a/finance",
            id="apiserver-source",
        ),
        pytest.param(
            {"subject": "/loraadapters/team-a/llama3/finance/w.safetensors"}, "team-a/finance", id="path"
        ),
        pytest.param(
            {"kind": "Pod", "namespace": "team-a", "name": "p", "subject": "/api/v1/x"}, None, id="pod"
        ),
        pytest.param({"subject": "/apis/v1/namespaces/a/modeldeployments/d"}, None, id="deployment"),
        pytest.param({}, None, id="no-subject"),
    ],
)
def test_which_adapter_an_event_is_about(attributes: dict[str, str], adapter: str | None) -> None:
    from functions.observability import adapter_of

    assert adapter_of(attributes) == adapter

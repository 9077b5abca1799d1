"""The local broker carries W3C trace context as Knative's data plane does: the headers an event
came in with go out on its deliveries, its dead letters and its replies (unless a reply brings
trace attributes of its own); a source's event starts a trace of its own."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from cloudevents.conversion import to_binary
from cloudevents.http import CloudEvent, from_http

from devstack.eventing.broker import Broker, BrokerClient
from devstack.eventing.triggers import load_triggers
from functions import tracing

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
OWN = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class Recorder:
    """Records each delivery's headers and event; answers with `reply(event)` (None: 204)."""

    def __init__(self) -> None:
        self.seen: list[tuple[dict[str, str], CloudEvent]] = []
        self.replies: dict[str, CloudEvent] = {}
        self.status = 204
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                event = from_http(headers, body)
                recorder.seen.append((headers, event))
                answer = recorder.replies.get(event["type"])
                if answer is not None:
                    out_headers, out_body = to_binary(answer)
                    self.send_response(200)
                    for key, value in out_headers.items():
                        self.send_header(key, value)
                else:
                    out_body = b""
                    self.send_response(recorder.status)
                self.send_header("Content-Length", str(len(out_body)))
                self.end_headers()
                self.wfile.write(out_body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/"

    def of(self, type_: str) -> list[tuple[dict[str, str], CloudEvent]]:
        return [(h, e) for h, e in self.seen if e["type"] == type_]


def trigger(name: str, type_: str, dead_letters: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "broker": "default",
        "filters": [{"exact": {"type": type_}}],
        "subscriber": {"ref": {"apiVersion": "serving.knative.dev/v1", "kind": "Service", "name": "sub"}},
    }
    if dead_letters:
        dls = {"ref": {"apiVersion": "serving.knative.dev/v1", "kind": "Service", "name": "dls"}}
        spec["delivery"] = {"retry": 0, "deadLetterSink": dls}
    return {
        "apiVersion": "eventing.knative.dev/v1",
        "kind": "Trigger",
        "metadata": {"name": name, "namespace": "loraflow"},
        "spec": spec,
    }


@pytest.fixture
def setup() -> Iterator[tuple[Broker, Recorder, Recorder]]:
    subscriber, dead = Recorder(), Recorder()
    docs = [trigger("a", "io.test.a"), trigger("b", "io.test.b"), trigger("fails", "io.test.fail", True)]

    def resolve(destination: Any) -> str:
        return dead.url if destination["ref"]["name"] == "dls" else subscriber.url

    broker = Broker(load_triggers(docs), resolve, time_scale=0.01).start()
    yield broker, subscriber, dead
    broker.stop()
    for recorder in (subscriber, dead):
        recorder.server.shutdown()
        recorder.server.server_close()


def post(broker: Broker, type_: str, headers: dict[str, str]) -> None:
    wire, body = to_binary(CloudEvent({"type": type_, "source": "/tests"}, {"k": "v"}))
    assert httpx.post(broker.url, headers={**wire, **headers}, content=body).status_code == 202


def test_delivery_and_reply_carry_the_ingress_headers(setup: tuple[Broker, Recorder, Recorder]) -> None:
    broker, subscriber, _ = setup
    subscriber.replies["io.test.a"] = CloudEvent({"type": "io.test.b", "source": "/sub"}, {})
    post(broker, "io.test.a", {"traceparent": TRACEPARENT, "tracestate": "rojo=1"})
    assert broker.wait_idle(5)
    ((first, _),) = subscriber.of("io.test.a")
    ((second, _),) = subscriber.of("io.test.b")
    for headers in (first, second):
        assert headers["traceparent"] == TRACEPARENT and headers["tracestate"] == "rojo=1"
    logged = {e["trace_id"] for e in broker.log.since(0)}
    assert logged == {TRACEPARENT.split("-")[1]}


def test_a_reply_with_its_own_trace_keeps_it(setup: tuple[Broker, Recorder, Recorder]) -> None:
    broker, subscriber, _ = setup
    subscriber.replies["io.test.a"] = CloudEvent(
        {"type": "io.test.b", "source": "/sub", "traceparent": OWN}, {}
    )
    post(broker, "io.test.a", {"traceparent": TRACEPARENT})
    assert broker.wait_idle(5)
    ((headers, _),) = subscriber.of("io.test.b")
    assert headers["traceparent"] == OWN


def test_a_dead_letter_carries_the_trace(setup: tuple[Broker, Recorder, Recorder]) -> None:
    broker, subscriber, dead = setup
    subscriber.status = 400
    post(broker, "io.test.fail", {"traceparent": TRACEPARENT})
    assert broker.wait_idle(5)
    ((headers, event),) = dead.seen
    assert headers["traceparent"] == TRACEPARENT and event["knativeerrorcode"] == "400"


def test_without_a_trace_nothing_is_made_up_on_delivery(setup: tuple[Broker, Recorder, Recorder]) -> None:
    broker, subscriber, _ = setup
    post(broker, "io.test.a", {})
    assert broker.wait_idle(5)
    ((headers, _),) = subscriber.of("io.test.a")
    assert "traceparent" not in headers


def test_a_source_starts_a_trace_per_event(setup: tuple[Broker, Recorder, Recorder]) -> None:
    broker, subscriber, _ = setup
    client = BrokerClient(broker.url)
    try:
        for _ in range(2):
            assert client.send(
                CloudEvent({"type": "io.test.a", "source": "/apis/v1/namespaces/x/pingsources/p"}, {})
            )
        assert client.send(CloudEvent({"type": "io.test.a", "source": "/s", "traceparent": TRACEPARENT}, {}))
    finally:
        client.close()
    assert broker.wait_idle(5)
    parents = [tracing.parse(h.get("traceparent")) for h, _ in subscriber.of("io.test.a")]
    assert all(p is not None for p in parents)
    ids = [p.trace_id for p in parents if p is not None]
    assert len(set(ids)) == 3 and TRACEPARENT.split("-")[1] in ids

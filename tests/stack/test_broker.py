"""The local broker against Knative's rules: filters, retries, dead letters, replies, TTL."""

from __future__ import annotations

import base64
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from cloudevents.conversion import to_binary
from cloudevents.http import CloudEvent, from_http
from hypothesis import given, settings
from hypothesis import strategies as st

from devstack.eventing.broker import Broker, Faults
from devstack.eventing.sink import EventSink
from devstack.eventing.triggers import (
    Delivery,
    ManifestError,
    compile_trigger_filter,
    load_triggers,
    parse_duration,
)

Answer = tuple[int, dict[str, str], bytes]


class Subscriber:
    """A subscriber whose answer is programmable: `answers` is consumed, then `default`."""

    def __init__(self) -> None:
        self.received: list[tuple[float, CloudEvent]] = []
        self.answers: list[Answer | Callable[[CloudEvent], Answer]] = []
        self.default: Answer | Callable[[CloudEvent], Answer] = (204, {}, b"")
        self._lock = threading.Lock()
        sub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                event = from_http(dict(self.headers.items()), body)
                with sub._lock:
                    sub.received.append((time.monotonic(), event))
                    answer = sub.answers.pop(0) if sub.answers else sub.default
                status, headers, payload = answer(event) if callable(answer) else answer
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/"

    def types(self) -> list[str]:
        return [e["type"] for _, e in self.received]

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def trigger(name: str, service: str, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "eventing.knative.dev/v1",
        "kind": "Trigger",
        "metadata": {"name": name, "namespace": "loraflow"},
        "spec": {
            "broker": "default",
            "subscriber": {
                "ref": {"apiVersion": "serving.knative.dev/v1", "kind": "Service", "name": service}
            },
            **(spec or {}),
        },
    }


def event(type_: str = "io.test.a", **extensions: Any) -> CloudEvent:
    return CloudEvent({"type": type_, "source": "/tests", **extensions}, {"hello": "world"})


@pytest.fixture
def subs() -> Iterator[dict[str, Subscriber]]:
    made = {name: Subscriber() for name in ("a", "b", "c")}
    yield made
    for sub in made.values():
        sub.stop()


@pytest.fixture
def sink() -> Iterator[EventSink]:
    s = EventSink().start()
    yield s
    s.stop()


@pytest.fixture
def make_broker(subs: dict[str, Subscriber], sink: EventSink) -> Iterator[Callable[..., Broker]]:
    made: list[Broker] = []

    def resolve(destination: Any) -> str:
        name = destination["ref"]["name"]
        return sink.url if name == "dls" else subs[name].url

    def build(docs: list[dict[str, Any]], **options: Any) -> Broker:
        broker = Broker(load_triggers(docs), resolve, **{"time_scale": 0.01, **options}).start()
        made.append(broker)
        return broker

    yield build
    for broker in made:
        broker.stop()


RETRY = {"retry": 3, "backoffPolicy": "exponential", "backoffDelay": "PT1S"}
DLS = {"deadLetterSink": {"ref": {"apiVersion": "serving.knative.dev/v1", "kind": "Service", "name": "dls"}}}


# -- filters ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec", "attrs", "expected"),
    [
        ({"filter": {"attributes": {"type": "t", "kind": "Pod"}}}, {"type": "t", "kind": "Pod"}, True),
        ({"filter": {"attributes": {"type": "t", "kind": "Pod"}}}, {"type": "t"}, False),
        ({"filter": {"attributes": {"kind": ""}}}, {"kind": "anything"}, True),
        ({"filter": {"attributes": {"kind": ""}}}, {"type": "t"}, False),
        ({"filters": [{"exact": {"type": "t"}}]}, {"type": "t"}, True),
        ({"filters": [{"exact": {"type": "t"}}]}, {"type": "T"}, False),
        ({"filters": [{"prefix": {"type": "dev.knative."}}]}, {"type": "dev.knative.x"}, True),
        ({"filters": [{"suffix": {"type": ".v1"}}]}, {"type": "a.v2"}, False),
        ({"filters": [{"any": [{"exact": {"kind": "A"}}, {"exact": {"kind": "B"}}]}]}, {"kind": "B"}, True),
        ({"filters": [{"all": [{"exact": {"kind": "A"}}, {"prefix": {"type": "x"}}]}]}, {"kind": "A"}, False),
        ({"filters": [{"not": {"exact": {"kind": "A"}}}]}, {"kind": "B"}, True),
        ({"filters": [{"not": {"exact": {"kind": "A"}}}]}, {"kind": "A"}, False),
        (
            {"filters": [{"exact": {"type": "t"}}, {"exact": {"kind": "A"}}]},
            {"type": "t", "kind": "B"},
            False,
        ),
        # `filters` wins over `filter` when both are set
        (
            {"filter": {"attributes": {"type": "no"}}, "filters": [{"exact": {"type": "t"}}]},
            {"type": "t"},
            True,
        ),
        ({}, {"type": "anything"}, True),
    ],
)
def test_filter_dialects(spec: dict[str, Any], attrs: dict[str, str], expected: bool) -> None:
    assert compile_trigger_filter(spec)(attrs) is expected


def knative_says(expression: dict[str, Any], attrs: dict[str, str]) -> bool:
    """The SubscriptionsAPI filter semantics read from Knative's filter code
    (pkg/eventfilter/subscriptionsapi: exact, prefix, suffix, all, any, not), evaluated the
    plain way: what the broker's compiled filters must agree with."""
    ((dialect, spec),) = expression.items()
    if dialect == "all":
        return all(knative_says(e, attrs) for e in spec)
    if dialect == "any":
        return any(knative_says(e, attrs) for e in spec)
    if dialect == "not":
        return not knative_says(spec, attrs)
    tests: dict[str, Callable[[str, str], bool]] = {
        "exact": lambda have, want: have == want,
        "prefix": str.startswith,
        "suffix": str.endswith,
    }
    test = tests[dialect]
    return all(k in attrs and test(attrs[k], v) for k, v in spec.items())


KEYS = st.sampled_from(["type", "kind", "source", "loraflowstep"])
WORDS = st.sampled_from(["a", "ab", "b", "io.x.a", "io.x", "a.v1", "x"])
LEAVES = st.builds(
    lambda dialect, pairs: {dialect: pairs},
    st.sampled_from(["exact", "prefix", "suffix"]),
    st.dictionaries(KEYS, WORDS, min_size=1, max_size=2),
)
EXPRESSIONS = st.recursive(
    LEAVES,
    lambda inner: st.one_of(
        st.builds(lambda parts: {"all": parts}, st.lists(inner, max_size=3)),
        st.builds(lambda parts: {"any": parts}, st.lists(inner, max_size=3)),
        st.builds(lambda part: {"not": part}, inner),
    ),
    max_leaves=6,
)


@settings(max_examples=500, deadline=None)
@given(st.lists(EXPRESSIONS, min_size=1, max_size=3), st.dictionaries(KEYS, WORDS, max_size=4))
def test_compiled_filters_agree_with_knatives_semantics(
    filters: list[dict[str, Any]], attrs: dict[str, str]
) -> None:
    assert compile_trigger_filter({"filters": filters})(attrs) is all(knative_says(f, attrs) for f in filters)


WANTED = st.dictionaries(KEYS, st.one_of(st.just(""), WORDS), max_size=3)


@settings(max_examples=300, deadline=None)
@given(WANTED, st.dictionaries(KEYS, WORDS, max_size=4))
def test_attribute_filters_agree_with_knatives_semantics(
    wanted: dict[str, str], attrs: dict[str, str]
) -> None:
    """The legacy `filter.attributes`: every attribute equal; "" wants it present, any value."""
    expected = all(k in attrs and (v == "" or attrs[k] == v) for k, v in wanted.items())
    assert compile_trigger_filter({"filter": {"attributes": wanted}})(attrs) is expected


@pytest.mark.parametrize(
    "spec",
    [
        {"filters": [{"cesql": "type = 't'"}]},
        {"filters": [{"exact": {"type": ""}}]},
        {"filters": [{"exact": {"type": "t"}, "prefix": {"type": "t"}}]},
        {"filters": [{"regex": {"type": "t"}}]},
    ],
)
def test_unsupported_filters_fail_at_load(spec: dict[str, Any]) -> None:
    with pytest.raises(ManifestError):
        compile_trigger_filter(spec)


def test_durations_and_backoff() -> None:
    assert parse_duration("PT0.2S") == pytest.approx(0.2)
    assert parse_duration("PT1M30S") == 90
    assert parse_duration("P1DT1H") == 90000
    with pytest.raises(ManifestError):
        parse_duration("200ms")
    exp = Delivery.parse({"retry": 2, "backoffDelay": "PT1S"})
    lin = Delivery.parse({"retry": 2, "backoffPolicy": "linear", "backoffDelay": "PT1S"})
    assert [exp.backoff(n) for n in (1, 2, 3)] == [2, 4, 8]
    assert [lin.backoff(n) for n in (1, 2, 3)] == [1, 2, 3]


def test_trigger_delivery_replaces_broker_delivery() -> None:
    # Knative's trigger reconciler puts the Trigger's delivery, else the Broker's, whole into
    # the Subscription: a Trigger that sets only `retry` has no backoff delay and no dead letter
    broker = {
        "kind": "Broker",
        "metadata": {"name": "default"},
        "spec": {"delivery": {"retry": 10, "backoffDelay": "PT0.2S", **DLS}},
    }
    (plain, own) = load_triggers([broker, trigger("p", "a"), trigger("o", "a", {"delivery": {"retry": 1}})])
    assert plain.delivery.retry == 10 and plain.delivery.backoff_delay_s == pytest.approx(0.2)
    assert plain.delivery.dead_letter == DLS["deadLetterSink"]
    assert (own.delivery.retry, own.delivery.backoff_delay_s, own.delivery.dead_letter) == (1, 0.0, None)


# -- routing and ingress ----------------------------------------------------------------------------
def test_routes_by_filter_and_ingress_rules(
    make_broker: Callable[..., Broker], subs: dict[str, Subscriber]
) -> None:
    broker = make_broker(
        [
            trigger("to-a", "a", {"filter": {"attributes": {"type": "io.test.a"}}}),
            trigger("to-b", "b", {"filters": [{"prefix": {"type": "io.test."}}]}),
        ]
    )
    headers, body = to_binary(event("io.test.a"))
    assert httpx.post(broker.url, headers=headers, content=body).status_code == 202
    headers, body = to_binary(event("io.test.b"))
    assert httpx.post(broker.url, headers=headers, content=body).status_code == 202
    assert httpx.post(broker.url, content=b"not an event").status_code == 400
    assert httpx.put(broker.url, content=b"").status_code == 405
    assert broker.wait_idle(5)
    assert subs["a"].types() == ["io.test.a"]
    assert sorted(subs["b"].types()) == ["io.test.a", "io.test.b"]
    received = subs["a"].received[0][1]
    assert received["knativearrivaltime"]
    assert int(received["knativebrokerttl"]) == 255
    log = httpx.get(broker.url + "_devstack/events", params={"since": 0}).json()
    assert {e["outcome"] for e in log} >= {"received", "delivered"}
    last = log[-1]["seq"]
    assert httpx.get(broker.url + "_devstack/events", params={"since": last}).json() == []


def test_a_delivery_logs_the_subscribers_answer_time_apart_from_its_whole(
    make_broker: Callable[..., Broker], subs: dict[str, Subscriber]
) -> None:
    """`answer_ms` is the subscriber's own time (here it sleeps 200 ms), `duration_ms` the whole
    delivery: what is left between them is the broker's."""

    def slow(_: CloudEvent) -> Answer:
        time.sleep(0.2)
        return 204, {}, b""

    subs["a"].default = slow
    broker = make_broker([trigger("to-a", "a")])
    broker.publish(event("io.test.a"))
    assert broker.wait_idle(5)
    (delivered,) = [e for e in broker.log.since(0) if e["outcome"] == "delivered"]
    assert 200 <= delivered["answer_ms"] <= delivered["duration_ms"] < 1000


# -- retries and dead letters --------------------------------------------------------------------------
def test_retries_5xx_with_backoff_then_delivers(
    make_broker: Callable[..., Broker], subs: dict[str, Subscriber]
) -> None:
    broker = make_broker([trigger("t", "a", {"delivery": RETRY})], time_scale=0.05)
    subs["a"].answers = [(503, {}, b"busy"), (500, {}, b""), (429, {}, b"")]
    broker.publish(event())
    assert broker.wait_idle(10)
    times = [t for t, _ in subs["a"].received]
    assert len(times) == 4
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # exponential PT1S * 0.05: 0.1, 0.2, 0.4
    assert gaps[0] >= 0.09 and gaps[1] >= 0.19 and gaps[2] >= 0.39
    assert broker.counters.retried == 3 and broker.counters.delivered == 1


def test_400_is_final_and_dead_lettered_with_extensions(
    make_broker: Callable[..., Broker], subs: dict[str, Subscriber], sink: EventSink
) -> None:
    broker = make_broker([trigger("t", "a", {"delivery": {**RETRY, **DLS}})])
    subs["a"].default = (400, {}, b"never processable")
    broker.publish(event())
    assert broker.wait_idle(5)
    assert len(subs["a"].received) == 1
    (dead,) = sink.wait_for("io.test.a")
    assert dead["knativeerrordest"] == subs["a"].url
    assert dead["knativeerrorcode"] == "400"
    assert base64.b64decode(dead["knativeerrordata"]) == b"never processable"
    assert broker.counters.dead_lettered == 1


def test_exhausted_retries_are_dead_lettered(
    make_broker: Callable[..., Broker], subs: dict[str, Subscriber], sink: EventSink
) -> None:
    broker = make_broker([trigger("t", "a", {"delivery": {**RETRY, "retry": 2, **DLS}})])
    subs["a"].default = (404, {}, b"")
    broker.publish(event())
    assert broker.wait_idle(5)
    assert len(subs["a"].received) == 3
    (dead,) = sink.wait_for("io.test.a")
    assert dead["knativeerrorcode"] == "404"


def test_no_delivery_spec_means_no_retry(
    make_broker: Callable[..., Broker], subs: dict[str, Subscriber]
) -> None:
    broker = make_broker([trigger("t", "a")])
    subs["a"].default = (503, {}, b"")
    broker.publish(event())
    assert broker.wait_idle(5)
    assert len(subs["a"].received) == 1
    assert broker.counters.failed == 1


def test_non_cloudevent_2xx_body_is_a_failed_delivery(
    make_broker: Callable[..., Broker], subs: dict[str, Subscriber], sink: EventSink
) -> None:
    broker = make_broker([trigger("t", "a", {"delivery": {**RETRY, "retry": 1, **DLS}})])
    subs["a"].default = (200, {"Content-Type": "text/html"}, b"OK")
    broker.publish(event())
    assert broker.wait_idle(5)
    assert len(subs["a"].received) == 2
    (dead,) = sink.wait_for("io.test.a")
    assert dead["knativeerrorcode"] == "502"


def test_unreachable_subscriber_is_retried(
    make_broker: Callable[..., Broker], subs: dict[str, Subscriber]
) -> None:
    broker = make_broker([trigger("t", "a", {"delivery": {**RETRY, "retry": 2}})])
    subs["a"].stop()
    broker.publish(event())
    assert broker.wait_idle(5)
    assert broker.counters.retried == 2 and broker.counters.failed == 1


# -- replies and TTL ---------------------------------------------------------------------------------------
def reply_with(type_: str) -> Callable[[CloudEvent], Answer]:
    def answer(_: CloudEvent) -> Answer:
        headers, body = to_binary(CloudEvent({"type": type_, "source": "/a"}, {"n": 1}))
        return 200, dict(headers), body or b""

    return answer


def test_reply_is_republished_with_decremented_ttl(
    make_broker: Callable[..., Broker], subs: dict[str, Subscriber]
) -> None:
    broker = make_broker(
        [
            trigger("first", "a", {"filter": {"attributes": {"type": "io.test.a"}}}),
            trigger("second", "b", {"filter": {"attributes": {"type": "io.test.next"}}}),
        ]
    )
    subs["a"].default = reply_with("io.test.next")
    broker.publish(event())
    assert broker.wait_idle(5)
    (next_event,) = [e for _, e in subs["b"].received]
    assert int(next_event["knativebrokerttl"]) == 254
    assert broker.counters.replies == 1


def test_ttl_exhaustion_stops_a_reply_loop(
    make_broker: Callable[..., Broker], subs: dict[str, Subscriber]
) -> None:
    broker = make_broker([trigger("loop", "a")])
    subs["a"].default = reply_with("io.test.a")
    broker.publish(event(knativebrokerttl="5"))
    assert broker.wait_idle(5)
    assert len(subs["a"].received) == 5
    assert [int(e["knativebrokerttl"]) for _, e in subs["a"].received] == [5, 4, 3, 2, 1]
    headers, body = to_binary(event(knativebrokerttl="0"))
    assert httpx.post(broker.url, headers=headers, content=body).status_code == 400


# -- faults --------------------------------------------------------------------------------------------------
def test_faults_duplicate_and_drop_are_seeded(
    make_broker: Callable[..., Broker], subs: dict[str, Subscriber]
) -> None:
    broker = make_broker([trigger("t", "a")], faults=Faults(duplicate=True, shuffle=0.02, seed=7))
    for _ in range(5):
        broker.publish(event())
    assert broker.wait_idle(5)
    assert 10 <= len(subs["a"].received) <= 15
    broker.set_faults(Faults(drop=1.0))
    subs["a"].received.clear()
    broker.publish(event())
    assert broker.wait_idle(5)
    assert subs["a"].received == []
    assert broker.counters.dropped == 1


def test_wait_idle_times_out_while_retrying(
    make_broker: Callable[..., Broker], subs: dict[str, Subscriber]
) -> None:
    broker = make_broker(
        [trigger("t", "a", {"delivery": {"retry": 1, "backoffDelay": "PT10S"}})], time_scale=1.0
    )
    subs["a"].answers = [(500, {}, b"")]
    broker.publish(event())
    assert not broker.wait_idle(0.3)

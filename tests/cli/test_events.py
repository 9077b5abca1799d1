"""`loraflow events` against the embedded broker's event log (`GET /_devstack/events?since=N`)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import httpx
import pytest
from cloudevents.conversion import to_binary
from cloudevents.http import CloudEvent

from devstack.eventing.broker import Broker
from loraflow.cli import main
from loraflow.tail import parse_page


@pytest.fixture
def broker() -> Iterator[Broker]:
    running = Broker([], lambda subscriber: "http://127.0.0.1:9/").start()
    try:
        yield running
    finally:
        running.stop()


def publish(broker: Broker, type_: str, subject: str) -> None:
    event = CloudEvent(
        {"type": type_, "source": "/tests", "id": secrets.token_hex(6), "subject": subject}, {}
    )
    headers, body = to_binary(event)
    assert httpx.post(broker.url, headers=headers, content=body).status_code == 202


def test_events_prints_our_domain_events(broker: Broker, capsys: pytest.CaptureFixture[str]) -> None:
    publish(broker, "io.loraflow.adapter.admitted.v1", "/apis/x/namespaces/a/loraadapters/one")
    publish(broker, "dev.knative.sources.ping", "")
    publish(broker, "io.loraflow.adapter.ready.v1", "/apis/x/namespaces/a/loraadapters/one")

    assert main(["events", "--broker-url", broker.url]) == 0

    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert "received" in lines[0] and "io.loraflow.adapter.admitted.v1" in lines[0]
    assert "io.loraflow.adapter.ready.v1" in lines[1] and "loraadapters/one" in lines[1]


def test_type_prefix_and_all(broker: Broker, capsys: pytest.CaptureFixture[str]) -> None:
    publish(broker, "io.loraflow.adapter.admitted.v1", "s")
    publish(broker, "io.loraflow.adapter.ready.v1", "s")
    publish(broker, "dev.knative.sources.ping", "s")

    assert main(["events", "--broker-url", broker.url, "--type", "io.loraflow.adapter.ready"]) == 0
    assert "adapter.ready" in capsys.readouterr().out
    assert main(["events", "--broker-url", broker.url, "--all"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3


def test_follow_polls_from_the_last_cursor(
    broker: Broker, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    publish(broker, "io.loraflow.adapter.admitted.v1", "first")
    polls: list[float] = []

    def sleep(seconds: float) -> None:
        polls.append(seconds)
        if len(polls) == 1:
            publish(broker, "io.loraflow.adapter.loaded.v1", "second")
        else:
            raise KeyboardInterrupt

    monkeypatch.setattr("loraflow.tail._pause", sleep)

    assert main(["events", "--broker-url", broker.url, "--follow", "--interval", "0.1"]) == 0

    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[4] for line in lines] == ["first", "second"]  # each once, in order


def test_cursor_is_exclusive_and_shapes_are_tolerated() -> None:
    assert parse_page([{"seq": 4}, {"seq": 5}], 3).next == 5
    assert parse_page([], 7).next == 7
    assert parse_page({"events": [{"type": "a"}], "next": 12}, 0).next == 12


def test_unreachable_or_missing_log_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["events", "--broker-url", "http://127.0.0.1:9"]) == 1
    err = capsys.readouterr().err
    assert "cannot reach the broker" in err and "Traceback" not in err


def test_each_line_names_its_trace(broker: Broker, capsys: pytest.CaptureFixture[str]) -> None:
    """The first 8 hex digits of the trace the event came with (W3C header), `-` without one."""
    event = CloudEvent({"type": "io.loraflow.adapter.ready.v1", "source": "/t", "subject": "s"}, {})
    headers, body = to_binary(event)
    traced = {**headers, "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    assert httpx.post(broker.url, headers=traced, content=body).status_code == 202
    publish(broker, "io.loraflow.adapter.ready.v1", "s")

    assert main(["events", "--broker-url", broker.url]) == 0
    assert [line.split()[1] for line in capsys.readouterr().out.splitlines()] == ["4bf92f35", "-"]

"""ingest on fakes (tests/support/fakes.py): the aws-sqs CloudEvent and the SeaweedFS webhook
become file.changed, with the token, the body limit, hostile bodies and the publish's retries
paced by a fake clock (no test waits on real time).

The same step over real HTTP is tests/functions/test_ingest.py; decoding by table is
tests/unit/test_ingest_decode.py.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import secrets
from typing import Any

import flask
import pytest
from cloudevents.http import CloudEvent
from werkzeug.test import EnvironBuilder

from events.domain import FILE_CHANGED
from events.external import AWS_SQS
from events.schema_urls import schema_file
from functions import ingest
from functions.edge.bootstrap import Deps
from functions.edge.messages import MAX_BODY_BYTES
from functions.errors import BodyTooLarge, Reject, Retryable, Unauthorized, WebhookNotConfigured
from functions.settings import Settings
from tests.support import filer_pb
from tests.support.fakes import FakeBroker

DIR = "/loraadapters/team-a/m1/a1"
CONTENT = b"weights"
MD5 = hashlib.md5(CONTENT, usedforsecurity=False).hexdigest()
TOKEN = "s3cret"
SCHEMAS = "https://schemas.example/loraflow/"
BAD_MD5 = {"new_entry": {"attributes": {"md5": "!!"}}}


class Clock:
    """Monotonic time that passes only when slept through (or when an attempt takes some)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class FlakyBroker(FakeBroker):
    """Answers 503 to the first `failures` posts (None: to all of them); each post takes `took`."""

    def __init__(self, clock: Clock, failures: int | None, took: float = 0.0) -> None:
        super().__init__()
        self.clock, self.failures, self.took = clock, failures, took
        self.timeouts: list[float | None] = []

    def publish(self, event: CloudEvent, timeout: float | None = None) -> None:
        self.timeouts.append(timeout)
        self.clock.now += self.took
        if self.failures is None or len(self.timeouts) <= self.failures:
            raise Retryable("broker answered 503")
        super().publish(event, timeout)


def deps(broker: FakeBroker | None = None, **settings: Any) -> Deps:
    configured: dict[str, Any] = {"webhook_token": TOKEN, "schema_base_url": SCHEMAS, **settings}
    return Deps(Settings(**configured), broker=broker or FakeBroker())


def entry(name: str, directory: bool = False) -> dict[str, Any]:
    """A filer Entry as the webhook's Go encoding/json writes it."""
    if directory:
        return {
            "name": name,
            "is_directory": True,
            "attributes": {"mtime": 1796109979, "file_mode": 2147484153},
        }
    md5 = base64.b64encode(bytes.fromhex(MD5)).decode()
    attributes = {"file_size": len(CONTENT), "mtime": 1796109979, "file_mode": 432, "md5": md5}
    return {"name": name, "attributes": attributes}


def webhook_body(key: str, name: str = "w.safetensors", parent: str = DIR, **message: Any) -> dict[str, Any]:
    note = {"new_entry": entry(name), "new_parent_path": parent, "delete_chunks": True, **message}
    return {"event_type": "create", "key": key, "message": note}


def request(
    body: bytes | dict[str, Any], token: str | None = TOKEN, length: int | None = None, chunked: bool = False
) -> flask.Request:
    """The filer's POST as the WSGI server hands it to the function."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = [("Authorization", f"Bearer {token}")] if token is not None else []
    environ = EnvironBuilder(
        method="POST", data=data, headers=headers, content_type="application/json"
    ).get_environ()
    if length is not None:
        environ["CONTENT_LENGTH"] = str(length)
    if chunked:  # no declared length: read as it comes
        del environ["CONTENT_LENGTH"]
        environ["wsgi.input"] = io.BytesIO(data)
        environ["wsgi.input_terminated"] = True
    return flask.Request(environ)


def webhook(req: flask.Request, using: Deps, clock: Clock | None = None) -> CloudEvent | None:
    clock = clock or Clock()
    return ingest.webhook(req, using, clock=clock.monotonic, sleep=clock.sleep)


# -- aws-sqs ---------------------------------------------------------------------------------------
def sqs_event(data: Any, key: str | None = None) -> CloudEvent:
    attributes = {"type": AWS_SQS, "source": "aws.sqs.test", "id": secrets.token_hex(8)}
    if key:
        attributes["key"] = key
    return CloudEvent(attributes, data)


def created_pb(parent: str = DIR, name: str = "w.safetensors") -> bytes:
    return filer_pb.notification(
        new=filer_pb.entry(name, size=len(CONTENT), md5_hex=MD5), new_parent_path=parent
    )


def test_an_sqs_notification_is_replied_as_file_changed() -> None:
    reply = ingest.handle(sqs_event(created_pb()), deps())
    assert reply is not None and reply["type"] == FILE_CHANGED
    assert (reply["subject"], reply["source"]) == (f"{DIR}/w.safetensors", "/loraflow/ingest")
    assert reply["dataschema"] == SCHEMAS + schema_file(FILE_CHANGED)
    assert reply.get_data() == {"path": f"{DIR}/w.safetensors", "eventType": "create", "size": 7, "md5": MD5}


def test_an_sqs_notification_of_a_directory_or_elsewhere_is_no_event() -> None:
    directory = filer_pb.notification(
        new=filer_pb.entry("a2", directory=True), new_parent_path="/loraadapters/t/m1"
    )
    assert ingest.handle(sqs_event(directory), deps()) is None
    assert ingest.handle(sqs_event(created_pb("/buckets/other", "x")), deps()) is None


@pytest.mark.parametrize(
    ("data", "key", "needle"),
    [
        (b"\x0a\xff\xff", None, "EventNotification"),
        (b"", None, "no data"),
        (filer_pb.notification(old=filer_pb.entry("w")), None, "no `key`"),
        (created_pb(), f"{DIR}/../x", "not normalised"),
        (created_pb(), f"{DIR}/%2e%2e/x", "percent-encoded"),
        (b"\x0a" + b"\xff" * 10 + b"\x7f", None, "EventNotification"),
    ],
    ids=["truncated", "empty", "no-key", "dotdot-key", "encoded-key", "varint-overflow"],
)
def test_hostile_sqs_events_are_rejected(data: bytes, key: str | None, needle: str) -> None:
    with pytest.raises(Reject, match=needle):
        ingest.handle(sqs_event(data, key), deps())


# -- the webhook -----------------------------------------------------------------------------------
def test_the_webhook_publishes_to_the_broker_and_answers_nothing() -> None:
    broker = FakeBroker()
    assert webhook(request(webhook_body(f"{DIR}/w.safetensors")), deps(broker, broker_url="http://b")) is None
    (event,) = broker.events
    assert (event["type"], event["subject"]) == (FILE_CHANGED, f"{DIR}/w.safetensors")
    assert event["dataschema"] == SCHEMAS + schema_file(FILE_CHANGED)


def test_without_a_broker_the_webhook_answers_with_the_event() -> None:
    reply = webhook(request(webhook_body(f"{DIR}/w.safetensors")), deps())
    assert reply is not None and reply.get_data()["md5"] == MD5  # type: ignore[index]


def test_a_publish_that_fails_is_retried_with_backoff_on_the_clock_given() -> None:
    clock = Clock()
    broker = FlakyBroker(clock, failures=3)
    using = deps(broker, broker_url="http://b", publish_budget=5.0)
    assert webhook(request(webhook_body(f"{DIR}/w.safetensors")), using, clock) is None
    assert len(broker.events) == 1 and len(broker.timeouts) == 4
    assert clock.sleeps == [0.05, 0.1, 0.2]
    assert broker.timeouts[0] == 5.0 and all(t is not None and t <= 5.0 for t in broker.timeouts)


def test_a_broker_down_for_the_whole_budget_is_a_retry_for_the_filer() -> None:
    clock = Clock()
    broker = FlakyBroker(clock, failures=None, took=0.2)
    using = deps(broker, broker_url="http://b", publish_budget=2.0)
    with pytest.raises(Retryable, match="503"):
        webhook(request(webhook_body(f"{DIR}/w.safetensors")), using, clock)
    assert clock.now - 100.0 <= 2.0 + 0.2  # the last attempt may take what it was given
    assert broker.events == [] and len(broker.timeouts) >= 2


def test_the_token_is_checked_before_the_body_is_read() -> None:
    body = webhook_body(f"{DIR}/w.safetensors")
    for token in (None, "", "wrong", TOKEN + "x"):
        with pytest.raises(Unauthorized):
            webhook(request(body, token=token), deps())
    oversized = request(b"x" * 16, token="wrong", length=MAX_BODY_BYTES + 1)
    with pytest.raises(Unauthorized):
        webhook(oversized, deps())


def test_a_webhook_without_a_token_configured_refuses_to_serve() -> None:
    with pytest.raises(WebhookNotConfigured, match="LORAFLOW_WEBHOOK_TOKEN is not set"):
        webhook(request(webhook_body(f"{DIR}/w.safetensors")), deps(webhook_token=None))
    with pytest.raises(WebhookNotConfigured):
        webhook(request(webhook_body(f"{DIR}/w.safetensors")), deps(webhook_token=""))


def test_a_body_over_the_limit_is_refused_before_it_is_read() -> None:
    declared = request(b"{}", length=MAX_BODY_BYTES + 1)
    with pytest.raises(BodyTooLarge, match="exceeds"):
        webhook(declared, deps())
    streamed = request(b" " * (MAX_BODY_BYTES + 1), chunked=True)
    with pytest.raises(BodyTooLarge, match="exceeds"):
        webhook(streamed, deps())


def test_a_body_at_the_limit_is_read() -> None:
    body = json.dumps(webhook_body(f"{DIR}/w.safetensors")).encode()
    padded = body + b" " * (MAX_BODY_BYTES - len(body))
    assert webhook(request(padded, chunked=True), deps()) is not None


def test_notifications_of_directories_and_unmapped_paths_are_no_event() -> None:
    directory = webhook_body(DIR, parent="/loraadapters/team-a/m1")
    directory["message"]["new_entry"] = entry("a1", directory=True)
    assert webhook(request(directory), deps()) is None
    assert webhook(request(webhook_body("/buckets/other/x", "x", "/buckets/other")), deps()) is None


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"{nope", "not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "not JSON"),
        (b"\xff\xfe\x00", "not JSON"),
        (b"[]", "not a SeaweedFS notification"),
        ({"event_type": "create", "message": {}}, "key"),
        ({"key": f"{DIR}/w", "event_type": "create", "message": {}}, "neither"),
        ({"key": f"{DIR}/w", "event_type": "create", "message": "x"}, "message"),
        (webhook_body(f"{DIR}/../../etc/passwd"), "not normalised"),
        (webhook_body(f"{DIR}/%2e%2e/x"), "percent-encoded"),
        (webhook_body(f"{DIR}/x\x00y"), "NUL"),
        ({"key": f"{DIR}/w", "event_type": "create", "message": BAD_MD5}, "md5"),
    ],
    ids=["not-json", "deep", "not-utf8", "array", "no-key", "empty-message", "message-type", "dotdot",
         "encoded-dotdot", "nul", "bad-md5"],
)  # fmt: skip
def test_hostile_webhook_bodies_are_rejected(body: bytes | dict[str, Any], needle: str) -> None:
    broker = FakeBroker()
    with pytest.raises(Reject, match=needle):
        webhook(request(body), deps(broker, broker_url="http://b"))
    assert broker.events == []

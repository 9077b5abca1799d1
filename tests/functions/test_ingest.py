"""ingest over real HTTP: the SeaweedFS webhook (JSON, bearer token) and the aws-sqs CloudEvent."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
from typing import Any

import httpx
import pytest
from cloudevents.http import CloudEvent, from_http

from devstack.standins.notifications import webhook_body
from events.domain import FILE_CHANGED
from events.external import AWS_SQS
from functions.logic.seaweed_event import EntryInfo, Notification, encode_event_notification
from tests.support.testbed import Testbed

DIR = "/loraadapters/ns1/llama/a"
CONTENT = b"weights"
MD5 = hashlib.md5(CONTENT, usedforsecurity=False).hexdigest()


def created(parent: str = DIR, name: str = "w.safetensors", directory: bool = False) -> Notification:
    entry = EntryInfo(name=name, is_directory=directory, file_size=len(CONTENT), md5=bytes.fromhex(MD5))
    return Notification(new_entry=entry, new_parent_path=parent)


def post_webhook(world: Testbed, body: Any, token: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return world.http.post(world.host.urls["ingest"], json=body, headers=headers)


def reply(response: httpx.Response) -> CloudEvent:
    assert response.status_code == 200, response.text
    return from_http(dict(response.headers), response.content)


def test_webhook_publishes_file_changed_to_the_broker(world: Testbed) -> None:
    path = f"{DIR}/{secrets.token_hex(4)}.safetensors"
    note = created(name=path.rsplit("/", 1)[1])
    assert post_webhook(world, webhook_body(path, "create", note)).status_code == 204
    (event,) = world.sink.wait_for(FILE_CHANGED, 1) and [
        e for e in world.sink.of_type(FILE_CHANGED) if e["subject"] == path
    ]
    assert event["source"] == "/loraflow/ingest"
    assert event.get_data() == {"path": path, "eventType": "create", "size": len(CONTENT), "md5": MD5}


def test_webhook_without_broker_replies_in_the_response(world: Testbed) -> None:
    with world.settings(LORAFLOW_BROKER_URL=""):
        event = reply(post_webhook(world, webhook_body(f"{DIR}/w.safetensors", "create", created())))
    assert event["type"] == FILE_CHANGED and event["subject"] == f"{DIR}/w.safetensors"


def test_webhook_broker_down_is_retryable(world: Testbed) -> None:
    with world.settings(LORAFLOW_BROKER_URL="http://127.0.0.1:9"):
        response = post_webhook(world, webhook_body(f"{DIR}/w.safetensors", "create", created()))
    assert response.status_code == 503


def test_webhook_token(world: Testbed) -> None:
    body = webhook_body(f"{DIR}/w.safetensors", "create", created())
    with world.settings(LORAFLOW_WEBHOOK_TOKEN="s3cret", LORAFLOW_BROKER_URL=""):
        assert post_webhook(world, body).status_code == 401
        assert post_webhook(world, body, token="wrong").status_code == 401
        assert reply(post_webhook(world, body, token="s3cret"))["type"] == FILE_CHANGED


def test_webhook_rename(world: Testbed) -> None:
    old = EntryInfo(name="tmp.upload", file_size=len(CONTENT))
    new = EntryInfo(name="w.safetensors", file_size=len(CONTENT), md5=bytes.fromhex(MD5))
    note = Notification(old_entry=old, new_entry=new, new_parent_path=DIR)
    with world.settings(LORAFLOW_BROKER_URL=""):
        event = reply(post_webhook(world, webhook_body(f"{DIR}/tmp.upload", "rename", note)))
    assert event["subject"] == f"{DIR}/tmp.upload"
    assert event.get_data() == {
        "path": f"{DIR}/tmp.upload",
        "eventType": "rename",
        "newPath": f"{DIR}/w.safetensors",
        "size": len(CONTENT),
        "md5": MD5,
    }


@pytest.mark.parametrize(
    ("key", "note"),
    [
        pytest.param("/buckets/other/x", created("/buckets/other", "x"), id="other-path"),
        pytest.param(DIR, created("/loraadapters/ns1/llama", "a", directory=True), id="directory"),
    ],
)
def test_webhook_ignored(world: Testbed, key: str, note: Notification) -> None:
    with world.settings(LORAFLOW_BROKER_URL=""):
        assert post_webhook(world, webhook_body(key, "create", note)).status_code == 204


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        pytest.param(
            {"key": f"{DIR}/../../x", "event_type": "create", "message": {}}, "not normalised", id="dotdot"
        ),
        pytest.param(
            webhook_body(f"{DIR}/%2e%2e/x", "create", created()), "percent-encoded", id="encoded-dotdot"
        ),
        pytest.param(webhook_body(f"{DIR}/x\x00y", "create", created()), "NUL", id="nul"),
        pytest.param({"event_type": "create", "message": {}}, "key", id="no-key"),
        pytest.param(
            {
                "key": f"{DIR}/w",
                "event_type": "create",
                "message": {"new_entry": {"attributes": {"md5": "!!"}}},
            },
            "md5",
            id="bad-md5-base64",
        ),
        pytest.param(
            {"key": f"{DIR}/w", "event_type": "create", "message": {}}, "neither", id="empty-message"
        ),
    ],
)
def test_webhook_rejects(world: Testbed, body: dict[str, Any], needle: str) -> None:
    response = post_webhook(world, body)
    assert response.status_code == 400
    assert needle in response.text


def test_webhook_body_not_json(world: Testbed) -> None:
    response = world.http.post(
        world.host.urls["ingest"], content=b"{nope", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400


def sqs_event(data: Any, key: str | None = None) -> CloudEvent:
    attributes = {"type": AWS_SQS, "source": "aws.sqs.test", "id": secrets.token_hex(8)}
    if key:
        attributes["key"] = key
    return CloudEvent(attributes, data)


@pytest.mark.parametrize(
    "structured", [pytest.param(False, id="binary"), pytest.param(True, id="structured")]
)
def test_sqs_event_raw_bytes_without_key(world: Testbed, structured: bool) -> None:
    event = reply(world.post("ingest", sqs_event(encode_event_notification(created())), structured))
    assert event["subject"] == f"{DIR}/w.safetensors"


@pytest.mark.parametrize(
    "structured", [pytest.param(False, id="binary"), pytest.param(True, id="structured")]
)
def test_sqs_event_base64_string_with_key(world: Testbed, structured: bool) -> None:
    data = base64.b64encode(encode_event_notification(created())).decode()
    event = reply(world.post("ingest", sqs_event(data, key=f"{DIR}/w.safetensors"), structured))
    assert event.get_data()["md5"] == MD5


@pytest.mark.parametrize(
    ("data", "key", "needle"),
    [
        pytest.param(b"\x0a\xff\xff", None, "EventNotification", id="truncated-protobuf"),
        pytest.param(
            encode_event_notification(Notification(old_entry=EntryInfo(name="w"))),
            None,
            "no `key`",
            id="no-key",
        ),
        pytest.param(encode_event_notification(created()), f"{DIR}/../x", "not normalised", id="bad-key"),
    ],
)
def test_sqs_event_rejects(world: Testbed, data: bytes, key: str | None, needle: str) -> None:
    response = world.post("ingest", sqs_event(data, key))
    assert response.status_code == 400
    assert needle in response.text


def test_sqs_event_for_another_path_is_ignored(world: Testbed) -> None:
    data = encode_event_notification(created("/buckets/x", "y"))
    assert world.post("ingest", sqs_event(data)).status_code == 204


def test_sqs_structured_json_object_data_is_rejected(world: Testbed) -> None:
    body = {"specversion": "1.0", "type": AWS_SQS, "source": "s", "id": "1", "data": {"Body": "x"}}
    response = world.http.post(
        world.host.urls["ingest"],
        content=json.dumps(body).encode(),
        headers={"content-type": "application/cloudevents+json"},
    )
    assert response.status_code == 400 and "JSON dict" in response.text

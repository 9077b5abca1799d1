"""ingest over real HTTP: the SeaweedFS webhook (JSON, bearer token) and the aws-sqs CloudEvent.

Webhook bodies have the real filer's shape (seaweedfs-real.md section 2: chunks, inode,
signatures, delete_chunks); SQS bodies are encoded by the official protobuf runtime
(tests.support.filer_pb). What the real filer sends end to end: tests/functions/test_seaweedfs.py.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
from typing import Any

import httpx
import pytest
from cloudevents.http import CloudEvent, from_http

from devstack.seaweedfs import FaultProxy
from events.domain import FILE_CHANGED
from events.external import AWS_SQS
from tests.support import filer_pb
from tests.support.testbed import Testbed

DIR = "/loraadapters/ns1/llama/a"
CONTENT = b"weights"
MD5 = hashlib.md5(CONTENT, usedforsecurity=False).hexdigest()


def entry_json(name: str, directory: bool = False, md5: str | None = MD5) -> dict[str, Any]:
    """A filer Entry as the webhook's Go encoding/json writes it (omitempty, base64 md5)."""
    if directory:
        attributes = {
            "mtime": 1796109979,
            "file_mode": 2147484153,
            "crtime": 1796109979,
            "ctime": -62135596800,
        }
        return {"name": name, "is_directory": True, "attributes": attributes}
    attributes = {"file_size": len(CONTENT), "mtime": 1796109979, "file_mode": 432, "crtime": 1796109979,
                  "inode": 13080058405695252649, "ctime": -62135596800}  # fmt: skip
    if md5:
        attributes["md5"] = base64.b64encode(bytes.fromhex(md5)).decode()
    chunk = {
        "size": len(CONTENT),
        "modified_ts_ns": 1796109979565793763,
        "fid": {"volume_id": 7, "file_key": 2},
    }
    return {"name": name, "chunks": [chunk], "attributes": attributes}


def created(parent: str = DIR, name: str = "w.safetensors", directory: bool = False) -> dict[str, Any]:
    return {
        "new_entry": entry_json(name, directory),
        "delete_chunks": not directory,
        "new_parent_path": parent,
        "signatures": [1927035721],
    }


def webhook_body(key: str, event_type: str, message: dict[str, Any]) -> dict[str, Any]:
    return {"event_type": event_type, "key": key, "message": message}


def created_pb(parent: str = DIR, name: str = "w.safetensors") -> bytes:
    return filer_pb.notification(
        new=filer_pb.entry(name, size=len(CONTENT), md5_hex=MD5), new_parent_path=parent
    )


def post_webhook(world: Testbed, body: Any, token: str | None = None) -> httpx.Response:
    """As the filer posts it, with the session's bearer token unless `token` says otherwise
    ("" sends none)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if token is None:
        headers = world.webhook_auth
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
    with world.settings(LORAFLOW_BROKER_URL="http://127.0.0.1:9", LORAFLOW_PUBLISH_BUDGET="0.3"):
        response = post_webhook(world, webhook_body(f"{DIR}/w.safetensors", "create", created()))
    assert response.status_code == 503


def test_webhook_retries_its_publish_instead_of_counting_on_a_redelivery(world: Testbed) -> None:
    """SeaweedFS 4.48 posts once: a Broker that fails three times must not lose the event."""
    path = f"{DIR}/{secrets.token_hex(4)}.safetensors"
    with FaultProxy(world.sink.url) as broker, world.settings(LORAFLOW_BROKER_URL=broker.url):
        broker.inject(503, times=3)
        response = post_webhook(world, webhook_body(path, "create", created(name=path.rsplit("/", 1)[1])))
        assert response.status_code == 204, response.text
        assert broker.requests == 4
    assert world.sink.wait_for(FILE_CHANGED, 1)
    assert [e["subject"] for e in world.sink.of_type(FILE_CHANGED) if e["subject"] == path] == [path]


def test_webhook_gives_up_when_the_budget_is_spent(world: Testbed) -> None:
    with FaultProxy(world.sink.url) as broker:
        broker.inject(503, times=None)
        with world.settings(LORAFLOW_BROKER_URL=broker.url, LORAFLOW_PUBLISH_BUDGET="0.4"):
            response = post_webhook(world, webhook_body(f"{DIR}/w.safetensors", "create", created()))
        assert response.status_code == 503
        assert 2 <= broker.requests <= 10  # backoff 50, 100, 200 ms... inside 0.4 s


def test_s3_gateway_paths_are_mapped_to_the_adapter_layout(world: Testbed) -> None:
    key = f"/buckets/loraadapters{DIR}/w.safetensors"
    with world.settings(LORAFLOW_BROKER_URL="", LORAFLOW_STORAGE="s3"):
        event = reply(
            post_webhook(world, webhook_body(key, "create", created(f"/buckets/loraadapters{DIR}")))
        )
    assert event["subject"] == f"{DIR}/w.safetensors"
    assert event.get_data()["path"] == f"{DIR}/w.safetensors"


def test_paths_the_backend_cannot_map_are_2xx_and_logged_once(
    world: Testbed, caplog: pytest.LogCaptureFixture
) -> None:
    folder = f"/elsewhere-{secrets.token_hex(3)}"
    with world.settings(LORAFLOW_BROKER_URL="", LORAFLOW_STORAGE="s3"), caplog.at_level("INFO", "loraflow"):
        for name in ("a", "b", "c"):  # a filer path outside the bucket; the S3 backend has no use for it
            assert (
                post_webhook(
                    world, webhook_body(f"{folder}/x/{name}", "create", created(f"{folder}/x", name))
                ).status_code
                == 204
            )
    noted = [r for r in caplog.records if r.name == "loraflow.ingest" and folder in r.getMessage()]
    assert len(noted) == 1, [r.getMessage() for r in noted]


def test_webhook_token(world: Testbed) -> None:
    body = webhook_body(f"{DIR}/w.safetensors", "create", created())
    with world.settings(LORAFLOW_WEBHOOK_TOKEN="s3cret", LORAFLOW_BROKER_URL=""):
        assert post_webhook(world, body, token="").status_code == 401
        assert post_webhook(world, body, token="wrong").status_code == 401
        assert reply(post_webhook(world, body, token="s3cret"))["type"] == FILE_CHANGED


def test_webhook_rename(world: Testbed) -> None:
    note = {
        "old_entry": entry_json("tmp.upload"),
        "new_entry": entry_json("w.safetensors"),
        "new_parent_path": DIR,
        "signatures": [1927035721],
    }
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
def test_webhook_ignored(world: Testbed, key: str, note: dict[str, Any]) -> None:
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
    headers = {"content-type": "application/json", **world.webhook_auth}
    response = world.http.post(world.host.urls["ingest"], content=b"{nope", headers=headers)
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
    event = reply(world.post("ingest", sqs_event(created_pb()), structured))
    assert event["subject"] == f"{DIR}/w.safetensors"


@pytest.mark.parametrize(
    "structured", [pytest.param(False, id="binary"), pytest.param(True, id="structured")]
)
def test_sqs_event_base64_string_with_key(world: Testbed, structured: bool) -> None:
    data = filer_pb.as_base64(created_pb())
    event = reply(world.post("ingest", sqs_event(data, key=f"{DIR}/w.safetensors"), structured))
    assert event.get_data()["md5"] == MD5


@pytest.mark.parametrize(
    ("data", "key", "needle"),
    [
        pytest.param(b"\x0a\xff\xff", None, "EventNotification", id="truncated-protobuf"),
        pytest.param(
            filer_pb.notification(old=filer_pb.entry("w")),
            None,
            "no `key`",
            id="no-key",
        ),
        pytest.param(created_pb(), f"{DIR}/../x", "not normalised", id="bad-key"),
    ],
)
def test_sqs_event_rejects(world: Testbed, data: bytes, key: str | None, needle: str) -> None:
    response = world.post("ingest", sqs_event(data, key))
    assert response.status_code == 400
    assert needle in response.text


def test_sqs_event_for_another_path_is_ignored(world: Testbed) -> None:
    data = created_pb("/buckets/x", "y")
    assert world.post("ingest", sqs_event(data)).status_code == 204


def test_sqs_structured_json_object_data_is_rejected(world: Testbed) -> None:
    body = {"specversion": "1.0", "type": AWS_SQS, "source": "s", "id": "1", "data": {"Body": "x"}}
    response = world.http.post(
        world.host.urls["ingest"],
        content=json.dumps(body).encode(),
        headers={"content-type": "application/cloudevents+json"},
    )
    assert response.status_code == 400 and "JSON dict" in response.text


def test_a_webhook_without_a_token_configured_refuses_to_serve(world: Testbed) -> None:
    """An open webhook would let anyone inject file.changed events: 503 saying why, never a 2xx."""
    body = webhook_body(f"{DIR}/w.safetensors", "create", created())
    with world.settings(LORAFLOW_WEBHOOK_TOKEN=""):
        response = post_webhook(world, body)
    assert response.status_code == 503 and "LORAFLOW_WEBHOOK_TOKEN is not set" in response.text

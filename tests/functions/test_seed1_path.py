"""The whole seed-1 path over real HTTP: adapter -> upload -> notification -> ingest -> stat ->
verify -> Ready, through the filer webhook, through the SQS body, and on the S3 backend (moto).

The Broker is played by `Flow`: it posts each reply to the functions whose Trigger accepts it,
as the Knative Broker would (admit/stat/verify only; load is another step's business).
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import time
from collections.abc import Iterator
from typing import Any

import boto3
import httpx
import pytest
from cloudevents.http import CloudEvent, from_http
from moto.server import ThreadedMotoServer

from devstack.notifications import webhook_body
from events.domain import ADAPTER_ADMITTED, ADAPTER_READY, ADAPTER_STAT_COMPLETED, FILE_CHANGED
from events.external import AWS_SQS
from functions.logic.seaweed_event import EntryInfo, Notification
from functions.resources.kinds import MODEL, VLLM_ADAPTER
from tests.functions.conftest import World

ROUTES = {
    FILE_CHANGED: ("stat",),
    ADAPTER_ADMITTED: ("stat", "verify"),
    ADAPTER_STAT_COMPLETED: ("verify",),
}
CONFIG = b'{"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}'
WEIGHTS = secrets.token_bytes(3000)


def md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


class Flow:
    """A broker for the test: replies are routed to the next steps until nothing is left."""

    def __init__(self, world: World, structured: bool = False) -> None:
        self.world = world
        self.structured = structured
        self.replies: list[CloudEvent] = []

    def send(self, function: str, event: CloudEvent) -> list[CloudEvent]:
        queue = [(function, event)]
        out: list[CloudEvent] = []
        while queue:
            target, current = queue.pop(0)
            response = self.world.post(target, current, self.structured)
            assert response.status_code in (200, 204), f"{target}: {response.status_code} {response.text}"
            if response.status_code == 200:
                reply = from_http(dict(response.headers), response.content)
                out.append(reply)
                queue.extend((nxt, reply) for nxt in ROUTES.get(reply["type"], ()))
        self.replies.extend(out)
        return out

    def published(self, prefix: str, count: int, timeout: float = 10.0) -> list[CloudEvent]:
        """file.changed events ingest published to the Broker (the sink) for paths under prefix."""
        deadline = time.monotonic() + timeout
        while True:
            found = [e for e in self.world.sink.of_type(FILE_CHANGED) if str(e["subject"]).startswith(prefix)]
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.05)


def setup_adapter(world: World, flow: Flow, integrity: bool = True) -> tuple[str, str]:
    ns = world.namespace()
    directory = f"/loraadapters/{ns}/llama/a/"
    world.create(MODEL, ns, {"metadata": {"name": "llama"}, "spec": {}})
    spec: dict[str, Any] = {"model": "llama"}
    if integrity:
        spec["integrity"] = {
            "md5": {
                directory + "adapter_config.json": md5(CONFIG),
                directory + "adapter_model.safetensors": md5(WEIGHTS),
            }
        }
    created = world.create(VLLM_ADAPTER, ns, {"metadata": {"name": "a"}, "spec": spec})
    replies = flow.send("admit", world.apiserver_event("add", created))
    # admitted, then stat's first observation (nothing stored yet: size 0); no verdict change
    assert [r["type"] for r in replies] == [ADAPTER_ADMITTED, ADAPTER_STAT_COMPLETED]
    return ns, directory


def expected_status(directory: str) -> dict[str, Any]:
    """Every seed-1 status field after a successful upload (lastTransitionTime aside)."""
    config, weights = directory + "adapter_config.json", directory + "adapter_model.safetensors"
    return {
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "IntegrityVerified",
                "message": "All 2 declared file(s) match",
                "observedGeneration": 1,
            }
        ],
        "files": [{"path": config, "size": len(CONFIG)}, {"path": weights, "size": len(WEIGHTS)}],
        "integrity": {
            "files": {
                config: {"md5": md5(CONFIG), "size": len(CONFIG)},
                weights: {"md5": md5(WEIGHTS), "size": len(WEIGHTS)},
            }
        },
        "observedGeneration": 1,
        "phase": "Ready",
        "ready": True,
        "size": str(len(CONFIG) + len(WEIGHTS)),
        "storageRef": {"path": directory},
        "uploadComplete": True,
    }


def status_of(world: World, ns: str) -> dict[str, Any]:
    stored = world.get(VLLM_ADAPTER, ns, "a")
    assert stored is not None
    status = json.loads(json.dumps(stored["status"]))
    for condition in status.get("conditions") or []:
        assert condition.pop("lastTransitionTime")
    return status


def assert_quiet(world: World, flow: Flow, ns: str, before: dict[str, Any]) -> None:
    """Our own status writes come back as updates; duplicates of every event: all no-ops."""
    stored = world.get(VLLM_ADAPTER, ns, "a")
    assert stored is not None
    assert flow.send("admit", world.apiserver_event("update", stored)) == []
    for reply in list(flow.replies):
        for target in ROUTES.get(reply["type"], ()):
            assert flow.send(target, reply) == [], f"duplicate {reply['type']} to {target} was not a no-op"
    assert status_of(world, ns) == before


@pytest.fixture
def webhook(world: World) -> Iterator[Any]:
    publisher = world.filer.subscribe_webhook(world.host.urls["ingest"])
    try:
        yield publisher
    finally:
        world.filer._publishers.remove(publisher)
        publisher.close()


@pytest.mark.parametrize(
    "structured", [pytest.param(False, id="binary"), pytest.param(True, id="structured")]
)
def test_seed1_path_through_the_filer_webhook(world: World, webhook: Any, structured: bool) -> None:
    flow = Flow(world, structured)
    ns, directory = setup_adapter(world, flow)
    world.upload(directory + "adapter_config.json", CONFIG)
    world.upload(directory + "adapter_model.safetensors", WEIGHTS)
    assert world.filer.flush_notifications()
    changed = flow.published(directory, 2)
    assert sorted(e["subject"] for e in changed) == [
        directory + "adapter_config.json",
        directory + "adapter_model.safetensors",
    ]
    assert changed[0].get_data()["eventType"] == "create"
    types: list[str] = []
    for event in changed:
        types += [r["type"] for r in flow.send("stat", event)]
    assert ADAPTER_READY in types
    final = status_of(world, ns)
    assert final == expected_status(directory)
    assert_quiet(world, flow, ns, final)


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def aws(service: str, url: str) -> Any:
    return boto3.client(
        service,
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def post_sqs(world: World, body: str, key: str | None, mode: str) -> httpx.Response:
    """What the IntegrationSource (aws.sqs) delivers: the SQS body as the event data."""
    attributes = {"specversion": "1.0", "type": AWS_SQS, "source": "aws.sqs.test", "id": secrets.token_hex(8)}
    if key:
        attributes["key"] = key
    if mode == "binary-text":
        headers = {f"ce-{k}": v for k, v in attributes.items()} | {
            "content-type": "text/plain; charset=utf-8"
        }
        return world.http.post(world.host.urls["ingest"], headers=headers, content=body.encode("utf-8"))
    if mode == "structured-base64":
        payload: dict[str, Any] = {
            **attributes,
            "data_base64": base64.b64encode(body.encode("latin-1")).decode(),
        }
    else:
        payload = {**attributes, "datacontenttype": "text/plain", "data": body}
    return world.http.post(
        world.host.urls["ingest"],
        headers={"content-type": "application/cloudevents+json"},
        content=json.dumps(payload).encode(),
    )


@pytest.mark.parametrize("mode", ["binary-text", "structured-text", "structured-base64"])
def test_seed1_path_through_the_sqs_body(world: World, moto_url: str, mode: str) -> None:
    sqs = aws("sqs", moto_url)
    queue = sqs.create_queue(QueueName=f"q-{secrets.token_hex(4)}")["QueueUrl"]
    publisher = world.filer.subscribe_sqs(sqs, queue)
    flow = Flow(world)
    try:
        ns, directory = setup_adapter(world, flow)
        world.upload(directory + "adapter_config.json", CONFIG)
        world.upload(directory + "adapter_model.safetensors", WEIGHTS)
        assert world.filer.flush_notifications()
    finally:
        world.filer._publishers.remove(publisher)
        publisher.close()
    messages = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, MessageAttributeNames=["All"])[
        "Messages"
    ]
    ours = [m for m in messages if m["MessageAttributes"]["key"]["StringValue"].startswith(directory)]
    assert len(ours) == 2
    for message in ours:
        key = message["MessageAttributes"]["key"]["StringValue"]
        response = post_sqs(world, message["Body"], key, mode)
        assert response.status_code == 200, response.text
        event = from_http(dict(response.headers), response.content)
        assert event["type"] == FILE_CHANGED and event["subject"] == key
        flow.send("stat", event)
    assert status_of(world, ns) == expected_status(directory)


def test_sqs_body_that_is_not_protobuf_is_rejected(world: World) -> None:
    response = post_sqs(world, "definitely not protobuf \ufffd", "/loraadapters/x/y/z/w", "binary-text")
    assert response.status_code == 400
    assert "not a protobuf EventNotification" in response.text


def test_seed1_path_on_s3(world: World, moto_url: str) -> None:
    s3 = aws("s3", moto_url)
    bucket = f"b-{secrets.token_hex(4)}"
    s3.create_bucket(Bucket=bucket)
    env = {
        "LORAFLOW_STORAGE": "s3",
        "LORAFLOW_S3_ENDPOINT": moto_url,
        "LORAFLOW_S3_BUCKET": bucket,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }
    with world.settings(**env):
        flow = Flow(world)
        ns, directory = setup_adapter(world, flow)
        for name, content in (("adapter_config.json", CONFIG), ("adapter_model.safetensors", WEIGHTS)):
            s3.put_object(Bucket=bucket, Key=(directory + name).lstrip("/"), Body=content)
            note = Notification(
                new_entry=EntryInfo(name=name, file_size=len(content)), new_parent_path=directory.rstrip("/")
            )
            body = webhook_body(directory + name, "create", note)
            response = world.http.post(world.host.urls["ingest"], json=body)
            assert response.status_code == 204, response.text  # published to the Broker
        for event in flow.published(directory, 2):
            flow.send("stat", event)
        assert status_of(world, ns) == expected_status(directory)

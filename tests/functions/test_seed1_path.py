"""The whole seed-1 path over real HTTP: adapter -> upload -> notification -> ingest -> stat ->
verify -> Ready, through the filer webhook, through the SQS body, and on the S3 backend (moto).

The Broker is played by `Flow`: it posts each reply to the functions whose Trigger accepts it,
as the Knative Broker would (admit/stat/verify only; load is another step's business).
"""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Iterator
from typing import Any

import boto3
import httpx
import pytest
from cloudevents.http import from_http
from moto.server import ThreadedMotoServer

from devstack.standins.notifications import webhook_body
from events.domain import ADAPTER_READY, FILE_CHANGED
from events.external import AWS_SQS
from functions.logic.seaweed_event import EntryInfo, Notification
from functions.resources.kinds import VLLM_ADAPTER
from tests.support.builders import CONFIG, ROUTES, WEIGHTS, Flow, expected_status, setup_adapter, status_of
from tests.support.testbed import Testbed


def assert_quiet(world: Testbed, flow: Flow, ns: str, before: dict[str, Any]) -> None:
    """Our own status writes come back as updates; duplicates of every event: all no-ops."""
    stored = world.get(VLLM_ADAPTER, ns, "a")
    assert stored is not None
    assert flow.send("admit", world.apiserver_event("update", stored)) == []
    for reply in list(flow.replies):
        for target in ROUTES.get(reply["type"], ()):
            assert flow.send(target, reply) == [], f"duplicate {reply['type']} to {target} was not a no-op"
    assert status_of(world, ns) == before


@pytest.fixture
def webhook(world: Testbed) -> Iterator[Any]:
    publisher = world.filer.subscribe_webhook(world.host.urls["ingest"])
    try:
        yield publisher
    finally:
        world.filer._publishers.remove(publisher)
        publisher.close()


@pytest.mark.parametrize(
    "structured", [pytest.param(False, id="binary"), pytest.param(True, id="structured")]
)
def test_seed1_path_through_the_filer_webhook(world: Testbed, webhook: Any, structured: bool) -> None:
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


def post_sqs(world: Testbed, body: str, key: str | None, mode: str) -> httpx.Response:
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
def test_seed1_path_through_the_sqs_body(world: Testbed, moto_url: str, mode: str) -> None:
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


def test_sqs_body_that_is_not_protobuf_is_rejected(world: Testbed) -> None:
    response = post_sqs(world, "definitely not protobuf \ufffd", "/loraadapters/x/y/z/w", "binary-text")
    assert response.status_code == 400
    assert "not a protobuf EventNotification" in response.text


def test_seed1_path_on_s3(world: Testbed, moto_url: str) -> None:
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

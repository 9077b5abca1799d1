"""The whole vllm path over real HTTP: adapter -> upload -> notification -> ingest -> stat ->
verify -> Ready, through the real filer's webhook, through an SQS body, and on the S3 backend
(the real SeaweedFS S3 gateway, notified by the same filer).

The Broker is played by `Flow`: it posts each reply to the functions whose Trigger accepts it,
as the Knative Broker would (admit/stat/verify only; load is another step's business).

The SQS path cannot be fed by the real filer (its aws_sqs queue puts raw protobuf bytes, not
valid UTF-8, into the message body, and SQS refuses them: docs/operations.md), so its test
posts what the IntegrationSource would deliver, with bytes the official protobuf runtime
encoded for the files the filer stored.
"""

from __future__ import annotations

import base64
import json
import secrets
from typing import Any

import boto3
import httpx
import pytest
from cloudevents.http import from_http

from devstack.seaweedfs import s3_iam
from events.domain import ADAPTER_READY, FILE_CHANGED
from events.external import AWS_SQS
from functions.resources.kinds import VLLM_ADAPTER
from tests.support import filer_pb
from tests.support.builders import (
    CONFIG,
    ROUTES,
    WEIGHTS,
    Flow,
    expected_status,
    md5,
    setup_adapter,
    status_of,
)
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


@pytest.mark.parametrize(
    "structured", [pytest.param(False, id="binary"), pytest.param(True, id="structured")]
)
def test_vllm_path_through_the_filer_webhook(world: Testbed, structured: bool) -> None:
    flow = Flow(world, structured)
    ns, directory = setup_adapter(world, flow)
    with world.webhook():
        world.upload(directory + "adapter_config.json", CONFIG)
        world.upload(directory + "adapter_model.safetensors", WEIGHTS)
        assert world.settle()
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


def post_sqs(world: Testbed, raw: bytes, key: str | None, mode: str) -> httpx.Response:
    """What the IntegrationSource (aws.sqs) would deliver: the SQS body as the event data, as
    bytes or as one of the text forms a transport that keeps every byte can carry."""
    body = filer_pb.as_latin1_text(raw)
    attributes = {"specversion": "1.0", "type": AWS_SQS, "source": "aws.sqs.test", "id": secrets.token_hex(8)}
    if key:
        attributes["key"] = key
    if mode == "binary-bytes":
        headers = {f"ce-{k}": v for k, v in attributes.items()} | {"content-type": "application/octet-stream"}
        return world.http.post(world.host.urls["ingest"], headers=headers, content=raw)
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


@pytest.mark.parametrize("mode", ["binary-bytes", "binary-text", "structured-text", "structured-base64"])
def test_vllm_path_through_the_sqs_body(world: Testbed, mode: str) -> None:
    flow = Flow(world)
    ns, directory = setup_adapter(world, flow)
    world.upload(directory + "adapter_config.json", CONFIG)
    world.upload(directory + "adapter_model.safetensors", WEIGHTS)
    for name, content in (("adapter_config.json", CONFIG), ("adapter_model.safetensors", WEIGHTS)):
        key = directory + name
        raw = filer_pb.notification(
            new=filer_pb.entry(name, size=len(content), md5_hex=md5(content)),
            new_parent_path=directory.rstrip("/"),
        )
        response = post_sqs(world, raw, key, mode)
        assert response.status_code == 200, response.text
        event = from_http(dict(response.headers), response.content)
        assert event["type"] == FILE_CHANGED and event["subject"] == key
        flow.send("stat", event)
    assert status_of(world, ns) == expected_status(directory)


def test_sqs_body_that_is_not_protobuf_is_rejected(world: Testbed) -> None:
    response = post_sqs(
        world, "definitely not protobuf \ufffd".encode(), "/loraadapters/x/y/z/w", "binary-text"
    )
    assert response.status_code == 400
    assert "not a protobuf EventNotification" in response.text


@pytest.mark.parametrize(
    "multipart", [pytest.param(False, id="put-object"), pytest.param(True, id="multipart")]
)
def test_vllm_path_on_s3(world: Testbed, multipart: bool) -> None:
    """PutObject and a multipart upload through the real S3 gateway: the filer notifies them under
    /buckets/<bucket>/, ingest maps them back, stat and verify read the bucket with boto3 (a
    multipart ETag is not an MD5: verify hashes the object by streaming it)."""
    s3 = boto3.client(
        "s3",
        endpoint_url=world.seaweed.server.s3_url,
        **world.seaweed.server.s3_operator.boto(),
    )
    bucket = f"b-{secrets.token_hex(4)}"
    s3.create_bucket(Bucket=bucket)
    # the functions sign as loraflow, scoped to this bucket: it reads it and writes its frozen sets
    loraflow = world.seaweed.server.add_s3_identity(s3_iam.loraflow(bucket))
    env = {
        "LORAFLOW_STORAGE": "s3",
        "LORAFLOW_S3_ENDPOINT": world.seaweed.server.s3_url,
        "LORAFLOW_S3_BUCKET": bucket,
        **loraflow.env(),
    }
    weights = WEIGHTS * 2000 if multipart else WEIGHTS  # 6 MB: two parts of at least 5 MiB + rest
    with world.settings(**env), world.webhook():
        flow = Flow(world)
        ns, directory = setup_adapter(world, flow, weights=weights)
        s3.put_object(Bucket=bucket, Key=(directory + "adapter_config.json").lstrip("/"), Body=CONFIG)
        key = (directory + "adapter_model.safetensors").lstrip("/")
        if multipart:
            upload = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
            part = 5 << 20
            parts = []
            for number, start in enumerate(range(0, len(weights), part), start=1):
                etag = s3.upload_part(
                    Bucket=bucket,
                    Key=key,
                    UploadId=upload,
                    PartNumber=number,
                    Body=weights[start : start + part],
                )["ETag"]
                parts.append({"PartNumber": number, "ETag": etag})
            s3.complete_multipart_upload(
                Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts}
            )
            assert s3.head_object(Bucket=bucket, Key=key)["ETag"].strip('"').endswith(f"-{len(parts)}")
        else:
            s3.put_object(Bucket=bucket, Key=key, Body=weights)
        assert world.settle()
        for event in flow.published(directory, 2):
            flow.send("stat", event)
        expected = expected_status(directory, weights)
        if multipart:  # the gateway reports no MD5 for it: verify hashed the object instead
            unhashed = expected["integrity"]["files"][directory + "adapter_model.safetensors"]
            unhashed.pop("md5")
            unhashed["version"] = "etag:" + s3.head_object(Bucket=bucket, Key=key)["ETag"].strip('"')
        assert status_of(world, ns) == expected

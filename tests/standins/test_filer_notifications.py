"""Filer stand-in notifications: webhook JSON (bearer token, retry after a 500) and aws_sqs protobuf
bodies through moto's SQS."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from moto.server import ThreadedMotoServer

from devstack.standins.filer import FilerServer
from functions.logic.seaweed_event import classify, decode_sqs_body, parse_webhook_message

D = "/loraadapters/ns/model/adapter"


class _Receiver:
    def __init__(self, fail_first: int) -> None:
        self.fail_first = fail_first
        self.requests: list[tuple[dict[str, str], bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append((dict(self.headers), body))
                status = 500 if len(receiver.requests) <= receiver.fail_first else 204
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


@pytest.fixture
def filer(tmp_path: Path) -> Iterator[FilerServer]:
    server = FilerServer(data_dir=tmp_path / "filer").start()
    yield server
    server.stop()


def test_webhook_delivery_bearer_and_retry(filer: FilerServer) -> None:
    receiver = _Receiver(fail_first=1)
    try:
        hook = filer.subscribe_webhook(
            receiver.url, bearer_token="s3cret", max_retries=3, backoff_seconds=0.05
        )
        data = b'{"r": 8}'
        with httpx.Client(base_url=filer.url) as c:
            assert c.put(f"{D}/adapter_config.json", content=data).status_code == 201
            assert c.put(f"{D}/adapter_config.json", content=b"{}").status_code == 201
            assert (
                c.post(
                    "/loraadapters/ns/model/b/cfg.json", params={"mv.from": f"{D}/adapter_config.json"}
                ).status_code
                == 204
            )
            assert c.delete("/loraadapters/ns/model/b/cfg.json").status_code == 204
        assert filer.flush_notifications(10)
    finally:
        receiver.close()
    bodies = [json.loads(b) for _, b in receiver.requests]
    headers = [h for h, _ in receiver.requests]
    assert all(h["Authorization"] == "Bearer s3cret" for h in headers)
    assert all(h["Content-Type"] == "application/json" for h in headers)
    # the first delivery got a 500 and was retried: same body twice, then in order
    assert bodies[0] == bodies[1]
    assert hook.dead_letters == []
    events = [(b["event_type"], b["key"]) for b in bodies[1:]]
    assert events == [
        ("create", "/loraadapters"),
        ("create", "/loraadapters/ns"),
        ("create", "/loraadapters/ns/model"),
        ("create", D),
        ("create", f"{D}/adapter_config.json"),
        ("update", f"{D}/adapter_config.json"),
        ("create", "/loraadapters/ns/model/b"),
        ("rename", f"{D}/adapter_config.json"),
        ("delete", "/loraadapters/ns/model/b/cfg.json"),
    ]
    create = bodies[5]
    assert set(create) == {"key", "event_type", "message"}
    msg = create["message"]
    assert "old_entry" not in msg and "delete_chunks" not in msg  # omitempty
    assert msg["new_parent_path"] == D
    attrs = msg["new_entry"]["attributes"]
    assert base64.b64decode(attrs["md5"]) == hashlib.md5(data).digest()
    assert attrs["file_size"] == len(data) and isinstance(attrs["mtime"], int)
    change = classify(create["key"], parse_webhook_message(msg))
    assert change.event_type == "create" and change.md5_hex == hashlib.md5(data).hexdigest()
    rename = classify(bodies[8]["key"], parse_webhook_message(bodies[8]["message"]))
    assert rename.new_path == "/loraadapters/ns/model/b/cfg.json"
    assert rename.event_type == "rename"
    delete = bodies[9]["message"]
    assert delete["delete_chunks"] is True and "new_entry" not in delete
    for b in bodies[1:]:  # every classification agrees with the event_type the filer sent
        assert classify(b["key"], parse_webhook_message(b["message"])).event_type == b["event_type"]


def test_webhook_gives_up_after_max_retries(filer: FilerServer) -> None:
    receiver = _Receiver(fail_first=100)
    try:
        hook = filer.subscribe_webhook(receiver.url, max_retries=2, backoff_seconds=0.01)
        filer.put_file("/x", b"1")
        assert filer.flush_notifications(10)
    finally:
        receiver.close()
    assert len(receiver.requests) == 3
    assert "Authorization" not in receiver.requests[0][0]
    assert [d["key"] for d in hook.dead_letters] == ["/x"]


@pytest.fixture
def moto() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def test_sqs_body_decodes_back(filer: FilerServer, moto: str) -> None:
    sqs = boto3.client(
        "sqs",
        endpoint_url=moto,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    queue_url = sqs.create_queue(QueueName="seaweedfs")["QueueUrl"]
    pub = filer.subscribe_sqs(sqs, queue_url)
    data = bytes(range(256))  # an MD5 and sizes with every byte value end up in the body
    filer.mkdir(D)
    filer.put_file(f"{D}/adapter_model.safetensors", data)
    filer.move(f"{D}/adapter_model.safetensors", f"{D}/renamed.safetensors")
    assert filer.flush_notifications(10)
    assert pub.errors == [] and pub.sent == 6  # 4 directories + create + rename
    got = []
    while True:
        resp = sqs.receive_message(
            QueueUrl=queue_url, MaxNumberOfMessages=10, MessageAttributeNames=["All"], WaitTimeSeconds=0
        )
        if not resp.get("Messages"):
            break
        for m in resp["Messages"]:
            key = m["MessageAttributes"]["key"]
            assert key["DataType"] == "String"
            got.append((key["StringValue"], decode_sqs_body(m["Body"])))
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=m["ReceiptHandle"])
    by_key = {k: classify(k, n) for k, n in got}
    created = by_key[f"{D}/adapter_model.safetensors"]
    assert len(got) == 6
    # the create and the rename share the old path as key; the last one seen wins in by_key
    kinds = sorted(classify(k, n).event_type for k, n in got)
    assert kinds == ["create"] * 5 + ["rename"]
    assert created.event_type == "rename"
    assert created.new_path == f"{D}/renamed.safetensors"
    assert created.md5_hex == hashlib.md5(data).hexdigest()
    assert created.size == 256
    (create_file,) = [n for k, n in got if k.endswith(".safetensors") and n.old_entry is None]
    assert create_file.new_entry is not None
    assert create_file.new_entry.md5 == hashlib.md5(data).digest()
    assert create_file.new_parent_path == D

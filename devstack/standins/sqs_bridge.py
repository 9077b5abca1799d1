"""The IntegrationSource (`aws.sqs`) stand-in: SQS messages into the broker as CloudEvents.

Mirrors the Knative IntegrationSource for AWS SQS (the Apache Camel `aws-sqs-source` Kamelet):
each message becomes `dev.knative.eventing.aws-sqs` with source `aws.sqs.<queue name>`, the body
bytes as data (`application/octet-stream`), and the message attribute `key` (SeaweedFS puts
the full path there) as the extension `key`. A message is deleted once the sink accepted it
(`deleteAfterRead`), otherwise it becomes visible again and is redelivered.

SeaweedFS writes raw protobuf bytes as the SQS body; our filer stand-in carries them as
latin-1 text (one code point per byte), so a body of code points below U+0100 is turned back
into those bytes; anything else is sent as UTF-8.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

from cloudevents.http import CloudEvent

from devstack.eventing.broker import BrokerClient

log = logging.getLogger("devstack.standins.sqs_bridge")

SQS_TYPE = "dev.knative.eventing.aws-sqs"


def body_bytes(body: str) -> bytes:
    if all(ord(c) < 0x100 for c in body):
        return body.encode("latin-1")
    return body.encode("utf-8", "surrogateescape")


def message_event(message: dict[str, Any], queue_name: str) -> CloudEvent:
    attributes = {
        "type": SQS_TYPE,
        "source": f"aws.sqs.{queue_name}",
        "id": str(message.get("MessageId") or uuid.uuid4()),
        "datacontenttype": "application/octet-stream",
    }
    key = ((message.get("MessageAttributes") or {}).get("key") or {}).get("StringValue")
    if key:
        attributes["key"] = str(key)
    return CloudEvent(attributes, body_bytes(str(message.get("Body", ""))))


class SqsBridge:
    """Long-polls `queue_url` with `sqs` (a boto3 client) and sends every message to `sink`."""

    def __init__(self, sqs: Any, queue_url: str, sink: BrokerClient, wait_s: int = 1) -> None:
        self._sqs = sqs
        self.queue_url = queue_url
        self.queue_name = queue_url.rstrip("/").rsplit("/", 1)[-1]
        self._sink = sink
        self._wait_s = wait_s
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sqs-bridge", daemon=True)

    def start(self) -> SqsBridge:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self._wait_s + 5)

    def poll_once(self) -> int:
        """One ReceiveMessage round; returns how many messages the sink accepted."""
        answer = self._sqs.receive_message(
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=self._wait_s,
            MessageAttributeNames=["All"],
        )
        accepted = 0
        for message in answer.get("Messages") or []:
            if self._sink.send(message_event(message, self.queue_name)):
                self._sqs.delete_message(QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"])
                accepted += 1
        self.sent += accepted
        return accepted

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception as err:
                if self._stop.is_set():
                    return
                log.warning("SQS receive failed: %s", err)
                self._stop.wait(0.5)

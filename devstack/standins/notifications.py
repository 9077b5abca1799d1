"""SeaweedFS filer notification queues for the stand-in: ``webhook`` and ``aws_sqs``.

Each publisher delivers from one worker thread, in order, so that the HTTP request that caused an
event never waits on the subscriber (the real webhook queue is asynchronous too:
``weed/notification/webhook``, buffered, retried with backoff, then dead-lettered).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

import boto3
import httpx

from functions.logic.seaweed_event import (
    EventType,
    Notification,
    encode_event_notification,
    sqs_body_from_bytes,
    to_webhook_message,
)

log = logging.getLogger(__name__)


class Publisher(Protocol):
    def publish(self, key: str, event_type: EventType, notification: Notification) -> None: ...

    def flush(self, timeout: float = 10.0) -> bool: ...

    def close(self, timeout: float = 5.0) -> None: ...


@dataclass(frozen=True)
class _Item:
    key: str
    event_type: EventType
    notification: Notification


class _QueuedPublisher:
    """One daemon worker draining a FIFO; ``flush`` waits until everything queued was handled."""

    name = "publisher"

    def __init__(self) -> None:
        self._queue: queue.Queue[_Item | None] = queue.Queue()
        self._pending = 0
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"filer-{self.name}", daemon=True)
        self._thread.start()

    def publish(self, key: str, event_type: EventType, notification: Notification) -> None:
        if self._closed:
            return
        with self._cond:
            self._pending += 1
        self._queue.put(_Item(key, event_type, notification))

    def flush(self, timeout: float = 10.0) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._pending == 0, timeout)

    def close(self, timeout: float = 5.0) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join(timeout)
        self._shutdown()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                self._deliver(item)
            except Exception:  # never let one event kill the worker
                log.exception("%s: delivering %s %s failed", self.name, item.event_type, item.key)
            finally:
                with self._cond:
                    self._pending -= 1
                    self._cond.notify_all()

    def _deliver(self, item: _Item) -> None:
        raise NotImplementedError

    def _shutdown(self) -> None:
        pass


def webhook_body(key: str, event_type: EventType, notification: Notification) -> dict[str, Any]:
    """``{"key", "event_type", "message"}`` with message = Go encoding/json of the
    EventNotification (``weed/notification/webhook/webhook_queue.go``)."""
    return {"key": key, "event_type": event_type, "message": to_webhook_message(notification)}


class WebhookPublisher(_QueuedPublisher):
    """``[notification.webhook]``: POST JSON, ``Content-Type: application/json``, optional
    ``Authorization: Bearer``; a non-2xx answer or a transport error is retried ``max_retries``
    times with exponential backoff (capped at ``max_backoff_seconds``), then dead-lettered
    (kept in ``dead_letters``)."""

    name = "webhook"

    def __init__(
        self,
        url: str,
        bearer_token: str | None = None,
        *,
        max_retries: int = 3,
        backoff_seconds: float = 3.0,
        max_backoff_seconds: float = 30.0,
        timeout_seconds: float = 10.0,
        event_types: tuple[str, ...] = ("create", "update", "delete", "rename"),
        path_prefixes: tuple[str, ...] = (),
    ) -> None:
        self.url = url
        self.bearer_token = bearer_token
        self.max_retries = max_retries
        self.backoff_seconds = backoff_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self.event_types = event_types
        self.path_prefixes = path_prefixes
        self.delivered: list[dict[str, Any]] = []
        self.dead_letters: list[dict[str, Any]] = []
        self.attempts = 0
        self._client = httpx.Client(timeout=timeout_seconds)
        super().__init__()

    def publish(self, key: str, event_type: EventType, notification: Notification) -> None:
        if event_type not in self.event_types:
            return
        if self.path_prefixes and not any(key.startswith(p) for p in self.path_prefixes):
            return
        super().publish(key, event_type, notification)

    def _deliver(self, item: _Item) -> None:
        body = webhook_body(item.key, item.event_type, item.notification)
        payload = json.dumps(body, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json"}
        if self.bearer_token:
            headers["Authorization"] = f"Bearer {self.bearer_token}"
        delay = self.backoff_seconds
        for attempt in range(self.max_retries + 1):
            if self._closed and attempt > 0:
                break
            self.attempts += 1
            try:
                resp = self._client.post(self.url, content=payload, headers=headers)
                if 200 <= resp.status_code < 300:
                    self.delivered.append(body)
                    return
                log.info("webhook %s answered %s", self.url, resp.status_code)
            except httpx.HTTPError as exc:
                log.info("webhook %s failed: %s", self.url, exc)
            if attempt < self.max_retries:
                time.sleep(delay)
                delay = min(delay * 2, self.max_backoff_seconds)
        self.dead_letters.append(body)

    def _shutdown(self) -> None:
        self._client.close()


class SqsPublisher(_QueuedPublisher):
    """``[notification.aws_sqs]`` (``weed/notification/aws_sqs/aws_sqs_pub.go``): ``SendMessage``
    with ``MessageBody = string(proto.Marshal(notification))``, attribute ``key`` (String) and
    ``DelaySeconds`` (10 upstream; a parameter here, 0 by default for tests).

    Python's boto3 needs text: the raw protobuf bytes are carried as latin-1 (one code point per
    byte, lossless; :func:`functions.logic.seaweed_event.sqs_body_from_bytes`). Real SQS rejects
    characters outside its allowed set (e.g. U+0000-U+0008); moto does not validate characters, so
    this mirrors what the filer attempts rather than what AWS accepts."""

    name = "sqs"

    def __init__(
        self,
        client_or_endpoint: Any,
        queue_url: str,
        *,
        delay_seconds: int = 0,
        region: str = "us-east-1",
    ) -> None:
        if isinstance(client_or_endpoint, str):
            self._client: Any = boto3.client(
                "sqs",
                endpoint_url=client_or_endpoint,
                region_name=region,
                aws_access_key_id="testing",
                aws_secret_access_key="testing",
            )
        else:
            self._client = client_or_endpoint
        self.queue_url = queue_url
        self.delay_seconds = delay_seconds
        self.sent = 0
        self.errors: list[str] = []
        super().__init__()

    def _deliver(self, item: _Item) -> None:
        body = sqs_body_from_bytes(encode_event_notification(item.notification))
        try:
            self._client.send_message(
                QueueUrl=self.queue_url,
                MessageBody=body,
                DelaySeconds=self.delay_seconds,
                MessageAttributes={"key": {"DataType": "String", "StringValue": item.key}},
            )
            self.sent += 1
        except Exception as exc:  # the filer logs and drops a failed SendMessage
            self.errors.append(f"{item.key}: {exc}")
            log.warning("sqs send_message for %s failed: %s", item.key, exc)

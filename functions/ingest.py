"""ingest: turn a SeaweedFS filer notification into our `file.changed` event.

Trigger: the SeaweedFS webhook queue, JSON `{key, event_type, message}` posted straight to
    this function (not a CloudEvent; bearer token checked when `LORAFLOW_WEBHOOK_TOKEN` is
    set); `dev.knative.eventing.aws-sqs` from the IntegrationSource, whose data is the SQS
    body: raw protobuf `EventNotification` bytes (or a base64 / latin-1 / UTF-8 string of
    them); the path comes from the extension `key`, else new_parent_path + new_entry.name.
Reads: the notification only (nothing else: the downstream steps re-read storage).
Writes: nothing.
Replies: `io.loraflow.file.changed.v1` (subject = the full path; for a rename the old path,
    data.newPath the new one; a rename from elsewhere into /loraadapters/ is a create of the
    new path) for files under /loraadapters/. With the S3 backend the filer notifies the S3
    gateway's writes under its bucket folder (`/buckets/<bucket>/<key>`), so that prefix is
    taken off first: `/buckets/loraadapters/loraadapters/ns/m/a/f` is `/loraadapters/ns/m/a/f`.
    The webhook is not delivered by the Broker, so there the event is published to the Broker
    (`K_SINK` / `LORAFLOW_BROKER_URL`) and the answer is 204; without a broker URL it is
    returned in the response.
Outcomes: 200 + file.changed; 204 a directory, or a well-formed notification for a path we
    cannot map to the adapter layout (the filer notifies about everything: logged once per
    top folder, never an error); 400 undecodable body or protobuf (the message says which
    field), a path that is not normalised (`..`, `.`, `//`, percent-encoded dots or slashes,
    NUL); 401 webhook without the right bearer token; 503 the Broker could not be reached
    within `LORAFLOW_PUBLISH_BUDGET` seconds (webhook only).
Delivery: SeaweedFS 4.48's webhook queue makes ONE attempt per event (its `max_retries` does
    nothing: the retry middleware wraps the dead-letter step) and only logs a failure. So
    ingest does not count on a redelivery: it retries its own publish with bounded
    exponential backoff, each attempt capped by what is left of the budget, which stays inside
    the webhook's `timeout_seconds` (10 by default). What is still lost is repaired by
    resync's next tick (it stats every adapter that is not Ready).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import logging
import posixpath
import threading
import time
from collections.abc import Callable
from typing import Any

import flask
from cloudevents.http import CloudEvent
from pydantic import ValidationError

from events.domain import FILE_CHANGED, FileChanged
from events.external import AWS_SQS, SeaweedWebhook
from functions.edge import messages, shell
from functions.edge.bootstrap import Deps
from functions.errors import Reject, Retryable, Unauthorized, WebhookNotConfigured, problems
from functions.logic.paths import STORAGE_ROOT, is_under
from functions.logic.seaweed_event import (
    FileChange,
    InvalidNotification,
    Notification,
    ProtoDecodeError,
    classify,
    decode_event_notification,
    decode_sqs_body,
    join_path,
    parse_webhook_message,
)
from functions.settings import Settings

NAME = "ingest"
ACCEPTS = (AWS_SQS,)
_ENCODED = ("%2e", "%2f", "%5c", "%00")
log = logging.getLogger("loraflow.ingest")


# -- pure ------------------------------------------------------------------------------------
def check_path(path: str, what: str) -> str:
    """Reject a path that is not absolute and normalised (no traversal in any spelling)."""
    lowered = path.lower()
    if "\x00" in path:
        raise Reject(f"{what} {path!r} contains a NUL byte")
    if any(code in lowered for code in _ENCODED):
        raise Reject(f"{what} {path!r} contains percent-encoded dots, slashes or NUL")
    if not path.startswith("/"):
        raise Reject(f"{what} {path!r} is not absolute")
    if path != "/" and posixpath.normpath(path) != path:
        raise Reject(f"{what} {path!r} is not normalised ('.', '..', '//' or a trailing slash)")
    return path


def bucket_dir(buckets_dir: str, bucket: str) -> str:
    """The filer folder of an S3 bucket (weed/s3api: `<buckets folder>/<bucket>`)."""
    return posixpath.join(buckets_dir, bucket)


def storage_path(path: str, folder: str | None) -> str | None:
    """The path in our storage layout of a notified filer path, or None when it has none.

    `folder` is the S3 bucket's filer folder (S3 backend) or None (filer backend: the filer
    path is the storage path). An S3 key `loraadapters/ns/m/a/f` is stored as
    `<folder>/loraadapters/ns/m/a/f` and is the storage path `/loraadapters/ns/m/a/f`."""
    if folder is None:
        return path
    if is_under(path, folder):
        return path[len(folder.rstrip("/")) :]
    return None


def file_changed(change: FileChange, folder: str | None = None) -> FileChanged | None:
    """Our payload for a classified notification; None when it is none of our business."""
    check_path(change.path, "notification path")
    if change.new_path is not None:
        check_path(change.new_path, "notification new path")
    if change.is_directory:
        return None
    md5 = change.md5_hex if change.md5_hex and len(change.md5_hex) == 32 else None
    path = storage_path(change.path, folder)
    new_path = storage_path(change.new_path, folder) if change.new_path is not None else None
    try:
        if path is not None and is_under(path, STORAGE_ROOT):
            return FileChanged(
                path=path,
                event_type=change.event_type,
                new_path=new_path if new_path is not None else change.new_path,
                size=change.size,
                md5=md5,
            )
        if new_path is not None and is_under(new_path, STORAGE_ROOT):
            return FileChanged(path=new_path, event_type="create", size=change.size, md5=md5)
    except ValidationError as err:
        raise Reject(
            f"notification for {change.path!r} is not a valid file.changed: {problems(err)}"
        ) from err
    return None


def decode_sqs_data(data: Any) -> Notification:
    """The EventNotification in an aws-sqs CloudEvent's data, or Reject saying what failed."""
    if data is None or data == b"" or data == "":
        raise Reject("aws-sqs event has no data (expected protobuf EventNotification bytes)")
    errors: list[str] = []
    if isinstance(data, bytes | bytearray):
        try:
            return decode_event_notification(bytes(data))
        except ProtoDecodeError as err:
            errors.append(f"as raw protobuf bytes: {err}")
        try:  # a text transport: base64, or the latin-1/UTF-8 text of the bytes
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            raise Reject("aws-sqs data is not a protobuf EventNotification: " + "; ".join(errors)) from None
    if not isinstance(data, str):
        raise Reject(
            f"aws-sqs data is a JSON {type(data).__name__}; expected protobuf EventNotification bytes"
        )
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raw = None
    if raw:
        try:
            return decode_event_notification(raw)
        except ProtoDecodeError as err:
            errors.append(f"as base64: {err}")
    try:
        return decode_sqs_body(data)
    except ProtoDecodeError as err:
        errors.append(str(err))
    raise Reject("aws-sqs data is not a protobuf EventNotification: " + "; ".join(errors))


def key_of(notification: Notification, extension: object) -> str:
    """The event key: the `key` extension (SQS attribute), else derived from the new entry."""
    if isinstance(extension, str) and extension:
        return extension
    if notification.new_entry is not None and notification.new_parent_path:
        return join_path(notification.new_parent_path, notification.new_entry.name)
    raise Reject(
        "aws-sqs event has no `key` extension and the notification names no new_parent_path "
        "and new entry to derive the path from"
    )


def _classify(key: str, notification: Notification) -> FileChange:
    try:
        return classify(key, notification)
    except InvalidNotification as err:
        raise Reject(f"notification for {key!r} cannot be classified: {err}") from err


def _event(payload: FileChanged) -> CloudEvent:
    return messages.reply(FILE_CHANGED, NAME, payload.path, payload)


def top_folder(path: str) -> str:
    """`/a/b/c` -> `/a`: how unmapped notifications are grouped in the log."""
    return "/" + path.strip("/").split("/", 1)[0]


class _Once:
    """Remembers what was logged already (bounded: a hostile filer cannot grow it forever)."""

    def __init__(self, limit: int = 1024) -> None:
        self._seen: set[str] = set()
        self._limit = limit
        self._lock = threading.Lock()

    def first(self, key: str) -> bool:
        with self._lock:
            if key in self._seen or len(self._seen) >= self._limit:
                return False
            self._seen.add(key)
            return True


_UNMAPPED = _Once()


def _changed(change: FileChange, settings: Settings) -> FileChanged | None:
    folder = bucket_dir(settings.s3_buckets_dir, settings.s3_bucket) if settings.storage == "s3" else None
    payload = file_changed(change, folder)
    if payload is None and not change.is_directory:
        where = top_folder(change.path)
        if _UNMAPPED.first(where):
            log.info(
                "ignoring notifications under %s: not the adapter layout of the %s backend",
                where,
                settings.storage,
                extra={"path": change.path},
            )
    return payload


def publish_with_retry(
    publish: Callable[[CloudEvent, float], None],
    event: CloudEvent,
    budget: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Publish, retrying a Retryable with exponential backoff (50 ms doubling, at most 1 s)
    until `budget` seconds are spent; each attempt may take only what is left. Returns the
    attempts made; raises the last Retryable when the budget ran out."""
    deadline = clock() + budget
    delay = 0.05
    attempts = 0
    while True:
        attempts += 1
        try:
            publish(event, max(0.05, deadline - clock()))
            return attempts
        except Retryable:
            if deadline - clock() <= delay:
                raise
            sleep(delay)
            delay = min(delay * 2, 1.0)


# -- shell -----------------------------------------------------------------------------------
def handle(event: CloudEvent, deps: Deps) -> CloudEvent | None:
    notification = decode_sqs_data(event.get_data())
    key = key_of(notification, event.get("key"))
    check_path(key, "notification key")
    payload = _changed(_classify(key, notification), deps.settings)
    return _event(payload) if payload is not None else None


def webhook(request: flask.Request, deps: Deps) -> CloudEvent | None:
    token = deps.settings.webhook_token
    if token is None or not token.get_secret_value():
        # an open webhook lets anyone inject file.changed events: refuse until one is set
        raise WebhookNotConfigured(
            "the webhook refuses to serve: LORAFLOW_WEBHOOK_TOKEN is not set (the filer's "
            "notification.toml must send the same bearer_token)"
        )
    expected = ("Bearer " + token.get_secret_value()).encode()
    given = (request.headers.get("Authorization") or "").encode()
    if not hmac.compare_digest(given, expected):
        raise Unauthorized("webhook request without the expected bearer token")
    body = messages.body_of(request)
    try:
        message = SeaweedWebhook.model_validate(json.loads(body))
    except ValidationError as err:
        raise Reject(
            f"webhook body is not a SeaweedFS notification {{key, event_type, message}}: {problems(err)}"
        ) from err
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise Reject(f"webhook body is not JSON: {err}") from err
    try:
        notification = parse_webhook_message(message.message)
    except InvalidNotification as err:
        raise Reject(f"webhook message for {message.key!r} cannot be decoded: {err}") from err
    check_path(message.key, "notification key")
    payload = _changed(_classify(message.key, notification), deps.settings)
    if payload is None:
        return None
    event = _event(payload)
    if deps.settings.broker_url:
        publish_with_retry(deps.broker.publish, event, deps.settings.publish_budget)
        return None
    return event


ingest = shell.function(NAME, ACCEPTS, handle, webhook=webhook)

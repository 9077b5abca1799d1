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
    The mapping is functions.logic.file_events, shared with the filer source
    (functions.filer_source), so both send the same payload for the same change.
    The webhook is not delivered by the Broker, so there the event is published to the Broker
    (`K_SINK` / `LORAFLOW_BROKER_URL`) and the answer is 204; without a broker URL it is
    returned in the response.
Outcomes: 200 + file.changed; 204 a directory, or a well-formed notification for a path we
    cannot map to the adapter layout (the filer notifies about everything: logged once per
    top folder, never an error); 400 undecodable body or protobuf (the message says what was
    tried), a path that is not normalised (`..`, `.`, `//`, percent-encoded dots or slashes,
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
import time
from collections.abc import Callable
from typing import Any

import flask
from cloudevents.http import CloudEvent
from pydantic import ValidationError

from events.domain import FILE_CHANGED, FileChanged
from events.external import AWS_SQS, SeaweedWebhook
from events.schema_urls import DEFAULT_SCHEMA_BASE_URL
from functions.edge import messages, shell
from functions.edge.bootstrap import Deps
from functions.errors import Reject, Retryable, Unauthorized, WebhookNotConfigured, problems
from functions.logic import file_events
from functions.logic.file_events import check_path
from functions.logic.seaweed_event import (
    FileChange,
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
log = logging.getLogger("loraflow.ingest")


# -- pure ------------------------------------------------------------------------------------
def _latin1_text(data: bytes) -> bool:
    """UTF-8 whose every character is below U+0100 and some above U+007F: text that carried
    one byte per character (a latin-1 transport). Raw protobuf is that only by accident, and
    then its latin-1 reading fails (a lone byte >= 0x80 is not UTF-8 in a string field)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(ord(c) < 0x100 for c in text) and any(ord(c) >= 0x80 for c in text)


def decode_sqs_data(data: Any) -> Notification:
    """The EventNotification in an aws-sqs CloudEvent's data, or Reject saying what failed."""
    if data is None or data == b"" or data == "":
        raise Reject("aws-sqs event has no data (expected protobuf EventNotification bytes)")
    errors: list[str] = []
    if isinstance(data, bytes | bytearray):
        raw = bytes(data)
        if _latin1_text(raw):  # the protobuf runtime would read these bytes as raw too, wrongly
            try:
                return decode_sqs_body(raw.decode("utf-8"))
            except ProtoDecodeError as err:
                errors.append(f"as latin-1 text: {err}")
        try:
            return decode_event_notification(raw)
        except ProtoDecodeError as err:
            errors.append(f"as raw protobuf bytes: {err}")
        try:  # a text transport: base64, or the latin-1/UTF-8 text of the bytes
            data = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise Reject("aws-sqs data is not a protobuf EventNotification: " + "; ".join(errors)) from None
    if not isinstance(data, str):
        raise Reject(
            f"aws-sqs data is a JSON {type(data).__name__}; expected protobuf EventNotification bytes"
        )
    try:
        decoded = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        decoded = None
    if decoded:
        try:
            return decode_event_notification(decoded)
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


def _event(payload: FileChanged, schema_base_url: str = DEFAULT_SCHEMA_BASE_URL) -> CloudEvent:
    return messages.reply(FILE_CHANGED, NAME, payload.path, payload, schema_base_url=schema_base_url)


_UNMAPPED = file_events.Once()


def _changed(change: FileChange, settings: Settings) -> FileChanged | None:
    payload = file_events.file_changed(change, file_events.bucket_folder(settings))
    if payload is None and not change.is_directory:
        where = file_events.top_folder(change.path)
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
    payload = _changed(classify(key, notification), deps.settings)
    return _event(payload, deps.settings.schema_base_url) if payload is not None else None


def webhook(
    request: flask.Request,
    deps: Deps,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> CloudEvent | None:
    """The SeaweedFS webhook; `clock` and `sleep` pace the publish's retries (tests pass fakes)."""
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
    notification = parse_webhook_message(message.message)  # InvalidNotification: a 400
    check_path(message.key, "notification key")
    payload = _changed(classify(message.key, notification), deps.settings)
    if payload is None:
        return None
    event = _event(payload, deps.settings.schema_base_url)
    if deps.settings.broker_url:
        publish_with_retry(deps.broker.publish, event, deps.settings.publish_budget, clock, sleep)
        return None
    return event


ingest = shell.function(NAME, ACCEPTS, handle, webhook=webhook)

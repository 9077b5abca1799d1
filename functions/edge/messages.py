"""CloudEvents on the wire: a request body read within its cap, parsed, its data validated
against its payload model, and every outgoing event built in one place (`reply`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, TypeVar
from uuid import uuid4

import flask
from cloudevents.exceptions import GenericException
from cloudevents.http import CloudEvent, from_http
from pydantic import BaseModel, ValidationError

from events import binary_mode
from events.schema_urls import DEFAULT_SCHEMA_BASE_URL, schema_url
from functions import tracing
from functions.errors import BodyTooLarge, Reject, problems

MAX_BODY_BYTES = 4 << 20
"""A Kubernetes object is at most ~1.5 MiB; anything much larger is not an event for us."""
BODY_KEY = "loraflow.body"
"""Where the body read once is kept in the WSGI environ (a webhook handler reads it again)."""

Reply = CloudEvent | None
P = TypeVar("P", bound=BaseModel)


def body_of(request: flask.Request) -> bytes:
    """The request body, refused before it is read past MAX_BODY_BYTES (a declared length over
    it is never read at all; a chunked one stops one byte after), read once per request."""
    cached = request.environ.get(BODY_KEY)
    if isinstance(cached, bytes):
        return cached
    declared = request.content_length
    if declared is not None and declared > MAX_BODY_BYTES:
        raise BodyTooLarge(f"body of {declared} bytes exceeds the {MAX_BODY_BYTES}-byte limit")
    body = request.stream.read(MAX_BODY_BYTES + 1)
    if len(body) > MAX_BODY_BYTES:
        raise BodyTooLarge(f"body exceeds the {MAX_BODY_BYTES}-byte limit")
    request.environ[BODY_KEY] = body
    return body


def parse(request: flask.Request) -> CloudEvent:
    """A CloudEvent from a binary- or structured-mode request, or Reject naming the problem."""
    body = body_of(request)
    try:
        event = binary_mode.read(_binary_headers(request.environ), body) or from_http(
            dict(request.headers), body
        )
    except (GenericException, ValueError, TypeError, AttributeError, RecursionError) as err:
        # RecursionError: JSON nested deeper than the decoder's limit (`[[[[...`) is garbage too.
        raise Reject(f"not a valid CloudEvent: {err}") from err
    for attribute in ("id", "source", "type"):
        if not isinstance(event.get(attribute), str) or not event.get(attribute):
            raise Reject(f"CloudEvent attribute {attribute!r} is missing or empty")
    return event


def _binary_headers(environ: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """The headers binary mode reads (Content-Type and `ce-*`), straight from the WSGI environ
    as werkzeug's EnvironHeaders names them, without building every other header's name first."""
    content_type = environ.get("CONTENT_TYPE")
    if content_type:  # an empty one is no header (EnvironHeaders skips it too)
        yield "content-type", content_type
    for key, value in environ.items():
        if key.startswith("HTTP_CE_"):
            yield "ce-" + key[8:].replace("_", "-").lower(), value


def data_as(event: CloudEvent, model: type[P]) -> P:
    """Validate the event's data against its payload model, or Reject with the field paths."""
    data = event.get_data()
    if isinstance(data, bytes | str):
        try:
            data = json.loads(data)
        except (ValueError, UnicodeDecodeError, RecursionError) as err:
            raise Reject(f"data of {event['type']} is not JSON: {err}") from err
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise Reject(f"data of {event['type']} is invalid: {problems(err)}") from err


def reply(
    type_: str,
    function: str,
    subject: str,
    data: BaseModel,
    extensions: dict[str, str] | None = None,
    *,
    schema_base_url: str = DEFAULT_SCHEMA_BASE_URL,
) -> CloudEvent:
    """Our outgoing event: JSON data by alias (unset optionals omitted, as the samples show),
    source `/loraflow/<function>`, `dataschema` its JSON Schema's URI under `schema_base_url`
    (the caller's `settings.schema_base_url`), and the trace context of the event being handled
    (every reply and every published event is built here)."""
    attributes = {
        "type": type_,
        "source": f"/loraflow/{function}",
        "subject": subject,
        "id": str(uuid4()),
        "datacontenttype": "application/json",
        "dataschema": schema_url(type_, schema_base_url),
        **tracing.outgoing(),
        **(extensions or {}),
    }
    return CloudEvent(attributes, data.model_dump(mode="json", exclude_none=True))

"""CloudEvents' HTTP binary mode, read and written without the SDK's marshaller layers.

Every delivery a Broker makes is binary mode (`ce-*` headers, the data as the body), and every
reply we answer with and every event we publish (functions/adapters/broker.py) is too. The
cloudevents SDK reads one by lowering the headers three times and passing each attribute
through a v1 event object of getters and setters, then copying it into a CloudEvent; writing
one goes the same way back. Here the same CloudEvent is built straight from the headers, on the
contract's floor, so the functions' edge and their Broker client share it.

What `read` returns equals what the SDK's `from_http` returns for the same request, attributes
and data (tests/unit/test_binary_mode.py holds them equal over generated requests); any request
that is not the plain case (structured mode, spec version 0.3, a `ce-data` or `ce-extensions`
header) returns None and is left to the SDK, errors and all. `write` gives the SDK's
`to_binary` headers and body for the events we build (string attributes, JSON data).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from cloudevents.http import CloudEvent

REQUIRED = ("ce-specversion", "ce-source", "ce-type", "ce-id")
STRUCTURED = "application/cloudevents"
"""The SDK reads a request in structured mode when its content type starts with this."""
_NOT_ATTRIBUTES = frozenset({"data", "extensions"})
"""`ce-` headers the SDK's event object treats as its own fields, not as attributes."""


def read(headers: Iterable[tuple[str, str]], body: bytes) -> CloudEvent | None:
    """The binary-mode CloudEvent of spec version 1.0 in `headers` and `body`; None when the
    request is anything else (the SDK then reads it, or says why it cannot)."""
    attributes: dict[str, str] = {}
    content_type: str | None = None
    for name, value in headers:
        lower = name.lower()
        if lower == "content-type":
            content_type = value
        elif lower.startswith("ce-"):
            key = lower[3:]
            if key in _NOT_ATTRIBUTES:
                return None
            attributes[key] = value
    if any(required[3:] not in attributes for required in REQUIRED):
        return None  # not binary mode: the SDK reads it as structured, or refuses it
    if attributes["specversion"] != "1.0" or (content_type or "").startswith(STRUCTURED):
        return None
    if content_type is not None:
        if "datacontenttype" in attributes:
            return None  # both: the SDK keeps whichever header came last
        attributes["datacontenttype"] = content_type
    return CloudEvent(attributes, _data(body))


def _data(body: bytes) -> Any:
    """The SDK's default for binary data: JSON when it parses, else the bytes; none when empty
    (an empty body, and as the SDK has it, a JSON empty string)."""
    if not body:
        return None
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, TypeError, UnicodeDecodeError):
        return body
    return None if isinstance(data, str) and not data else data


def write(event: CloudEvent) -> tuple[dict[str, str], bytes]:
    """`event` as binary-mode headers and body."""
    headers: dict[str, str] = {}
    attributes = event.get_attributes()
    content_type = attributes.get("datacontenttype")
    if content_type:
        headers["content-type"] = content_type
    for key, value in attributes.items():
        if key != "datacontenttype" and value is not None:
            headers["ce-" + key] = value
    data = event.get_data()
    if data is None:
        return headers, b""
    if isinstance(data, bytes):
        return headers, data
    return headers, json.dumps(data).encode()

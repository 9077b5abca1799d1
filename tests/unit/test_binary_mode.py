"""events/binary_mode.py reads and writes binary-mode CloudEvents as the cloudevents SDK
does: over generated requests, `read` gives the SDK's `from_http` event (attributes and data) or
leaves the request to the SDK; `write` gives the SDK's `to_binary` headers and body."""

from __future__ import annotations

import json
from typing import Any

from cloudevents.conversion import to_binary
from cloudevents.http import CloudEvent, from_http
from hypothesis import given, settings
from hypothesis import strategies as st
from werkzeug.datastructures import EnvironHeaders

from events import binary_mode, catalog
from functions.edge import messages

TEXT = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=12)
CORE = ["id", "source", "type", "specversion", "time", "subject", "dataschema", "datacontenttype"]
OTHERS = ["loraflowstep", "traceparent", "Knativearrivaltime", "data", "extensions", ""]
NAMES = st.sampled_from([*CORE, *OTHERS])
BODIES = st.one_of(
    st.just(b""),
    st.binary(max_size=20),
    st.builds(lambda v: json.dumps(v).encode(), st.recursive(st.none() | st.integers() | TEXT, st.lists)),
    st.just(b'{"a": 1}'),
    st.just(b"\xff\xfe"),
)


@st.composite
def requests(draw: st.DrawFn) -> tuple[dict[str, str], bytes]:
    headers: dict[str, str] = {}
    if draw(st.booleans()):
        headers.update({"ce-id": "1", "ce-source": "/s", "ce-type": "t", "ce-specversion": "1.0"})
    for name, value in draw(st.lists(st.tuples(NAMES, TEXT), max_size=5)):
        headers[draw(st.sampled_from(["ce-", "Ce-", "CE-"])) + name] = value
    if draw(st.booleans()):
        headers["ce-specversion"] = draw(st.sampled_from(["1.0", "0.3", "2", ""]))
    if draw(st.booleans()):
        headers["Content-Type"] = draw(
            st.sampled_from(
                ["application/json", "Text/Plain; charset=UTF-8", "application/cloudevents+json", ""]
            )
        )
    return headers, draw(BODIES)


def sdk(headers: dict[str, str], body: bytes) -> tuple[str, Any]:
    try:
        event = from_http(headers, body)
    except Exception as err:
        return "raised", type(err).__name__
    return "event", comparable(event, headers)


def comparable(event: CloudEvent, headers: dict[str, str]) -> tuple[dict[str, Any], Any]:
    """Attributes and data; a time the request did not give is the moment it was read: left out."""
    attributes = dict(event.get_attributes())
    if not any(name.lower() == "ce-time" for name in headers):
        del attributes["time"]
    return attributes, event.get_data()


@settings(max_examples=600, deadline=None)
@given(requests())
def test_read_gives_the_sdks_event_or_leaves_the_request_to_it(request: tuple[dict[str, str], bytes]) -> None:
    headers, body = request
    try:
        mine = binary_mode.read(headers.items(), body)
    except Exception as err:
        # the SDK's CloudEvent refused what it read: the SDK refuses the same request
        assert sdk(headers, body)[0] == "raised", err
        return
    if mine is None:
        return  # the SDK's to read
    assert sdk(headers, body) == ("event", comparable(mine, headers))


def test_a_brokers_delivery_is_read_here_not_left_to_the_sdk() -> None:
    headers = {
        "Ce-Id": "abc",
        "Ce-Source": "/loraflow/admit",
        "Ce-Type": "io.loraflow.adapter.admitted.v1",
        "Ce-Specversion": "1.0",
        "Ce-Time": "2026-12-01T00:00:00Z",
        "Ce-Knativearrivaltime": "2026-12-01T00:00:00.1Z",
        "Content-Type": "application/json",
    }
    event = binary_mode.read(headers.items(), b'{"name": "a"}')
    assert event is not None
    assert comparable(event, headers) == comparable(from_http(headers, b'{"name": "a"}'), headers)
    assert event["knativearrivaltime"] == "2026-12-01T00:00:00.1Z"


@given(st.sampled_from([t for t in catalog.BY_TYPE]))
def test_write_gives_the_sdks_headers_and_body(event_type: str) -> None:
    sample = catalog.sample(catalog.BY_TYPE[event_type])
    if "data_base64" in sample:
        return  # not an event we answer with
    data = sample.get("data")
    attributes = {k: v for k, v in sample.items() if k != "data"}
    event = CloudEvent(attributes, data)
    mine_headers, mine_body = binary_mode.write(event)
    their_headers, their_body = to_binary(event)
    assert mine_headers == their_headers
    assert mine_body == their_body


@given(
    st.dictionaries(
        st.sampled_from(
            ["HTTP_CE_ID", "HTTP_CE_LORAFLOWSTEP", "HTTP_CE_SPEC_VERSION", "HTTP_TRACEPARENT", "HTTP_HOST",
             "CONTENT_TYPE", "CONTENT_LENGTH", "HTTP_CONTENT_TYPE", "SERVER_NAME", "wsgi.input"]
        ),
        st.sampled_from(["", "a", "application/json", "1.0"]),
    )
)  # fmt: skip
def test_the_headers_binary_mode_reads_are_werkzeugs_own(environ: dict[str, str]) -> None:
    """The shell hands binary mode its headers from the WSGI environ: Content-Type and `ce-*`,
    named and valued as werkzeug's EnvironHeaders (what flask.Request.headers is) gives them."""
    theirs = [(k.lower(), v) for k, v in EnvironHeaders(environ).items()]
    wanted = [(k, v) for k, v in theirs if k == "content-type" or k.startswith("ce-")]
    assert sorted(messages._binary_headers(environ)) == sorted(wanted)

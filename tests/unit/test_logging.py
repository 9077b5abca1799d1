"""JSON log lines: one object per line with the CloudEvent context, credentials redacted."""

from __future__ import annotations

import io
import json
import logging
from datetime import UTC, datetime

import flask
from cloudevents.conversion import to_binary
from cloudevents.http import CloudEvent
from hypothesis import given, settings
from hypothesis import strategies as st

from functions.edge import shell
from functions.errors import Retryable
from functions.observability import rfc3339_millis

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def records(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


def call(view: object, event: CloudEvent) -> flask.Response:
    headers, body = to_binary(event)
    app = flask.Flask("t")
    with app.test_request_context("/", method="POST", headers=headers, data=body):
        response: flask.Response = view(flask.request)  # type: ignore[operator]
    return response


def event(**extra: str) -> CloudEvent:
    attributes = {
        "type": "io.loraflow.test.v1",
        "source": "/tests",
        "id": "evt-1",
        "subject": "/apis/x/namespaces/ns/loraadapters/a",
        "traceparent": TRACEPARENT,
        **extra,
    }
    return CloudEvent(attributes, {"k": "v"})


def test_handled_event_line_carries_the_cloudevent_context(lines: io.StringIO) -> None:
    view = shell.function("logtest_ok", ["io.loraflow.test.v1"], lambda e, d: None)

    assert call(view, event()).status_code == 204

    (line,) = [r for r in records(lines) if r.get("function") == "logtest_ok"]
    assert line["msg"] == "Handled event" and line["level"] == "info"
    assert line["ce_id"] == "evt-1"
    assert line["ce_type"] == "io.loraflow.test.v1"
    assert line["ce_subject"] == "/apis/x/namespaces/ns/loraadapters/a"
    assert line["traceparent"] == TRACEPARENT
    assert line["outcome"] == "done" and line["status"] == 204
    assert isinstance(line["duration_ms"], float)


def test_retry_is_logged_as_warning_with_the_detail(lines: io.StringIO) -> None:
    def handle(e: CloudEvent, d: object) -> None:
        raise Retryable("filer unavailable")

    view = shell.function("logtest_retry", ["io.loraflow.test.v1"], handle)

    assert call(view, event()).status_code == 503

    (line,) = [r for r in records(lines) if r.get("function") == "logtest_retry"]
    assert line["level"] == "warning" and line["outcome"] == "retry"
    assert line["detail"] == "filer unavailable" and line["ce_id"] == "evt-1"


def test_a_crash_is_logged_with_its_trace_then_answered_500(lines: io.StringIO) -> None:
    def handle(e: CloudEvent, d: object) -> None:
        raise KeyError("a bug")

    view = shell.function("logtest_crash", ["io.loraflow.test.v1"], handle)

    assert call(view, event()).status_code == 500

    crashed, handled = [r for r in records(lines) if r.get("function") == "logtest_crash"]
    assert crashed["msg"] == "Handler crashed" and crashed["level"] == "error"
    assert "KeyError: 'a bug'" in str(crashed["exc"]) and "in handle" in str(crashed["exc"])
    assert handled["msg"] == "Handled event" and handled["level"] == "warning"
    assert handled["outcome"] == "error" and handled["status"] == 500 and handled["ce_id"] == "evt-1"


def test_token_like_fields_are_redacted(lines: io.StringIO) -> None:
    log = logging.getLogger("loraflow.test")
    log.info(
        "calling",
        extra={"webhook_token": "s3cr3t", "Authorization": "Bearer abc", "aws_secret": "x", "path": "/a"},
    )

    (line,) = records(lines)
    assert line["webhook_token"] == "[redacted]"
    assert line["Authorization"] == "[redacted]"
    assert line["aws_secret"] == "[redacted]"
    assert line["path"] == "/a"
    assert "s3cr3t" not in lines.getvalue() and "Bearer abc" not in lines.getvalue()


def test_every_line_is_one_json_object(lines: io.StringIO) -> None:
    log = logging.getLogger("loraflow.test")
    log.info("multi\nline message", extra={"n": 1})
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("crashed")

    parsed = records(lines)
    assert len(lines.getvalue().splitlines()) == len(parsed) == 2
    assert parsed[0]["msg"] == "multi\nline message"
    assert "ValueError: boom" in str(parsed[1]["exc"])


@settings(max_examples=3000)
@given(
    st.one_of(
        st.floats(0, 4e9, allow_nan=False),
        st.builds(lambda s, us: s + us / 1e6, st.integers(10**9, 2 * 10**9), st.integers(0, 999_999)),
        st.builds(lambda s: s + 0.9999995, st.integers(10**9, 2 * 10**9)),  # rounds up a second
    )
)
def test_a_lines_time_is_the_moment_datetime_gives(timestamp: float) -> None:
    """The formatter keeps each second's text: the line still says what datetime says."""
    moment = datetime.fromtimestamp(timestamp, UTC)
    expected = moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
    assert rfc3339_millis(timestamp) == expected

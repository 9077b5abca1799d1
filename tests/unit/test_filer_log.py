"""The filer source's pure decisions: where to resume, when the log cannot replay from there,
what a response of the log is, and the names it gives a change."""

from __future__ import annotations

import pytest

from functions.adapters.filer_log import grpc_target
from functions.logic.file_events import watched_prefixes
from functions.logic.filer_log import (
    CHANGE,
    HEARTBEAT,
    MEMORY_HORIZON_NS,
    PROGRESS,
    Cursor,
    Start,
    annotations_of,
    cursor_of,
    event_id,
    plan_start,
    rfc3339_ns,
    step_of,
)
from functions.settings import Settings

NOW = 1_796_122_145_707_821_593
SIG = 1282549692


@pytest.mark.parametrize(
    ("cursor", "signature", "begins", "since", "why"),
    [
        pytest.param(None, SIG, None, NOW, "no cursor yet", id="first-start"),
        pytest.param(Cursor(NOW - 10, SIG), SIG, None, NOW - 10, None, id="young-filer-memory-only"),
        pytest.param(Cursor(NOW - 10, SIG), SIG, NOW - 20, NOW - 10, None, id="covered"),
        pytest.param(Cursor(NOW - 20, SIG), SIG, NOW - 20, NOW - 20, None, id="covered-exactly"),
        pytest.param(Cursor(NOW - 21, SIG), SIG, NOW - 20, NOW, "no longer retained", id="retention"),
        pytest.param(Cursor(NOW - 10, SIG), 7, NOW - 20, NOW, "signature 1282549692, now 7", id="new-store"),
        pytest.param(
            Cursor(NOW - MEMORY_HORIZON_NS - 1, SIG),
            SIG,
            None,
            NOW,
            "no metadata log on disk",
            id="files-gone",
        ),
        pytest.param(
            Cursor(NOW - MEMORY_HORIZON_NS, SIG), SIG, None, NOW - MEMORY_HORIZON_NS, None, id="horizon"
        ),
    ],
)
def test_plan_start(
    cursor: Cursor | None, signature: int, begins: int | None, since: int, why: str | None
) -> None:
    start = plan_start(cursor, signature, begins, NOW)
    assert start.since_ns == since
    if why is None:
        assert start == Start(since, None)
    else:
        assert start.resync is not None and why in start.resync


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({"loraflow.io/filer-since-ns": "12", "loraflow.io/filer-signature": "-5"}, Cursor(12, -5)),
        ({"loraflow.io/filer-since-ns": "12"}, None),
        ({"loraflow.io/filer-since-ns": "twelve", "loraflow.io/filer-signature": "1"}, None),
        ({"loraflow.io/filer-since-ns": "0", "loraflow.io/filer-signature": "1"}, None),
        ({}, None),
        (None, None),
    ],
)
def test_cursor_of(annotations: dict[str, str] | None, expected: Cursor | None) -> None:
    assert cursor_of(annotations) == expected


def test_the_cursor_round_trips_through_its_annotations() -> None:
    cursor = Cursor(NOW, -SIG)
    assert cursor_of(annotations_of(cursor)) == cursor


@pytest.mark.parametrize(
    ("has_notification", "has_entry", "ts", "kind"),
    [
        (False, False, NOW, HEARTBEAT),  # idle heartbeat: the filer's now, no notification
        (False, False, 0, HEARTBEAT),  # flush report
        (True, False, NOW, PROGRESS),  # filtered events skipped up to here
        (True, True, NOW, CHANGE),
        (True, True, 0, HEARTBEAT),  # a change without a position cannot move the cursor
    ],
)
def test_step_of(has_notification: bool, has_entry: bool, ts: int, kind: str) -> None:
    assert step_of(has_notification, has_entry, ts).kind == kind


def test_a_change_is_named_by_its_store_and_log_position() -> None:
    assert event_id(SIG, NOW) == "1282549692-1796122145707821593"
    assert rfc3339_ns(NOW) == "2026-12-01T10:49:05.707821593Z"
    assert rfc3339_ns(10**9) == "1970-01-01T00:00:01.000000000Z"


@pytest.mark.parametrize(
    ("url", "explicit", "target"),
    [
        ("http://seaweedfs-filer.seaweedfs:8888", None, "seaweedfs-filer.seaweedfs:18888"),
        ("http://127.0.0.1:8888/", None, "127.0.0.1:18888"),
        ("http://filer", None, "filer:10080"),
        ("http://filer:8888", "filer-0.filer:19999", "filer-0.filer:19999"),
    ],
)
def test_grpc_target(url: str, explicit: str | None, target: str) -> None:
    assert grpc_target(url, explicit) == target


def test_watched_prefixes_follow_the_backend() -> None:
    assert watched_prefixes(Settings()) == ("/loraadapters/",)
    s3 = Settings(storage="s3", s3_bucket="b", s3_buckets_dir="/buckets/")
    assert watched_prefixes(s3) == ("/buckets/b/loraadapters/",)

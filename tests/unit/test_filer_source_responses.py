"""What the filer source does with each kind of response of the log (bytes the official protobuf
runtime encodes with functions/proto, the messages the real filer sends: tests/seaweedfs holds
them equal to weed's own), the Broker a fake that keeps what it is given.

The cursor moves past a response only once it asked nothing of the Broker or the Broker took its
event; bad input is logged (with its ts_ns when it has one) and skipped."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from functions.adapters.filer_log import FilerLog
from functions.filer_source import Source
from functions.logic.filer_log import Cursor
from functions.proto import filer_pb2
from functions.settings import Settings
from tests.support.fakes import FakeBroker

SIG = 42
TS = 1_796_122_145_707_821_593
DIR = "/loraadapters/ns/m/a"


class Lease:
    """The cursor store's face the source shows in its logs (these tests never load or save)."""

    where = "Lease loraflow/test"

    def load(self) -> Cursor | None:
        raise AssertionError("not used here")

    def save(self, cursor: Cursor) -> None:
        raise AssertionError("not used here")


def source(settings: Settings | None = None) -> tuple[Source, FakeBroker]:
    broker = FakeBroker()
    filer = FilerLog("127.0.0.1:9", "http://127.0.0.1:9")  # connects lazily: never here
    made = Source(settings or Settings(), filer, Lease(), broker)  # type: ignore[arg-type]
    made.position = Cursor(TS - 1000, SIG)
    return made, broker


def entry(name: str, *, directory: bool = False, size: int = 3) -> filer_pb2.Entry:
    attributes = filer_pb2.FuseAttributes(file_size=size, md5=bytes(range(16)) if not directory else b"")
    return filer_pb2.Entry(name=name, is_directory=directory, attributes=attributes)


def response(ts: int, directory: str = DIR, **notification: Any) -> filer_pb2.SubscribeMetadataResponse:
    return filer_pb2.SubscribeMetadataResponse(
        directory=directory, ts_ns=ts, event_notification=filer_pb2.EventNotification(**notification)
    )


def test_a_change_is_published_then_the_cursor_moves() -> None:
    made, broker = source()
    made._handle(response(TS, new_entry=entry("w.bin"), new_parent_path=DIR).SerializeToString(), SIG)
    (event,) = broker.events
    assert event["subject"] == f"{DIR}/w.bin" and event["id"] == f"{SIG}-{TS}"
    assert event.get_data() == {
        "path": f"{DIR}/w.bin",
        "eventType": "create",
        "size": 3,
        "md5": bytes(range(16)).hex(),
    }
    assert made.position == Cursor(TS, SIG)


def test_a_batch_is_handled_in_its_order() -> None:
    made, broker = source()
    first = response(TS, new_entry=entry("a.bin"), new_parent_path=DIR)
    first.events.append(
        response(TS + 1, old_entry=entry("a.bin"), new_entry=entry("b.bin"), new_parent_path=DIR)
    )
    first.events.append(response(TS + 2, old_entry=entry("b.bin")))
    made._handle(first.SerializeToString(), SIG)
    assert [e.get_data()["eventType"] for e in broker.events] == ["create", "rename", "delete"]  # type: ignore[index]
    assert made.position == Cursor(TS + 2, SIG)


@pytest.mark.parametrize(
    "message",
    [
        pytest.param(response(TS, new_entry=entry("sub", directory=True)), id="a-directory"),
        pytest.param(response(TS), id="a-progress-marker"),  # the filer skipped filtered events
    ],
)
def test_what_needs_nothing_sent_moves_the_cursor(message: filer_pb2.SubscribeMetadataResponse) -> None:
    made, broker = source()
    made._handle(message.SerializeToString(), SIG)
    assert broker.events == [] and made.position == Cursor(TS, SIG)


@pytest.mark.parametrize(
    "message",
    [
        pytest.param(filer_pb2.SubscribeMetadataResponse(ts_ns=TS), id="idle-heartbeat"),
        pytest.param(filer_pb2.SubscribeMetadataResponse(flushed_ts_ns=TS), id="flush-report"),
    ],
)
def test_heartbeats_move_nothing(message: filer_pb2.SubscribeMetadataResponse) -> None:
    made, broker = source()
    made._handle(message.SerializeToString(), SIG)
    assert broker.events == [] and made.position == Cursor(TS - 1000, SIG)


def test_an_event_it_refuses_is_logged_with_its_ts_and_skipped(caplog: pytest.LogCaptureFixture) -> None:
    made, broker = source()
    with caplog.at_level(logging.ERROR, logger="loraflow.filer_source"):
        made._handle(response(TS, new_entry=entry("x%2e%2e"), new_parent_path=DIR).SerializeToString(), SIG)
    (record,) = caplog.records
    assert f"ts_ns={TS}" in record.getMessage() and "percent-encoded" in record.getMessage()
    assert broker.events == [] and made.position == Cursor(TS, SIG)


def test_bytes_that_do_not_decode_are_logged_and_skipped(caplog: pytest.LogCaptureFixture) -> None:
    made, broker = source()
    with caplog.at_level(logging.ERROR, logger="loraflow.filer_source"):
        made._handle(b"\xff\xff\xff", SIG)
    (record,) = caplog.records
    assert "3 bytes that does not decode" in record.getMessage()
    assert f"after ts_ns={TS - 1000}" in record.getMessage()
    assert broker.events == [] and made.position == Cursor(TS - 1000, SIG)


def test_with_the_s3_backend_the_buckets_folder_is_taken_off() -> None:
    made, broker = source(Settings(storage="s3"))
    bucket = "/buckets/loraadapters/loraadapters/ns/m/a"
    made._handle(
        response(TS, bucket, new_entry=entry("w.bin"), new_parent_path=bucket).SerializeToString(), SIG
    )
    (event,) = broker.events
    assert event["subject"] == "/loraadapters/ns/m/a/w.bin"

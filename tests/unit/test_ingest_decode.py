"""ingest's pure parts and the mapping it shares with the filer source (functions.logic.file_events):
path checks, classification to file.changed, SQS body decoding."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pytest

from events.domain import FileChanged
from functions.adapters.storage import quote_path
from functions.errors import Reject, Retryable
from functions.ingest import decode_sqs_data, key_of, publish_with_retry
from functions.logic.file_events import bucket_dir, check_path, file_changed, storage_path
from functions.logic.seaweed_event import (
    EntryInfo,
    FileChange,
    Notification,
)
from tests.support import filer_pb

P = "/loraadapters/ns/llama/a/w.safetensors"
MD5 = hashlib.md5(b"x", usedforsecurity=False).hexdigest()


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("/loraadapters/ns/m/a/../../b/x", id="dotdot"),
        pytest.param("/loraadapters/ns/m/a/%2e%2e/x", id="encoded-dotdot"),
        pytest.param("/loraadapters/ns/m/a/%2E%2E/x", id="encoded-dotdot-upper"),
        pytest.param("/loraadapters/ns/m/a%2fx", id="encoded-slash"),
        pytest.param("/loraadapters/ns/m/a/x\x00y", id="nul"),
        pytest.param("/loraadapters//ns/m/a/x", id="double-slash"),
        pytest.param("/loraadapters/ns/m/a/./x", id="dot"),
        pytest.param("loraadapters/ns/m/a/x", id="relative"),
        pytest.param("/loraadapters/ns/m/a/", id="trailing-slash"),
    ],
)
def test_check_path_rejects(path: str) -> None:
    with pytest.raises(Reject):
        check_path(path, "key")


def test_check_path_accepts() -> None:
    assert check_path(P, "key") == P
    assert check_path("/", "key") == "/"


def change(path: str = P, **kw: Any) -> FileChange:
    base: dict[str, Any] = {
        "event_type": "create",
        "new_path": None,
        "size": 7,
        "md5_hex": MD5,
        "is_directory": False,
    }
    return FileChange(path=path, **(base | kw))


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        pytest.param(change(), FileChanged(path=P, event_type="create", size=7, md5=MD5), id="create"),
        pytest.param(
            change(event_type="update", md5_hex=None),
            FileChanged(path=P, event_type="update", size=7),
            id="update-without-md5",
        ),
        pytest.param(
            change(event_type="delete", size=None, md5_hex=None),
            FileChanged(path=P, event_type="delete"),
            id="delete",
        ),
        pytest.param(
            change(path="/loraadapters/ns/llama/a/tmp", event_type="rename", new_path=P),
            FileChanged(
                path="/loraadapters/ns/llama/a/tmp", event_type="rename", new_path=P, size=7, md5=MD5
            ),
            id="rename-inside",
        ),
        pytest.param(
            change(path="/uploads/x", event_type="rename", new_path=P),
            FileChanged(path=P, event_type="create", size=7, md5=MD5),
            id="rename-into-adapters-is-create",
        ),
        pytest.param(change(path="/other/x"), None, id="outside-ignored"),
        pytest.param(change(path="/loraadapters", is_directory=True), None, id="root-dir-ignored"),
        pytest.param(
            change(path="/loraadapters/ns/llama/a", is_directory=True), None, id="directory-ignored"
        ),
        pytest.param(
            change(md5_hex="abcd"), FileChanged(path=P, event_type="create", size=7), id="odd-md5-dropped"
        ),
    ],
)
def test_file_changed(given: FileChange, expected: FileChanged | None) -> None:
    assert file_changed(given) == expected


def test_file_changed_rejects_bad_new_path() -> None:
    with pytest.raises(Reject, match="new path"):
        file_changed(change(event_type="rename", new_path="/loraadapters/ns/../x"))


NOTE = Notification(
    new_entry=EntryInfo(name="w.safetensors", file_size=7, md5=bytes.fromhex(MD5)),
    new_parent_path="/loraadapters/ns/llama/a",
)
RAW = filer_pb.encode(NOTE)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(RAW, id="raw-bytes"),
        pytest.param(base64.b64encode(RAW).decode(), id="base64-string"),
        pytest.param(base64.b64encode(RAW), id="base64-bytes"),
        pytest.param(filer_pb.as_latin1_text(RAW), id="latin1-string"),
    ],
)
def test_decode_sqs_data(data: Any) -> None:
    assert decode_sqs_data(data) == NOTE


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(None, "no data", id="none"),
        pytest.param({"a": 1}, "JSON dict", id="json-object"),
        pytest.param(b"\xff\xff\xff\xff", "not a protobuf EventNotification", id="garbage-bytes"),
        pytest.param("hello \ufffd world", "not a protobuf EventNotification", id="garbage-text"),
    ],
)
def test_decode_sqs_data_rejects(data: Any, message: str) -> None:
    with pytest.raises(Reject, match=message):
        decode_sqs_data(data)


def test_key_of() -> None:
    assert key_of(NOTE, "/x/y") == "/x/y"
    assert key_of(NOTE, None) == P
    with pytest.raises(Reject, match="no `key` extension"):
        key_of(Notification(old_entry=EntryInfo(name="w")), None)


def test_decode_sqs_data_text_transport_of_latin1_body() -> None:
    # what an HTTP text transport makes of the filer's string(bytes) SQS body
    assert decode_sqs_data(filer_pb.as_latin1_text(RAW).encode("utf-8")) == NOTE


# -- the S3 gateway's paths, percent-encoding, the publish budget ---------------------------------
@pytest.mark.parametrize(
    ("path", "folder", "expected"),
    [
        ("/loraadapters/ns/m/a/f", None, "/loraadapters/ns/m/a/f"),
        ("/buckets/loraadapters/loraadapters/ns/m/a/f", "/buckets/loraadapters", "/loraadapters/ns/m/a/f"),
        ("/buckets/loraadapters-old/loraadapters/ns/m/a/f", "/buckets/loraadapters", None),
        ("/loraadapters/ns/m/a/f", "/buckets/loraadapters", None),
        ("/buckets/loraadapters", "/buckets/loraadapters", None),
    ],
)
def test_storage_path(path: str, folder: str | None, expected: str | None) -> None:
    assert storage_path(path, folder) == expected


def test_file_changed_maps_the_bucket_folder() -> None:
    change = FileChange(
        path="/buckets/b/loraadapters/ns/m/a/f",
        event_type="rename",
        new_path="/buckets/b/loraadapters/ns/m/a/g",
        size=3,
        md5_hex=None,
        is_directory=False,
    )
    payload = file_changed(change, bucket_dir("/buckets", "b"))
    assert payload is not None
    assert (payload.path, payload.new_path) == ("/loraadapters/ns/m/a/f", "/loraadapters/ns/m/a/g")
    assert file_changed(change) is None  # the filer backend: /buckets/... is none of ours


@pytest.mark.parametrize(
    ("path", "quoted"),
    [
        ("/a/w?x=1", "/a/w%3Fx%3D1"),
        ("/a/hash#tag", "/a/hash%23tag"),
        ("/a/pct%41", "/a/pct%2541"),
        ("/a/sp ace", "/a/sp%20ace"),
        ("/a/ü", "/a/%C3%BC"),
        ("/a/b-c_d.e~f/", "/a/b-c_d.e~f/"),
    ],
)
def test_quote_path(path: str, quoted: str) -> None:
    assert quote_path(path) == quoted


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_publish_with_retry_backs_off_and_succeeds() -> None:
    clock, timeouts = Clock(), []

    def publish(event: object, timeout: float) -> None:
        timeouts.append(timeout)
        if len(timeouts) < 4:
            raise Retryable("broker answered 503")

    assert publish_with_retry(publish, object(), 5.0, clock.time, clock.sleep) == 4  # type: ignore[arg-type]
    assert clock.sleeps == [0.05, 0.1, 0.2]
    assert timeouts[0] == 5.0 and all(t <= 5.0 for t in timeouts)


def test_publish_with_retry_gives_up_inside_the_budget() -> None:
    clock = Clock()

    def publish(event: object, timeout: float) -> None:
        clock.now += 0.01  # each attempt takes a little
        raise Retryable("broker unreachable")

    with pytest.raises(Retryable):
        publish_with_retry(publish, object(), 2.0, clock.time, clock.sleep)  # type: ignore[arg-type]
    assert clock.now <= 2.0
    assert clock.sleeps == [0.05, 0.1, 0.2, 0.4, 0.8]  # the next wait (1 s) would overrun

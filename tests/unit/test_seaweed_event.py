"""Table tests of our reading of SeaweedFS EventNotification (protobuf through the official
runtime and functions/proto, and the webhook's JSON).

Bytes come from the wire format's specification (hand-assembled, commented) or from the official
`protobuf` runtime with descriptors declared apart from functions/proto (tests.support.filer_pb);
webhook bodies are the real filer's, verbatim from /work/shared/reference/seaweedfs-real.md. The
real filer's own protobuf is decoded in tests/seaweedfs/test_filer_source.py."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pytest

from functions.logic.seaweed_event import (
    EntryInfo,
    FileChange,
    InvalidNotification,
    Notification,
    ProtoDecodeError,
    classify,
    decode_event_notification,
    decode_sqs_body,
    parse_webhook_message,
)
from tests.support import filer_pb

MD5 = hashlib.md5(b"adapter weights").digest()


# ----------------------------------------------------------------------------- EventNotification

FILE = EntryInfo(
    name="adapter_model.safetensors",
    file_size=123456789,
    md5=MD5,
    mtime=1_760_000_000,
    crtime=1_760_000_000,
    file_mode=0o660,
    mime="application/octet-stream",
)
CASES: dict[str, Notification] = {
    "create": Notification(new_entry=FILE, new_parent_path="/loraadapters/ns/m/a"),
    "update": Notification(
        old_entry=FILE,
        new_entry=EntryInfo(name=FILE.name, file_size=5, md5=None),
        new_parent_path="/loraadapters/ns/m/a",
    ),
    "delete": Notification(old_entry=FILE, delete_chunks=True),
    "rename": Notification(
        old_entry=FILE,
        new_entry=EntryInfo(name="renamed.safetensors", file_size=1, md5=MD5),
        new_parent_path="/loraadapters/ns/m/b",
        is_from_other_cluster=True,
        signatures=(-7, 42),
    ),
    "dir": Notification(new_entry=EntryInfo(name="a", is_directory=True, file_mode=0x800001F9)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_official_protobuf_bytes_decode_to_the_record(name: str) -> None:
    n = CASES[name]
    assert decode_event_notification(filer_pb.encode(n)) == n


def test_a_real_filer_body_with_chunks_inode_and_zero_ctime() -> None:
    """The fields our records leave out (chunks, inode above 2**63, negative ctime, signatures)
    are skipped, as a protobuf reader does."""
    data = filer_pb.notification(
        new=filer_pb.entry("adapter_config.json", size=87, md5_hex=MD5.hex()),
        new_parent_path="/loraadapters/default/llama3-8b/finance",
    )
    n = decode_event_notification(data)
    assert n.new_entry is not None
    assert (n.new_entry.name, n.new_entry.file_size, n.new_entry.md5) == ("adapter_config.json", 87, MD5)
    assert n.signatures == (1927035721, -576249426) and n.delete_chunks


# Verbatim webhook bodies of SeaweedFS 4.48 (seaweedfs-real.md section 2, "Exact samples").
REAL_CREATE = {
    "new_entry": {
        "name": "adapter_config.json",
        "chunks": [
            {
                "size": 87,
                "modified_ts_ns": 1796109979565793763,
                "e_tag": "92bKW78PmNUwLHGPX29WbA==",
                "fid": {"volume_id": 7, "file_key": 2, "cookie": 3288247118},
            }
        ],
        "attributes": {
            "file_size": 87,
            "mtime": 1796109979,
            "file_mode": 432,
            "crtime": 1796109979,
            "mime": "application/json",
            "md5": "92bKW78PmNUwLHGPX29WbA==",
            "inode": 13080058405695252649,
            "ctime": -62135596800,
            "mtime_ns": 565818852,
            "atime": 1796109979,
            "atime_ns": 565818852,
        },
    },
    "delete_chunks": True,
    "new_parent_path": "/loraadapters/default/llama3-8b/finance",
    "signatures": [1927035721],
}
REAL_DIRECTORY = {
    "new_entry": {
        "name": "finance",
        "is_directory": True,
        "attributes": {
            "mtime": 1796109979,
            "file_mode": 2147484153,
            "crtime": 1796109979,
            "inode": 7842941588456153815,
            "ctime": -62135596800,
            "mtime_ns": 566141415,
        },
    },
    "new_parent_path": "/loraadapters/default/llama3-8b",
    "signatures": [1927035721],
}


def test_real_webhook_bodies() -> None:
    created = parse_webhook_message(REAL_CREATE)
    assert created.new_entry == EntryInfo(
        name="adapter_config.json",
        file_size=87,
        md5=base64.b64decode("92bKW78PmNUwLHGPX29WbA=="),
        mtime=1796109979,
        crtime=1796109979,
        file_mode=432,
        mime="application/json",
    )
    assert created.signatures == (1927035721,) and created.delete_chunks
    directory = parse_webhook_message(REAL_DIRECTORY)
    assert directory.new_entry is not None and directory.new_entry.is_directory


def test_known_protobuf_bytes() -> None:
    # Hand-assembled: new_entry{name "x", attributes{file_size 3, md5}} , new_parent_path "/d"
    attrs = b"\x08\x03" + b"\x72\x10" + MD5
    entry = b"\x0a\x01x" + b"\x22" + bytes([len(attrs)]) + attrs
    data = b"\x12" + bytes([len(entry)]) + entry + b"\x22\x02/d" + b"\xf8\x01\x05"  # unknown 31
    n = decode_event_notification(data)
    assert n == Notification(new_entry=EntryInfo(name="x", file_size=3, md5=MD5), new_parent_path="/d")
    assert n.new_entry is not None and n.new_entry.md5_hex == MD5.hex()


@pytest.mark.parametrize(
    ("data", "why"),
    [
        pytest.param(b"\x12\x05\x0a\x10abc", "Wire format was corrupt", id="name-longer-than-entry"),
        pytest.param(b"\x0a\x03\x22\x01\x08", "Wire format was corrupt", id="truncated-varint"),
        pytest.param(b"\x12\x04\x22\x02\x72\x09", "Wire format was corrupt", id="truncated-md5"),
        pytest.param(b"\x22\x02\xff\xfe", "bad UTF-8", id="parent-path-not-utf8"),
        pytest.param(b"\x12\x03\x0a\x01\xff", "bad UTF-8", id="name-not-utf8"),
        pytest.param(b"\xff\xff\xff", "Wire format was corrupt", id="truncated-tag"),
        pytest.param(b"\x08" + b"\xff" * 10 + b"\x01", "Wire format was corrupt", id="varint-over-64-bits"),
        pytest.param(b"\x0b", "Wire format was corrupt", id="start-group"),
        pytest.param(b"GET / HTTP/1.1\r\n", "Wire format was corrupt", id="http-text"),
    ],
)
def test_decode_event_garbage(data: bytes, why: str) -> None:
    with pytest.raises(ProtoDecodeError, match=why) as info:
        decode_event_notification(data)
    assert str(info.value).startswith(f"EventNotification: {len(data)} bytes are not a valid message")


def test_a_field_of_another_wire_type_is_unknown_not_an_error() -> None:
    """Field 1 (old_entry, a message) sent as a varint: the runtime keeps it as an unknown field,
    as every protobuf reader does, and the notification then has no entry at all (which
    classify refuses)."""
    assert decode_event_notification(b"\x08\x01") == Notification()


def test_sqs_body_latin1_round_trip_and_utf8_fallback() -> None:
    n = CASES["rename"]
    raw = filer_pb.encode(n)
    assert decode_sqs_body(filer_pb.as_latin1_text(raw)) == n
    assert decode_sqs_body(raw) == n
    text_only = Notification(new_entry=EntryInfo(name="é.json"), new_parent_path="/ü")
    as_text = filer_pb.encode(text_only).decode("utf-8")  # valid UTF-8 travelled as text
    assert decode_sqs_body(as_text) == text_only


def test_sqs_body_mangled_by_utf8_transport() -> None:
    raw = filer_pb.encode(CASES["create"])
    mangled = raw.decode("utf-8", "replace")
    with pytest.raises(ProtoDecodeError, match="U\\+FFFD replacement characters"):
        decode_sqs_body(mangled)


@pytest.mark.parametrize(
    ("message", "error"),
    [
        ({"new_entry": "x"}, "message.new_entry: expected an object"),
        ({"new_entry": {"name": 3}}, "message.new_entry.name: expected a string"),
        ({"new_entry": {"attributes": {"md5": "***"}}}, "attributes.md5: not valid base64"),
        ({"new_entry": {"attributes": {"file_size": "big"}}}, "file_size: expected an integer"),
        ({"delete_chunks": "yes"}, "delete_chunks: expected a boolean"),
        ({"signatures": ["a"]}, "signatures: expected a list of integers"),
    ],
)
def test_parse_webhook_message_errors(message: dict[str, Any], error: str) -> None:
    with pytest.raises(InvalidNotification, match=error):
        parse_webhook_message(message)


# ----------------------------------------------------------------------------- classify

D = "/loraadapters/ns/m/a"


@pytest.mark.parametrize(
    ("key", "notification", "expected"),
    [
        (
            f"{D}/adapter_model.safetensors",
            CASES["create"],
            FileChange(f"{D}/adapter_model.safetensors", "create", None, 123456789, MD5.hex(), False),
        ),
        (
            f"{D}/adapter_model.safetensors",
            CASES["update"],
            FileChange(f"{D}/adapter_model.safetensors", "update", None, 5, None, False),
        ),
        (
            f"{D}/adapter_model.safetensors",
            CASES["delete"],
            FileChange(f"{D}/adapter_model.safetensors", "delete", None, None, None, False),
        ),
        (
            f"{D}/adapter_model.safetensors",
            CASES["rename"],
            FileChange(
                f"{D}/adapter_model.safetensors",
                "rename",
                "/loraadapters/ns/m/b/renamed.safetensors",
                1,
                MD5.hex(),
                False,
            ),
        ),
        (  # same directory, new name
            f"{D}/old.json",
            Notification(EntryInfo("old.json"), EntryInfo("new.json"), new_parent_path=D),
            FileChange(f"{D}/old.json", "rename", f"{D}/new.json", 0, None, False),
        ),
        (  # same name, other directory (a directory moved)
            f"{D}/sub",
            Notification(
                EntryInfo("sub", is_directory=True),
                EntryInfo("sub", is_directory=True),
                new_parent_path="/elsewhere",
            ),
            FileChange(f"{D}/sub", "rename", "/elsewhere/sub", 0, None, True),
        ),
        (  # update with an empty new_parent_path stays in place
            f"{D}/x",
            Notification(EntryInfo("x"), EntryInfo("x", file_size=9)),
            FileChange(f"{D}/x", "update", None, 9, None, False),
        ),
        (  # trailing slash on new_parent_path is tolerated
            f"{D}/x",
            Notification(EntryInfo("x"), EntryInfo("x"), new_parent_path=D + "/"),
            FileChange(f"{D}/x", "update", None, 0, None, False),
        ),
        (  # rename to the root directory
            "/a/x",
            Notification(EntryInfo("x"), EntryInfo("y"), new_parent_path="/"),
            FileChange("/a/x", "rename", "/y", 0, None, False),
        ),
        (
            D,
            CASES["dir"],
            FileChange(D, "create", None, 0, None, True),
        ),
    ],
)
def test_classify(key: str, notification: Notification, expected: FileChange) -> None:
    assert classify(key, notification) == expected


@pytest.mark.parametrize(
    ("key", "notification", "error"),
    [
        ("/x", Notification(), "neither old_entry nor new_entry"),
        ("", CASES["create"], "absolute path"),
        ("relative/x", CASES["create"], "absolute path"),
    ],
)
def test_classify_rejects(key: str, notification: Notification, error: str) -> None:
    with pytest.raises(InvalidNotification, match=error):
        classify(key, notification)

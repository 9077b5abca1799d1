"""functions/proto: the committed generated code is what the pinned compiler makes of filer.proto,
and the messages carry upstream's field numbers (weed/pb/filer.proto; the real filer's own
bytes are decoded in tests/seaweedfs/test_filer_source.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from functions.proto import filer_pb2
from tests.support.protogen import GENERATED, PROTO_DIR, generate

# weed/pb/filer.proto at seaweedfs cc8364a03ebf5cf9f8eab3315ded2000cd07fff6: (message, field) -> number
UPSTREAM = {
    ("Entry", "name"): 1,
    ("Entry", "is_directory"): 2,
    ("Entry", "attributes"): 4,
    ("EventNotification", "old_entry"): 1,
    ("EventNotification", "new_entry"): 2,
    ("EventNotification", "delete_chunks"): 3,
    ("EventNotification", "new_parent_path"): 4,
    ("EventNotification", "is_from_other_cluster"): 5,
    ("EventNotification", "signatures"): 6,
    ("FuseAttributes", "file_size"): 1,
    ("FuseAttributes", "mtime"): 2,
    ("FuseAttributes", "file_mode"): 3,
    ("FuseAttributes", "crtime"): 6,
    ("FuseAttributes", "mime"): 7,
    ("FuseAttributes", "md5"): 14,
    ("GetFilerConfigurationResponse", "dir_buckets"): 5,
    ("GetFilerConfigurationResponse", "signature"): 8,
    ("GetFilerConfigurationResponse", "version"): 11,
    ("LogEntry", "ts_ns"): 1,
    ("SubscribeMetadataRequest", "client_name"): 1,
    ("SubscribeMetadataRequest", "path_prefix"): 2,
    ("SubscribeMetadataRequest", "since_ns"): 3,
    ("SubscribeMetadataRequest", "signature"): 4,
    ("SubscribeMetadataRequest", "path_prefixes"): 6,
    ("SubscribeMetadataRequest", "client_id"): 7,
    ("SubscribeMetadataRequest", "until_ns"): 8,
    ("SubscribeMetadataRequest", "client_epoch"): 9,
    ("SubscribeMetadataRequest", "directories"): 10,
    ("SubscribeMetadataRequest", "client_supports_batching"): 11,
    ("SubscribeMetadataRequest", "client_supports_metadata_chunks"): 12,
    ("SubscribeMetadataRequest", "client_supports_idle_heartbeat"): 13,
    ("SubscribeMetadataResponse", "directory"): 1,
    ("SubscribeMetadataResponse", "event_notification"): 2,
    ("SubscribeMetadataResponse", "ts_ns"): 3,
    ("SubscribeMetadataResponse", "events"): 4,
    ("SubscribeMetadataResponse", "flushed_ts_ns"): 6,
}


def test_committed_code_is_what_the_pinned_compiler_generates(tmp_path: Path) -> None:
    fresh = generate(tmp_path)
    for path in fresh:
        committed = PROTO_DIR / path.name
        assert committed.read_bytes() == path.read_bytes(), (
            f"{committed} is stale: run `make proto` and commit the result"
        )
    assert sorted(p.name for p in fresh) == sorted(GENERATED)


def test_every_declared_field_has_upstreams_number() -> None:
    declared = {
        (message.name, field.name): field.number
        for message in filer_pb2.DESCRIPTOR.message_types_by_name.values()
        for field in message.fields
    }
    assert declared == UPSTREAM


def test_the_service_path_is_upstreams() -> None:
    """gRPC routes by `/<package>.<service>/<method>`: the package and names must be upstream's."""
    service = filer_pb2.DESCRIPTOR.services_by_name["SeaweedFiler"]
    assert service.full_name == "filer_pb.SeaweedFiler"
    assert set(service.methods_by_name) == {"SubscribeMetadata", "GetFilerConfiguration"}
    assert service.methods_by_name["SubscribeMetadata"].server_streaming


@pytest.mark.parametrize("message", ["EventNotification", "SubscribeMetadataResponse"])
def test_fields_we_leave_out_are_kept_as_unknown(message: str) -> None:
    """A field of upstream's that filer.proto does not declare (Entry.chunks is 3) survives a
    decode and re-encode: leaving a field out never breaks decoding."""
    cls = getattr(filer_pb2, message)
    chunk = b"\x1a\x04\x0a\x02ab"  # field 3 (chunks), length 4, holding file_id "ab"
    entry = b"\x0a\x01x" + chunk  # name "x" + the unknown chunk
    body = b"\x12" + bytes([len(entry)]) + entry  # field 2 (new_entry / event_notification)
    if message == "SubscribeMetadataResponse":
        notification = b"\x12" + bytes([len(entry)]) + entry
        body = b"\x12" + bytes([len(notification)]) + notification
    decoded = cls.FromString(body)
    assert decoded.SerializeToString() == body

"""SeaweedFS `filer_pb.EventNotification` bytes made by the official `protobuf` package.

The tests of ingest's protobuf decoding need bytes that functions/proto did not describe: the
messages are declared here once more, apart from functions/proto/filer.proto, from the field
numbers of SeaweedFS `weed/pb/filer.proto` (the subset the filer fills in a notification, as
seen in 51 real bodies: seaweedfs-real.md section 4, chunks and inode included, which
functions/proto leaves out), and the official runtime encodes them in a pool of their own. A
wrong number in either declaration fails the round trip; the real filer's own bytes are
decoded in tests/seaweedfs/test_filer_source.py.
"""

from __future__ import annotations

import base64
from functools import cache
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from functions.logic.seaweed_event import EntryInfo, Notification

_F = descriptor_pb2.FieldDescriptorProto

# (name, number, type, label, message type) per message; numbers from weed/pb/filer.proto.
_MESSAGES: dict[str, list[tuple[str, int, int, int, str | None]]] = {
    "FuseAttributes": [
        ("file_size", 1, _F.TYPE_UINT64, _F.LABEL_OPTIONAL, None),
        ("mtime", 2, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None),
        ("file_mode", 3, _F.TYPE_UINT32, _F.LABEL_OPTIONAL, None),
        ("uid", 4, _F.TYPE_UINT32, _F.LABEL_OPTIONAL, None),
        ("gid", 5, _F.TYPE_UINT32, _F.LABEL_OPTIONAL, None),
        ("crtime", 6, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None),
        ("mime", 7, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        ("md5", 14, _F.TYPE_BYTES, _F.LABEL_OPTIONAL, None),
        ("inode", 17, _F.TYPE_UINT64, _F.LABEL_OPTIONAL, None),
        ("ctime", 18, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None),
        ("mtime_ns", 19, _F.TYPE_INT32, _F.LABEL_OPTIONAL, None),
        ("atime", 22, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None),
        ("atime_ns", 23, _F.TYPE_INT32, _F.LABEL_OPTIONAL, None),
    ],
    "FileChunk": [
        ("file_id", 1, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        ("offset", 2, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None),
        ("size", 3, _F.TYPE_UINT64, _F.LABEL_OPTIONAL, None),
        ("modified_ts_ns", 4, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None),
        ("e_tag", 5, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
    ],
    "Entry": [
        ("name", 1, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        ("is_directory", 2, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, None),
        ("chunks", 3, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, ".filer_pb.FileChunk"),
        ("attributes", 4, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, ".filer_pb.FuseAttributes"),
    ],
    "EventNotification": [
        ("old_entry", 1, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, ".filer_pb.Entry"),
        ("new_entry", 2, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, ".filer_pb.Entry"),
        ("delete_chunks", 3, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, None),
        ("new_parent_path", 4, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        ("is_from_other_cluster", 5, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, None),
        ("signatures", 6, _F.TYPE_INT32, _F.LABEL_REPEATED, None),
    ],
}


@cache
def _classes() -> dict[str, Any]:
    file = descriptor_pb2.FileDescriptorProto(name="loraflow_tests_filer.proto", package="filer_pb")
    file.syntax = "proto3"
    for name, fields in _MESSAGES.items():
        message = file.message_type.add(name=name)
        for field_name, number, type_, label, type_name in fields:
            field = message.field.add(name=field_name, number=number, type=type_, label=label)
            if type_name:
                field.type_name = type_name
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"filer_pb.{name}"))
        for name in _MESSAGES
    }


def entry(name: str, *, directory: bool = False, size: int = 0, md5_hex: str | None = None) -> Any:
    """An Entry as the filer fills it for an HTTP upload (chunk, inode, zero ctime included)."""
    classes = _classes()
    attributes = classes["FuseAttributes"](
        file_size=size,
        mtime=1796109979,
        file_mode=2147484153 if directory else 432,
        crtime=1796109979,
        inode=13080058405695252649,
        ctime=-62135596800,
        mtime_ns=565818852,
    )
    if md5_hex is not None:
        attributes.md5 = bytes.fromhex(md5_hex)
    found = classes["Entry"](name=name, is_directory=directory, attributes=attributes)
    if not directory and size:
        found.chunks.add(file_id="7,16dbd2e2b6", size=size, modified_ts_ns=1796109985820533161)
    return found


def notification(
    *,
    old: Any | None = None,
    new: Any | None = None,
    new_parent_path: str = "",
    signatures: tuple[int, ...] = (),
) -> bytes:
    """`proto.Marshal` of an EventNotification (what the filer puts in an aws_sqs body)."""
    message = _classes()["EventNotification"](new_parent_path=new_parent_path, delete_chunks=True)
    if old is not None:
        message.old_entry.CopyFrom(old)
    if new is not None:
        message.new_entry.CopyFrom(new)
    message.signatures.extend(signatures or (1927035721, -576249426))
    data: bytes = message.SerializeToString()
    return data


def as_latin1_text(data: bytes) -> str:
    """The bytes as text one code point per byte (a transport that keeps every byte)."""
    return data.decode("latin-1")


def as_base64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def encode(notification: Notification) -> bytes:
    """The official encoding of one of our decoded records: what the filer would have sent for
    it. Decoding this must give the record back (a round trip through someone else's encoder)."""
    classes = _classes()

    def pb_entry(info: EntryInfo) -> Any:
        attributes = classes["FuseAttributes"](
            file_size=info.file_size,
            mtime=info.mtime,
            file_mode=info.file_mode,
            crtime=info.crtime,
            mime=info.mime,
            md5=info.md5 or b"",
        )
        return classes["Entry"](name=info.name, is_directory=info.is_directory, attributes=attributes)

    message = classes["EventNotification"](
        delete_chunks=notification.delete_chunks,
        new_parent_path=notification.new_parent_path,
        is_from_other_cluster=notification.is_from_other_cluster,
        signatures=list(notification.signatures),
    )
    if notification.old_entry is not None:
        message.old_entry.CopyFrom(pb_entry(notification.old_entry))
    if notification.new_entry is not None:
        message.new_entry.CopyFrom(pb_entry(notification.new_entry))
    data: bytes = message.SerializeToString()
    return data

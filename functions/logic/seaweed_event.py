"""Our typed reading of SeaweedFS ``filer_pb.EventNotification`` (``weed/pb/filer.proto``).

Two encodings travel:

* protobuf bytes (``proto.Marshal``): Kafka values, Pub/Sub data, the ``aws_sqs`` queue, where
  ``weed/notification/aws_sqs/aws_sqs_pub.go`` sends ``MessageBody: string(bytes)`` -- raw binary in
  a string -- and the filer's metadata log (``SubscribeMetadata``). The official ``protobuf``
  runtime decodes them with the messages generated from functions/proto/filer.proto:
  :func:`decode_event_notification` reads bytes, :func:`from_proto` a decoded message, and
  :func:`decode_sqs_body` first turns an SQS body back into bytes (see its docstring for how).
* Go ``encoding/json`` of the generated struct (the ``webhook`` queue, ``weed/notification/webhook``):
  snake_case protobuf json tags with ``omitempty`` (false/0/""/empty omitted), ``[]byte`` as std
  base64, int64/uint64 as JSON numbers (not protojson). :func:`parse_webhook_message`.

Fields read (numbers from ``weed/pb/filer.proto``)::

    EventNotification: old_entry 1, new_entry 2, delete_chunks 3, new_parent_path 4,
                       is_from_other_cluster 5, signatures 6 (repeated int32)
    Entry:             name 1, is_directory 2, attributes 4 (chunks 3, extended 5, ... unread)
    FuseAttributes:    file_size 1 (uint64), mtime 2 (int64, unix s), file_mode 3 (uint32),
                       crtime 6 (int64), mime 7, md5 14 (bytes)

Unknown fields are skipped, as any protobuf reader does. Event semantics
(``weed/filer/filer_notify.go``): create = new only; delete = old only; update = both, same
directory and name; rename = both with a different ``new_parent_path`` or name. The event key is the
full path of the old entry when there is one, else of the new entry.
"""

from __future__ import annotations

import base64
import binascii
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from functions.errors import Reject

if TYPE_CHECKING:
    from functions.proto import filer_pb2

__all__ = [
    "EntryInfo",
    "EventType",
    "FileChange",
    "InvalidNotification",
    "Notification",
    "ProtoDecodeError",
    "classify",
    "decode_event_notification",
    "decode_sqs_body",
    "event_type_of",
    "from_proto",
    "join_path",
    "parse_webhook_message",
]

EventType = Literal["create", "update", "delete", "rename"]


class InvalidNotification(Reject):
    """A webhook message (JSON form) or a notification that cannot be interpreted (a 400)."""


class ProtoDecodeError(Reject):
    """Bytes that are not a protobuf EventNotification (the message says what was tried; a 400)."""


@dataclass(frozen=True, slots=True)
class EntryInfo:
    """The parts of ``filer_pb.Entry`` (+ its ``FuseAttributes``) we use. ``md5`` is the raw
    16-byte digest or None when the filer did not record one (appends, S3 multipart, mount...)."""

    name: str
    is_directory: bool = False
    file_size: int = 0
    md5: bytes | None = None
    mtime: int = 0
    crtime: int = 0
    file_mode: int = 0
    mime: str = ""

    @property
    def md5_hex(self) -> str | None:
        return self.md5.hex() if self.md5 else None


@dataclass(frozen=True, slots=True)
class Notification:
    old_entry: EntryInfo | None = None
    new_entry: EntryInfo | None = None
    new_parent_path: str = ""
    delete_chunks: bool = False
    is_from_other_cluster: bool = False
    signatures: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class FileChange:
    """One classified filer event. ``path`` is the event key (old path for renames); ``size`` and
    ``md5_hex`` describe the new entry (None for deletes, and md5 None when the filer has none)."""

    path: str
    event_type: EventType
    new_path: str | None
    size: int | None
    md5_hex: str | None
    is_directory: bool


# ------------------------------------------------------------------------------ protobuf decode


def _entry(entry: filer_pb2.Entry) -> EntryInfo:
    attributes = entry.attributes
    return EntryInfo(
        name=entry.name,
        is_directory=entry.is_directory,
        file_size=attributes.file_size,
        md5=attributes.md5 or None,  # proto3: empty bytes == absent
        mtime=attributes.mtime,
        crtime=attributes.crtime,
        file_mode=attributes.file_mode,
        mime=attributes.mime,
    )


def from_proto(message: filer_pb2.EventNotification) -> Notification:
    """Our record of a decoded EventNotification (an entry is present only when it was sent)."""
    return Notification(
        old_entry=_entry(message.old_entry) if message.HasField("old_entry") else None,
        new_entry=_entry(message.new_entry) if message.HasField("new_entry") else None,
        delete_chunks=message.delete_chunks,
        new_parent_path=message.new_parent_path,
        is_from_other_cluster=message.is_from_other_cluster,
        signatures=tuple(message.signatures),
    )


def decode_event_notification(data: bytes) -> Notification:
    """Decode ``proto.Marshal(EventNotification)`` bytes with the official runtime. Raises
    :class:`ProtoDecodeError` (truncated or malformed bytes, a string that is not UTF-8)."""
    from google.protobuf.message import DecodeError

    from functions.proto import filer_pb2  # imported on first use: only these paths need it

    try:
        message = filer_pb2.EventNotification.FromString(data)
    except DecodeError as err:
        what = f"EventNotification: {len(data)} bytes are not a valid message ({err})"
        raise ProtoDecodeError(what) from None
    return from_proto(message)


# ------------------------------------------------------------------------------ SQS body


def decode_sqs_body(body: str | bytes) -> Notification:
    """Turn an SQS ``MessageBody`` back into protobuf bytes and decode it.

    Go's ``string(bytes)`` is not text. Bytes arriving as ``bytes`` are decoded as they are. For a
    ``str`` we try, in order: latin-1 (one code point per byte, a lossless text form; only when
    every character is below U+0100), then UTF-8 (what a text transport does to bytes that happened
    to be valid UTF-8). Bytes that were not valid UTF-8 are lost by a UTF-8 transport (U+FFFD
    replacement characters); the error then says so.
    """
    if isinstance(body, bytes | bytearray):
        return decode_event_notification(bytes(body))
    candidates: list[tuple[str, bytes]] = []
    if all(ord(c) < 0x100 for c in body):
        candidates.append(("latin-1", body.encode("latin-1")))
    candidates.append(("utf-8", body.encode("utf-8", "surrogateescape")))
    errors: list[str] = []
    for name, raw in candidates:
        try:
            return decode_event_notification(raw)
        except ProtoDecodeError as exc:
            errors.append(f"as {name}: {exc}")
    hint = ""
    if "\ufffd" in body:
        hint = (
            " (the body contains U+FFFD replacement characters: the protobuf bytes were not valid"
            " UTF-8 and were altered in transit)"
        )
    raise ProtoDecodeError("SQS body is not a protobuf EventNotification" + hint + ": " + "; ".join(errors))


# ------------------------------------------------------------------------------ webhook JSON


def _json_int(obj: Mapping[str, Any], key: str, what: str) -> int:
    value = obj.get(key, 0)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        # Go marshals int64 as a number; accept a protojson-style numeric string defensively.
        if isinstance(value, str) and value.lstrip("-").isdigit():
            return int(value)
        raise InvalidNotification(f"{what}.{key}: expected an integer, got {value!r}")
    return value


def _json_str(obj: Mapping[str, Any], key: str, what: str) -> str:
    value = obj.get(key, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InvalidNotification(f"{what}.{key}: expected a string, got {value!r}")
    return value


def _json_bool(obj: Mapping[str, Any], key: str, what: str) -> bool:
    value = obj.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidNotification(f"{what}.{key}: expected a boolean, got {value!r}")
    return value


def _json_obj(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidNotification(f"{what}: expected an object, got {type(value).__name__}")
    return value


def _parse_entry_json(value: Any, what: str) -> EntryInfo:
    entry = _json_obj(value, what)
    attrs_value = entry.get("attributes")
    attrs = _json_obj(attrs_value, f"{what}.attributes") if attrs_value is not None else {}
    aw = f"{what}.attributes"
    md5_b64 = _json_str(attrs, "md5", aw)
    md5: bytes | None = None
    if md5_b64:
        try:
            md5 = base64.b64decode(md5_b64, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InvalidNotification(f"{aw}.md5: not valid base64 ({exc})") from exc
    return EntryInfo(
        name=_json_str(entry, "name", what),
        is_directory=_json_bool(entry, "is_directory", what),
        file_size=_json_int(attrs, "file_size", aw),
        md5=md5 or None,
        mtime=_json_int(attrs, "mtime", aw),
        crtime=_json_int(attrs, "crtime", aw),
        file_mode=_json_int(attrs, "file_mode", aw),
        mime=_json_str(attrs, "mime", aw),
    )


def parse_webhook_message(message: Mapping[str, Any]) -> Notification:
    """Read the ``message`` member of a SeaweedFS webhook body. Raises :class:`InvalidNotification`."""
    what = "message"
    msg = _json_obj(message, what)
    old = msg.get("old_entry")
    new = msg.get("new_entry")
    sigs = msg.get("signatures") or []
    if not isinstance(sigs, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in sigs):
        raise InvalidNotification(f"{what}.signatures: expected a list of integers")
    return Notification(
        old_entry=_parse_entry_json(old, f"{what}.old_entry") if old is not None else None,
        new_entry=_parse_entry_json(new, f"{what}.new_entry") if new is not None else None,
        new_parent_path=_json_str(msg, "new_parent_path", what),
        delete_chunks=_json_bool(msg, "delete_chunks", what),
        is_from_other_cluster=_json_bool(msg, "is_from_other_cluster", what),
        signatures=tuple(sigs),
    )


# ------------------------------------------------------------------------------ classification


def join_path(parent: str, name: str) -> str:
    """``util.NewFullPath(dir, name)``: join without doubling the root slash."""
    if not parent:
        parent = "/"
    return parent.rstrip("/") + "/" + name if name else parent


def event_type_of(key: str, notification: Notification) -> EventType:
    """create / update / delete / rename, as ``weed/notification/webhook`` derives it."""
    old, new = notification.old_entry, notification.new_entry
    if old is None and new is None:
        raise InvalidNotification("notification has neither old_entry nor new_entry")
    if old is None:
        return "create"
    if new is None:
        return "delete"
    old_dir = posixpath.dirname(key.rstrip("/")) or "/"
    new_dir = (notification.new_parent_path or old_dir).rstrip("/") or "/"
    if new_dir != old_dir or new.name != old.name:
        return "rename"
    return "update"


def classify(key: str, notification: Notification) -> FileChange:
    """Pure classification of one notification keyed by ``key`` (old full path if any, else new).

    ``new_path`` is ``new_parent_path + "/" + new_entry.name`` for renames, else None. An update or
    rename whose ``new_parent_path`` is empty is taken to stay in the old directory.
    """
    if not key or not key.startswith("/"):
        raise InvalidNotification(f"event key must be an absolute path, got {key!r}")
    event_type = event_type_of(key, notification)
    old, new = notification.old_entry, notification.new_entry
    new_path: str | None = None
    if event_type == "rename" and new is not None:
        parent = notification.new_parent_path or (posixpath.dirname(key.rstrip("/")) or "/")
        new_path = join_path(parent, new.name)
    current = new if new is not None else old
    assert current is not None  # event_type_of rejected the empty notification
    return FileChange(
        path=key,
        event_type=event_type,
        new_path=new_path,
        size=new.file_size if new is not None else None,
        md5_hex=new.md5_hex if new is not None else None,
        is_directory=current.is_directory,
    )

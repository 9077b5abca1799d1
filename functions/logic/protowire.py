"""A tiny, dependency-free codec for the protobuf wire format.

Only what reading SeaweedFS ``filer_pb`` messages needs (the tests encode with the official
``protobuf`` runtime, so our decoder is never checked against our own encoder): the four live wire types
(varint 0, 64-bit 1, length-delimited 2, 32-bit 5). Groups (3/4) are deprecated and rejected.

Decoding returns ``{field_number: [value, ...]}`` in wire order: varints and fixed-width fields as
``int`` (unsigned, as they were on the wire), length-delimited fields as ``bytes``. Interpreting a
value (string, nested message, signed int, packed repeated) is the caller's job; the typed accessors
below do it with errors that name the field. Every failure raises :class:`ProtoDecodeError`.

Reference: https://protobuf.dev/programming-guides/encoding/
"""

from __future__ import annotations

__all__ = [
    "I32",
    "I64",
    "LEN",
    "VARINT",
    "FieldValue",
    "Fields",
    "ProtoDecodeError",
    "as_signed32",
    "as_signed64",
    "decode_message",
    "decode_packed_varints",
    "decode_varint",
    "get_bool",
    "get_bytes",
    "get_int",
    "get_string",
    "wire_type_name",
]

VARINT = 0
I64 = 1
LEN = 2
_SGROUP = 3
_EGROUP = 4
I32 = 5

_WIRE_NAMES = {
    VARINT: "varint",
    I64: "64-bit",
    LEN: "length-delimited",
    _SGROUP: "start-group",
    _EGROUP: "end-group",
    I32: "32-bit",
}
_MAX_FIELD = (1 << 29) - 1
_U64 = (1 << 64) - 1

FieldValue = int | bytes
Fields = dict[int, list[FieldValue]]


class ProtoDecodeError(ValueError):
    """The bytes are not a valid protobuf encoding of what was expected."""


def wire_type_name(wire_type: int) -> str:
    return _WIRE_NAMES.get(wire_type, f"invalid wire type {wire_type}")


# --------------------------------------------------------------------------------------- decode


def decode_varint(data: bytes, pos: int = 0, *, what: str = "varint") -> tuple[int, int]:
    """Read one base-128 varint at ``pos``; return ``(value, next_pos)``."""
    result = 0
    shift = 0
    start = pos
    end = len(data)
    while True:
        if pos >= end:
            raise ProtoDecodeError(f"{what}: truncated varint at offset {start}")
        byte = data[pos]
        pos += 1
        if shift == 63 and byte > 1:
            raise ProtoDecodeError(f"{what}: varint at offset {start} overflows 64 bits")
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ProtoDecodeError(f"{what}: varint at offset {start} is longer than 10 bytes")


def decode_message(data: bytes, *, what: str = "message") -> Fields:
    """Split one message into its fields. ``what`` names the message in error messages."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ProtoDecodeError(f"{what}: expected bytes, got {type(data).__name__}")
    buf = bytes(data)
    fields: Fields = {}
    pos = 0
    end = len(buf)
    while pos < end:
        tag_at = pos
        tag, pos = decode_varint(buf, pos, what=f"{what}: tag")
        field_number = tag >> 3
        wire_type = tag & 0x7
        if field_number == 0 or field_number > _MAX_FIELD:
            raise ProtoDecodeError(f"{what}: invalid field number {field_number} in tag at offset {tag_at}")
        label = f"{what} field {field_number}"
        value: FieldValue
        if wire_type == VARINT:
            value, pos = decode_varint(buf, pos, what=label)
        elif wire_type == I64:
            if pos + 8 > end:
                raise ProtoDecodeError(f"{label}: truncated 64-bit value at offset {pos}")
            value = int.from_bytes(buf[pos : pos + 8], "little")
            pos += 8
        elif wire_type == I32:
            if pos + 4 > end:
                raise ProtoDecodeError(f"{label}: truncated 32-bit value at offset {pos}")
            value = int.from_bytes(buf[pos : pos + 4], "little")
            pos += 4
        elif wire_type == LEN:
            length, pos = decode_varint(buf, pos, what=f"{label} length")
            if pos + length > end:
                raise ProtoDecodeError(
                    f"{label}: length-delimited value of {length} bytes at offset {pos} "
                    f"runs past the end of the data ({end - pos} bytes left)"
                )
            value = buf[pos : pos + length]
            pos += length
        else:
            raise ProtoDecodeError(
                f"{label}: unsupported {wire_type_name(wire_type)} wire type in tag at offset {tag_at}"
            )
        fields.setdefault(field_number, []).append(value)
    return fields


def decode_packed_varints(data: bytes, *, what: str = "packed field") -> list[int]:
    out: list[int] = []
    pos = 0
    while pos < len(data):
        value, pos = decode_varint(data, pos, what=what)
        out.append(value)
    return out


def as_signed64(value: int) -> int:
    """Reinterpret an unsigned 64-bit wire value as int64 (two's complement)."""
    value &= _U64
    return value - (1 << 64) if value >> 63 else value


def as_signed32(value: int) -> int:
    """Reinterpret a wire value as int32 (negative int32 varints are sign-extended to 64 bits)."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >> 31 else value


def _last(fields: Fields, number: int) -> FieldValue | None:
    values = fields.get(number)
    return values[-1] if values else None  # proto3: the last occurrence wins


def get_int(fields: Fields, number: int, *, what: str) -> int | None:
    value = _last(fields, number)
    if value is None:
        return None
    if not isinstance(value, int):
        raise ProtoDecodeError(f"{what}: expected a number, got a length-delimited value")
    return value


def get_bool(fields: Fields, number: int, *, what: str) -> bool:
    value = get_int(fields, number, what=what)
    return bool(value)


def get_bytes(fields: Fields, number: int, *, what: str) -> bytes | None:
    value = _last(fields, number)
    if value is None:
        return None
    if not isinstance(value, bytes):
        raise ProtoDecodeError(f"{what}: expected a length-delimited value, got a number")
    return value


def get_string(fields: Fields, number: int, *, what: str) -> str | None:
    raw = get_bytes(fields, number, what=what)
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtoDecodeError(f"{what}: string is not valid UTF-8 ({exc.reason})") from exc

"""JSON Schema (draft 2020-12) of a record class: `events/schemas/` and the CRD agreement test.

The layout is the one the committed schemas have had since they were first generated (then
by pydantic): nested records under `$defs` by class name, X | None as `anyOf` with a null
branch, constraints on the non-null branch, a title per property from its JSON name, the
class docstring as `description`. Keeping it means a consumer sees no change.
"""

from __future__ import annotations

import inspect
import typing
from types import NoneType, UnionType
from typing import Any, Literal

from events.records import Field, Record, RecordField, record_fields

Schema = dict[str, Any]


def json_schema(cls: type[Record]) -> Schema:
    """The schema of `cls`, validating what `cls.parse` accepts (wire names)."""
    defs: dict[str, Schema] = {}
    schema = _object(cls, defs)
    if defs:
        schema["$defs"] = defs
    return schema


def _object(cls: type[Record], defs: dict[str, Schema]) -> Schema:
    fields = record_fields(cls)
    schema: Schema = {
        "properties": {f.key: _property(f, defs) for f in fields},
        "title": cls.__name__,
        "type": "object",
        "additionalProperties": cls.extra == "allow",
    }
    required = [f.key for f in fields if f.required]
    if required:
        schema["required"] = required
    doc = cls.__dict__.get("__doc__")
    if doc:
        schema["description"] = inspect.cleandoc(doc)
    return schema


def _property(f: RecordField, defs: dict[str, Schema]) -> Schema:
    schema = _constrained(f.hint, f.spec, defs)
    if not f.required and f.spec.default_factory is None:
        schema["default"] = f.spec.default
    if "$ref" not in schema:  # a reference's title is its definition's
        schema["title"] = f.key.title().replace("_", " ").strip()
    return schema


def _constrained(hint: Any, spec: Field, defs: dict[str, Schema]) -> Schema:
    """The type's schema with the field's constraints on it (on the non-null branch)."""
    members = typing.get_args(hint) if typing.get_origin(hint) in (UnionType, typing.Union) else ()
    if NoneType in members and len(members) == 2:
        (inner,) = [m for m in members if m is not NoneType]
        return {"anyOf": [_constrained(inner, spec, defs), {"type": "null"}]}
    schema = _type(hint, defs)
    string = schema.get("type") == "string"
    array = schema.get("type") == "array"
    for value, name in (
        (spec.min_length, "minLength" if string else "minItems" if array else "minProperties"),
        (spec.max_length, "maxLength" if string else "maxItems" if array else "maxProperties"),
        (spec.pattern, "pattern"),
        (spec.ge, "minimum"),
        (spec.gt, "exclusiveMinimum"),
        (spec.le, "maximum"),
    ):
        if value is not None:
            schema[name] = value
    return schema


_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean", NoneType: "null"}


def _type(hint: Any, defs: dict[str, Schema]) -> Schema:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return {}
    if isinstance(hint, type) and issubclass(hint, Record):
        if hint.__name__ not in defs:
            defs[hint.__name__] = {}  # placed first: a record may refer to itself
            defs[hint.__name__] = _object(hint, defs)
        return {"$ref": f"#/$defs/{hint.__name__}"}
    if hint in _SCALARS:
        return {"type": _SCALARS[hint]}
    if origin is Literal:
        types = {_SCALARS[type(a)] for a in args}
        enum: Schema = {"const": args[0]} if len(args) == 1 else {"enum": list(args)}
        return {**enum, "type": types.pop()} if len(types) == 1 else enum
    if origin in (UnionType, typing.Union):
        return {"anyOf": [_type(a, defs) for a in args]}
    if origin is list:
        return {"items": _type(args[0], defs), "type": "array"}
    if origin is dict:
        values = _type(args[1], defs)
        return {"additionalProperties": values or True, "type": "object"}
    raise TypeError(f"no JSON Schema for {hint!r}")

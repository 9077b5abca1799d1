"""Typed records for JSON: what every event payload and Kubernetes resource model is declared with.

A record class declares its fields as annotations, optionally with `field(...)` for a default,
a wire name or a constraint:

    class AdapterRef(Record):
        namespace: str = field(pattern=LABEL_PATTERN, max_length=63)

`parse` validates JSON-shaped data (every problem reported at once, with its path) and builds
the record; calling the class does the same with Python names. `to_json` is the inverse, and
`json_schema` describes the class in JSON Schema (draft 2020-12), as `events/schemas/` and the
CRD agreement test need it.

Why not pydantic, which the project used first: a step's cold start (bench 4) is measured
against a bare functions-framework function, and importing pydantic and building the
validators of one step's models cost ~100 ms of CPU, more than the whole budget. This module
covers exactly the vocabulary our contracts use (str, int, float, bool, Any, Literal,
unions, X | None, list[X], dict[str, X] and nested records; length, pattern and bound
constraints) with pydantic's semantics and JSON Schema output, and costs ~2 ms to import.

Validation is strict: JSON already has types, so "1" is not an int and 1 is not a bool.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import UnionType
from typing import Any, ClassVar, Literal, NamedTuple, Self

Loc = tuple[str | int, ...]
Convert = Callable[[Any, Loc], Any]

_MISSING: Any = object()


class Invalid(ValueError):
    """Data that does not fit a record: every problem, each with the path where it is."""

    def __init__(self, problems: list[tuple[Loc, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{'.'.join(map(str, loc)) or 'data'}: {msg}" for loc, msg in problems))


class Field(NamedTuple):
    """What `field(...)` declares: a default and the constraints on a value (JSON Schema names
    in the comments). A NamedTuple, not a dataclass: it is created at every start, and a frozen
    dataclass costs ~1 ms to define (its methods are compiled with exec)."""

    default: Any = _MISSING
    default_factory: Callable[[], Any] | None = None
    alias: str | None = None
    min_length: int | None = None  # minLength (strings), minItems / minProperties otherwise
    max_length: int | None = None
    pattern: str | None = None
    ge: float | None = None  # minimum
    gt: float | None = None  # exclusiveMinimum
    le: float | None = None  # maximum


def field(
    default: Any = _MISSING,
    *,
    default_factory: Callable[[], Any] | None = None,
    alias: str | None = None,
    min_length: int | None = None,
    max_length: int | None = None,
    pattern: str | None = None,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
) -> Any:
    """A field's default, wire name and constraints (typed Any so it can stand as a default)."""
    return Field(default, default_factory, alias, min_length, max_length, pattern, ge, gt, le)


def to_camel(name: str) -> str:
    """`last_transition_time` -> `lastTransitionTime` (Kubernetes' JSON field names)."""
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


class Record:
    """Base of every record. Subclasses tune these class attributes:"""

    extra: ClassVar[Literal["forbid", "allow"]] = "forbid"
    """forbid: an unknown key is a problem; allow: kept verbatim and written back by to_json."""
    hashable: ClassVar[bool] = False
    """Usable as a set member or dict key (event payloads). Every record is immutable."""
    wire_names: ClassVar[Callable[[str], str] | None] = None
    """How a Python name becomes its JSON key when no alias is given (None: unchanged)."""
    omit_empty: ClassVar[bool] = False
    """to_json drops None always; with this, "", [] and {} too (Go's omitempty)."""
    always_emit: ClassVar[frozenset[str]] = frozenset()
    """JSON keys written even when empty (a Go field without omitempty)."""

    _extra: dict[str, Any]

    def __init__(self, **values: Any) -> None:
        _shape(type(self)).fill(self, values, ())

    @classmethod
    def parse(cls, data: Any) -> Self:
        """The record `data` describes, or Invalid naming every problem."""
        record: Self = _shape(cls).build(data, ())
        return record

    def replace(self, **changes: Any) -> Self:
        """A copy with `changes` (Python names), validated like a new record."""
        values = {f.name: getattr(self, f.name) for f in _shape(type(self)).fields}
        return type(self)(**{**self._extra, **values, **changes})

    def to_json(self) -> dict[str, Any]:
        """The JSON object: wire names, None (and with omit_empty, empty values) left out."""
        cls = type(self)
        out: dict[str, Any] = {}
        for f in _shape(cls).fields:
            value = _dump(getattr(self, f.name))
            if value is None or (cls.omit_empty and _is_empty(value) and f.key not in cls.always_emit):
                continue
            out[f.key] = value
        out.update(self._extra)
        return out

    def __setattr__(self, name: str, value: Any) -> None:
        # Records are values: a change is a new record (replace), validated like any other.
        raise AttributeError(f"{type(self).__name__} is immutable: use replace({name}=...)")

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f.name) for f in _shape(type(self)).fields)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        assert isinstance(other, Record)
        return self._values() == other._values() and self._extra == other._extra

    def __hash__(self) -> int:
        if not type(self).hashable:
            raise TypeError(f"unhashable type: {type(self).__name__!r}")
        return hash((type(self), self._values()))

    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in _shape(type(self)).fields)
        return f"{type(self).__name__}({shown})"


def _is_empty(value: Any) -> bool:
    return isinstance(value, str | list | dict) and len(value) == 0


def _dump(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_json()
    if isinstance(value, list):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    return value


# -- validation: each class's shape is built on its first use, not at import -----------------
class RecordField(NamedTuple):
    """One field of a record class, as validation and the JSON Schema see it."""

    name: str
    key: str
    convert: Convert
    spec: Field
    hint: Any

    @property
    def required(self) -> bool:
        return self.spec.default is _MISSING and self.spec.default_factory is None

    def default(self) -> Any:
        return self.spec.default_factory() if self.spec.default_factory else self.spec.default


@dataclass
class _Shape:
    cls: type[Record]
    fields: list[RecordField]

    def build(self, data: Any, loc: Loc) -> Any:
        if not isinstance(data, dict):
            raise Invalid([(loc, "Input should be an object")])
        record = self.cls.__new__(self.cls)
        self.fill(record, data, loc)
        return record

    def fill(self, record: Record, data: dict[str, Any], loc: Loc) -> None:
        problems: list[tuple[Loc, str]] = []
        values: dict[str, Any] = {}
        rest = dict(data)
        for f in self.fields:
            raw = rest.pop(f.key, _MISSING)
            if f.name != f.key:  # a Python name is accepted too (construction in code)
                by_name = rest.pop(f.name, _MISSING)
                raw = by_name if raw is _MISSING else raw
            if raw is _MISSING:
                if f.required:
                    problems.append(((*loc, f.key), "Field required"))
                else:
                    values[f.name] = f.default()
                continue
            try:
                values[f.name] = f.convert(raw, (*loc, f.key))
            except Invalid as err:
                problems.extend(err.problems)
        if rest and self.cls.extra == "forbid":
            problems.extend(((*loc, key), "Extra inputs are not permitted") for key in rest)
        if problems:
            raise Invalid(problems)
        values["_extra"] = rest
        record.__dict__.update(values)


_SHAPES: dict[type[Record], _Shape] = {}


def _shape(cls: type[Record]) -> _Shape:
    shape = _SHAPES.get(cls)
    if shape is None:
        # Built whole before it is shared, so a thread never sees a half-built shape (two
        # threads may both build one; the first stored wins). A nested record's shape is
        # looked up when a value is converted, so a record may nest itself.
        shape = _SHAPES.setdefault(cls, _Shape(cls, list(_fields_of(cls))))
    return shape


def record_fields(cls: type[Record]) -> list[RecordField]:
    """The fields of a record class in declaration order (base classes' first)."""
    return _shape(cls).fields


def _fields_of(cls: type[Record]) -> Iterable[RecordField]:
    for name, hint in typing.get_type_hints(cls).items():
        if name.startswith("_") or hint is ClassVar or typing.get_origin(hint) is ClassVar:
            continue
        declared = getattr(cls, name, _MISSING)
        spec = declared if isinstance(declared, Field) else Field(default=declared)
        key = spec.alias or (cls.wire_names(name) if cls.wire_names else name)
        yield RecordField(name, key, _converter(hint, spec), spec, hint)


def _converter(hint: Any, spec: Field) -> Convert:
    base = _type_converter(hint)
    checks = _constraint_checks(spec)
    if not checks:
        return base

    def convert(value: Any, loc: Loc) -> Any:
        value = base(value, loc)
        if value is not None:
            for check in checks:
                check(value, loc)
        return value

    return convert


def _type_converter(hint: Any) -> Convert:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return lambda value, loc: value
    if isinstance(hint, type) and issubclass(hint, Record):
        return lambda value, loc: value if isinstance(value, hint) else _shape(hint).build(value, loc)
    if hint in _SCALARS:
        return _scalar(hint)
    if origin is Literal:
        return _literal(args)
    if origin in (UnionType, typing.Union):
        return _union([_type_converter(arg) for arg in args], args)
    if origin is list:
        return _list(_type_converter(args[0]))
    if origin is dict:
        return _dict(_type_converter(args[1]))
    raise TypeError(f"records do not support the type {hint!r}")


_SCALARS: dict[Any, tuple[tuple[type, ...], str]] = {
    str: ((str,), "a valid string"),
    int: ((int,), "a valid integer"),
    float: ((int, float), "a valid number"),
    bool: ((bool,), "a valid boolean"),
    type(None): ((type(None),), "None"),
}


def _scalar(hint: type) -> Convert:
    accepted, what = _SCALARS[hint]

    def convert(value: Any, loc: Loc) -> Any:
        if isinstance(value, bool) and hint is not bool:  # bool is an int in Python, not in JSON
            raise Invalid([(loc, f"Input should be {what}")])
        if isinstance(value, accepted):
            return value
        if hint is int and isinstance(value, float) and value.is_integer():  # JSON's 1.0
            return int(value)
        raise Invalid([(loc, f"Input should be {what}")])

    return convert


def _literal(options: tuple[Any, ...]) -> Convert:
    shown = " or ".join(repr(o) for o in options)

    def convert(value: Any, loc: Loc) -> Any:
        if any(type(value) is type(o) and value == o for o in options):
            return value
        raise Invalid([(loc, f"Input should be {shown}")])

    return convert


def _union(members: list[Convert], hints: tuple[Any, ...]) -> Convert:
    def convert(value: Any, loc: Loc) -> Any:
        problems: list[tuple[Loc, str]] = []
        for member in members:
            try:
                return member(value, loc)
            except Invalid as err:
                problems.extend(err.problems)
        if value is not None and type(None) in hints:  # X | None: report X's problem alone
            problems = [p for p in problems if p[1] != "Input should be None"]
        prefix = "Input should be "
        if len(problems) > 1 and all(at == loc and msg.startswith(prefix) for at, msg in problems):
            problems = [(loc, prefix + " or ".join(msg.removeprefix(prefix) for _, msg in problems))]
        raise Invalid(problems)

    return convert


def _list(item: Convert) -> Convert:
    def convert(value: Any, loc: Loc) -> Any:
        if not isinstance(value, list):
            raise Invalid([(loc, "Input should be a valid list")])
        return _collect([(i, item, v) for i, v in enumerate(value)], loc, list)

    return convert


def _dict(item: Convert) -> Convert:
    def convert(value: Any, loc: Loc) -> Any:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise Invalid([(loc, "Input should be an object with string keys")])
        return _collect([(k, item, v) for k, v in value.items()], loc, dict)

    return convert


def _collect(members: list[tuple[Any, Convert, Any]], loc: Loc, into: type) -> Any:
    problems: list[tuple[Loc, str]] = []
    out: list[tuple[Any, Any]] = []
    for key, convert, value in members:
        try:
            out.append((key, convert(value, (*loc, key))))
        except Invalid as err:
            problems.extend(err.problems)
    if problems:
        raise Invalid(problems)
    return [v for _, v in out] if into is list else dict(out)


def _constraint_checks(spec: Field) -> list[Callable[[Any, Loc], None]]:
    checks: list[Callable[[Any, Loc], None]] = []
    if spec.min_length is not None or spec.max_length is not None:
        checks.append(_length_check(spec.min_length, spec.max_length))
    if spec.pattern is not None:
        checks.append(_pattern_check(spec.pattern))
    for bound, holds, says in (
        (spec.ge, lambda v, b: v >= b, "greater than or equal to"),
        (spec.gt, lambda v, b: v > b, "greater than"),
        (spec.le, lambda v, b: v <= b, "less than or equal to"),
    ):
        if bound is not None:
            checks.append(_bound_check(bound, holds, says))
    return checks


def _length_check(low: int | None, high: int | None) -> Callable[[Any, Loc], None]:
    def check(value: Any, loc: Loc) -> None:
        unit = "characters" if isinstance(value, str) else "items"
        if low is not None and len(value) < low:
            raise Invalid([(loc, f"Value should have at least {low} {unit}")])
        if high is not None and len(value) > high:
            raise Invalid([(loc, f"Value should have at most {high} {unit}")])

    return check


def _pattern_check(pattern: str) -> Callable[[Any, Loc], None]:
    # JSON Schema and the apiserver (Go RE2) search unanchored, and a final `$` is the end of the
    # text; Python's `$` would also match before a trailing newline, so it becomes `\Z`.
    anchored = pattern[:-1] + r"\Z" if pattern.endswith("$") and not pattern.endswith(r"\$") else pattern
    compiled = re.compile(anchored)

    def check(value: Any, loc: Loc) -> None:
        if not compiled.search(value):
            raise Invalid([(loc, f"String should match pattern '{pattern}'")])

    return check


def _bound_check(bound: float, holds: Callable[[Any, float], bool], says: str) -> Callable[[Any, Loc], None]:
    def check(value: Any, loc: Loc) -> None:
        if not holds(value, bound):
            raise Invalid([(loc, f"Input should be {says} {bound:g}")])

    return check

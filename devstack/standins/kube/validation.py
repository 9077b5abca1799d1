"""Structural-schema processing of custom resources, compiled once per CRD version.

Order mirrors apiextensions-apiserver: prune unknown fields, apply defaults, validate the
OpenAPI v3 constraints, then evaluate `x-kubernetes-validations` CEL rules (cel-python).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import celpy

from devstack.standins.kube.errors import Cause

JSON = dict[str, Any]

OBJECT_META_FIELDS = frozenset(
    {
        "name",
        "generateName",
        "namespace",
        "selfLink",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "ownerReferences",
        "finalizers",
        "managedFields",
    }
)
_MISSING = object()
_DATE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
_CEL_ENV = celpy.Environment()


@dataclass
class CelRule:
    """One compiled `x-kubernetes-validations` entry."""

    rule: str
    program: Any
    message: str
    message_program: Any
    field_path: str
    reason: str
    transition: bool


@dataclass
class Schema:
    """A compiled structural schema node."""

    type: str = ""
    properties: dict[str, Schema] = field(default_factory=dict)
    additional: Schema | None = None
    additional_allowed: bool = False
    items: Schema | None = None
    required: tuple[str, ...] = ()
    enum: tuple[Any, ...] | None = None
    pattern: re.Pattern[str] | None = None
    limits: dict[str, float] = field(default_factory=dict)
    nullable: bool = False
    int_or_string: bool = False
    preserve_unknown: bool = False
    embedded: bool = False
    format: str = ""
    default: Any = _MISSING
    list_type: str = ""
    list_map_keys: tuple[str, ...] = ()
    any_of: tuple[Schema, ...] = ()
    rules: tuple[CelRule, ...] = ()
    # derived once at compile time (hot-path shortcuts; they never change a result)
    rules_below: bool = False
    """This node or a descendant carries CEL rules (else `_walk_rules` need not descend)."""
    defaults_below: bool = False
    """A descendant property has a `default` (else `apply_defaults` need not descend)."""
    plain: str = ""
    """For a scalar node whose only constraint is its type ("string", "integer", "number",
    "boolean"): that type; a value of exactly that Python type validates and prunes to nothing."""


_LIMIT_KEYS = (
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "multipleOf",
)


def _compile_rule(doc: JSON) -> CelRule:
    rule = doc["rule"]
    program = _CEL_ENV.program(_CEL_ENV.compile(rule))
    expression = doc.get("messageExpression")
    message_program = _CEL_ENV.program(_CEL_ENV.compile(expression)) if expression else None
    return CelRule(
        rule,
        program,
        doc.get("message", ""),
        message_program,
        doc.get("fieldPath", ""),
        doc.get("reason", "FieldValueInvalid"),
        "oldSelf" in rule,
    )


def compile_schema(doc: JSON) -> Schema:
    """Compile an openAPIV3Schema document (regexes and CEL programs compiled here, once)."""
    return _derive(_compile(doc))


_PLAIN_TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,)}
_PLAIN_FORMATS = ("", "int32", "int64", "float", "double", "byte")


def _derive(schema: Schema) -> Schema:
    children = [*schema.properties.values(), *schema.any_of]
    children += [c for c in (schema.additional, schema.items) if c is not None]
    schema.rules_below = bool(schema.rules) or any(c.rules_below for c in children)
    schema.defaults_below = any(
        c.default is not _MISSING or c.defaults_below
        for c in [*schema.properties.values(), *(c for c in (schema.additional, schema.items) if c)]
    )
    if (
        schema.type in _PLAIN_TYPES
        and schema.format in _PLAIN_FORMATS
        and not (schema.properties or schema.additional or schema.items or schema.any_of)
        and schema.enum is None
        and schema.pattern is None
        and not schema.limits
        and not schema.int_or_string
        and not schema.rules
    ):
        schema.plain = schema.type
    return schema


def _plain_ok(value: Any, schema: Schema) -> bool:
    """`value` certainly validates (and prunes, defaults) to nothing under `schema`."""
    if not schema.plain:
        return False
    kind = type(value)
    if schema.plain == "string":
        return kind is str
    if schema.plain == "boolean":
        return kind is bool
    if schema.plain == "integer":
        return kind is int
    return kind is int or kind is float


def _compile(doc: JSON) -> Schema:
    additional = doc.get("additionalProperties")
    return Schema(
        type=doc.get("type", ""),
        properties={k: compile_schema(v) for k, v in (doc.get("properties") or {}).items()},
        additional=compile_schema(additional) if isinstance(additional, dict) else None,
        additional_allowed=additional is True,
        items=compile_schema(doc["items"]) if isinstance(doc.get("items"), dict) else None,
        required=tuple(doc.get("required") or ()),
        enum=tuple(doc["enum"]) if "enum" in doc else None,
        pattern=re.compile(doc["pattern"]) if "pattern" in doc else None,
        limits={k: doc[k] for k in _LIMIT_KEYS if k in doc},
        nullable=bool(doc.get("nullable")),
        int_or_string=bool(doc.get("x-kubernetes-int-or-string")),
        preserve_unknown=bool(doc.get("x-kubernetes-preserve-unknown-fields")),
        embedded=bool(doc.get("x-kubernetes-embedded-resource")),
        format=doc.get("format", ""),
        default=copy.deepcopy(doc["default"]) if "default" in doc else _MISSING,
        list_type=doc.get("x-kubernetes-list-type", ""),
        list_map_keys=tuple(doc.get("x-kubernetes-list-map-keys") or ()),
        any_of=tuple(compile_schema(s) for s in doc.get("anyOf") or ()),
        rules=tuple(_compile_rule(r) for r in doc.get("x-kubernetes-validations") or ()),
    )


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


# ---------------------------------------------------------------- pruning and defaulting


def prune(value: Any, schema: Schema, path: str = "", root: bool = True) -> list[str]:
    """apiextensions pruning: drop fields not in the schema (unless preserve-unknown-fields)
    and nulls of non-nullable fields (CRD docs, "Defaulting and Nullable"). Returns the paths."""
    pruned: list[str] = []
    if isinstance(value, dict):
        _prune_object(value, schema, path, root or schema.embedded, pruned)
    elif isinstance(value, list) and schema.items is not None:
        for index, item in enumerate(value):
            pruned += prune(item, schema.items, f"{path}[{index}]", False)
    return pruned


def _prune_object(value: JSON, schema: Schema, path: str, meta: bool, pruned: list[str]) -> None:
    for key in list(value):
        child = schema.properties.get(key) or schema.additional
        if child is not None and not meta and _plain_ok(value[key], child):
            continue  # a plain scalar: nothing to prune below it
        child_path = _join(path, key)
        if meta and key in ("apiVersion", "kind"):
            continue
        if meta and key == "metadata" and isinstance(value[key], dict):
            for meta_key in [k for k in value[key] if k not in OBJECT_META_FIELDS]:
                pruned.append(f"{child_path}.{meta_key}")
                del value[key][meta_key]
            continue
        if child is None:
            if not (schema.preserve_unknown or schema.additional_allowed):
                pruned.append(child_path)
                del value[key]
            continue
        if value[key] is None and not child.nullable:
            del value[key]
            continue
        if isinstance(value[key], dict | list):
            pruned += prune(value[key], child, child_path, False)


def apply_defaults(value: Any, schema: Schema) -> None:
    """apiextensions defaulting: `default:` values set for missing properties, recursively."""
    if not schema.defaults_below:
        return  # no `default` anywhere below: nothing to set
    if isinstance(value, dict):
        for key, child in schema.properties.items():
            if key not in value and child.default is not _MISSING:
                value[key] = copy.deepcopy(child.default)
            if key in value:
                apply_defaults(value[key], child)
        if schema.additional is not None:
            for key in value.keys() - schema.properties.keys():
                apply_defaults(value[key], schema.additional)
    elif isinstance(value, list) and schema.items is not None:
        for item in value:
            apply_defaults(item, schema.items)


# ---------------------------------------------------------------- OpenAPI validation


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _render(value: Any) -> str:
    """Go's `%#v`-ish rendering used by field.Invalid for scalar values."""
    if isinstance(value, str | bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(_type_name(value))


def _invalid(path: str, value: Any, detail: str) -> Cause:
    return Cause("FieldValueInvalid", f"Invalid value: {_render(value)}: {detail}", path)


def _type_ok(value: Any, schema: Schema) -> bool:
    actual = _type_name(value)
    if schema.int_or_string:
        return actual in ("integer", "string")
    if not schema.type or actual == schema.type:
        return True
    return schema.type == "number" and actual == "integer"


def validate(value: Any, schema: Schema, path: str = "") -> list[Cause]:
    """kube-openapi validation of one value; causes carry apiserver-style messages."""
    if value is None:
        if schema.nullable:
            return []
        return [_invalid(path, "null", f'{path} in body must be of type {schema.type or "object"}: "null"')]
    if not _type_ok(value, schema):
        actual = _type_name(value)
        return [
            Cause(
                "FieldValueInvalid",
                f'Invalid value: "{actual}": {path} in body must be of type {schema.type}: "{actual}"',
                path,
            )
        ]
    causes = _validate_scalar(value, schema, path)
    if isinstance(value, dict):
        causes += _validate_object(value, schema, path)
    elif isinstance(value, list):
        causes += _validate_array(value, schema, path)
    if (
        schema.any_of
        and not schema.int_or_string
        and not any(not validate(value, option, path) for option in schema.any_of)
    ):
        causes.append(_invalid(path, value, f"{path} in body must match at least one schema in anyOf"))
    return causes


def _validate_scalar(value: Any, schema: Schema, path: str) -> list[Cause]:
    causes: list[Cause] = []
    if schema.enum is not None and value not in schema.enum:
        supported = ", ".join(json.dumps(v) for v in schema.enum)
        causes.append(
            Cause(
                "FieldValueNotSupported",
                f"Unsupported value: {_render(value)}: supported values: {supported}",
                path,
            )
        )
    if isinstance(value, str):
        causes += _validate_string(value, schema, path)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        causes += _validate_number(value, schema, path)
    return causes


def _validate_string(value: str, schema: Schema, path: str) -> list[Cause]:
    causes = []
    limits = schema.limits
    if "minLength" in limits and len(value) < limits["minLength"]:
        causes.append(
            _invalid(path, value, f"{path} in body should be at least {int(limits['minLength'])} chars long")
        )
    if "maxLength" in limits and len(value) > limits["maxLength"]:
        causes.append(
            Cause(
                "FieldValueTooLong", f"Too long: may not be more than {int(limits['maxLength'])} bytes", path
            )
        )
    if schema.pattern is not None and not schema.pattern.search(value):
        causes.append(_invalid(path, value, f"{path} in body should match '{schema.pattern.pattern}'"))
    if schema.format == "date-time" and not _DATE_TIME.match(value):
        causes.append(_invalid(path, value, f"{path} in body must be of type date-time: {json.dumps(value)}"))
    return causes


def _validate_number(value: float, schema: Schema, path: str) -> list[Cause]:
    causes = []
    limits = schema.limits
    if "minimum" in limits and value < limits["minimum"]:
        causes.append(
            _invalid(
                path, value, f"{path} in body should be greater than or equal to {_render(limits['minimum'])}"
            )
        )
    if "maximum" in limits and value > limits["maximum"]:
        causes.append(
            _invalid(
                path, value, f"{path} in body should be less than or equal to {_render(limits['maximum'])}"
            )
        )
    if "multipleOf" in limits and value % limits["multipleOf"]:
        causes.append(
            _invalid(path, value, f"{path} in body should be a multiple of {_render(limits['multipleOf'])}")
        )
    return causes


def _validate_object(value: JSON, schema: Schema, path: str) -> list[Cause]:
    causes = [
        Cause("FieldValueRequired", "Required value", _join(path, key))
        for key in schema.required
        if key not in value
    ]
    for key, item in value.items():
        child = schema.properties.get(key) or schema.additional
        if child is not None and not _plain_ok(item, child):
            causes += validate(item, child, _join(path, key))
    limits = schema.limits
    if "minProperties" in limits and len(value) < limits["minProperties"]:
        causes.append(
            _invalid(
                path, value, f"{path} in body should have at least {int(limits['minProperties'])} properties"
            )
        )
    if "maxProperties" in limits and len(value) > limits["maxProperties"]:
        causes.append(
            Cause(
                "FieldValueTooMany",
                f"Too many: {len(value)}: must have at most {int(limits['maxProperties'])} items",
                path,
            )
        )
    return causes


def _validate_array(value: list[Any], schema: Schema, path: str) -> list[Cause]:
    causes: list[Cause] = []
    if schema.items is not None:
        items = schema.items
        for index, item in enumerate(value):
            if not _plain_ok(item, items):
                causes += validate(item, items, f"{path}[{index}]")
    limits = schema.limits
    if "minItems" in limits and len(value) < limits["minItems"]:
        causes.append(
            _invalid(path, value, f"{path} in body should have at least {int(limits['minItems'])} items")
        )
    if "maxItems" in limits and len(value) > limits["maxItems"]:
        causes.append(
            Cause(
                "FieldValueTooMany",
                f"Too many: {len(value)}: must have at most {int(limits['maxItems'])} items",
                path,
            )
        )
    return causes + _list_uniqueness(value, schema, path)


def _list_uniqueness(value: list[Any], schema: Schema, path: str) -> list[Cause]:
    """apiextensions: x-kubernetes-list-type set/map items must be unique (by list-map-keys)."""
    if schema.list_type not in ("set", "map"):
        return []
    seen: set[str] = set()
    causes = []
    for index, item in enumerate(value):
        keyed = schema.list_type == "map" and isinstance(item, dict)
        key_obj = {k: item.get(k) for k in schema.list_map_keys} if keyed else item
        # JSON text, not the values: 1, 1.0 and true are one Python key but three JSON values
        key = json.dumps(key_obj, sort_keys=True)
        if key in seen:  # the message only for a duplicate: a status write checks every item
            shown = _go_map(key_obj) if keyed else _render(item)
            causes.append(Cause("FieldValueDuplicate", f"Duplicate value: {shown}", f"{path}[{index}]"))
        seen.add(key)
    return causes


def _go_map(value: JSON) -> str:
    inner = ", ".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in value.items())
    return f"map[string]interface {{}}{{{inner}}}"


# ---------------------------------------------------------------- CEL rules


def _walk_rules(
    value: Any, old: Any, schema: Schema, path: str
) -> Iterator[tuple[CelRule, Any, Any, str, Schema]]:
    for rule in schema.rules:
        yield rule, value, old, path, schema
    if isinstance(value, dict):
        old_map = old if isinstance(old, dict) else {}
        for key, item in value.items():
            child = schema.properties.get(key) or schema.additional
            if child is not None and item is not None and child.rules_below:
                yield from _walk_rules(item, old_map.get(key), child, _join(path, key))
    elif isinstance(value, list) and schema.items is not None and schema.items.rules_below:
        for index, item in enumerate(value):
            yield from _walk_rules(item, None, schema.items, f"{path}[{index}]")


def _cel_value(value: Any) -> Any:
    return celpy.json_to_cel(value)  # type: ignore[attr-defined]


def evaluate_rules(value: Any, old: Any, schema: Schema) -> list[Cause]:
    """apiextensions CEL validation: each failed rule -> FieldValueInvalid (or its reason)
    with `Invalid value: "<type>": <message>`; transition rules only run on updates, and
    unchanged values are not re-validated (CRD validation ratcheting, KEP-4008)."""
    causes = []
    for rule, node, old_node, path, node_schema in _walk_rules(value, old, schema, ""):
        if rule.transition and old_node is None:
            continue
        if not rule.transition and old_node is not None and old_node == node:
            continue
        if _passes(rule, node, old_node):
            continue
        field_path = path + rule.field_path if rule.field_path else path
        message = _message(rule, _activation(rule, node, old_node))
        type_name = node_schema.type or _type_name(node)
        causes.append(Cause(rule.reason, f'Invalid value: "{type_name}": {message}', field_path))
    return causes


_VERDICTS: dict[tuple[str, str], bool] = {}
_VERDICTS_MAX = 4096


def _activation(rule: CelRule, node: Any, old_node: Any) -> dict[str, Any]:
    activation = {"self": _cel_value(node)}
    if rule.transition:
        activation["oldSelf"] = _cel_value(old_node)
    return activation


def _passes(rule: CelRule, node: Any, old_node: Any) -> bool:
    """Evaluate a rule; verdicts of rules on `self` alone are memoised (CEL is pure)."""
    key = None if rule.transition else (rule.rule, json.dumps(node, sort_keys=True))
    if key is not None and key in _VERDICTS:
        return _VERDICTS[key]
    try:
        verdict = bool(rule.program.evaluate(_activation(rule, node, old_node)))
    except Exception:  # celpy raises evaluation errors as a variety of types
        verdict = False
    if key is not None:
        if len(_VERDICTS) >= _VERDICTS_MAX:
            _VERDICTS.clear()
        _VERDICTS[key] = verdict
    return verdict


def _message(rule: CelRule, activation: dict[str, Any]) -> str:
    if rule.message_program is not None:
        try:
            return str(rule.message_program.evaluate(activation))
        except Exception:  # fall back to the static message, as the apiserver does
            pass
    return rule.message or f"failed rule: {rule.rule}"


# ---------------------------------------------------------------- entry point


def process(obj: JSON, schema: Schema, old: JSON | None) -> tuple[list[str], list[Cause]]:
    """Prune, default and validate obj in place; returns (pruned paths, causes)."""
    pruned = prune(obj, schema)
    apply_defaults(obj, schema)
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    body_schema = _derive(
        Schema(
            type="object",
            properties={
                k: v for k, v in schema.properties.items() if k not in ("apiVersion", "kind", "metadata")
            },
            required=tuple(r for r in schema.required if r != "metadata"),
            rules=schema.rules,
            preserve_unknown=schema.preserve_unknown,
        )
    )
    causes = validate(body, body_schema)
    if not causes:
        old_body = None if old is None else {k: v for k, v in old.items() if k != "metadata"}
        causes = evaluate_rules(body, old_body, body_schema)
    return pruned, causes

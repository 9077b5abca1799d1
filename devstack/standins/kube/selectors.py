"""Label and field selectors, parsed once per request (apimachinery labels/fields packages)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from devstack.standins.kube.errors import ApiError, bad_request

JSON = dict[str, Any]
Predicate = Callable[[JSON], bool]

_SET_EXPR = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*(?:(notin|in)\s*\(([^)]*)\))?\s*$")
_EQ_EXPR = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|=|!=)\s*([A-Za-z0-9_.-]*)\s*$")


def _split_requirements(text: str) -> list[str]:
    """Split on commas outside parentheses (`a in (x,y),b` -> two requirements)."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [part for part in parts if part.strip()]


def _label_requirement(text: str) -> Predicate:
    equality = _EQ_EXPR.match(text)
    if equality:
        key, op, value = equality.groups()
        if op == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    match = _SET_EXPR.match(text)
    if not match:
        raise bad_request(f"unable to parse requirement: {text!r}")
    negate, key, op, values_text = match.groups()
    if op is None:
        return (lambda labels: key not in labels) if negate else (lambda labels: key in labels)
    values = {v.strip() for v in values_text.split(",") if v.strip()}
    if op == "in":
        return lambda labels: labels.get(key) in values
    return lambda labels: labels.get(key) not in values


def label_selector(text: str | None) -> Predicate:
    """labels.Parse: `=`, `==`, `!=`, `in`, `notin`, `key`, `!key`, comma = AND."""
    if not text:
        return lambda _obj: True
    requirements = [_label_requirement(part) for part in _split_requirements(text)]

    def matches(obj: JSON) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(requirement(labels) for requirement in requirements)

    return matches


def field_value(obj: JSON, path: str) -> str:
    """A field selector value: nested lookup of a dotted path rendered as a string."""
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _field_requirement(text: str, allowed: Callable[[str], bool]) -> Predicate:
    match = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*?)\s*$", text)
    if not match:
        raise bad_request(f"invalid selector: '{text}'; can't understand '{text}'")
    path, op, value = match.groups()
    if not allowed(path):
        raise ApiError(
            400,
            "BadRequest",
            f'"{path}" is not a known field selector: only "metadata.name", "metadata.namespace"',
        )
    if op == "!=":
        return lambda obj: field_value(obj, path) != value
    return lambda obj: field_value(obj, path) == value


def field_selector(text: str | None, allowed: Callable[[str], bool]) -> Predicate:
    """fields.ParseSelector: comma-separated `path=value`, `path==value`, `path!=value`."""
    if not text:
        return lambda _obj: True
    requirements = [_field_requirement(part, allowed) for part in text.split(",") if part.strip()]
    return lambda obj: all(requirement(obj) for requirement in requirements)


POD_FIELDS = frozenset(
    {
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    }
)
NAMESPACE_FIELDS = frozenset({"status.phase"})


def allowed_fields(group: str, plural: str) -> Callable[[str], bool]:
    """Field selectors each resource supports (metadata.name/namespace everywhere, as for CRs;
    Pods add status.phase, spec.nodeName...; Events allow their involvedObject/reason fields)."""

    def allowed(path: str) -> bool:
        if path in ("metadata.name", "metadata.namespace"):
            return True
        if group == "" and plural == "pods":
            return path in POD_FIELDS
        if group == "" and plural == "namespaces":
            return path in NAMESPACE_FIELDS
        if group == "" and plural == "events":
            return path.startswith(("involvedObject.", "reason", "type", "source", "reportingComponent"))
        return False

    return allowed

"""`meta.k8s.io/v1` Table rendering (server-side printing for `kubectl get`)."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from devstack.standins.kube.resources import PrinterColumn, ResourceType

JSON = dict[str, Any]
TABLE_MEDIA = "application/json;as=Table;v=v1;g=meta.k8s.io"
NAME_DESCRIPTION = (
    "Name must be unique within a namespace. Is required when creating resources, "
    "although some resources may allow a client to request the generation of an "
    "appropriate name automatically."
)
_TOKEN = re.compile(
    r"\.([A-Za-z0-9_-]+)|\[(\d+|\*)\]"
    r"|\[\?\(@\.([A-Za-z0-9_.-]+)\s*==\s*[\"']([^\"']*)[\"']\)\]"
)


def wants_table(accept: str | None) -> bool:
    """The client asks for server-side printing (`as=Table;v=v1;g=meta.k8s.io`)."""
    return bool(accept) and "as=Table" in str(accept) and "g=meta.k8s.io" in str(accept)


def jsonpath(obj: Any, path: str) -> list[Any]:
    """A JSONPath subset for printer columns: `.a.b`, `[0]`, `[*]`, `[?(@.type=="Ready")]`."""
    nodes = [obj]
    for field, index, filter_key, filter_value in _TOKEN.findall(path.strip().strip("{}")):
        nodes = [n for node in nodes for n in _step(node, field, index, filter_key, filter_value)]
    return nodes


def _step(node: Any, field: str, index: str, filter_key: str, filter_value: str) -> list[Any]:
    if field:
        return [node[field]] if isinstance(node, dict) and field in node else []
    if not isinstance(node, list):
        return []
    if index == "*":
        return list(node)
    if index:
        return [node[int(index)]] if int(index) < len(node) else []
    return [item for item in node if _filter_matches(item, filter_key, filter_value)]


def _filter_matches(item: Any, key: str, value: str) -> bool:
    found = jsonpath(item, "." + key)
    return bool(found) and str(found[0]) == value


def human_duration(seconds: float) -> str:
    """apimachinery duration.HumanDuration (what `kubectl get` shows as AGE)."""
    s = int(seconds)
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    return f"{hours // (24 * 365)}y"


def age(timestamp: Any) -> str:
    if not isinstance(timestamp, str):
        return "<unknown>"
    try:
        then = datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return "<unknown>"
    return human_duration((datetime.now(UTC) - then).total_seconds())


def _column(
    name: str, type_: str = "string", description: str = "", priority: int = 0, format_: str = ""
) -> JSON:
    return {"name": name, "type": type_, "format": format_, "description": description, "priority": priority}


def _printer_cell(obj: JSON, column: PrinterColumn) -> Any:
    """CRD tableconvertor: first JSONPath result; dates rendered as a human duration."""
    values = jsonpath(obj, column.json_path)
    if not values:
        return None
    value = values[0]
    if column.type == "date":
        return age(value)
    if column.type in ("integer", "number", "boolean") or isinstance(value, str):
        return value
    return str(value)


def _pod_cells(pod: JSON) -> list[Any]:
    status = pod.get("status") or {}
    containers = (pod.get("spec") or {}).get("containers") or []
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for s in statuses if s.get("ready"))
    restarts = sum(int(s.get("restartCount", 0)) for s in statuses)
    phase = status.get("reason") or status.get("phase") or "Unknown"
    if pod["metadata"].get("deletionTimestamp"):
        phase = "Terminating"
    return [
        pod["metadata"]["name"],
        f"{ready}/{len(containers)}",
        phase,
        restarts,
        age(pod["metadata"].get("creationTimestamp")),
        status.get("podIP") or "<none>",
        (pod.get("spec") or {}).get("nodeName") or "<none>",
    ]


POD_COLUMNS = [
    _column("Name", format_="name", description=NAME_DESCRIPTION),
    _column("Ready"),
    _column("Status"),
    _column("Restarts", "string"),
    _column("Age"),
    _column("IP", priority=1),
    _column("Node", priority=1),
]


def _event_cells(event: JSON) -> list[Any]:
    involved = event.get("involvedObject") or {}
    last = event.get("lastTimestamp") or event.get("eventTime") or event["metadata"].get("creationTimestamp")
    return [
        age(last),
        event.get("type", ""),
        event.get("reason", ""),
        f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}",
        event.get("message", ""),
    ]


EVENT_COLUMNS = [
    _column("Last Seen"),
    _column("Type"),
    _column("Reason"),
    _column("Object"),
    _column("Message"),
]


def _layout(rtype: ResourceType) -> tuple[list[JSON], Callable[[JSON], list[Any]]]:
    if rtype.builtin and rtype.plural == "pods":
        return POD_COLUMNS, _pod_cells
    if rtype.builtin and rtype.plural == "events":
        return EVENT_COLUMNS, _event_cells
    if rtype.builtin and rtype.plural == "namespaces":
        return (
            [
                _column("Name", format_="name", description=NAME_DESCRIPTION),
                _column("Status"),
                _column("Age"),
            ],
            lambda ns: [
                ns["metadata"]["name"],
                (ns.get("status") or {}).get("phase", ""),
                age(ns["metadata"].get("creationTimestamp")),
            ],
        )
    columns = list(rtype.printer_columns)
    if rtype.builtin:
        columns = [PrinterColumn("Age", "date", ".metadata.creationTimestamp")]
    definitions = [_column("Name", format_="name", description=NAME_DESCRIPTION)] + [
        _column(c.name, c.type, c.description, c.priority, c.format) for c in columns
    ]
    return definitions, lambda obj: [obj["metadata"]["name"], *(_printer_cell(obj, c) for c in columns)]


def _row_object(obj: JSON, include: str) -> JSON | None:
    if include == "None":
        return None
    if include == "Object":
        return obj
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}


def table(
    rtype: ResourceType, objects: list[JSON], list_meta: JSON, include: str, with_columns: bool = True
) -> JSON:
    """A Table of objects; watch events carry Tables without columnDefinitions after the first."""
    definitions, cells = _layout(rtype)
    rows = [{"cells": cells(obj), "object": _row_object(obj, include)} for obj in objects]
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": definitions if with_columns else [],
        "rows": rows,
    }

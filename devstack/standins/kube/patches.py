"""Patch application: JSON merge patch, JSON patch, strategic merge patch and (simple) apply."""

from __future__ import annotations

import copy
from typing import Any

from devstack.standins.kube.errors import ApiError, bad_request
from devstack.standins.kube.validation import Schema

JSON = dict[str, Any]

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"
APPLY_CBOR = "application/apply-patch+cbor"

# Pod API patchMergeKey tags (k8s.io/api/core/v1/types.go) for the strategic merge subset.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "ports": "containerPort",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "conditions": "type",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "ownerReferences": "uid",
    "podIPs": "ip",
    "resourceClaims": "name",
    "topologySpreadConstraints": "topologyKey",
}
PRIMITIVE_MERGE = frozenset({"finalizers"})


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merged, null deletes, arrays replaced wholesale."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# ---------------------------------------------------------------- RFC 6902


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request(f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _container(doc: Any, parts: list[str]) -> Any:
    node = doc
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def _get(doc: Any, parts: list[str]) -> Any:
    node = doc
    for part in parts:
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def _add(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    parent = _container(doc, parts)
    last = parts[-1]
    if isinstance(parent, list):
        index = len(parent) if last == "-" else int(last)
        if index > len(parent):
            raise IndexError(last)
        parent.insert(index, value)
    else:
        parent[last] = value
    return doc


def _remove(doc: Any, parts: list[str]) -> Any:
    parent = _container(doc, parts)
    if isinstance(parent, list):
        del parent[int(parts[-1])]
    else:
        del parent[parts[-1]]
    return doc


def _json_patch_op(doc: Any, op: JSON) -> Any:
    kind, parts = op.get("op"), _pointer(op.get("path", ""))
    if kind == "add":
        return _add(doc, parts, copy.deepcopy(op["value"]))
    if kind == "remove":
        return _remove(doc, parts)
    if kind == "replace":
        _get(doc, parts)
        return _add(_remove(doc, parts), parts, copy.deepcopy(op["value"])) if parts else op["value"]
    if kind in ("move", "copy"):
        source = _pointer(op["from"])
        value = copy.deepcopy(_get(doc, source))
        if kind == "move":
            doc = _remove(doc, source)
        return _add(doc, parts, value)
    if kind == "test":
        if _get(doc, parts) != op.get("value"):
            raise ValueError(f"testing value {op.get('path')} failed")
        return doc
    raise bad_request(f"Unexpected kind: {kind}")


def json_patch(target: JSON, operations: Any) -> JSON:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test). A failed op -> 422,
    as apiserver's applyJSPatch reports errors (`the server rejected our request ...`)."""
    if not isinstance(operations, list):
        raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc: Any = copy.deepcopy(target)
    for op in operations:
        try:
            doc = _json_patch_op(doc, op)
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise ApiError(
                422, "Invalid", f"the server rejected our request due to an error in our request: {exc}"
            ) from exc
    if not isinstance(doc, dict):
        raise bad_request("patched document is not an object")
    return doc


# ---------------------------------------------------------------- strategic merge (Pods)


def _strip_directives(patch: JSON) -> tuple[JSON, dict[str, list[Any]]]:
    deletions: dict[str, list[Any]] = {}
    clean: JSON = {}
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            deletions[key.split("/", 1)[1]] = list(value or [])
        elif not key.startswith(("$setElementOrder/", "$retainKeys")):
            clean[key] = value
    return clean, deletions


def _merge_list(key: str, current: list[Any], patch: list[Any]) -> list[Any]:
    merge_key = MERGE_KEYS.get(key)
    if key in PRIMITIVE_MERGE:
        return current + [item for item in patch if item not in current]
    if merge_key is None:
        return copy.deepcopy(patch)
    result = [copy.deepcopy(item) for item in current]
    for item in patch:
        if not isinstance(item, dict):
            continue
        directive = item.get("$patch")
        index = next(
            (
                i
                for i, e in enumerate(result)
                if isinstance(e, dict) and e.get(merge_key) == item.get(merge_key)
            ),
            None,
        )
        if directive == "delete":
            if index is not None:
                del result[index]
        elif index is None:
            result.append({k: v for k, v in item.items() if k != "$patch"})
        else:
            result[index] = strategic_merge(result[index], item)
    return result


def strategic_merge(target: Any, patch: Any) -> Any:
    """A strategic-merge-patch subset for Pods: lists with a patchMergeKey (containers and env
    by name, ports by containerPort, conditions by type) merged item-wise, `$patch: delete`,
    `$deleteFromPrimitiveList/finalizers`, `$setElementOrder` accepted and ignored."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: v for k, v in patch.items() if k != "$patch"}
    clean, deletions = _strip_directives(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in clean.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _merge_list(key, result[key], value)
        else:
            result[key] = strategic_merge(result.get(key), value)
    for key, removed in deletions.items():
        result[key] = [item for item in result.get(key) or [] if item not in removed]
    return result


# ---------------------------------------------------------------- server-side apply (simple)


def apply_merge(target: Any, applied: Any, schema: Schema | None) -> Any:
    """Server-side apply, simplified: the applied configuration is merged into the live object;
    `x-kubernetes-list-type: map` lists merge by their list-map-keys, other lists are atomic.
    No ownership tracking (every apply behaves as `force=true`)."""
    if not isinstance(applied, dict):
        return copy.deepcopy(applied)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in applied.items():
        child = _child_schema(schema, key)
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and child is not None and child.list_type == "map":
            result[key] = _apply_map_list(result.get(key) or [], value, child)
        else:
            result[key] = apply_merge(result.get(key), value, child)
    return result


def _child_schema(schema: Schema | None, key: str) -> Schema | None:
    if schema is None:
        return None
    return schema.properties.get(key) or schema.additional


def _apply_map_list(current: list[Any], applied: list[Any], schema: Schema) -> list[Any]:
    keys = schema.list_map_keys
    result = [copy.deepcopy(item) for item in current]
    for item in applied:
        match = next(
            (
                i
                for i, e in enumerate(result)
                if isinstance(e, dict)
                and isinstance(item, dict)
                and all(e.get(k) == item.get(k) for k in keys)
            ),
            None,
        )
        if match is None:
            result.append(copy.deepcopy(item))
        else:
            result[match] = apply_merge(result[match], item, schema.items)
    return result

"""Discovery documents (/version, /api, /apis...) and a minimal OpenAPI v3 for kubectl."""

from __future__ import annotations

from typing import Any

from devstack.standins.kube.resources import Registry, ResourceType

JSON = dict[str, Any]

VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0-loraflow-devstack",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.23",
    "compiler": "gc",
    "platform": "linux/amd64",
}


def api_versions(address: str) -> JSON:
    """GET /api: APIVersions (core group only serves v1)."""
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}],
    }


def _group(name: str, versions: list[str]) -> JSON:
    entries = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": entries, "preferredVersion": entries[0]}


def api_group_list(registry: Registry) -> JSON:
    """GET /apis: APIGroupList of every served group."""
    groups = [_group(name, versions) for name, versions in registry.groups().items()]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def api_group(registry: Registry, name: str) -> JSON | None:
    versions = registry.groups().get(name)
    if not versions:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(name, versions)}


def _resource_entries(rtype: ResourceType) -> list[JSON]:
    main: JSON = {
        "name": rtype.plural,
        "singularName": rtype.singular,
        "namespaced": rtype.namespaced,
        "kind": rtype.kind,
        "verbs": list(rtype.verbs),
    }
    if rtype.short_names:
        main["shortNames"] = list(rtype.short_names)
    if rtype.categories:
        main["categories"] = list(rtype.categories)
    entries = [main]
    if rtype.status_subresource:
        entries.append(
            {
                "name": f"{rtype.plural}/status",
                "singularName": "",
                "namespaced": rtype.namespaced,
                "kind": rtype.kind,
                "verbs": ["get", "patch", "update"],
            }
        )
    return entries


def api_resource_list(registry: Registry, group: str, version: str) -> JSON | None:
    """GET /api/v1 or /apis/<g>/<v>: APIResourceList with subresources like `x/status`."""
    types = registry.in_group_version(group, version)
    if not types:
        return None
    resources = [entry for rtype in types for entry in _resource_entries(rtype)]
    group_version = f"{group}/{version}" if group else version
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }


def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def openapi_v3_root(registry: Registry) -> JSON:
    """GET /openapi/v3: one entry per group-version (kube-openapi handler3 layout)."""
    pairs = {(t.group, t.version) for t in registry.types}
    return {
        "paths": {
            _gv_path(g, v): {"serverRelativeURL": f"/openapi/v3/{_gv_path(g, v)}?hash=loraflow"}
            for g, v in sorted(pairs)
        }
    }


_FIELD_VALIDATION = {
    "name": "fieldValidation",
    "in": "query",
    "schema": {"type": "string"},
    "description": "fieldValidation instructs the server on how to handle "
    "objects in the request containing unknown or duplicate fields.",
}


def _patch_operation(rtype: ResourceType) -> JSON:
    gvk = {"group": rtype.group, "version": rtype.version, "kind": rtype.kind}
    content = ["application/json-patch+json", "application/merge-patch+json", "application/apply-patch+yaml"]
    return {
        "operationId": f"patch{rtype.kind}",
        "parameters": [_FIELD_VALIDATION],
        "requestBody": {"content": {c: {"schema": {"type": "object"}} for c in content}},
        "responses": {"200": {"description": "OK"}},
        "x-kubernetes-action": "patch",
        "x-kubernetes-group-version-kind": gvk,
    }


def openapi_v3_group_version(registry: Registry, group: str, version: str) -> JSON | None:
    """GET /openapi/v3/apis/<g>/<v>: PATCH operations advertising `fieldValidation`, so kubectl
    uses server-side field validation (QueryParamVerifierV3), and not strategic merge."""
    types = registry.in_group_version(group, version)
    if not types:
        return None
    paths: JSON = {}
    for rtype in types:
        prefix = f"/{_gv_path(group, version)}"
        scope = "/namespaces/{namespace}" if rtype.namespaced else ""
        paths[f"{prefix}{scope}/{rtype.plural}/{{name}}"] = {"patch": _patch_operation(rtype)}
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths,
        "components": {"schemas": {}},
    }

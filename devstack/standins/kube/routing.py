"""Request model and URL routing (`/api/v1/...`, `/apis/<g>/<v>/...`) to request attributes."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

_NAMESPACE_SUBRESOURCES = ("status", "finalize")


@dataclass
class Request:
    """One HTTP request as the API layer sees it."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes = b""
    # The body limit a larger body exceeded: its bytes were discarded unread, and a handler
    # that reads the body answers 413 (where the apiserver's limitedReadBody would).
    body_limit_exceeded: int | None = None

    @classmethod
    def parse(
        cls,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes,
        body_limit_exceeded: int | None = None,
    ) -> Request:
        parts = urlsplit(target)
        query = {k: v[0] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        lowered = {k.lower(): v for k, v in headers.items()}
        return cls(method, parts.path, query, lowered, body, body_limit_exceeded)

    def flag(self, name: str) -> bool:
        return self.query.get(name, "").lower() in ("true", "1")


@dataclass
class Route:
    """A resource request: group/version/plural plus optional namespace, name, subresource."""

    group: str
    version: str
    plural: str
    namespace: str = ""
    name: str = ""
    subresource: str = ""
    extra: list[str] = field(default_factory=list)


def _resource_route(group: str, version: str, rest: list[str]) -> Route | None:
    if not rest:
        return None
    if (
        rest[0] == "namespaces"
        and len(rest) >= 3
        and not (group == "" and len(rest) == 3 and rest[2] in _NAMESPACE_SUBRESOURCES)
    ):
        namespace, rest = rest[1], rest[2:]
    else:
        namespace = ""
    if len(rest) > 3:
        return None
    return Route(
        group, version, rest[0], namespace, rest[1] if len(rest) > 1 else "", rest[2] if len(rest) > 2 else ""
    )


def route(path: str) -> Route | None:
    """Resource route of a path, or None for discovery and other non-resource paths."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 3 and parts[0] == "api":
        return _resource_route("", parts[1], parts[2:])
    if len(parts) >= 4 and parts[0] == "apis":
        return _resource_route(parts[1], parts[2], parts[3:])
    return None


def verb_of(method: str, route_: Route, watch: bool) -> str:
    """apiserver RequestInfo verbs: get/list/watch/create/update/patch/delete/deletecollection."""
    if method == "GET":
        if watch:
            return "watch"
        return "get" if route_.name else "list"
    if method == "DELETE":
        return "delete" if route_.name else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())

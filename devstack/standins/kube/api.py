"""The API layer: authentication, discovery, RBAC, fault injection and resource operations."""

from __future__ import annotations

import base64
import binascii
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from devstack.standins.kube import discovery, errors, patches
from devstack.standins.kube.errors import ApiError
from devstack.standins.kube.faults import Faults
from devstack.standins.kube.rbac import Attributes, Authenticator, Authorizer, User
from devstack.standins.kube.resources import Registry, ResourceType
from devstack.standins.kube.routing import Request, Route, route, verb_of
from devstack.standins.kube.selectors import allowed_fields, field_selector, label_selector
from devstack.standins.kube.store import Compacted, Store, WriteOptions, clone
from devstack.standins.kube.tables import TABLE_MEDIA, table, wants_table
from devstack.standins.kube.watch import WatchSpec, WatchStream

JSON = dict[str, Any]
EXPIRED_MESSAGE = (
    "The provided continue parameter is too old to display a consistent list result. You can "
    "start a new list without the continue parameter, or use the continue token in this "
    "response to retrieve the remainder of the results. Continuing with the provided token "
    "results in an inconsistent list - objects that were created, modified, or deleted between "
    "the time the first chunk was returned and now may show up in the list."
)
CR_PATCH_TYPES = [patches.JSON_PATCH, patches.MERGE, patches.APPLY]
# kube-apiserver's MaxRequestBodyBytes (apiserver/pkg/server/config.go): 3 MiB, twice etcd's
# default request limit because the JSON body is stored in a more compact form (protobuf for
# built-in types); https://github.com/kubernetes/kubernetes/issues/105863.
MAX_REQUEST_BODY_BYTES = 3 * 1024 * 1024


@dataclass
class Response:
    """A complete JSON answer, or a watch stream."""

    status: int
    body: JSON | None = None
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    stream: WatchStream | None = None
    raw: bytes | None = None
    """The body already encoded (a list of cached object encodings); `body` is then None."""


@dataclass
class Counters:
    """Request counters for benchmarks: total and by (verb, resource), and the CPU seconds spent
    answering them (the handling thread's, request read to answer written)."""

    total: int = 0
    by_key: Counter[tuple[str, str]] = field(default_factory=Counter)
    seconds: dict[tuple[str, str], float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    current: threading.local = field(default_factory=threading.local)

    def add(self, verb: str, resource: str) -> None:
        self.current.key = (verb, resource)
        with self.lock:
            self.total += 1
            self.by_key[(verb, resource)] += 1

    def spent(self, seconds: float) -> None:
        """Charge this thread's last counted request with `seconds`."""
        key = getattr(self.current, "key", None)
        if key is not None:
            with self.lock:
                self.seconds[key] = self.seconds.get(key, 0.0) + seconds

    def reset(self) -> None:
        with self.lock:
            self.total = 0
            self.by_key.clear()
            self.seconds.clear()


def _encode_continue(rv: int, last: tuple[str, str]) -> str:
    """apiserver storage.EncodeContinue: the revision of the first page and the key to start
    after (`<namespace>/<name>` + NUL, relative to the resource's prefix), base64url JSON."""
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": f"{last[0]}/{last[1]}\x00"})
    return base64.urlsafe_b64encode(raw.encode()).decode()


def _decode_continue(token: str) -> tuple[int, tuple[str, str]]:
    """(revision, key after which to start); a garbled token -> 410 Expired (ResourceExpired),
    as for a compacted one."""
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        namespace, name = data["start"].rstrip("\x00").split("/", 1)
        return int(data["rv"]), (namespace, name)
    except (ValueError, KeyError, TypeError, binascii.Error, AttributeError) as exc:
        raise errors.expired(EXPIRED_MESSAGE) from exc


def _parse_body(request: Request) -> JSON:
    """The decoded body; one over the body limit is refused here, where the apiserver's
    handlers read theirs (after authentication, authorization and routing)."""
    if request.body_limit_exceeded is not None:
        raise errors.request_entity_too_large(request.body_limit_exceeded)
    content_type = request.headers.get("content-type", "")
    try:
        if "yaml" in content_type:
            body = yaml.safe_load(request.body.decode() or "{}")
        else:
            body = json.loads(request.body or b"{}")
    except (ValueError, yaml.YAMLError) as exc:
        raise errors.bad_request(f"the body of the request could not be decoded: {exc}") from exc
    if not isinstance(body, dict) and not isinstance(body, list):
        raise errors.bad_request("the body of the request must be an object")
    return body  # type: ignore[return-value]


class Api:
    """Dispatches requests to discovery or resource operations."""

    def __init__(
        self,
        registry: Registry,
        store: Store,
        authn: Authenticator,
        authz: Authorizer,
        faults: Faults,
        counters: Counters,
        address: Callable[[], str],
    ) -> None:
        self.registry, self.store, self.authn, self.authz = registry, store, authn, authz
        self.faults, self.counters, self.address = faults, counters, address
        self.bookmark_interval_s = 1.0
        self.max_request_body_bytes = MAX_REQUEST_BODY_BYTES

    def handle(self, request: Request) -> Response:
        """Answer one request; every ApiError becomes its `Status` body."""
        self.store.warnings.items = []
        try:
            return self._handle(request)
        except ApiError as error:
            return Response(error.code, error.body(), headers=error.headers)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:  # a malformed request
            malformed = errors.bad_request(f"{type(exc).__name__}: {exc}")
            return Response(malformed.code, malformed.body())

    def _handle(self, request: Request) -> Response:
        target = route(request.path)
        if target is None:
            self.counters.add(request.method.lower(), request.path)
            self.authn.authenticate(request.headers.get("authorization"))
            return self._discovery(request.path)
        rtype = self.registry.lookup(target.group, target.version, target.plural)
        verb = verb_of(request.method, target, request.flag("watch"))
        resource = f"{target.plural}/{target.subresource}" if target.subresource else target.plural
        self.counters.add(verb, resource)
        user = self.authn.authenticate(request.headers.get("authorization"))
        if (
            rtype is None
            or target.subresource not in ("", "status")
            or (target.subresource == "status" and not rtype.status_subresource)
        ):
            raise errors.not_found_path()
        self._inject(verb, resource, target)
        self._authorize(user, verb, target)
        return self._operate(request, rtype, target, verb)

    def _inject(self, verb: str, resource: str, target: Route) -> None:
        fault = self.faults.take(verb, resource)
        if fault is None:
            return
        if fault.delay_s:
            time.sleep(fault.delay_s)
        error = fault.error(target.group, resource, target.name)
        if error is not None:
            raise error

    def _authorize(self, user: User, verb: str, target: Route) -> None:
        self.authz.authorize(
            user,
            Attributes(verb, target.group, target.plural, target.subresource, target.namespace, target.name),
        )

    # ------------------------------------------------------------ discovery

    def _discovery(self, path: str) -> Response:
        """Discovery and OpenAPI are readable by every authenticated user (system:discovery)."""
        parts = [p for p in path.split("/") if p]
        document = self._discovery_document(parts)
        if document is None:
            raise errors.not_found_path()
        return Response(200, document)

    def _discovery_document(self, parts: list[str]) -> JSON | None:
        registry = self.registry
        if parts == ["version"]:
            return discovery.VERSION
        if parts == ["api"]:
            return discovery.api_versions(self.address())
        if parts == ["apis"]:
            return discovery.api_group_list(registry)
        if len(parts) == 2 and parts[0] == "api":
            return discovery.api_resource_list(registry, "", parts[1])
        if len(parts) == 2 and parts[0] == "apis":
            return discovery.api_group(registry, parts[1])
        if len(parts) == 3 and parts[0] == "apis":
            return discovery.api_resource_list(registry, parts[1], parts[2])
        if parts == ["openapi", "v3"]:
            return discovery.openapi_v3_root(registry)
        if parts[:2] == ["openapi", "v3"] and len(parts) in (4, 5):
            group, version = ("", parts[3]) if parts[2] == "api" else (parts[3], parts[-1])
            return discovery.openapi_v3_group_version(registry, group, version)
        return None

    # ------------------------------------------------------------ resource operations

    def _operate(self, request: Request, rtype: ResourceType, target: Route, verb: str) -> Response:
        if rtype.key == ("apiextensions.k8s.io", "customresourcedefinitions"):
            return self._crds(request, target, verb)
        namespace = target.namespace if rtype.namespaced else ""
        handlers: dict[str, Callable[[], Response]] = {
            "get": lambda: self._get(request, rtype, namespace, target.name),
            "list": lambda: self._list(request, rtype, target),
            "watch": lambda: self._watch(request, rtype, target),
            "create": lambda: self._create(request, rtype, namespace, target),
            "update": lambda: self._update(request, rtype, namespace, target),
            "patch": lambda: self._patch(request, rtype, namespace, target),
            "delete": lambda: self._delete(request, rtype, namespace, target.name),
            "deletecollection": lambda: self._delete_collection(request, rtype, target),
        }
        handler = handlers.get(verb)
        if handler is None:
            raise errors.method_not_allowed(request.method)
        return handler()

    def _crds(self, request: Request, target: Route, verb: str) -> Response:
        """apiextensions.k8s.io/v1 customresourcedefinitions: read-only view of loaded CRDs."""
        if verb == "get":
            crd = self.registry.crds.get(target.name)
            if crd is None:
                raise errors.not_found("apiextensions.k8s.io", "customresourcedefinitions", target.name)
            return Response(200, crd)
        if verb == "list":
            items = [self.registry.crds[name] for name in sorted(self.registry.crds)]
            return Response(
                200,
                {
                    "apiVersion": "apiextensions.k8s.io/v1",
                    "kind": "CustomResourceDefinitionList",
                    "metadata": {"resourceVersion": "1"},
                    "items": items,
                },
            )
        raise errors.method_not_allowed(request.method)

    def _object_response(
        self, request: Request, rtype: ResourceType, obj: JSON, status: int = 200
    ) -> Response:
        headers = self._warning_headers()
        if wants_table(request.headers.get("accept")):
            body = table(
                rtype,
                [obj],
                {"resourceVersion": obj["metadata"]["resourceVersion"]},
                request.query.get("includeObject", "Metadata"),
            )
            return Response(status, body, TABLE_MEDIA, headers)
        return Response(status, obj, headers=headers)

    def _warning_headers(self) -> dict[str, str]:
        items = getattr(self.store.warnings, "items", [])
        self.store.warnings.items = []
        if not items:
            return {}
        return {"Warning": ", ".join(f"299 - {json.dumps(text)}" for text in items)}

    def _get(self, request: Request, rtype: ResourceType, namespace: str, name: str) -> Response:
        """GET one object (a one-row Table when asked for)."""
        return self._object_response(request, rtype, self.store.get(rtype, namespace, name))

    def _predicate(self, request: Request, rtype: ResourceType) -> Callable[[JSON], bool]:
        labels = label_selector(request.query.get("labelSelector"))
        fields = field_selector(request.query.get("fieldSelector"), allowed_fields(rtype.group, rtype.plural))
        return lambda obj: labels(obj) and fields(obj)

    def _list(self, request: Request, rtype: ResourceType, target: Route) -> Response:
        """List with selectors and limit/continue pagination, as the apiserver serves it from
        etcd: a continue token's page is read at the first page's revision (a consistent
        list), 410 Expired once that revision left the history; `remainingItemCount` only
        when no selector filters the list (the count of keys would overstate the matches)."""
        predicate = self._predicate(request, rtype)
        token = request.query.get("continue")
        rv, after = _decode_continue(token) if token else (None, None)
        limit = int(request.query.get("limit") or 0)
        try:
            page = self.store.list_page(rtype, target.namespace or None, after, rv, max(limit, 0), predicate)
        except Compacted as exc:
            raise errors.expired(EXPIRED_MESSAGE) from exc
        meta: JSON = {"resourceVersion": str(page.rv)}
        if page.last is not None:
            meta["continue"] = _encode_continue(page.rv, page.last)
            if not (request.query.get("labelSelector") or request.query.get("fieldSelector")):
                meta["remainingItemCount"] = page.remaining
        items = page.items
        if wants_table(request.headers.get("accept")):
            body = table(rtype, items, meta, request.query.get("includeObject", "Metadata"))
            return Response(200, body, TABLE_MEDIA)
        head = {"apiVersion": rtype.api_version, "kind": rtype.list_kind, "metadata": meta}
        raw = json.dumps(head, separators=(",", ":")).encode()[:-1] + b',"items":['
        raw += b",".join(self.store.encoded(rtype, obj) for obj in items) + b"]}"
        return Response(200, raw=raw)

    def _watch(self, request: Request, rtype: ResourceType, target: Route) -> Response:
        """GET ?watch=true: a chunked stream of watch events (Tables when asked for)."""
        timeout = request.query.get("timeoutSeconds")
        spec = WatchSpec(
            rtype,
            target.namespace or None,
            self._predicate(request, rtype),
            request.query.get("resourceVersion", ""),
            request.flag("allowWatchBookmarks"),
            float(timeout) if timeout else None,
            self.bookmark_interval_s,
        )
        if target.name:
            name = target.name
            base = spec.predicate
            spec.predicate = lambda obj: obj["metadata"]["name"] == name and base(obj)
        as_table = wants_table(request.headers.get("accept"))
        include = request.query.get("includeObject", "Metadata")

        def render(obj: JSON, first: bool) -> JSON:
            if not as_table:
                return obj
            meta = {"resourceVersion": obj["metadata"].get("resourceVersion", "")}
            return table(rtype, [obj], meta, include, with_columns=first)

        stream = WatchStream(self.store, spec, render).open()
        return Response(200, None, TABLE_MEDIA if as_table else "application/json", stream=stream)

    @staticmethod
    def _write_options(request: Request) -> WriteOptions:
        return WriteOptions(
            request.query.get("fieldValidation", "Warn") or "Warn", request.query.get("dryRun") == "All"
        )

    def _create(self, request: Request, rtype: ResourceType, namespace: str, target: Route) -> Response:
        """POST on the collection -> 201 Created with the stored object."""
        if target.name or target.subresource:
            raise errors.method_not_allowed(request.method)
        body = _parse_body(request)
        if not isinstance(body, dict):
            raise errors.bad_request("the body of the request must be an object")
        obj = self.store.create(rtype, namespace, body, self._write_options(request))
        return self._object_response(request, rtype, obj, 201)

    def _update(self, request: Request, rtype: ResourceType, namespace: str, target: Route) -> Response:
        """PUT: whole-object replace, guarded by metadata.resourceVersion."""
        body = _parse_body(request)
        if not isinstance(body, dict):
            raise errors.bad_request("the body of the request must be an object")
        obj = self.store.update(
            rtype,
            namespace,
            target.name,
            body,
            target.subresource,
            self._write_options(request),
            require_rv=True,
        )
        return self._object_response(request, rtype, obj)

    def _patcher(self, request: Request, rtype: ResourceType) -> Callable[[JSON], JSON]:
        """Patch types accepted by the apiserver; strategic merge on CRs -> 415."""
        content_type = request.headers.get("content-type", "").split(";")[0].strip()
        body = _parse_body(request)
        if content_type == patches.JSON_PATCH:
            return lambda current: patches.json_patch(current, body)
        if not isinstance(body, dict):
            raise errors.bad_request("the patch body must be an object")
        if content_type == patches.MERGE:
            return lambda current: patches.merge_patch(current, body)
        if content_type == patches.STRATEGIC and rtype.builtin:
            return lambda current: patches.strategic_merge(current, body)
        if content_type == patches.APPLY:
            return lambda current: patches.apply_merge(current, body, rtype.schema)
        accepted = [*CR_PATCH_TYPES, patches.STRATEGIC] if rtype.builtin else CR_PATCH_TYPES
        raise errors.unsupported_media_type(content_type, accepted)

    def _patch(self, request: Request, rtype: ResourceType, namespace: str, target: Route) -> Response:
        """PATCH; server-side apply creates a missing object (as the apiserver does)."""
        change = self._patcher(request, rtype)
        options = self._write_options(request)
        is_apply = request.headers.get("content-type", "").startswith(patches.APPLY)
        try:
            obj = self.store.mutate(rtype, namespace, target.name, change, target.subresource, options)
        except ApiError as error:
            if not (is_apply and error.code == 404):
                raise
            created = change({"metadata": {"name": target.name}})
            obj = self.store.create(rtype, namespace, created, options)
            if target.subresource == "status" and "status" in created:
                obj = self.store.mutate(
                    rtype,
                    namespace,
                    target.name,
                    lambda cur: {**cur, "status": created["status"]},
                    "status",
                    options,
                )
            return self._object_response(request, rtype, obj, 201)
        return self._object_response(request, rtype, obj)

    def _delete(self, request: Request, rtype: ResourceType, namespace: str, name: str) -> Response:
        """DELETE with optional DeleteOptions (preconditions, dryRun); answers the object
        (ReturnDeletedObject), still present with deletionTimestamp while finalizers remain."""
        options = _parse_body(request)
        preconditions = options.get("preconditions") or {} if isinstance(options, dict) else {}
        dry_run = request.query.get("dryRun") == "All"
        obj = self.store.delete(rtype, namespace, name, preconditions, dry_run)
        return self._object_response(request, rtype, obj)

    def _delete_collection(self, request: Request, rtype: ResourceType, target: Route) -> Response:
        """DELETE on a collection (deletecollection) honours label and field selectors; its
        DeleteOptions body is read (and size-checked) as upstream, but not otherwise used."""
        _parse_body(request)
        predicate = self._predicate(request, rtype)
        items, _ = self.store.list_objects(rtype, target.namespace or None)
        deleted = []
        for obj in (o for o in items if predicate(o)):
            meta = obj["metadata"]
            try:
                deleted.append(self.store.delete(rtype, meta.get("namespace", ""), meta["name"], {}))
            except ApiError as error:
                if error.code != 404:
                    raise
        meta_out = {"resourceVersion": str(self.store.resource_version)}
        return Response(
            200,
            {
                "apiVersion": rtype.api_version,
                "kind": rtype.list_kind,
                "metadata": meta_out,
                "items": [clone(o) for o in deleted],
            },
        )

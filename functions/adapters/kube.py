"""The Kubernetes API as the functions need it, over a thin REST client (JSON over keep-alive
`http.client` connections, functions/adapters/keepalive.py; httpx through a proxy or a given
transport).

Not the `kubernetes` package: importing it costs ~0.5 s of cold start (its ~770 model
modules) and its (de)serialisation costs more than the requests themselves for large objects.
Only a handful of paths are used: GET/LIST (limit/continue, labelSelector) of custom objects
and pods, merge PATCH of an object or its /status, POST of a core/v1 Event.

Transport errors stop here: 404 becomes None, 409 after bounded re-reads becomes
KubeConflict, 5xx/429/timeouts/connection errors become KubeUnavailable (both Retryable),
other refusals KubeRefused.
"""

from __future__ import annotations

import hashlib
import json
import logging
import ssl
from collections.abc import Callable, Iterator
from datetime import datetime
from functools import cached_property, partial
from typing import Any
from urllib.parse import quote, urlencode

import httpx
import pydantic_core

from functions.adapters.keepalive import KeepAlive
from functions.adapters.kubeconfig import KubeConfig, load
from functions.adapters.tls import never_used
from functions.errors import KubeConflict, KubeRefused, KubeUnavailable, LoraflowError
from functions.logic import mergepatch
from functions.logic.conditions import timestamp
from functions.observability import KUBE_CONFLICTS, KUBE_REQUESTS, WARNING_EVENTS
from functions.ports import StatusFn, Written
from functions.resources.kinds import Kind

log = logging.getLogger("loraflow.kube")

Obj = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"
EVENT_WINDOW_S = 600
WRITE_ATTEMPTS = 5
TIMEOUT = httpx.Timeout(connect=5.0, read=30.0, write=30.0, pool=30.0)
LIMITS = httpx.Limits(max_connections=32, max_keepalive_connections=16, keepalive_expiry=60.0)
HEADERS = {"Accept": "application/json", "User-Agent": "loraflow-functions"}


class ApiError(Exception):
    """A non-2xx answer of the API server (stays inside this module)."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"Kubernetes API answered {status}")
        self.status = status
        self.body = body


class KubeApi:
    """Keep-alive connections to the API server, shared by the process's threads; JSON bodies
    in and out. Through a proxy (a kubeconfig's proxy-url), or with a `transport` given (tests),
    one shared httpx.Client instead."""

    def __init__(self, config: KubeConfig, transport: httpx.BaseTransport | None = None) -> None:
        self._config = config
        self._base = config.server.rstrip("/")
        self._extensions = {"sni_hostname": config.tls_server_name} if config.tls_server_name else None
        self._direct: KeepAlive | None = None
        self._http: httpx.Client | None = None
        if transport is None and not config.proxy:
            self._direct = KeepAlive(
                self._base,
                _verify(config),
                config.tls_server_name,
                connect_timeout=TIMEOUT.connect or 5.0,
                read_timeout=TIMEOUT.read or 30.0,
                max_idle=LIMITS.max_keepalive_connections or 16,
            )
            return
        if transport is None:
            transport = httpx.HTTPTransport(
                verify=_verify(config),
                limits=LIMITS,
                retries=1,  # connection failures only (a stale keep-alive socket, a restart)
                proxy=httpx.Proxy(config.proxy) if config.proxy else None,
            )
        self._http = httpx.Client(
            transport=transport,
            timeout=TIMEOUT,
            headers=HEADERS,
            trust_env=False,
        )

    def request(
        self,
        method: str,
        path: str,
        params: dict[str, Any] | None = None,
        body: Obj | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        """The decoded JSON answer; ApiError for non-2xx, httpx.HTTPError for transport trouble."""
        headers: dict[str, str] = {}
        authorization = self._config.authorization()
        if authorization:
            headers["Authorization"] = authorization
        content = None
        if body is not None:
            content = json.dumps(body, separators=(",", ":")).encode()
            headers["Content-Type"] = content_type
        if self._http is None:
            assert self._direct is not None  # one of the two, set in __init__
            return _request_direct(self._direct, method, path, params, headers, content)
        response = self._http.request(
            method,
            self._base + path,
            params=params,
            content=content,
            headers=headers,
            extensions=self._extensions,
        )
        if not response.is_success:
            raise ApiError(response.status_code, response.text)
        try:
            decoded: Obj = decode(response.content)
        except ValueError as err:
            raise httpx.DecodingError(f"answer is not JSON: {err}", request=response.request) from err
        return decoded

    @cached_property
    def server(self) -> tuple[str, int] | None:
        """The API server's host and port (load asks once per event: parsed once)."""
        url = httpx.URL(self._base)
        port = url.port or (443 if url.scheme == "https" else 80)
        return (url.host, port) if url.host else None

    def close(self) -> None:
        if self._direct is not None:
            self._direct.close()
        if self._http is not None:
            self._http.close()


def _request_direct(
    direct: KeepAlive,
    method: str,
    path: str,
    params: dict[str, Any] | None,
    headers: dict[str, str],
    content: bytes | None,
) -> Obj:
    target = path + ("?" + urlencode(params) if params else "")
    answer = direct.request(method, target, {**HEADERS, **headers}, content)
    if not 200 <= answer.status < 300:
        raise ApiError(answer.status, answer.body.decode("utf-8", "replace"))
    try:
        decoded: Obj = decode(answer.body)
    except ValueError as err:
        raise httpx.DecodingError(f"answer is not JSON: {err}") from err
    return decoded


def decode(body: bytes) -> Obj:
    """An answer's JSON, by pydantic's parser: ~0.7x json.loads' CPU for a page of 500 adapters,
    and the repeated keys and values (every adapter's condition types, reasons, its namespace)
    are one string each. The API server writes UTF-8 (RFC 8259); nesting is bounded (ValueError,
    not RecursionError, for a hostile proxy's answer)."""
    decoded: Obj = pydantic_core.from_json(body, cache_strings=True)
    return decoded


def _verify(config: KubeConfig) -> ssl.SSLContext:
    if config.server.startswith("https:"):
        return config.ssl_context()
    return never_used()


def connect(kubeconfig: str | None) -> KubeApi:
    """A client from a kubeconfig file, else the in-cluster service account."""
    return KubeApi(load(kubeconfig))


TOO_LARGE = "etcdserver: request is too large"
"""etcd refuses writes above --max-request-bytes (1.5 MiB by default); the API server passes it
on as a 500 (kubernetes/kubernetes#112152), but no retry can make the object smaller."""
TOO_LARGE_TO_SEND = "trying to send message larger than max"
"""Above 2 MiB the API server's own etcd client refuses to send the write (gRPC ResourceExhausted,
also a 500): as permanent as etcd's refusal."""


def _translate(err: ApiError, verb: str, what: str) -> LoraflowError:
    refusal = next((m for m in (TOO_LARGE, TOO_LARGE_TO_SEND) if m in err.body), None)
    if err.status == 500 and refusal is not None:
        return KubeRefused(f"{verb} {what}: the object would exceed etcd's request limit ({refusal})", 413)
    if err.status in (429,) or (err.status or 0) >= 500:
        return KubeUnavailable(f"{verb} {what}: Kubernetes API answered {err.status}")
    return KubeRefused(f"{verb} {what}: Kubernetes API answered {err.status}: {err.body[:500]}", err.status)


def _collection(kind: Kind, namespace: str | None) -> str:
    prefix = f"/apis/{kind.group}/{kind.version}" if kind.group else f"/api/{kind.version}"
    if namespace:
        return f"{prefix}/namespaces/{quote(namespace, safe='')}/{kind.plural}"
    return f"{prefix}/{kind.plural}"


def _object(kind: Kind, namespace: str, name: str) -> str:
    return f"{_collection(kind, namespace)}/{quote(name, safe='')}"


class Kube:
    """Typed, guarded access to the objects loraflow reads and writes."""

    def __init__(self, api: KubeApi) -> None:
        self._api = api

    @property
    def server(self) -> tuple[str, int] | None:
        return self._api.server

    # -- reads -----------------------------------------------------------------------------
    def get(self, kind: Kind, namespace: str, name: str) -> Obj | None:
        try:
            result: Obj = self._call("get", kind, lambda: self._get(kind, namespace, name))
        except ApiError as err:
            if err.status == 404:
                return None
            raise _translate(err, "get", f"{kind.plural}/{name}") from err
        return result

    def list_all(
        self,
        kind: Kind,
        namespace: str | None = None,
        label_selector: str | None = None,
        page_size: int = 500,
    ) -> list[Obj]:
        return list(self.iter(kind, namespace, label_selector, page_size))

    def iter(
        self,
        kind: Kind,
        namespace: str | None = None,
        label_selector: str | None = None,
        page_size: int = 500,
    ) -> Iterator[Obj]:
        """Every matching object, one page (limit/continue) at a time."""
        token: str | None = None
        while True:
            try:
                page: Obj = self._call(
                    "list",
                    kind,
                    partial(self._list, kind, namespace, label_selector, page_size, token),
                )
            except ApiError as err:
                if err.status == 410 and token:
                    # the first page's revision was compacted while we read: the list cannot be
                    # finished consistently; the event is retried and starts a fresh list
                    raise KubeUnavailable(f"list {kind.plural}: continue token expired (410)") from err
                raise _translate(err, "list", kind.plural) from err
            yield from page.get("items") or []
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return

    # -- guarded writes ----------------------------------------------------------------------
    def write_status(
        self, kind: Kind, namespace: str, name: str, desired: StatusFn, current: Obj | None = None
    ) -> Written | None:
        """One merge patch to /status with the read's resourceVersion; 409 -> re-read, recompute.

        Returns None when the object is gone; skips the write when nothing would change.
        `current`: the object as this invocation just read it (a GET or a list); the first
        attempt starts from it instead of a GET (its resourceVersion guards the patch, a 409
        re-reads), and nothing is requested at all when it shows nothing would change.
        """
        return self._guarded(kind, namespace, name, desired, "status", subresource=True, current=current)

    def write_finalizers(
        self, kind: Kind, namespace: str, name: str, desired: Callable[[Obj], list[str] | None]
    ) -> Written | None:
        """Set metadata.finalizers under the same resourceVersion guard."""

        def compute(obj: Obj) -> Obj | None:
            wanted = desired(obj)
            return None if wanted is None else {"finalizers": wanted}

        return self._guarded(kind, namespace, name, compute, "metadata", subresource=False)

    def _guarded(
        self,
        kind: Kind,
        namespace: str,
        name: str,
        desired: StatusFn,
        field: str,
        subresource: bool,
        current: Obj | None = None,
    ) -> Written | None:
        start = current if current and (current.get("metadata") or {}).get("resourceVersion") else None
        for _ in range(WRITE_ATTEMPTS):
            obj, start = (start, None) if start is not None else (self.get(kind, namespace, name), None)
            if obj is None:
                return None
            wanted = desired(obj)
            current = obj.get(field) or {}
            patch = (
                mergepatch.diff(current, current | wanted if field == "metadata" else wanted)
                if wanted is not None
                else {}
            )
            if not patch:
                return Written(obj, changed=False, before=obj)
            body: Obj = {field: patch} if field != "metadata" else {"metadata": dict(patch)}
            body.setdefault("metadata", {})["resourceVersion"] = obj["metadata"]["resourceVersion"]
            try:
                stored = self._call(
                    "patch", kind, partial(self._patch, kind, namespace, name, body, subresource)
                )
            except ApiError as err:
                if err.status == 409:
                    KUBE_CONFLICTS.labels(kind.plural).inc()
                    continue
                if err.status == 404:
                    return None
                raise _translate(err, "patch", f"{kind.plural}/{name}") from err
            return Written(stored, changed=True, before=obj)
        raise KubeConflict(f"{kind.plural}/{name} kept changing under us ({WRITE_ATTEMPTS} attempts)")

    def annotate(self, kind: Kind, namespace: str, name: str, annotations: dict[str, str]) -> Obj | None:
        """Merge-patch `metadata.annotations` without a resourceVersion: the last write wins,
        which is what a value only its one writer sets wants (the filer source's cursor).
        None when the object does not exist."""
        body: Obj = {"metadata": {"annotations": annotations}}
        try:
            stored: Obj = self._call(
                "patch", kind, partial(self._patch, kind, namespace, name, body, subresource=False)
            )
        except ApiError as err:
            if err.status == 404:
                return None
            raise _translate(err, "patch", f"{kind.plural}/{name}") from err
        return stored

    # -- events ------------------------------------------------------------------------------
    def record_event(
        self, obj: Obj, event_type: str, reason: str, message: str, component: str, now: datetime
    ) -> None:
        """A core/v1 Event on the object so that `kubectl describe` tells the story (best effort).

        One Event per object, reason and message per EVENT_WINDOW_S: the name is derived from
        them, so a failure that every retry meets again is recorded once (409 AlreadyExists is
        that), not once per retry, and never floods etcd.
        """
        meta = obj.get("metadata") or {}
        namespace = meta.get("namespace") or "default"
        stamp = timestamp(now)
        window = int(now.timestamp() // EVENT_WINDOW_S)
        seed = f"{meta.get('uid')}\x00{reason}\x00{message}\x00{window}".encode()
        suffix = hashlib.sha256(seed).hexdigest()[:16]
        body = {
            "metadata": {"name": f"{meta.get('name')}.{suffix}", "namespace": namespace},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion"),
                "kind": obj.get("kind"),
                "name": meta.get("name"),
                "namespace": namespace,
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "reason": reason,
            "message": message[:1024],
            "type": event_type,
            "source": {"component": f"loraflow-{component}"},
            "reportingComponent": f"loraflow-{component}",
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        if event_type == "Warning":
            WARNING_EVENTS.labels(component, reason).inc()  # counted even if the write fails
        # Named on the line: a pod's reload records Events for many adapters in one request.
        about = {"adapter": f"{namespace}/{meta.get('name')}", "reason": reason}
        try:
            KUBE_REQUESTS.labels("create", "events").inc()
            self._api.request("POST", f"/api/v1/namespaces/{quote(namespace, safe='')}/events", body=body)
        except ApiError as err:
            if err.status != 409:  # 409: recorded already in this window
                log.warning("Could not record Event", extra={**about, "error": str(err)})
        except httpx.HTTPError as err:
            log.warning("Could not record Event", extra={**about, "error": str(err)})

    # -- plumbing ----------------------------------------------------------------------------
    def _call(self, verb: str, kind: Kind, request: Callable[[], Any]) -> Any:
        KUBE_REQUESTS.labels(verb, kind.plural).inc()
        try:
            return request()
        except httpx.HTTPError as err:
            raise KubeUnavailable(f"{verb} {kind.plural}: {err}") from err

    def _get(self, kind: Kind, namespace: str, name: str) -> Obj:
        return self._api.request("GET", _object(kind, namespace, name))

    def _list(
        self, kind: Kind, namespace: str | None, selector: str | None, limit: int, token: str | None
    ) -> Obj:
        params: dict[str, Any] = {"limit": limit}
        if selector:
            params["labelSelector"] = selector
        if token:
            params["continue"] = token
        return self._api.request("GET", _collection(kind, namespace), params=params)

    def _patch(self, kind: Kind, namespace: str, name: str, body: Obj, subresource: bool) -> Obj:
        path = _object(kind, namespace, name) + ("/status" if subresource else "")
        return self._api.request("PATCH", path, body=body, content_type=MERGE_PATCH)

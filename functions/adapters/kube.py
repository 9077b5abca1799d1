"""The Kubernetes API as the functions need it, over a thin REST client: JSON over the one
transport (functions/transport/), chosen once from the kubeconfig.

Not the `kubernetes` package: importing its hundreds of model modules weighs on cold start,
and its (de)serialisation costs more than the requests themselves for large objects.
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
from collections.abc import Callable, Iterator
from datetime import datetime
from functools import cached_property, partial
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import pydantic_core

from functions import transport
from functions.adapters.kubeconfig import KubeConfig, load
from functions.errors import KubeConflict, KubeRefused, KubeUnavailable, LoraflowError
from functions.logic import mergepatch
from functions.logic.conditions import timestamp
from functions.observability import KUBE_CONFLICTS, KUBE_REQUESTS, WARNING_EVENTS
from functions.ports import PageSize, StatusFn, Written
from functions.resources.kinds import Kind

log = logging.getLogger("loraflow.kube")

Obj = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"
EVENT_WINDOW_S = 600
WRITE_ATTEMPTS = 5
TIMEOUT_S = 30.0
KEPT_CONNECTIONS = 16
HEADERS = {"Accept": "application/json", "User-Agent": "loraflow-functions"}


class ApiError(Exception):
    """A non-2xx answer of the API server (stays inside this module)."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"Kubernetes API answered {status}")
        self.status = status
        self.body = body


class KubeApi:
    """The API server's connections, shared by the process's threads; JSON bodies in and out."""

    def __init__(self, config: KubeConfig, through: transport.Transport | None = None) -> None:
        """`through`: the transport to send on (default: one made from the kubeconfig)."""
        self._config = config
        self._base = config.server.rstrip("/")
        self._transport = through or transport.connect(
            self._base,
            config.ssl_context() if self._base.startswith("https:") else None,
            config.tls_server_name,
            proxy=config.proxy,
            timeout=TIMEOUT_S,
            max_idle=KEPT_CONNECTIONS,
        )

    def request(
        self,
        method: str,
        path: str,
        params: dict[str, Any] | None = None,
        body: Obj | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        """The decoded JSON answer; ApiError for non-2xx, TransportError for no usable answer."""
        headers = dict(HEADERS)
        authorization = self._config.authorization()
        if authorization:
            headers["Authorization"] = authorization
        content = None
        if body is not None:
            content = json.dumps(body, separators=(",", ":")).encode()
            headers["Content-Type"] = content_type
        target = path + ("?" + urlencode(params) if params else "")
        answer = self._transport.request(method, target, headers, content)
        if not 200 <= answer.status < 300:
            raise ApiError(answer.status, answer.body.decode("utf-8", "replace"))
        try:
            return decode(answer.body)
        except ValueError as err:
            raise transport.TransportError(f"{method} {path[:200]}: the answer is not JSON: {err}") from err

    @cached_property
    def server(self) -> tuple[str, int] | None:
        """The API server's host and port (load asks once per event: parsed once)."""
        url = urlsplit(self._base)
        port = url.port or (443 if url.scheme == "https" else 80)
        return (url.hostname, port) if url.hostname else None

    def close(self) -> None:
        self._transport.close()


def decode(body: bytes) -> Obj:
    """An answer's JSON, by pydantic's parser: cheaper than json.loads for a page of adapters,
    and the repeated keys and values (every adapter's condition types, reasons, its namespace)
    are one string each. The API server writes UTF-8 (RFC 8259); nesting is bounded (ValueError,
    not RecursionError, for a hostile proxy's answer)."""
    decoded: Obj = pydantic_core.from_json(body, cache_strings=True)
    return decoded


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

    def close(self) -> None:
        self._api.close()

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
        page_size: PageSize = 500,
    ) -> Iterator[Obj]:
        """Every matching object, one page (limit/continue) at a time."""
        token: str | None = None
        items: list[Obj] = []
        while True:
            limit = page_size if isinstance(page_size, int) else max(1, page_size(items))
            try:
                page: Obj = self._call(
                    "list",
                    kind,
                    partial(self._list, kind, namespace, label_selector, limit, token),
                )
            except ApiError as err:
                if err.status == 410 and token:
                    # the first page's revision was compacted while we read: the list cannot be
                    # finished consistently; the event is retried and starts a fresh list
                    raise KubeUnavailable(f"list {kind.plural}: continue token expired (410)") from err
                raise _translate(err, "list", kind.plural) from err
            items = page.get("items") or []
            yield from items
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
        self,
        kind: Kind,
        namespace: str,
        name: str,
        desired: Callable[[Obj], list[str] | None],
        current: Obj | None = None,
    ) -> Written | None:
        """Set metadata.finalizers under the same resourceVersion guard (`current` as for
        `write_status`)."""

        def compute(obj: Obj) -> Obj | None:
            wanted = desired(obj)
            return None if wanted is None else {"finalizers": wanted}

        return self._guarded(kind, namespace, name, compute, "metadata", subresource=False, current=current)

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
        except transport.TransportError as err:
            log.warning("Could not record Event", extra={**about, "error": str(err)})

    # -- plumbing ----------------------------------------------------------------------------
    def _call(self, verb: str, kind: Kind, request: Callable[[], Any]) -> Any:
        KUBE_REQUESTS.labels(verb, kind.plural).inc()
        try:
            return request()
        except transport.TransportError as err:
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

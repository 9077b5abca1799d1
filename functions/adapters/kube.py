"""The Kubernetes API as the functions need it, over the real `kubernetes` client.

Library exceptions stop here: 404 becomes None, 409 after bounded re-reads becomes
KubeConflict, 5xx/429/timeouts become KubeUnavailable (both Retryable).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any
from uuid import uuid4

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from functions.errors import KubeConflict, KubeUnavailable, LoraflowError
from functions.logic import mergepatch
from functions.logic.conditions import timestamp
from functions.observability import KUBE_CONFLICTS, KUBE_REQUESTS
from functions.resources.kinds import Kind

log = logging.getLogger("loraflow.kube")

Obj = dict[str, Any]
StatusFn = Callable[[Obj], Obj | None]
"""Given the current object, the whole desired status (None: leave it alone)."""

MERGE_PATCH = "application/merge-patch+json"
WRITE_ATTEMPTS = 5
TIMEOUT = (5.0, 30.0)


class KubeRefused(LoraflowError):
    """The API refused a request for a reason a retry will not fix (403, 422, 400)."""


@dataclass(frozen=True)
class Written:
    """Outcome of a guarded write: the object as stored, and whether we changed it."""

    obj: Obj
    changed: bool


def connect(kubeconfig: str | None) -> client.ApiClient:
    """An ApiClient from a kubeconfig file, else the in-cluster service account."""
    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    else:
        config.load_incluster_config(client_configuration=configuration)
    configuration.retries = 1
    return client.ApiClient(configuration)


def _translate(err: ApiException, verb: str, what: str) -> LoraflowError:
    if err.status in (429,) or (err.status or 0) >= 500:
        return KubeUnavailable(f"{verb} {what}: Kubernetes API answered {err.status}")
    return KubeRefused(f"{verb} {what}: Kubernetes API answered {err.status}: {err.body}")


class Kube:
    """Typed, guarded access to the objects loraflow reads and writes."""

    def __init__(self, api: client.ApiClient) -> None:
        self._custom = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)

    # -- reads -----------------------------------------------------------------------------
    def get(self, kind: Kind, namespace: str, name: str) -> Obj | None:
        try:
            result: Obj = self._call("get", kind, lambda: self._get(kind, namespace, name))
        except ApiException as err:
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
            except ApiException as err:
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
                return Written(obj, changed=False)
            body: Obj = {field: patch} if field != "metadata" else {"metadata": dict(patch)}
            body.setdefault("metadata", {})["resourceVersion"] = obj["metadata"]["resourceVersion"]
            try:
                stored = self._call(
                    "patch", kind, partial(self._patch, kind, namespace, name, body, subresource)
                )
            except ApiException as err:
                if err.status == 409:
                    KUBE_CONFLICTS.labels(kind.plural).inc()
                    continue
                if err.status == 404:
                    return None
                raise _translate(err, "patch", f"{kind.plural}/{name}") from err
            return Written(stored, changed=True)
        raise KubeConflict(f"{kind.plural}/{name} kept changing under us ({WRITE_ATTEMPTS} attempts)")

    # -- events ------------------------------------------------------------------------------
    def record_event(
        self, obj: Obj, event_type: str, reason: str, message: str, component: str, now: datetime
    ) -> None:
        """A core/v1 Event on the object so that `kubectl describe` tells the story (best effort)."""
        meta = obj.get("metadata") or {}
        namespace = meta.get("namespace") or "default"
        stamp = timestamp(now)
        body = {
            "metadata": {"name": f"{meta.get('name')}.{uuid4().hex[:16]}", "namespace": namespace},
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
        try:
            KUBE_REQUESTS.labels("create", "events").inc()
            self._core.create_namespaced_event(namespace, body, _request_timeout=TIMEOUT)
        except (ApiException, urllib3.exceptions.HTTPError) as err:
            log.warning("Could not record Event", extra={"reason": reason, "error": str(err)})

    # -- plumbing ----------------------------------------------------------------------------
    def _call(self, verb: str, kind: Kind, request: Callable[[], Any]) -> Any:
        KUBE_REQUESTS.labels(verb, kind.plural).inc()
        try:
            return request()
        except urllib3.exceptions.HTTPError as err:
            raise KubeUnavailable(f"{verb} {kind.plural}: {err}") from err

    def _get(self, kind: Kind, namespace: str, name: str) -> Obj:
        if not kind.group:
            response = self._core.read_namespaced_pod(
                name, namespace, _preload_content=False, _request_timeout=TIMEOUT
            )
            raw: Obj = json.loads(response.data)
            return raw
        result: Obj = self._custom.get_namespaced_custom_object(
            kind.group, kind.version, namespace, kind.plural, name, _request_timeout=TIMEOUT
        )
        return result

    def _list(
        self, kind: Kind, namespace: str | None, selector: str | None, limit: int, token: str | None
    ) -> Obj:
        params: dict[str, Any] = {"limit": limit, "_request_timeout": TIMEOUT}
        if selector:
            params["label_selector"] = selector
        if token:
            params["_continue"] = token
        if not kind.group:
            # Raw JSON: deserialising thousands of V1Pod objects costs more than the request.
            response = (
                self._core.list_namespaced_pod(namespace, _preload_content=False, **params)
                if namespace
                else self._core.list_pod_for_all_namespaces(_preload_content=False, **params)
            )
            parsed: Obj = json.loads(response.data)
            return parsed
        # Raw JSON here too: a page of 500 custom objects is parsed once, by json.loads.
        if namespace:
            response = self._custom.list_namespaced_custom_object(
                kind.group, kind.version, namespace, kind.plural, _preload_content=False, **params
            )
        else:
            response = self._custom.list_cluster_custom_object(
                kind.group, kind.version, kind.plural, _preload_content=False, **params
            )
        page: Obj = json.loads(response.data)
        return page

    def _patch(self, kind: Kind, namespace: str, name: str, body: Obj, subresource: bool) -> Obj:
        args = (kind.group, kind.version, namespace, kind.plural, name, body)
        options: dict[str, Any] = {"_content_type": MERGE_PATCH, "_request_timeout": TIMEOUT}
        if subresource:
            result: Obj = self._custom.patch_namespaced_custom_object_status(*args, **options)
        else:
            result = self._custom.patch_namespaced_custom_object(*args, **options)
        return result

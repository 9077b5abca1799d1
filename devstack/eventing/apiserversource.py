"""An ApiServerSource (mode Resource) stand-in: watch kinds, send CloudEvents to a sink.

Mirrors knative/eventing `pkg/adapter/apiserver` (`events/events.go`, `delegate.go`):
- one watch per `spec.resources[]` entry (apiVersion, kind, label `selector`), in the
  namespaces `spec.namespaceSelector` selects (`{}` = all; absent = the source's own);
- ADDED/MODIFIED/DELETED -> `dev.knative.apiserver.resource.add|update|delete`, data = the
  whole object (last state on delete), `subject` `/apis/<apiVersion>/namespaces/<ns>/<plural>/
  <name>` (core kinds too: `/apis/v1/...`, the plural guessed from the kind), extensions
  `kind`, `apiversion`, `name`, `namespace`, `source` = the API server URL;
- the informer's `Replace()`/`Resync()` are no-ops (`resourceDelegate` in `delegate.go`):
  objects that exist when the source starts, and anything seen again by a relist after
  `410 Gone`, produce no event;
- status-subresource writes are MODIFIED events too, so our own patches come back as updates.
Each kind is a list+watch on the real kube-apiserver (informer.py: bookmarks, a relist after
410 Expired, which a restarted kube-apiserver answers to every resume point from before its
restart, and a capped backoff while it or etcd is down). Watches resume from the last seen
resourceVersion. Events go out in watch order per resource.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cloudevents.http import CloudEvent
from kubernetes import client

from devstack.eventing.broker import BrokerClient
from devstack.eventing.informer import Connection, Informer

log = logging.getLogger("devstack.eventing.apiserversource")

VERBS = {"ADDED": "add", "MODIFIED": "update", "DELETED": "delete"}


def guess_plural(kind: str) -> str:
    """`meta.UnsafeGuessKindToResource`: lower-case; `s` -> `ses`, consonant+`y` -> `ies`."""
    lower = kind.lower()
    if lower.endswith("s"):
        return lower + "es"
    if lower.endswith("y") and len(lower) > 1 and lower[-2] not in "aeiou":
        return lower[:-1] + "ies"
    return lower + "s"


def label_selector(selector: Mapping[str, Any] | None) -> str:
    """A metav1.LabelSelector as the `labelSelector` query string."""
    if not selector:
        return ""
    parts = [f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items()]
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In":
            parts.append(f"{key} in ({','.join(values)})")
        elif op == "NotIn":
            parts.append(f"{key} notin ({','.join(values)})")
        elif op == "Exists":
            parts.append(key)
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
    return ",".join(parts)


def resource_event(verb: str, obj: Mapping[str, Any], source: str) -> CloudEvent:
    """The CloudEvent ApiServerSource sends for `obj` (mode Resource)."""
    meta = obj.get("metadata") or {}
    api_version, kind = str(obj.get("apiVersion", "")), str(obj.get("kind", ""))
    namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    scope = f"/namespaces/{namespace}" if namespace else ""
    attributes = {
        "type": f"dev.knative.apiserver.resource.{verb}",
        "source": source,
        "id": str(uuid.uuid4()),
        "time": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        "subject": f"/apis/{api_version}{scope}/{guess_plural(kind)}/{name}",
        "datacontenttype": "application/json",
        "kind": kind,
        "apiversion": api_version,
        "name": name,
    }
    if namespace:
        attributes["namespace"] = namespace
    return CloudEvent(attributes, dict(obj))


@dataclass(frozen=True)
class WatchedResource:
    api_version: str
    kind: str
    selector: str = ""

    @property
    def group_version(self) -> tuple[str, str]:
        group, _, version = self.api_version.rpartition("/")
        return group, version


class _NamespaceFilter:
    """`spec.namespaceSelector`: absent = the source's namespace only, `{}` = every namespace."""

    def __init__(self, core: client.CoreV1Api, own: str, selector: Mapping[str, Any] | None) -> None:
        self._core, self._own = core, own
        self._selector = None if selector is None else label_selector(selector)

    def allows(self, namespace: str) -> bool:
        if self._selector is None:
            return namespace == self._own
        if not self._selector:
            return True
        found = self._core.list_namespace(
            label_selector=self._selector, field_selector=f"metadata.name={namespace}"
        )
        return bool(found.items)


class _ResourceWatch:
    """List (silently) then watch one kind from the last resourceVersion; relist on 410."""

    def __init__(
        self, api: client.ApiClient, resource: WatchedResource, on_event: Callable[[str, Any], None]
    ) -> None:
        self.resource = resource
        self._on_event = on_event
        self.informer = Informer(
            Connection.of(api),
            collection_path(resource),
            self._event,
            label_selector=resource.selector,
            name=f"apiserversource-{resource.kind}",
        )

    @property
    def expired(self) -> int:
        return self.informer.expired

    def start(self) -> None:
        self.informer.start()

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        self._on_event(kind, {"apiVersion": self.resource.api_version, "kind": self.resource.kind, **obj})

    def stop(self) -> None:
        self.informer.stop()


def collection_path(resource: WatchedResource) -> str:
    """The kind's collection across namespaces: `/api/v1/pods`, `/apis/<group>/<version>/<plural>`."""
    group, version = resource.group_version
    if not group:
        if resource.kind != "Pod":
            raise ValueError(f"core kind {resource.kind} is not supported by the local source")
        return f"/api/{version}/pods"
    return f"/apis/{group}/{version}/{guess_plural(resource.kind)}"


class ApiServerSource:
    """Everything one ApiServerSource manifest watches, sent to `sink` (the broker)."""

    def __init__(
        self,
        manifest: Mapping[str, Any],
        api: client.ApiClient,
        sink: BrokerClient,
        source_url: str,
    ) -> None:
        spec = manifest.get("spec") or {}
        if spec.get("mode", "Reference") != "Resource":
            raise ValueError("only mode Resource is supported by the local ApiServerSource")
        self.name = str(manifest["metadata"]["name"])
        self.resources = [
            WatchedResource(r["apiVersion"], r["kind"], label_selector(r.get("selector")))
            for r in spec["resources"]
        ]
        own = str(manifest["metadata"].get("namespace", "default"))
        self._namespaces = _NamespaceFilter(client.CoreV1Api(api), own, spec.get("namespaceSelector"))
        self._sink = sink
        self.source_url = source_url
        self._watches = [_ResourceWatch(api, r, self._emit) for r in self.resources]
        self.sent = 0
        self.unsent = 0
        """Events the sink refused or never answered after every retry: lost, no dead letter."""

    @property
    def expired(self) -> int:
        """Watches of this source that expired (410 Gone) and were relisted without events."""
        return sum(w.expired for w in self._watches)

    def start(self) -> ApiServerSource:
        for w in self._watches:
            w.start()
        return self

    def stop(self) -> None:
        threads = [threading.Thread(target=w.stop, name="apiserversource-stop") for w in self._watches]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _emit(self, watch_type: str, obj: Mapping[str, Any]) -> None:
        namespace = (obj.get("metadata") or {}).get("namespace", "")
        if namespace and not self._namespaces.allows(namespace):
            return
        if self._sink.send(resource_event(VERBS[watch_type], obj, self.source_url)):
            self.sent += 1
        else:
            self.unsent += 1

"""An ApiServerSource (mode Resource) stand-in: watch kinds, send CloudEvents to a sink.

Mirrors knative/eventing `pkg/adapter/apiserver` (`events/events.go`, `delegate.go`):
- one watch per `spec.resources[]` entry (apiVersion, kind, label `selector`), in the
  namespaces `spec.namespaceSelector` selects (`{}` = all; absent = the source's own);
- ADDED/MODIFIED/DELETED -> `dev.knative.apiserver.resource.add|update|delete`, data = the
  whole object (last state on delete), `subject` `/apis/<apiVersion>/namespaces/<ns>/<plural>/
  <name>` (core kinds too: `/apis/v1/...`, the plural guessed from the kind), extensions
  `kind`, `apiversion`, `name`, `namespace`, `source` = the API server URL;
- the informer's `Replace()`/`Resync()` are no-ops: objects that exist when the source starts,
  and anything seen again by a relist after `410 Gone`, produce no event;
- status-subresource writes are MODIFIED events too, so our own patches come back as updates.
Watches resume from the last seen resourceVersion. Events go out in watch order per resource.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cloudevents.http import CloudEvent
from kubernetes import client, watch

from devstack.eventing.broker import BrokerClient

log = logging.getLogger("devstack.eventing.apiserversource")

VERBS = {"ADDED": "add", "MODIFIED": "update", "DELETED": "delete"}
WATCH_WINDOW_S = 5


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
        self._custom = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None
        self._rv = ""
        self.expired = 0
        """Watches that ended in 410 Gone: the events between were never sent (informer semantics)."""
        self._thread = threading.Thread(
            target=self._run, name=f"apiserversource-{resource.kind}", daemon=True
        )

    def _list_fn(self) -> Callable[..., Any]:
        group, version = self.resource.group_version
        if not group:
            if self.resource.kind != "Pod":
                raise ValueError(f"core kind {self.resource.kind} is not supported by the local source")
            list_pods: Callable[..., Any] = self._core.list_pod_for_all_namespaces
            return list_pods
        plural = guess_plural(self.resource.kind)

        def list_custom(**kwargs: Any) -> Any:
            return self._custom.list_cluster_custom_object(group, version, plural, **kwargs)

        return list_custom

    def _kwargs(self) -> dict[str, Any]:
        return {"label_selector": self.resource.selector} if self.resource.selector else {}

    def relist(self) -> None:
        """Informer Replace(): remember where the list is, emit nothing."""
        response = self._list_fn()(_preload_content=False, **self._kwargs())
        self._rv = json.loads(response.data)["metadata"]["resourceVersion"]

    def start(self) -> None:
        self.relist()
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for kind, obj in self._events():
                    self._on_event(kind, obj)
            except client.ApiException as err:
                if err.status == 410:
                    self.expired += 1
                    log.warning("%s watch expired (410): relisting without events", self.resource.kind)
                    self._relist_quietly()
                    continue
                log.warning("%s watch failed: %s", self.resource.kind, err)
                self._stop.wait(0.2)
            except Exception as err:
                if not self._stop.is_set():
                    log.warning("%s watch broke: %s", self.resource.kind, err)
                    self._stop.wait(0.2)

    def _relist_quietly(self) -> None:
        with contextlib.suppress(Exception):
            self.relist()

    def _events(self) -> Iterator[tuple[str, Any]]:
        self._watch = watch.Watch()
        stream = self._watch.stream(
            self._list_fn(),
            resource_version=self._rv,
            timeout_seconds=WATCH_WINDOW_S,
            allow_watch_bookmarks=True,
            **self._kwargs(),
        )
        for event in stream:
            if self._stop.is_set():
                return
            obj = event.get("raw_object") or {}
            self._rv = (obj.get("metadata") or {}).get("resourceVersion") or self._rv
            if event.get("type") in VERBS:
                yield (
                    event["type"],
                    {"apiVersion": self.resource.api_version, "kind": self.resource.kind, **obj},
                )

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
            response = getattr(self._watch, "_resp", None)
            if response is not None:
                with contextlib.suppress(Exception):
                    response.close()
        self._thread.join(timeout=WATCH_WINDOW_S + 2)


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
        for w in self._watches:
            w._stop.set()
        for w in self._watches:
            w.stop()

    def _emit(self, watch_type: str, obj: Mapping[str, Any]) -> None:
        namespace = (obj.get("metadata") or {}).get("namespace", "")
        if namespace and not self._namespaces.allows(namespace):
            return
        if self._sink.send(resource_event(VERBS[watch_type], obj, self.source_url)):
            self.sent += 1
        else:
            self.unsent += 1

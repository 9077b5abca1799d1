"""The embedded broker's Triggers, as the API server holds them: list+watch, not files.

Knative's multi-tenant broker never reads manifests. Its filter (`pkg/broker/filter/
filter_handler.go`) keeps a Trigger informer (list+watch of `triggers.eventing.knative.dev`):
the informer's add/update/delete handlers compile each Trigger's `spec.filters` into a map,
and every delivery looks its Trigger up in the informer's lister by namespace, name and uid
(`getTrigger`; a Trigger that is gone is answered 404), then applies the Trigger's current
filter. The trigger reconciler (`pkg/reconciler/broker/trigger/trigger.go`) takes the Triggers
whose `spec.broker` names a Broker in their own namespace, resolves `spec.subscriber` into
`status.subscriberUri` (a `uri` as is, a `ref` through the addressable it names), resolves the
dead-letter sink, and writes conditions (`Ready`, `SubscriberResolved`, ...) that `kubectl get
triggers` shows.

Here one `TriggerWatch` does both for the stack's Broker: its Informer (informer.py) watches
the Broker's namespace; every change recomputes the Triggers whose `spec.broker` is this
Broker (`Trigger.parse`: the Trigger's delivery, else the Broker's as read at each relist)
and swaps them into the Broker (`Broker.set_triggers`), so a `kubectl apply` of a Trigger
routes its events from the next publish and a `kubectl delete` stops them, pending retries
included. The first list at start is strict: a Trigger of the stack's own that cannot be
resolved fails the start. Later a Trigger that cannot be parsed or resolved is left without
delivery and says why in its `Ready` condition, as a cluster's would.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from devstack.eventing.broker import Broker
from devstack.eventing.informer import Connection, Informer, Obj
from devstack.eventing.triggers import Delivery, ManifestError, Trigger

log = logging.getLogger("devstack.eventing.triggerwatch")

GROUP_VERSION = "eventing.knative.dev/v1"


class TriggerWatch:
    """Keeps `broker`'s routes equal to the Triggers of `namespace` that name it."""

    def __init__(
        self, connection: Connection, broker: Broker, namespace: str, write_status: bool = True
    ) -> None:
        self.broker = broker
        self.namespace = namespace
        self.write_status = write_status
        self._objects: dict[str, Obj] = {}
        self._delivery = Delivery()
        self._strict = True
        self._lock = threading.Lock()
        base = f"/apis/{GROUP_VERSION}/namespaces/{namespace}"
        self._broker_path = f"{base}/brokers/{broker.name}"
        self._triggers_path = f"{base}/triggers"
        self.informer = Informer(
            connection, self._triggers_path, self._event, self._replace, name=f"broker-{broker.name}-triggers"
        )
        self._http = connection.client(10.0)

    def start(self) -> TriggerWatch:
        """List the Triggers and route by them before returning (strictly), then follow them."""
        self.informer.start()
        self._strict = False
        return self

    def stop(self) -> None:
        self.informer.stop()
        self._http.close()

    # -- the informer's handlers -------------------------------------------------------------------
    def _replace(self, items: Sequence[Obj]) -> None:
        self._delivery = self._broker_delivery()
        with self._lock:
            self._objects = {str(o["metadata"]["name"]): o for o in items}
        self._apply()

    def _event(self, kind: str, obj: Obj) -> None:
        name = str(obj["metadata"]["name"])
        with self._lock:
            if kind == "DELETED":
                self._objects.pop(name, None)
            else:
                self._objects[name] = obj
        self._apply()

    def _broker_delivery(self) -> Delivery:
        answer = self._http.get(self._broker_path)
        if answer.status_code != 200:
            log.warning(
                "Broker %s/%s not readable (%s): no delivery defaults",
                self.namespace,
                self.broker.name,
                answer.status_code,
            )
            return Delivery()
        return Delivery.parse((answer.json().get("spec") or {}).get("delivery"))

    # -- routes and status -------------------------------------------------------------------------
    def _apply(self) -> None:
        with self._lock:
            objects = [
                o for o in self._objects.values() if (o.get("spec") or {}).get("broker") == self.broker.name
            ]
        triggers: list[Trigger] = []
        problems: dict[str, str] = {}
        for obj in objects:
            try:
                triggers.append(Trigger.parse(obj, self._delivery))
            except ManifestError as err:
                if self._strict:
                    raise
                problems[str(obj["metadata"]["name"])] = f"invalid: {err}"
        outcome = {**self.broker.set_triggers(triggers, strict=self._strict), **problems}
        if self.write_status:
            for obj in objects:
                self._status(obj, outcome.get(str(obj["metadata"]["name"]), "unresolved"))

    def _status(self, obj: Mapping[str, Any], outcome: str) -> None:
        """Write what the trigger reconciler would, when it differs from what the object says."""
        meta, status = obj["metadata"], dict(obj.get("status") or {})
        ready = not outcome.startswith(("unresolved", "invalid"))
        conditions = {c.get("type"): c for c in status.get("conditions") or []}
        same = (
            status.get("observedGeneration") == meta.get("generation")
            and (conditions.get("Ready") or {}).get("status") == ("True" if ready else "False")
            and status.get("subscriberUri") == (outcome if ready else None)
        )
        if same:
            return
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        reason = (
            ""
            if ready
            else ("TriggerInvalid" if outcome.startswith("invalid") else "SubscriberResolveFailed")
        )

        def condition(type_: str, true: bool) -> dict[str, Any]:
            found = {"type": type_, "status": "True" if true else "False", "lastTransitionTime": now}
            old = conditions.get(type_) or {}
            if old.get("status") == found["status"] and old.get("lastTransitionTime"):
                found["lastTransitionTime"] = old["lastTransitionTime"]
            if not true:
                found |= {"reason": reason, "message": outcome.split(": ", 1)[-1]}
            return found

        patch = {
            "status": {
                "observedGeneration": meta.get("generation"),
                "subscriberUri": outcome if ready else None,
                "conditions": [
                    condition("BrokerReady", True),
                    condition("SubscriberResolved", ready),
                    condition("Ready", ready),
                ],
            }
        }
        answer = self._http.patch(
            f"{self._triggers_path}/{meta['name']}/status",
            json=patch,
            headers={"Content-Type": "application/merge-patch+json"},
        )
        if answer.status_code not in (200, 404):
            log.warning(
                "Trigger %s status not written: %s %s", meta["name"], answer.status_code, answer.text[:200]
            )

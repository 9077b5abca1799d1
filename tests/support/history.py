"""Every version of a namespace's objects that the API server committed, as a watch sees them.

    with History(stack.kube.plane, VLLM_ADAPTER, namespace) as history:
        ...                       # the scenario
    history.events                # [(resourceVersion, type, object)], in commit order

A watch from the resourceVersion of a list made at the start delivers each committed version
(etcd keeps every revision until compaction), so nothing written in between is missed."""

from __future__ import annotations

import json
import threading
from typing import Any

from devstack.kubernetes import ControlPlane
from functions.resources.kinds import Kind


class History:
    def __init__(self, plane: ControlPlane, kind: Kind, namespace: str) -> None:
        self.path = f"/apis/{kind.group}/{kind.version}/namespaces/{namespace}/{kind.plural}"
        self.plane = plane
        self.events: list[tuple[int, str, dict[str, Any]]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> History:
        with self.plane.http() as http:
            since = http.get(self.path).raise_for_status().json()["metadata"]["resourceVersion"]
        self._thread = threading.Thread(target=self._follow, args=(since,), daemon=True, name="history")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _follow(self, since: str) -> None:
        params = {"watch": "1", "resourceVersion": since, "timeoutSeconds": "1"}
        while not self._stop.is_set():
            with self.plane.http(timeout=10) as http, http.stream("GET", self.path, params=params) as answer:
                for line in answer.iter_lines():
                    if not line:
                        continue
                    event = json.loads(line)
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        raise RuntimeError(f"the history's watch ended: {obj}")
                    version = obj["metadata"]["resourceVersion"]
                    params["resourceVersion"] = version
                    self.events.append((int(version), event["type"], obj))

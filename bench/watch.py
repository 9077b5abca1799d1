"""What the benchmarks wait for, as a client of the real API server sees it: a watch.

`Conditions` follows one namespace's objects of a kind with one watch (a list, then
`watch=1` from its resourceVersion, bookmarks on, a relist after 410 Gone) and keeps each
object's conditions by type; a probe polling GETs every millisecond would cost the server it
measures far more. What it reports lags a write by the watch's delivery (a few ms on loopback).
`wait` wakes its caller as each change is recorded: a caller polling `get` every millisecond
would take this interpreter's lock a thousand times a second from whatever else runs in it
(the broker and the engine stand-ins).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from devstack.kubernetes import ControlPlane
from functions.resources.kinds import VLLM_ADAPTER, Kind


class Conditions:
    """Each object's conditions ({type: status}) in `namespace`, as the watch last said."""

    def __init__(self, plane: ControlPlane, namespace: str, kind: Kind = VLLM_ADAPTER) -> None:
        prefix = f"/apis/{kind.group}/{kind.version}" if kind.group else f"/api/{kind.version}"
        self._path = f"{prefix}/namespaces/{namespace}/{kind.plural}"
        self._http = plane.http(timeout=30)
        self._seen: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._follow, name=f"watch-{kind.plural}", daemon=True)
        self._version = self._list()
        self._thread.start()

    def get(self, name: str) -> dict[str, str]:
        with self._lock:
            return dict(self._seen.get(name, {}))

    def wait(
        self, name: str, until: Callable[[dict[str, str]], bool], timeout: float
    ) -> dict[str, str] | None:
        """`name`'s conditions once `until` holds for them (None after `timeout` seconds)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not until(conditions := self._seen.get(name, {})):
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._changed.wait(left)
            return dict(conditions)

    def close(self) -> None:
        self._stopped.set()
        with contextlib.suppress(Exception):
            self._http.close()
        self._thread.join(5)

    def __enter__(self) -> Conditions:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _record(self, obj: dict[str, Any], deleted: bool = False) -> None:
        name = str(obj["metadata"]["name"])
        with self._lock:
            if deleted:
                self._seen.pop(name, None)
            else:
                conditions = (obj.get("status") or {}).get("conditions") or []
                self._seen[name] = {str(c.get("type")): str(c.get("status")) for c in conditions}
            self._changed.notify_all()

    def _list(self) -> str:
        answer = self._http.get(self._path)
        answer.raise_for_status()
        listing = answer.json()
        with self._lock:
            self._seen.clear()
        for obj in listing.get("items") or []:
            self._record(obj)
        return str(listing["metadata"]["resourceVersion"])

    def _follow(self) -> None:
        params = {"watch": "1", "allowWatchBookmarks": "true"}
        while not self._stopped.is_set():
            try:
                with self._http.stream(
                    "GET",
                    self._path,
                    params={**params, "resourceVersion": self._version},
                    timeout=httpx.Timeout(30, read=None),
                ) as stream:
                    for line in stream.iter_lines():
                        if line:
                            self._event(json.loads(line))
            except Exception:
                if self._stopped.is_set():
                    return
                with contextlib.suppress(Exception):
                    self._version = self._list()

    def _event(self, event: dict[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":  # 410 Gone: the version left the server's window
            raise RuntimeError(f"watch ended: {obj.get('message')}")
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if version:
            self._version = str(version)
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            self._record(obj, deleted=kind == "DELETED")

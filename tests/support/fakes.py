"""In-memory fakes of the ports (functions/ports.py), for the handler tier (tests/handlers).

"We do not test the clients, we test the layers on top of them" (kopf): the stand-ins and the
real SeaweedFS test the clients; these let every handler run in microseconds, typed against the
same Protocols as production (mypy checks them), with just the behaviour the handlers rely on:
- FakeKube: objects by kind/namespace/name, a resourceVersion per write, `write_status` and
  `write_finalizers` with the real client's contract (the desired function sees the current
  object; a no-op write is skipped), equality label selectors, and the Events recorded;
  `meddle` makes another writer win the race to a guarded write (a 409 and a re-read).
- `watch_callbacks`: the port calls made while a guarded write's callback runs (a callback
  may run again after a 409 with a newer object: it should only decide).
- FakeEngines: vLLM/SGLang as loraflow sees them: a listing of name -> root, "already loaded"
  on a duplicate load (unless in place), "not found" on an unknown unload as success.
- FakeStorage and FakeBroker: files by path; events published.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from cloudevents.http import CloudEvent

from functions.errors import KubeConflict
from functions.logic import reasons
from functions.logic.capacity import Capacity
from functions.logic.pods import Endpoint
from functions.logic.serving import ListingFailure
from functions.ports import CallResult, FinalizersFn, PageSize, StatusFn, StoredFile, Written
from functions.resources.kinds import Kind

Obj = dict[str, Any]
WRITE_ATTEMPTS = 5
"""Attempts of a guarded write before it gives up with KubeConflict, as in the real client."""


class FakeKube:
    def __init__(self, *objects: Obj) -> None:
        self.objects: dict[tuple[str, str, str], Obj] = {}
        self.events: list[tuple[str, str, str, str]] = []
        """(object name, type, reason, message) of every Event recorded."""
        self.writes = 0
        self.conflicts = 0
        """Guarded write attempts refused because another writer changed the object first."""
        self._version = 0
        self._meddlers: dict[tuple[tuple[str, str, str], str], list[Callable[[Obj], None]]] = {}
        for obj in objects:
            self.put(obj)

    @staticmethod
    def _kind_of(obj: Obj) -> str:
        return f"{obj['apiVersion']}/{obj['kind']}"

    def put(self, obj: Obj) -> Obj:
        """Create or replace an object as a user would (the test's own writes)."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        self._version += 1
        meta["resourceVersion"] = str(self._version)
        meta.setdefault("generation", 1)
        meta.setdefault("uid", f"uid-{meta['name']}")
        meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
        self.objects[(self._kind_of(obj), meta.get("namespace", ""), meta["name"])] = obj
        return obj

    def delete(self, kind: Kind, namespace: str, name: str) -> None:
        """Delete as the API server does: with finalizers, only a deletionTimestamp is set."""
        key = (f"{kind.api_version}/{kind.kind}", namespace, name)
        obj = self.objects[key]
        if obj["metadata"].get("finalizers"):
            obj["metadata"]["deletionTimestamp"] = "2026-01-02T00:00:00Z"
        else:
            del self.objects[key]

    def _key(self, kind: Kind, namespace: str, name: str) -> tuple[str, str, str]:
        return (f"{kind.api_version}/{kind.kind}", namespace, name)

    def meddle(
        self,
        kind: Kind,
        namespace: str,
        name: str,
        change: Callable[[Obj], None],
        times: int = 1,
        write: Literal["status", "finalizers"] = "status",
    ) -> None:
        """Another writer applies `change` to the object between the next guarded `write`'s read
        and its patch, `times` times: each of those attempts is computed from the object it read,
        meets a 409, and the write starts again from a fresh read (WRITE_ATTEMPTS in all)."""
        self._meddlers.setdefault((self._key(kind, namespace, name), write), []).extend([change] * times)

    def _lose_races(
        self, key: tuple[str, str, str], write: str, change: Callable[[Obj], Obj | None]
    ) -> Written | None:
        """The attempts that other writers beat (`meddle`); a Written when one sent no patch."""
        for attempt, meddler in enumerate(self._meddlers.pop((key, write), []), 1):
            current = self.objects.get(key)
            if current is None:
                return None
            read = copy.deepcopy(current)
            after = change(copy.deepcopy(read))
            meddler(current)
            self._version += 1
            current["metadata"]["resourceVersion"] = str(self._version)
            if after is None or after == read:
                return Written(read, changed=False, before=read)  # no patch sent: nothing refused
            self.conflicts += 1
            if attempt >= WRITE_ATTEMPTS:
                raise KubeConflict(f"{key[2]} kept changing under us ({WRITE_ATTEMPTS} attempts)")
        return None

    @property
    def server(self) -> tuple[str, int] | None:
        return ("10.96.0.1", 443)

    def get(self, kind: Kind, namespace: str, name: str) -> Obj | None:
        found = self.objects.get(self._key(kind, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def iter(
        self,
        kind: Kind,
        namespace: str | None = None,
        label_selector: str | None = None,
        page_size: PageSize = 500,
    ) -> Iterator[Obj]:
        wanted = dict(part.split("=", 1) for part in (label_selector or "").split(",") if part)
        # in etcd's key order (.../<namespace>/<name> as bytes): "ns-a/x" before "ns/x"
        for (k, ns, _), obj in sorted(
            self.objects.items(), key=lambda item: (item[0][0], "/".join(item[0][1:]))
        ):
            if k != f"{kind.api_version}/{kind.kind}" or (namespace is not None and ns != namespace):
                continue
            labels = obj["metadata"].get("labels") or {}
            if all(labels.get(key) == value for key, value in wanted.items()):
                yield copy.deepcopy(obj)

    def list_all(
        self,
        kind: Kind,
        namespace: str | None = None,
        label_selector: str | None = None,
        page_size: int = 500,
    ) -> list[Obj]:
        return list(self.iter(kind, namespace, label_selector, page_size))

    def _write(
        self,
        kind: Kind,
        namespace: str,
        name: str,
        change: Callable[[Obj], Obj | None],
        write: Literal["status", "finalizers"] = "status",
    ) -> Written | None:
        key = self._key(kind, namespace, name)
        lost = self._lose_races(key, write, change)
        if lost is not None:
            return lost
        current = self.objects.get(key)
        if current is None:
            return None
        before = copy.deepcopy(current)
        after = change(copy.deepcopy(current))
        if after is None or after == current:
            return Written(before, changed=False, before=before)
        self._version += 1
        after["metadata"]["resourceVersion"] = str(self._version)
        self.objects[key] = after
        self.writes += 1
        if after["metadata"].get("deletionTimestamp") and not after["metadata"].get("finalizers"):
            del self.objects[key]
        return Written(copy.deepcopy(after), changed=True, before=before)

    def write_status(
        self, kind: Kind, namespace: str, name: str, desired: StatusFn, current: Obj | None = None
    ) -> Written | None:
        def change(obj: Obj) -> Obj | None:
            status = desired(obj)
            return None if status is None else {**obj, "status": status}

        return self._write(kind, namespace, name, change)

    def write_finalizers(
        self, kind: Kind, namespace: str, name: str, desired: FinalizersFn, current: Obj | None = None
    ) -> Written | None:
        def change(obj: Obj) -> Obj | None:
            wanted = desired(obj)
            if wanted is None:
                return None
            return {**obj, "metadata": {**obj["metadata"], "finalizers": wanted}}

        return self._write(kind, namespace, name, change, "finalizers")

    def record_event(
        self, obj: Obj, event_type: str, reason: str, message: str, component: str, now: datetime
    ) -> None:
        self.events.append((obj["metadata"]["name"], event_type, reason, message))


@dataclass
class FakeEngine:
    runtime: str
    loaded: dict[str, str] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)
    """(operation, name) in order."""
    listing_answer: dict[str, str] | ListingFailure | None = None
    """When set, what `listing` answers instead of the truth (a hostile or broken pod)."""
    fail: dict[str, CallResult] = field(default_factory=dict)
    """operation -> the failure it answers."""
    reports: Capacity | None = None
    """What `capacity` answers (SGLang's server info)."""
    slots: int | None = None
    """sglang: max_loaded_loras as the LRU release enforces it (a load past it evicts the first
    loaded, and the name leaves the listing); None: no limit."""
    evicted: list[str] = field(default_factory=list)


class FakeEngines:
    def __init__(self) -> None:
        self.pods: dict[str, FakeEngine] = {}

    def engine(self, url: str, runtime: str = "vllm") -> FakeEngine:
        return self.pods.setdefault(url, FakeEngine(runtime))

    def healthy(self, endpoint: Endpoint) -> bool:
        return True

    def listing(self, endpoint: Endpoint) -> dict[str, str] | ListingFailure:
        engine = self.engine(endpoint.url, endpoint.runtime)
        engine.calls.append(("list", ""))
        if engine.listing_answer is not None:
            return engine.listing_answer
        return dict(engine.loaded)

    def capacity(self, endpoint: Endpoint) -> Capacity | None:
        engine = self.engine(endpoint.url, endpoint.runtime)
        engine.calls.append(("info", ""))
        return engine.reports

    def load(self, endpoint: Endpoint, name: str, path: str, inplace: bool = False) -> CallResult:
        engine = self.engine(endpoint.url, endpoint.runtime)
        engine.calls.append(("load-inplace" if inplace else "load", name))
        if "load" in engine.fail:
            return engine.fail["load"]
        if name in engine.loaded and not inplace:
            return CallResult(
                True, reasons.POD_ALREADY_LOADED, f"The lora adapter '{name}' has already been loaded."
            )
        engine.loaded[name] = path
        while engine.slots is not None and len(engine.loaded) > engine.slots:
            victim = next(iter(engine.loaded))
            del engine.loaded[victim]
            engine.evicted.append(victim)
        return CallResult(True, reasons.POD_LOADED)

    def unload(self, endpoint: Endpoint, name: str) -> CallResult:
        engine = self.engine(endpoint.url, endpoint.runtime)
        engine.calls.append(("unload", name))
        if "unload" in engine.fail:
            return engine.fail["unload"]
        if engine.loaded.pop(name, None) is None:
            return CallResult(True, reasons.POD_NOT_LOADED, f"The lora adapter '{name}' cannot be found.")
        return CallResult(True, reasons.POD_UNLOADED)

    def replace(self, endpoint: Endpoint, name: str, path: str) -> CallResult:
        if endpoint.runtime == "vllm":
            result = self.load(endpoint, name, path, inplace=True)
        else:
            self.unload(endpoint, name)
            result = self.load(endpoint, name, path)
        return CallResult(True, reasons.POD_REPLACED) if result.ok else result


class FakeStorage:
    def __init__(self, files: Mapping[str, bytes] | None = None) -> None:
        self.files = dict(files or {})

    def stat_dir(self, directory: str) -> list[StoredFile]:
        prefix = directory.rstrip("/") + "/"
        return [
            StoredFile(path, len(content), hashlib.md5(content, usedforsecurity=False).hexdigest())
            for path, content in sorted(self.files.items())
            if path.startswith(prefix)
        ]

    def hash_file(self, path: str, max_bytes: int) -> str | None:
        content = self.files.get(path)
        if content is None or len(content) > max_bytes:
            return None
        return hashlib.md5(content, usedforsecurity=False).hexdigest()

    def read_small(self, path: str, max_bytes: int) -> bytes | None:
        content = self.files.get(path)
        return None if content is None or len(content) > max_bytes else content

    copy_checks_md5 = False

    def copy_file(self, source: str, target: str, size: int, md5: str) -> bool:
        content = self.files.get(source)
        if content is None or len(content) != size:
            return False
        self.files[target] = content
        return True

    def delete_tree(self, directory: str) -> None:
        prefix = directory.rstrip("/") + "/"
        for path in [p for p in self.files if p.startswith(prefix)]:
            del self.files[path]


class FakeConfigs:
    def __init__(self, storage: FakeStorage) -> None:
        self.storage = storage

    def get(self, path: str, md5: str | None) -> bytes | None:
        return self.storage.read_small(path, 1 << 20)


class FakeBroker:
    def __init__(self) -> None:
        self.events: list[CloudEvent] = []

    def publish(self, event: CloudEvent, timeout: float | None = None) -> None:
        self.events.append(event)


def watch_callbacks(kube: FakeKube, *ports: object) -> list[str]:
    """Every call to a method of `kube` or `ports` made while one of `kube`'s guarded write
    callbacks runs, as `Class.method`, in the list returned (it stays empty when they only
    decide)."""
    inside: list[bool] = []
    made: list[str] = []

    def watched(port: object, method: str) -> None:
        call = getattr(port, method)

        def recorded(*args: Any, **kwargs: Any) -> Any:
            if inside:
                made.append(f"{type(port).__name__}.{method}")
            return call(*args, **kwargs)

        setattr(port, method, recorded)

    for port in (kube, *ports):
        for method in dir(port):
            if not method.startswith("_") and callable(getattr(port, method)):
                watched(port, method)

    def guarded(write: Callable[..., Written | None]) -> Callable[..., Written | None]:
        def run(kind: Kind, namespace: str, name: str, desired: Callable[[Obj], Any], **options: Any) -> Any:
            def deciding(obj: Obj) -> Any:
                inside.append(True)
                try:
                    return desired(obj)
                finally:
                    inside.pop()

            return write(kind, namespace, name, deciding, **options)

        return run

    kube.write_status = guarded(kube.write_status)  # type: ignore[method-assign]
    kube.write_finalizers = guarded(kube.write_finalizers)  # type: ignore[method-assign]
    return made

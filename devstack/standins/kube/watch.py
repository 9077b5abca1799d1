"""Watch streams: replay from a resourceVersion, synthetic ADDED, live events, bookmarks."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from devstack.standins.kube import errors
from devstack.standins.kube.resources import ResourceType
from devstack.standins.kube.store import Store, WatchEvent

JSON = dict[str, Any]
Predicate = Callable[[JSON], bool]
Render = Callable[[JSON, bool], JSON]
POLL_S = 0.25


@dataclass
class WatchSpec:
    """What one watch request asked for."""

    rtype: ResourceType
    namespace: str | None
    predicate: Predicate
    resource_version: str
    bookmarks: bool
    timeout_s: float | None
    bookmark_interval_s: float


def _line(event_type: str, obj: JSON) -> bytes:
    return json.dumps({"type": event_type, "object": obj}, separators=(",", ":")).encode() + b"\n"


def _in_scope(spec: WatchSpec, obj: JSON | None) -> bool:
    if obj is None:
        return False
    if spec.namespace is not None and obj["metadata"].get("namespace", "") != spec.namespace:
        return False
    return spec.predicate(obj)


def translate(spec: WatchSpec, event: WatchEvent) -> str | None:
    """Watch-cache filtering: an object entering the selector is ADDED, leaving it DELETED."""
    now_in = _in_scope(spec, event.obj)
    if event.type == "DELETED":
        return "DELETED" if now_in or _in_scope(spec, event.prev) else None
    was_in = event.type == "MODIFIED" and _in_scope(spec, event.prev)
    if now_in:
        return "MODIFIED" if was_in else "ADDED"
    return "DELETED" if was_in else None


class WatchStream:
    """Yields newline-delimited watch events until timeout, client gone or server stop."""

    def __init__(self, store: Store, spec: WatchSpec, render: Render) -> None:
        self.store, self.spec, self.render = store, spec, render
        self._first = True
        self._initial: list[bytes] = []
        self._cursor = 0

    def open(self) -> WatchStream:
        """Resolve the starting point before any byte is sent (errors become plain Status)."""
        self._initial, self._cursor = self._start()
        return self

    def _render(self, obj: JSON) -> JSON:
        rendered = self.render(obj, self._first)
        self._first = False
        return rendered

    def _start(self) -> tuple[list[bytes], int]:
        """No resourceVersion (or "0"): synthetic ADDED for existing objects, then live."""
        rv_text = self.spec.resource_version
        if rv_text in ("", "0"):
            items, rv = self.store.list_objects(self.spec.rtype, self.spec.namespace)
            lines = [_line("ADDED", self._render(o)) for o in items if _in_scope(self.spec, o)]
            return lines, rv
        try:
            return [], int(rv_text)
        except ValueError as exc:
            raise errors.bad_request(f"invalid resource version: {rv_text}") from exc

    def _too_old(self, rv: int) -> bytes:
        """apiserver watch cache: a 410 Expired ERROR event for a compacted resourceVersion."""
        error = errors.expired(f"too old resource version: {rv} ({self.store.oldest_rv()})")
        return _line("ERROR", error.body())

    def _bookmark(self, rv: int) -> bytes:
        obj = {
            "kind": self.spec.rtype.kind,
            "apiVersion": self.spec.rtype.api_version,
            "metadata": {"resourceVersion": str(rv)},
        }
        return _line("BOOKMARK", obj)

    def lines(self, alive: Callable[[], bool]) -> Iterator[bytes]:
        cursor = self._cursor
        yield from self._initial
        self._initial = []
        deadline = None if self.spec.timeout_s is None else time.monotonic() + self.spec.timeout_s
        last_sent = time.monotonic()
        while not self.store.closed and alive():
            events = self.store.events_after(cursor)
            if events is None:
                yield self._too_old(cursor)
                return
            for event in events:
                cursor = event.rv
                if event.key != self.spec.rtype.key:
                    continue
                event_type = translate(self.spec, event)
                if event_type is not None:
                    last_sent = time.monotonic()
                    yield _line(event_type, self._render(event.obj))
            if deadline is not None and time.monotonic() >= deadline:
                return
            if self.spec.bookmarks and time.monotonic() - last_sent >= self.spec.bookmark_interval_s:
                last_sent = time.monotonic()
                yield self._bookmark(max(cursor, self.store.resource_version))
            self._wait(cursor, deadline)

    def _wait(self, cursor: int, deadline: float | None) -> None:
        timeout = POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.monotonic()))
        changed = self.store.changed(self.spec.rtype.key)  # woken by this resource's writes only
        with changed:
            if self.store.resource_version <= cursor and not self.store.closed:
                changed.wait(timeout)

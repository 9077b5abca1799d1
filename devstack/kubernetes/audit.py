"""The API server's own record of the requests it answered: its audit log, read back.

kube-apiserver writes one JSON line per request at the ResponseComplete stage (the policy
`AUDIT_POLICY` below: Metadata level, the earlier stages omitted), with the user, the verb, the
resource and subresource, the answer's code and the authorizer's decision. Counting requests
there, not in a client, is what makes a figure the server's. The line is written as the
handler returns, a moment after the client has its answer: readers wait until the log has
stopped growing."""

from __future__ import annotations

import bisect
import json
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

SERVICE_ACCOUNT_USER = b'"username":"system:serviceaccount:'
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
  - level: Metadata
"""


class AuthorizedRequest(NamedTuple):
    """One (user, verb, group, resource, subresource) the authorizer allowed."""

    user: str
    verb: str
    group: str
    resource: str
    subresource: str


@dataclass(frozen=True)
class Request:
    """One audited resource request."""

    user: str
    verb: str
    group: str
    resource: str
    subresource: str
    namespace: str
    code: int
    decision: str
    """The authorizer's: "allow", "forbid", or "" where none was asked."""
    seconds: float
    """From the server's receiving the request to its answer's end."""
    received: float = 0.0
    """When the server received it (seconds since the epoch; 0 where the log does not say)."""

    @property
    def allowed(self) -> bool:
        return self.decision == "allow"

    @property
    def key(self) -> tuple[str, str]:
        """(verb, resource[/subresource]), e.g. ("patch", "loraadapters/status")."""
        return self.verb, f"{self.resource}/{self.subresource}" if self.subresource else self.resource


def time_on_server(requests: Iterable[Request]) -> float:
    """Seconds during which at least one of `requests` was on the server: what a client making
    them, some side by side, waited on it (their summed `seconds` counts an overlap twice). A
    watch is left out: it stays open while its client does other things."""
    covered, reach = 0.0, float("-inf")
    spans = sorted((r.received, r.received + r.seconds) for r in requests if r.verb != "watch")
    for start, end in spans:
        if end > reach:
            covered += end - max(start, reach)
            reach = end
    return covered


def _timing(entry: dict[str, Any]) -> tuple[float, float]:
    """(when the server received the request, seconds until its answer's end); 0 for what the
    entry does not say."""
    started, finished = entry.get("requestReceivedTimestamp"), entry.get("stageTimestamp")
    received = _epoch(started) if started else 0.0
    return received, (_epoch(finished) - received if started and finished else 0.0)


def _epoch(stamp: str) -> float:
    """RFC 3339 with microseconds ("2026-12-03T09:00:00.123456Z") to seconds."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    seconds = time.mktime(time.strptime(whole, "%Y-%m-%dT%H:%M:%S"))
    return seconds + (float("0." + fraction) if fraction else 0.0)


def parse(line: str) -> Request | None:
    """A resource request's entry; None for a non-resource URL (/readyz, /version, discovery)."""
    entry = json.loads(line)
    ref = entry.get("objectRef")
    if not ref or not ref.get("resource"):
        return None
    annotations = entry.get("annotations") or {}
    received, seconds = _timing(entry)
    return Request(
        user=str((entry.get("user") or {}).get("username", "")),
        verb=str(entry.get("verb", "")),
        group=str(ref.get("apiGroup", "")),
        resource=str(ref["resource"]),
        subresource=str(ref.get("subresource", "")),
        namespace=str(ref.get("namespace", "")),
        code=int((entry.get("responseStatus") or {}).get("code", 0)),
        decision=str(annotations.get("authorization.k8s.io/decision", "")),
        seconds=seconds,
        received=received,
    )


class AuditLog:
    """The audit log of one kube-apiserver; `mark()` and `since(mark)` bracket a piece of work.

    What it answers is the ServiceAccounts' requests (the functions', the sources'): the
    admin's and kubectl's setup is skipped unparsed. The log is read once, incrementally, so a
    test session's thousands of questions cost what was written since the last one."""

    def __init__(self, path: Path, quiet_s: float = 0.05) -> None:
        self.path = path
        self.quiet_s = quiet_s
        self._parsed = 0
        self._offsets: list[int] = []
        self._requests: list[Request] = []
        self._lock = threading.Lock()

    def _size(self) -> int:
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def settled_size(self, timeout: float = 5.0) -> int:
        """The log's size once it has not grown for `quiet_s` (the last answers' lines are in)."""
        deadline = time.monotonic() + timeout
        size, quiet_since = self._size(), time.monotonic()
        while time.monotonic() < deadline and time.monotonic() - quiet_since < self.quiet_s:
            time.sleep(0.01)
            now = self._size()
            if now != size:
                size, quiet_since = now, time.monotonic()
        return size

    def mark(self) -> int:
        """Where the log stands now: what `since` counts from."""
        return self.settled_size()

    def _read_to(self, end: int) -> None:
        if end <= self._parsed:
            return
        with self.path.open("rb") as log:
            log.seek(self._parsed)
            chunk = log.read(end - self._parsed)
        complete = chunk.rfind(b"\n") + 1  # a line still being written waits for the next read
        offset = self._parsed
        for raw in chunk[:complete].splitlines(keepends=True):
            if SERVICE_ACCOUNT_USER in raw and (found := parse(raw.decode())) is not None:
                self._offsets.append(offset)
                self._requests.append(found)
            offset += len(raw)
        self._parsed += complete

    def since(self, mark: int = 0) -> list[Request]:
        """The ServiceAccounts' resource requests logged from `mark` on."""
        end = self.settled_size()
        with self._lock:
            self._read_to(end)
            return self._requests[bisect.bisect_left(self._offsets, mark) :]

    def counts(self, mark: int = 0, user_prefix: str = "") -> Counter[tuple[str, str]]:
        """Requests by (verb, resource[/subresource]) since `mark`, of users named `user_prefix*`."""
        return Counter(r.key for r in self.since(mark) if r.user.startswith(user_prefix))

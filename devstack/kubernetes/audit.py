"""The API server's own record of the requests it answered: its audit log, read back.

kube-apiserver writes one JSON line per request at the ResponseComplete stage (the policy
`AUDIT_POLICY` below: Metadata level, the earlier stages omitted), with the user, the verb, the
resource and subresource, the answer's code and the authorizer's decision. Counting requests
there, not in a client, is what makes a figure the server's. The line is written as the
handler returns, a moment after the client has its answer: readers wait until the log has
stopped growing."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

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

    @property
    def allowed(self) -> bool:
        return self.decision == "allow"

    @property
    def key(self) -> tuple[str, str]:
        """(verb, resource[/subresource]), e.g. ("patch", "loraadapters/status")."""
        return self.verb, f"{self.resource}/{self.subresource}" if self.subresource else self.resource


def _seconds(entry: dict[str, Any]) -> float:
    started, finished = entry.get("requestReceivedTimestamp"), entry.get("stageTimestamp")
    if not started or not finished:
        return 0.0
    return _epoch(finished) - _epoch(started)


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
    return Request(
        user=str((entry.get("user") or {}).get("username", "")),
        verb=str(entry.get("verb", "")),
        group=str(ref.get("apiGroup", "")),
        resource=str(ref["resource"]),
        subresource=str(ref.get("subresource", "")),
        namespace=str(ref.get("namespace", "")),
        code=int((entry.get("responseStatus") or {}).get("code", 0)),
        decision=str(annotations.get("authorization.k8s.io/decision", "")),
        seconds=_seconds(entry),
    )


class AuditLog:
    """The audit log of one kube-apiserver; `mark()` and `since(mark)` bracket a piece of work."""

    def __init__(self, path: Path, quiet_s: float = 0.15) -> None:
        self.path = path
        self.quiet_s = quiet_s

    def _size(self) -> int:
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def settled_size(self, timeout: float = 5.0) -> int:
        """The log's size once it has not grown for `quiet_s` (the last answers' lines are in)."""
        deadline = time.monotonic() + timeout
        size = self._size()
        while time.monotonic() < deadline:
            time.sleep(self.quiet_s)
            now = self._size()
            if now == size:
                return size
            size = now
        return size

    def mark(self) -> int:
        """Where the log stands now: what `since` counts from."""
        return self.settled_size()

    def since(self, mark: int = 0) -> Iterator[Request]:
        end = self.settled_size()
        with self.path.open("rb") as log:
            log.seek(mark)
            for raw in log.read(end - mark).splitlines():
                if raw.strip() and (found := parse(raw.decode())) is not None:
                    yield found

    def counts(self, mark: int = 0, user_prefix: str = "") -> Counter[tuple[str, str]]:
        """Requests by (verb, resource[/subresource]) since `mark`, of users named `user_prefix*`."""
        return Counter(r.key for r in self.since(mark) if r.user.startswith(user_prefix))

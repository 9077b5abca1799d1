"""Fault injection for tests and benchmarks: forced error statuses and added latency."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from devstack.standins.kube import errors
from devstack.standins.kube.errors import ApiError

_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    409: "Conflict",
    410: "Expired",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


@dataclass
class Fault:
    """Matches requests by verb/resource (None = any); `times=None` never runs out."""

    status: int | None = None
    times: int | None = 1
    verb: str | None = None
    resource: str | None = None
    delay_s: float = 0.0
    hits: int = 0

    def matches(self, verb: str, resource: str) -> bool:
        return (
            (self.verb in (None, verb))
            and (self.resource in (None, resource))
            and (self.times is None or self.hits < self.times)
        )

    def error(self, group: str, resource: str, name: str) -> ApiError | None:
        """The injected Status; 409 mirrors the optimistic-lock conflict, 429 sets Retry-After."""
        if self.status is None:
            return None
        if self.status == 409:
            return errors.conflict(group, resource.split("/")[0], name or "unknown")
        if self.status == 500:
            return errors.internal("injected fault")
        error = ApiError(self.status, _REASONS.get(self.status, "Unknown"), f"injected fault ({self.status})")
        if self.status == 429:
            error.headers["Retry-After"] = "1"
        return error


class Faults:
    """The active faults; the first matching one is consumed per request."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.active: list[Fault] = []

    def add(self, fault: Fault) -> Fault:
        with self._lock:
            self.active.append(fault)
        return fault

    def take(self, verb: str, resource: str) -> Fault | None:
        if not self.active:
            return None
        with self._lock:
            for fault in self.active:
                if fault.matches(verb, resource):
                    fault.hits += 1
                    return fault
        return None

    def clear(self) -> None:
        with self._lock:
            self.active.clear()

    def __len__(self) -> int:
        return len(self.active)

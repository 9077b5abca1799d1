"""Injected faults for the engine stand-ins.

Nothing here mirrors upstream code: faults model what a cluster does to an engine pod
(HTTP errors, slow answers, connections reset, the container restarting mid-request).

A fault matches engine routes by name (``load``, ``unload``, ``models``, ``health``,
``completion``, ``info``) and is
consumed ``times`` times (``None`` = until cleared). Wire form (``POST /_devstack/faults``)::

    {"status": 500, "times": 3, "routes": ["load"]}     # answer 500 (engine-shaped error body)
    {"delay_s": 5, "times": 1}                           # answer late (client timeout)
    {"refuse": true, "times": 2}                         # reset the connection, no answer
    {"restart_mid_load": true}                           # forget everything during the next
                                                         # load, then drop the connection
    {"restart_mid_load": true, "status": 500}            # ... or answer 500 instead

Keys may be combined: ``delay_s`` is applied first, then ``refuse``, then
``restart_mid_load``, then ``status``. ``times`` absent means 1, ``null`` means unlimited.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

ROUTES = frozenset({"load", "unload", "models", "health", "completion", "info"})


class FaultSpecError(ValueError):
    """A fault specification that cannot be honoured."""


@dataclass
class Fault:
    """One injected fault (see module docstring for the semantics)."""

    status: int | None = None
    delay_s: float = 0.0
    refuse: bool = False
    restart_mid_load: bool = False
    unhealthy_for_s: float = 0.0
    times: int | None = 1
    routes: frozenset[str] | None = None
    message: str = "Injected fault (devstack)."
    fired: int = field(default=0, compare=False)

    def __post_init__(self) -> None:
        if self.routes is not None:
            self.routes = frozenset(self.routes)
            unknown = self.routes - ROUTES
            if unknown:
                raise FaultSpecError(f"unknown routes {sorted(unknown)}; known {sorted(ROUTES)}")
        elif self.restart_mid_load:
            self.routes = frozenset({"load"})
        if self.status is not None and not 100 <= self.status <= 599:
            raise FaultSpecError(f"status {self.status} is not an HTTP status")
        if self.delay_s < 0 or self.unhealthy_for_s < 0:
            raise FaultSpecError("delay_s and unhealthy_for_s must be >= 0")
        if self.times is not None and self.times < 1:
            raise FaultSpecError("times must be >= 1 (or null for unlimited)")
        if not (self.status or self.delay_s or self.refuse or self.restart_mid_load):
            raise FaultSpecError("a fault needs one of status, delay_s, refuse, restart_mid_load")

    def matches(self, route: str) -> bool:
        return self.routes is None or route in self.routes

    @classmethod
    def from_json(cls, data: Any) -> Fault:
        """Build a fault from its wire form; raises FaultSpecError on bad input."""
        if not isinstance(data, dict):
            raise FaultSpecError("a fault is a JSON object")
        allowed = {
            "status",
            "delay_s",
            "refuse",
            "restart_mid_load",
            "unhealthy_for_s",
            "times",
            "routes",
            "message",
        }
        extra = set(data) - allowed
        if extra:
            raise FaultSpecError(f"unknown fault keys {sorted(extra)}")
        try:
            routes = data.get("routes")
            if routes is not None and (
                not isinstance(routes, list) or not all(isinstance(r, str) for r in routes)
            ):
                raise FaultSpecError("routes is a list of strings")
            status = data.get("status")
            if status is not None and (not isinstance(status, int) or isinstance(status, bool)):
                raise FaultSpecError("status is an integer")
            times = data.get("times", 1)
            if times is not None and (not isinstance(times, int) or isinstance(times, bool)):
                raise FaultSpecError("times is an integer or null")
            return cls(
                status=status,
                delay_s=float(data.get("delay_s", 0.0)),
                refuse=bool(data.get("refuse", False)),
                restart_mid_load=bool(data.get("restart_mid_load", False)),
                unhealthy_for_s=float(data.get("unhealthy_for_s", 0.0)),
                times=times,
                routes=frozenset(routes) if routes is not None else None,
                message=str(data.get("message", "Injected fault (devstack).")),
            )
        except (TypeError, ValueError) as exc:
            if isinstance(exc, FaultSpecError):
                raise
            raise FaultSpecError(str(exc)) from exc

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "delay_s": self.delay_s,
            "refuse": self.refuse,
            "restart_mid_load": self.restart_mid_load,
            "unhealthy_for_s": self.unhealthy_for_s,
            "times": self.times,
            "routes": sorted(self.routes) if self.routes is not None else None,
            "message": self.message,
            "fired": self.fired,
        }


class FaultSet:
    """Thread-safe ordered list of active faults; the first match wins and is consumed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []

    def add(self, fault: Fault) -> Fault:
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def take(self, route: str) -> Fault | None:
        """Consume one use of the first fault matching ``route`` (None if there is none)."""
        if not self._faults:  # fast path, no lock (benign race: list read is atomic)
            return None
        with self._lock:
            for i, fault in enumerate(self._faults):
                if fault.matches(route):
                    fault.fired += 1
                    if fault.times is not None:
                        fault.times -= 1
                        if fault.times <= 0:
                            del self._faults[i]
                    return fault
        return None

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return [f.to_json() for f in self._faults]

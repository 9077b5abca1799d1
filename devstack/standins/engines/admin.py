"""The ``/_devstack/`` admin API every stand-in replica answers (no upstream counterpart).

* ``POST /_devstack/restart``  body optional ``{"unhealthy_for_s": 0.2}`` -> state
* ``POST /_devstack/faults``   a fault object, a list of them, or ``{"faults": [...]}`` -> faults
* ``GET /_devstack/faults``    active faults
* ``DELETE /_devstack/faults`` clear all faults
* ``GET /_devstack/state``     ``{"loaded", "healthy", "restarts", "calls", "faults", "config",
  "loads": [{"name","start","end","ok"}], ...}``
* ``POST /_devstack/config``   e.g. ``{"load_latency_s": 0.1}`` -> config

Admin calls are never counted in ``calls`` and never hit by faults or restarts.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from devstack.standins.engines.answers import METHOD_NOT_ALLOWED, NOT_FOUND, Response
from devstack.standins.engines.faults import Fault, FaultSet, FaultSpecError


class Administered(Protocol):
    """What the admin API asks of a replica (base.EngineReplica)."""

    faults: FaultSet

    def state(self) -> dict[str, Any]: ...
    def restart(self, unhealthy_for_s: float = 0.2) -> None: ...
    def inject(self, fault: Fault | None = None, **kwargs: Any) -> Fault: ...
    def clear_faults(self) -> None: ...
    def config(self) -> dict[str, Any]: ...
    def configure(self, **settings: Any) -> None: ...


def _bad(message: str) -> Response:
    return Response.json(400, {"error": message})


def _body(body: bytes) -> tuple[Any, Response | None]:
    if not body.strip():
        return None, None
    try:
        return json.loads(body), None
    except (ValueError, UnicodeDecodeError) as exc:
        return None, _bad(f"invalid JSON: {exc}")


def handle_admin(replica: Administered, method: str, path: str, body: bytes) -> Response:
    """Serve one admin request."""
    endpoint = path[len("/_devstack/") :].rstrip("/")
    data, err = _body(body)
    if err is not None:
        return err
    if endpoint == "state":
        if method != "GET":
            return METHOD_NOT_ALLOWED
        return Response.json(200, replica.state())
    if endpoint == "restart":
        if method != "POST":
            return METHOD_NOT_ALLOWED
        unhealthy_for_s = 0.2
        if isinstance(data, dict) and "unhealthy_for_s" in data:
            try:
                unhealthy_for_s = float(data["unhealthy_for_s"])
            except (TypeError, ValueError):
                return _bad("unhealthy_for_s must be a number")
        elif data is not None and not isinstance(data, dict):
            return _bad("body must be a JSON object")
        replica.restart(unhealthy_for_s=unhealthy_for_s)
        return Response.json(200, replica.state())
    if endpoint == "faults":
        if method == "GET":
            return Response.json(200, {"faults": replica.faults.snapshot()})
        if method == "DELETE":
            replica.clear_faults()
            return Response.json(200, {"faults": []})
        if method != "POST":
            return METHOD_NOT_ALLOWED
        specs = data.get("faults") if isinstance(data, dict) and "faults" in data else data
        if isinstance(specs, dict):
            specs = [specs]
        if not isinstance(specs, list) or not specs:
            return _bad("expected a fault object, a list of them, or {'faults': [...]}")
        try:
            faults = [Fault.from_json(s) for s in specs]
        except FaultSpecError as exc:
            return _bad(str(exc))
        for fault in faults:
            replica.inject(fault)
        return Response.json(200, {"faults": replica.faults.snapshot()})
    if endpoint == "config":
        if method == "GET":
            return Response.json(200, replica.config())
        if method != "POST":
            return METHOD_NOT_ALLOWED
        if not isinstance(data, dict):
            return _bad("body must be a JSON object")
        try:
            replica.configure(**data)
        except (TypeError, ValueError) as exc:
            return _bad(str(exc))
        return Response.json(200, replica.config())
    return NOT_FOUND

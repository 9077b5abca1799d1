"""What a Pod object tells us about an engine replica (pure).

Endpoints come only from Pod objects of the target (podIP + the container port named
`http`), never from event data: an event cannot point us at an arbitrary address.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Literal, NamedTuple

from functions.resources.kinds import RUNTIME_LABEL

Runtime = Literal["vllm", "sglang"]


class Endpoint(NamedTuple):
    namespace: str
    pod: str
    url: str
    runtime: Runtime
    restarts: int


def is_ready(pod: dict[str, Any]) -> bool:
    """Running, not being deleted, and its Ready condition is True."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    if meta.get("deletionTimestamp") or status.get("phase", "Running") != "Running":
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def restarts(pod: dict[str, Any]) -> int:
    return sum(
        int(c.get("restartCount") or 0) for c in (pod.get("status") or {}).get("containerStatuses") or []
    )


def http_port(pod: dict[str, Any]) -> int | None:
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == "http" and isinstance(port.get("containerPort"), int):
                return int(port["containerPort"])
    return None


def endpoint(pod: dict[str, Any], default_runtime: Runtime) -> Endpoint | None:
    """The engine URL of a Ready pod, or None when it has no usable address yet."""
    meta = pod.get("metadata") or {}
    ip = (pod.get("status") or {}).get("podIP")
    port = http_port(pod)
    if not is_ready(pod) or not ip or port is None:
        return None
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return None
    host = f"[{address}]" if address.version == 6 else str(address)
    label = (meta.get("labels") or {}).get(RUNTIME_LABEL)
    runtime: Runtime = label if label in ("vllm", "sglang") else default_runtime
    return Endpoint(
        meta.get("namespace", ""), meta.get("name", ""), f"http://{host}:{port}", runtime, restarts(pod)
    )

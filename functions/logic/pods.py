"""What a Pod object tells us about an engine replica (pure).

Endpoints come only from Pod objects selected by their own target's label in the target's
namespace (podIP, which only the kubelet writes through pods/status, plus the container port
named `http`), never from event data. A pod that points at an address we must never call (the
API server, link-local metadata services, or a network the operator denies) is no endpoint.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, NamedTuple

from functions.resources.kinds import RUNTIME_LABEL

Runtime = Literal["vllm", "sglang"]
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
LOOPBACK: tuple[Network, ...] = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))
ALWAYS_DENIED: tuple[Network, ...] = (
    ipaddress.ip_network("0.0.0.0/8"),
    ipaddress.ip_network("169.254.0.0/16"),  # link-local: cloud metadata services live here
    ipaddress.ip_network("224.0.0.0/4"),
    ipaddress.ip_network("255.255.255.255/32"),
    ipaddress.ip_network("::/128"),
    ipaddress.ip_network("fe80::/10"),
    ipaddress.ip_network("ff00::/8"),
)


class Endpoint(NamedTuple):
    namespace: str
    pod: str
    url: str
    runtime: Runtime
    restarts: int


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def is_ready(pod: Mapping[str, Any]) -> bool:
    """Running, not being deleted, and its Ready condition is True."""
    meta = _mapping(pod.get("metadata"))
    status = _mapping(pod.get("status"))
    if meta.get("deletionTimestamp") or status.get("phase", "Running") != "Running":
        return False
    return any(
        isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def restarts(pod: Mapping[str, Any]) -> int:
    total = 0
    for c in _mapping(pod.get("status")).get("containerStatuses") or []:
        count = _mapping(c).get("restartCount")
        total += count if isinstance(count, int) and not isinstance(count, bool) else 0
    return total


def http_port(pod: Mapping[str, Any]) -> int | None:
    for container in _mapping(pod.get("spec")).get("containers") or []:
        for port in _mapping(container).get("ports") or []:
            number = _mapping(port).get("containerPort")
            if _mapping(port).get("name") == "http" and isinstance(number, int) and 0 < number < 65536:
                return number
    return None


def parse_networks(text: str) -> tuple[Network, ...]:
    """`10.0.0.0/8, 127.0.0.0/8` -> networks; a bad entry is a ValueError (a setting, checked once)."""
    return tuple(ipaddress.ip_network(part.strip(), strict=False) for part in text.split(",") if part.strip())


def denied_by(
    networks: Sequence[Network], addresses: Sequence[tuple[str, int]] = ()
) -> Callable[[Address, int], bool]:
    """The check `endpoint` applies: always-denied and configured networks, and exact
    (address, port) pairs such as the API server's own."""
    blocked = (*ALWAYS_DENIED, *networks)
    pairs = {(ipaddress.ip_address(a), p) for a, p in addresses if _is_ip(a)}

    def denied(address: Address, port: int) -> bool:
        return (address, port) in pairs or any(address.version == n.version and address in n for n in blocked)

    return denied


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


DEFAULT_DENIED = denied_by(())


def endpoint(
    pod: Mapping[str, Any],
    default_runtime: Runtime,
    denied: Callable[[Address, int], bool] | None = None,
) -> Endpoint | None:
    """The engine URL of a Ready pod, or None when it has no usable (or allowed) address."""
    meta = _mapping(pod.get("metadata"))
    ip = _mapping(pod.get("status")).get("podIP")
    port = http_port(pod)
    if not is_ready(pod) or not isinstance(ip, str) or port is None:
        return None
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return None
    if (denied or DEFAULT_DENIED)(address, port):
        return None
    host = f"[{address}]" if address.version == 6 else str(address)
    label = _mapping(meta.get("labels")).get(RUNTIME_LABEL)
    runtime: Runtime = label if label in ("vllm", "sglang") else default_runtime
    return Endpoint(
        str(meta.get("namespace") or ""),
        str(meta.get("name") or ""),
        f"http://{host}:{port}",
        runtime,
        restarts(pod),
    )

"""``EngineFleet``: many engine replicas in one process, each on its own 127.0.0.x address.

Addresses come from a process-wide allocator (127.0.0.2, 127.0.0.3, ... then 127.0.1.1, ...;
Linux routes all of 127.0.0.0/8 to ``lo``): an address is never handed out twice in the same
process until it is released (``EngineFleet.remove``/``stop_all``). An address whose port is
already bound (another process) is skipped and stays reserved.
"""

from __future__ import annotations

import errno
import ipaddress
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from devstack.standins.engines.base import EngineReplica
from devstack.standins.engines.sglang import SglangReplica
from devstack.standins.engines.vllm import VllmReplica

_FIRST = int(ipaddress.IPv4Address("127.0.0.2"))
_LAST = int(ipaddress.IPv4Address("127.255.255.254"))
_alloc_lock = threading.Lock()
_in_use: set[int] = set()

ENGINES: dict[str, type[EngineReplica]] = {"vllm": VllmReplica, "sglang": SglangReplica}


def allocate_address() -> str:
    """Reserve the lowest free loopback address (127.0.0.2 upwards, skipping .0/.255)."""
    with _alloc_lock:
        n = _FIRST
        while n <= _LAST:
            if n not in _in_use and (n & 0xFF) not in (0, 255):
                _in_use.add(n)
                return str(ipaddress.IPv4Address(n))
            n += 1
    raise RuntimeError("no free 127.0.0.0/8 address left")


def release_address(address: str) -> None:
    with _alloc_lock:
        _in_use.discard(int(ipaddress.IPv4Address(address)))


def reserved_addresses() -> set[str]:
    with _alloc_lock:
        return {str(ipaddress.IPv4Address(n)) for n in _in_use}


class EngineFleet:
    """Replicas by key. ``defaults`` are keyword arguments applied to every replica."""

    def __init__(self, port: int = 8000, **defaults: Any) -> None:
        self.port = port
        self.defaults = defaults
        self._lock = threading.Lock()
        self._replicas: dict[str, EngineReplica] = {}

    def create(
        self,
        key: str,
        engine: Literal["vllm", "sglang"] = "vllm",
        *,
        start: bool = True,
        **kwargs: Any,
    ) -> EngineReplica:
        """Create (and by default start) a replica on a fresh address; ``key`` must be new."""
        with self._lock:
            if key in self._replicas:
                raise KeyError(f"replica {key!r} already exists")
        cls = ENGINES[engine]
        options = {"port": self.port, **self.defaults, **kwargs}
        skipped: list[str] = []
        while True:
            host = allocate_address()
            replica = cls(host=host, **options)
            if not start:
                break
            try:
                replica.start()
                break
            except OSError as exc:
                taken = exc.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL)
                if not taken or len(skipped) > 64:
                    release_address(host)
                    raise
                skipped.append(host)  # bound by someone else: keep it reserved, try the next
        with self._lock:
            self._replicas[key] = replica
        return replica

    def get(self, key: str) -> EngineReplica | None:
        with self._lock:
            return self._replicas.get(key)

    def __getitem__(self, key: str) -> EngineReplica:
        with self._lock:
            return self._replicas[key]

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._replicas

    def __iter__(self) -> Iterator[str]:
        with self._lock:
            return iter(list(self._replicas))

    def __len__(self) -> int:
        with self._lock:
            return len(self._replicas)

    def items(self) -> list[tuple[str, EngineReplica]]:
        with self._lock:
            return list(self._replicas.items())

    def remove(self, key: str) -> None:
        """Stop the replica and release its address."""
        with self._lock:
            replica = self._replicas.pop(key, None)
        if replica is not None:
            replica.release()
            release_address(replica.host)

    stop = remove

    def stop_all(self) -> None:
        """Stop every replica (in parallel) and release their addresses."""
        with self._lock:
            replicas = list(self._replicas.values())
            self._replicas.clear()
        if not replicas:
            return
        # a stop waits up to one poll interval for the serving loop: wide, so that thousands
        # of replicas stop in about one interval
        with ThreadPoolExecutor(max_workers=min(1024, len(replicas))) as pool:
            list(pool.map(lambda r: r.release(), replicas))
        for replica in replicas:
            release_address(replica.host)

    def __enter__(self) -> EngineFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()

"""One keep-alive connection pool per engine pod, behind the engines' single httpx client.

httpcore's pool re-examines every connection it holds each time a request enters or leaves
it, under one lock: it polls each idle socket and counts the idle connections again for each
(`ConnectionPool._assign_requests_to_connections`, httpcore 1.0). One pool shared by 50 pods
made every call pay for all 50: 50 loads at 100 ms with 10 in flight took ~590 ms, against
~540 ms with a pool per pod (~520 ms with bare http.client), on 2 cores.

Pods come and go with new addresses, so a pool not used for `idle_after_s` is closed when the
next new pod arrives. Every call marks its pool used as it starts, so a pool with a call in
flight is never closed as long as calls last less than `idle_after_s`. The pools are kept in
the order they were last used, so finding the idle ones costs what is dropped (a resync meeting
5,000 pods for the first time scanned every pool for each new one: 12.5 million steps).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

import httpx

from functions.adapters.tls import never_used

Origin = tuple[str, str, int | None]


class PodPools(httpx.BaseTransport):
    def __init__(
        self,
        keepalive_per_pod: int,
        idle_after_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._limits = httpx.Limits(max_connections=None, max_keepalive_connections=keepalive_per_pod)
        self._idle_after_s = idle_after_s
        self._clock = clock
        self._lock = threading.Lock()
        self._pools: dict[Origin, httpx.HTTPTransport] = {}
        self._last_used: OrderedDict[Origin, float] = OrderedDict()
        """Least recently used first."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        return self._pool((url.scheme, url.host, url.port)).handle_request(request)

    def origins(self) -> list[Origin]:
        """The pods that have a pool now (oldest first)."""
        with self._lock:
            return list(self._pools)

    def close(self) -> None:
        with self._lock:
            pools = list(self._pools.values())
            self._pools.clear()
            self._last_used.clear()
        for pool in pools:
            pool.close()

    def _pool(self, origin: Origin) -> httpx.HTTPTransport:
        now = self._clock()
        stale: list[httpx.HTTPTransport] = []
        with self._lock:
            pool = self._pools.get(origin)
            if pool is None:
                stale = self._drop_idle(now)
                # engines are reached at http://<pod IP>:<port>: no TLS to set up
                pool = self._pools[origin] = httpx.HTTPTransport(verify=never_used(), limits=self._limits)
            self._last_used[origin] = now
            self._last_used.move_to_end(origin)
        for old in stale:
            old.close()
        return pool

    def _drop_idle(self, now: float) -> list[httpx.HTTPTransport]:
        dropped: list[httpx.HTTPTransport] = []
        while self._last_used:
            origin, used = next(iter(self._last_used.items()))
            if now - used <= self._idle_after_s:
                break  # the rest were used later
            del self._last_used[origin]
            dropped.append(self._pools.pop(origin))
        return dropped

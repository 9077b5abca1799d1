"""Keep-alive connections to engine pods: one small idle stack per pod (`KeepAlive`).

A load fans out to every replica of a deployment, and a reload bursts into one pod, so each pod
keeps up to `keepalive_per_pod` idle connections for the next call. A call takes the most
recently used idle one of its own pod, so a call never scans other pods' connections (one pool
shared by 50 pods would make every call pay for all 50).

Pods come and go with new addresses, and a resync meets every Ready pod (5,000 at scale), so
two bounds hold: a pod not called for `idle_after_s` has its connections closed when the next
new pod arrives, and at most `max_pods` pods keep connections at all (the least recently called
make way: each idle connection is an open file, and a container's soft limit can be 1,024).
The pods are kept in the order they were last called, so finding the ones to drop costs what is
dropped. Every call marks its pod as it starts; a pod dropped with a call in flight closes that
connection as it comes back instead of keeping it.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from functions.transport.keepalive import KeepAlive


class PodConnections:
    def __init__(
        self,
        keepalive_per_pod: int,
        idle_after_s: float,
        max_pods: int,
        timeout: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._keepalive_per_pod = keepalive_per_pod
        self._idle_after_s = idle_after_s
        self._max_pods = max_pods
        self._timeout = timeout
        self._clock = clock
        self._lock = threading.Lock()
        self._pods: OrderedDict[str, tuple[KeepAlive, float]] = OrderedDict()
        """Base URL -> its connections and when it was last called; least recently called first."""

    def to(self, url: str) -> KeepAlive:
        """The connections to the engine at `url` (http://<pod IP>:<port>), marked as called now.
        ValueError for an address that is not http."""
        if not url.startswith("http://"):
            raise ValueError(f"not an engine address: {url[:100]!r}")
        now = self._clock()
        dropped: list[KeepAlive] = []
        with self._lock:
            found = self._pods.get(url)
            if found is None:
                dropped = self._drop_idle(now)
                pod = KeepAlive(
                    url,
                    connect_timeout=self._timeout,
                    read_timeout=self._timeout,
                    max_idle=self._keepalive_per_pod,
                )
            else:
                pod = found[0]
            self._pods[url] = (pod, now)
            self._pods.move_to_end(url)
        for old in dropped:
            old.close()
        return pod

    def pods(self) -> list[str]:
        """The pods that keep connections now, least recently called first."""
        with self._lock:
            return list(self._pods)

    def close(self) -> None:
        with self._lock:
            pods = [pod for pod, _ in self._pods.values()]
            self._pods.clear()
        for pod in pods:
            pod.close()

    def _drop_idle(self, now: float) -> list[KeepAlive]:
        """Make room for one more pod: those idle too long, then the oldest beyond `max_pods`."""
        dropped: list[KeepAlive] = []
        while self._pods:
            url, (pod, called) = next(iter(self._pods.items()))
            if now - called <= self._idle_after_s and len(self._pods) < self._max_pods:
                break  # the rest were called later
            del self._pods[url]
            dropped.append(pod)
        return dropped

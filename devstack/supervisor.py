"""Restart a process of the stack that dies, as a kubelet restarts a container.

The embedded stack runs some parts as processes of their own (the filer source, the functions
with `function_processes=True`, the real SeaweedFS); a test or a person may kill one from
outside (`kill -9 <pid>`, the pids are in `make serve`'s endpoints file) and the stack brings it
back, like `restartPolicy: Always`: after an exit the process is started again after a backoff
that doubles from `first_backoff` to `max_backoff` (the kubelet: 10 s to 5 min; here shorter, a
laptop's stack should heal in seconds) and starts again from `first_backoff` once a run lasted
`reset_after` seconds. `restarts` counts them, as a Pod's `restartCount`.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from devstack.processes import kill_tree

log = logging.getLogger("devstack.supervisor")

Launch = Callable[[], "subprocess.Popen[bytes]"]


@dataclass
class Child:
    name: str
    launch: Launch
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: float = 0.0
    backoff: float = 0.0
    next_start: float | None = None
    stop_signal: int = signal.SIGTERM
    exits: list[int] = field(default_factory=list)

    @property
    def pid(self) -> int | None:
        process = self.process
        return process.pid if process is not None and process.poll() is None else None


class Supervisor:
    def __init__(
        self,
        first_backoff: float = 0.2,
        max_backoff: float = 5.0,
        reset_after: float = 10.0,
        interval: float = 0.1,
    ) -> None:
        self.first_backoff, self.max_backoff, self.reset_after = first_backoff, max_backoff, reset_after
        self.interval = interval
        self._children: dict[str, Child] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._changed = threading.Condition(self._lock)
        self._thread = threading.Thread(target=self._watch, name="supervisor", daemon=True)
        self._thread.start()

    def add(self, name: str, launch: Launch, stop_signal: int = signal.SIGTERM) -> Child:
        """Start `launch()` now and keep it running until `stop()`."""
        child = Child(name, launch, stop_signal=stop_signal, backoff=self.first_backoff)
        with self._lock:
            if name in self._children:
                raise ValueError(f"a process named {name!r} is supervised already")
            child.process, child.started_at = launch(), time.monotonic()
            self._children[name] = child
        return child

    def remove(self, name: str, grace: float = 10.0) -> None:
        """Stop supervising `name` and stop it (its stop signal, SIGKILL after `grace`)."""
        with self._lock:
            child = self._children.pop(name, None)
        if child is not None:
            _stop([child], grace)

    def child(self, name: str) -> Child:
        with self._lock:
            return self._children[name]

    def processes(self) -> list[dict[str, Any]]:
        """What endpoints.json lists: each process's name, pid (None while it waits to be
        started again) and how often it was restarted."""
        with self._lock:
            return [
                {"name": c.name, "pid": c.pid, "restarts": c.restarts, "exit_codes": list(c.exits[-5:])}
                for c in self._children.values()
            ]

    def wait_restarted(self, name: str, restarts: int, timeout: float = 30.0) -> Child:
        """Until `name` was restarted at least `restarts` times and runs again."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                child = self._children[name]
                if child.restarts >= restarts and child.pid is not None:
                    return child
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{name} was not restarted {restarts} time(s) within {timeout}s")
                self._changed.wait(left)

    def _watch(self) -> None:
        while not self._stopping.wait(self.interval):
            with self._lock:
                for child in self._children.values():
                    self._tend(child)

    def _tend(self, child: Child) -> None:
        now = time.monotonic()
        process = child.process
        if process is not None and process.poll() is not None:
            code = process.returncode
            child.exits.append(code)
            lived = now - child.started_at
            if lived >= self.reset_after:
                child.backoff = self.first_backoff
            child.next_start = now + child.backoff
            log.warning(
                "%s exited with %s after %.1f s; restarting in %.1f s", child.name, code, lived, child.backoff
            )
            child.backoff = min(child.backoff * 2, self.max_backoff)
            child.process = None
        if child.process is None and child.next_start is not None and now >= child.next_start:
            try:
                child.process = child.launch()
            except Exception:
                log.exception("starting %s again failed", child.name)
                child.next_start = now + child.backoff
                return
            child.started_at, child.next_start = now, None
            child.restarts += 1
            self._changed.notify_all()

    def stop(self, grace: float = 10.0) -> None:
        """Stop watching, then stop every process (its stop signal, SIGKILL after `grace`)."""
        self._stopping.set()
        self._thread.join(timeout=5)
        with self._lock:
            children = list(self._children.values())
            self._children.clear()
        _stop(children, grace)


def _stop(children: list[Child], grace: float) -> None:
    for child in children:
        if child.process is not None and child.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                child.process.send_signal(child.stop_signal)
    for child in children:
        if child.process is None:
            continue
        try:
            child.process.wait(grace)
        except subprocess.TimeoutExpired:
            kill_tree(child.process, 5)  # what it forked too (a function server's worker)

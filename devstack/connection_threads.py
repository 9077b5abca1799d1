"""Connection threads kept for the next connection, as a Go server's goroutines are cheap.

`ThreadingMixIn` starts a thread per accepted connection and lets it end with the connection:
~250 us of this interpreter's CPU per connection on this machine (the thread's start and its
handshake with the accepting one), on top of the ~300 us of reading and answering a request.
A resync lists 5,000 engine replicas on new connections every tick (a pod's connection is not
kept across ticks: 5,000 would be 5,000 open files), all served by this one process. Here a
connection is still served by a thread of its own for as long as it lasts, but the thread is
one that served an earlier connection when one is waiting; a thread idle for IDLE_S ends."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

IDLE_S = 30.0


class ConnectionThreads:
    """Runs each job on a waiting thread, or on a new one when none waits."""

    def __init__(self, name: str, idle_s: float = IDLE_S) -> None:
        self._name = name
        self._idle_s = idle_s
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._waiting = 0
        """Threads waiting for a job and not yet promised one."""

    @property
    def waiting(self) -> int:
        with self._lock:
            return self._waiting

    def run(self, job: Callable[[], None]) -> None:
        with self._lock:
            promised = self._waiting > 0
            if promised:
                self._waiting -= 1
        self._jobs.put(job)
        if not promised:
            threading.Thread(target=self._serve, name=self._name, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self._idle_s)
            except queue.Empty:
                with self._lock:
                    if self._waiting > 0:  # no job was promised to a waiting thread: end one
                        self._waiting -= 1
                        return
                continue  # a job was promised meanwhile: it is on its way
            job()
            with self._lock:
                self._waiting += 1


class ReusedThreadsMixIn:
    """`ThreadingMixIn`'s one thread per connection, from `threads` (daemon threads: a server
    stopping does not wait for its connections' threads, as `daemon_threads = True`)."""

    threads: ConnectionThreads

    def process_request(self, request: Any, client_address: Any) -> None:
        self.threads.run(lambda: self._serve_connection(request, client_address))

    def _serve_connection(self, request: Any, client_address: Any) -> None:
        """What `ThreadingMixIn.process_request_thread` does."""
        server: Any = self
        try:
            server.finish_request(request, client_address)
        except Exception:
            server.handle_error(request, client_address)
        finally:
            server.shutdown_request(request)

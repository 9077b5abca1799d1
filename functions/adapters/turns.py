"""Turns on a capacity-bound engine pod: the invocations of one process that load into the same
pod do it one after another, each planning from a listing taken after the previous one's calls.

An SGLang pod started with `--max-loaded-loras` evicts an adapter when a load finds it full. The
planner never asks one pod for more than its room, but two invocations plan from their own
views: one may have read the claimants before a higher-ranked adapter became Available, the
other lists the pod while the first one's load is still in flight, and each fills the one free
slot. In its turn an invocation lists again every pod that another turn changed since it began
observing, plans from that listing, makes its calls and writes its statuses; the next one then
sees both. Turns order the invocations of one process (in a cluster, one instance of a
function with its one server worker, `WORKERS`). What a load from elsewhere makes the engine
evict shows in the answer to ours (`serving.put_out`), and fleet lists that InferenceService
again; resync repairs the rest.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager

from functions.errors import EngineUnavailable

REMEMBERED = 4096
"""Pods whose last turn is remembered; an older one counts as changed (listed again)."""


class _Turn:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0  # holding or waiting: the entry goes when none is left


class Turns:
    """One lock per engine (its URL) while someone holds or waits for it, and the stamp of the
    last turn taken on each of the last `remembered` engines."""

    def __init__(self, remembered: int = REMEMBERED) -> None:
        self._guard = threading.Lock()
        self._clock = itertools.count(1)
        self._now = 0
        self._turns: dict[str, _Turn] = {}
        self._last: OrderedDict[str, int] = OrderedDict()
        self._floor = 0  # the latest stamp forgotten: an engine not remembered may have changed then
        self._remembered = remembered

    def stamp(self) -> int:
        """Now, for `changed_since`: take it before listing."""
        with self._guard:
            return self._now

    def changed_since(self, engine: str, stamp: int) -> bool:
        with self._guard:
            return self._last.get(engine, self._floor) > stamp

    @contextmanager
    def taking(self, engines: Iterable[str], timeout: float) -> Iterator[None]:
        """Hold the turns of `engines` (in sorted order, so two takers never wait on each
        other); EngineUnavailable when one is not free within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with ExitStack() as held:
            for engine in sorted(set(engines)):
                turn = self._join(engine)
                if not turn.lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                    self._leave(engine, turn, taken=False)
                    raise EngineUnavailable(
                        f"{engine}: another load into this engine has held its turn for {timeout:g} s"
                    )
                held.callback(self._leave, engine, turn, taken=True)
            yield

    def _join(self, engine: str) -> _Turn:
        with self._guard:
            turn = self._turns.setdefault(engine, _Turn())
            turn.users += 1
            return turn

    def _leave(self, engine: str, turn: _Turn, taken: bool) -> None:
        with self._guard:
            if taken:
                self._now = next(self._clock)
                self._last[engine] = self._now
                self._last.move_to_end(engine)
                while len(self._last) > self._remembered:
                    _, forgotten = self._last.popitem(last=False)
                    self._floor = max(self._floor, forgotten)
                turn.lock.release()
            turn.users -= 1
            if turn.users == 0:
                del self._turns[engine]


TURNS = Turns()
"""The process's turns (functions are one process per instance)."""

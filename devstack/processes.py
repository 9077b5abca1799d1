"""A spawned server and the processes it forked: found through /proc, killed together.

A function's server is granian: a main process that forks its worker. SIGKILLed alone, the
main process leaves the worker running (orphaned to PID 1), so whoever kills a server outright
kills what it forked too, the main process first so that it cannot fork another."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
from pathlib import Path


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def descendants(pid: int) -> list[int]:
    """Every process `pid` forked, and theirs (none once it is gone)."""
    found: list[int] = []
    todo = _children(pid)
    while todo:
        child = todo.pop()
        found.append(child)
        todo += _children(child)
    return found


def adopt_orphans() -> None:
    """Make this process the reaper of its orphaned descendants (Linux PR_SET_CHILD_SUBREAPER),
    so that `kill_tree` can reap a killed main process's workers itself: here PID 1 reaps
    nothing."""
    pr_set_child_subreaper = 36
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_child_subreaper, 1, 0, 0, 0)


def kill_tree(process: subprocess.Popen[bytes], wait_s: float = 10.0) -> None:
    """SIGKILL a spawned process, then its descendants, and reap what is ours to reap (the
    descendants only after `adopt_orphans`; otherwise PID 1 reaps them)."""
    found = descendants(process.pid)
    with contextlib.suppress(ProcessLookupError):
        process.kill()
    process.wait(wait_s)
    for pid in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)

"""CPU seconds of the embedded stack's processes, from /proc (which a shared machine's load
bends less than the clock): this process (the stand-ins, the broker, the measuring) and each
supervised one (the functions; a function's server worker is its child)."""

from __future__ import annotations

import contextlib
import os
import time

from devstack.processes import descendants
from devstack.stack import Stack


def process_cpu_s(pid: int) -> float:
    """utime + stime of a process (and of its reaped children) from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    ticks = sum(int(f) for f in fields[11:15])  # utime stime cutime cstime (proc(5) fields 14-17)
    return ticks / os.sysconf("SC_CLK_TCK")


def stack_cpu(stack: Stack) -> dict[str, float]:
    """CPU seconds so far: "standins" (this process) and each supervised process by name."""
    found = {"standins": time.process_time()}
    for proc in stack.supervisor.processes():
        pid = proc["pid"]
        if pid is None:
            continue
        with contextlib.suppress(OSError):
            found[str(proc["name"])] = process_cpu_s(pid) + sum(map(process_cpu_s, descendants(pid)))
    return found

"""CPU seconds of the embedded stack's processes, from /proc (which a shared machine's load
bends less than the clock): this process (the stand-ins, the broker, the measuring), each
supervised one (the functions; a function's server worker is its child) and the real control
plane's servers (kube-apiserver, etcd), reported apart from ours."""

from __future__ import annotations

import contextlib
import os
import time

from devstack.kubernetes import ControlPlane
from devstack.processes import descendants
from devstack.stack import Stack


def process_cpu_s(pid: int) -> float:
    """utime + stime of a process (and of its reaped children) from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    ticks = sum(int(f) for f in fields[11:15])  # utime stime cutime cstime (proc(5) fields 14-17)
    return ticks / os.sysconf("SC_CLK_TCK")


def server_cpu(plane: ControlPlane) -> dict[str, float]:
    """CPU seconds so far of the control plane's servers: "kube-apiserver" and "etcd"."""
    found = {}
    for name, pid in plane.pids().items():
        with contextlib.suppress(OSError):
            found[name] = process_cpu_s(pid)
    return found


def stack_cpu(stack: Stack) -> dict[str, float]:
    """CPU seconds so far: "standins" (this process), each supervised process by name, and the
    control plane's servers ("kube-apiserver", "etcd")."""
    found = {"standins": time.process_time(), **server_cpu(stack.control_plane)}
    for proc in stack.supervisor.processes():
        pid = proc["pid"]
        if pid is None:
            continue
        with contextlib.suppress(OSError):
            found[str(proc["name"])] = process_cpu_s(pid) + sum(map(process_cpu_s, descendants(pid)))
    return found


def idle_server_cpu(plane: ControlPlane, seconds: float = 3.0, windows: int = 3) -> dict[str, float]:
    """The servers' CPU seconds per second while nobody calls them (their own timers, leases,
    the watch caches' bookkeeping): subtracted from a measurement so that what remains is the
    work asked of them. Each server's least rate over `windows` parts of `seconds`: a burst of
    work left over from before (pods still starting) is not taken for its idle rate."""
    span = seconds / windows
    rates: dict[str, float] = {}
    for _ in range(windows):
        before = server_cpu(plane)
        time.sleep(span)
        after = server_cpu(plane)
        for k, v in after.items():
            rate = max(0.0, v - before.get(k, 0.0)) / span
            rates[k] = min(rates.get(k, rate), rate)
    return rates


def net(spent: dict[str, float], idle: dict[str, float], seconds: float) -> dict[str, float]:
    """`spent` CPU seconds over `seconds` less what the idle rates account for (never below 0)."""
    return {k: max(0.0, v - idle.get(k, 0.0) * seconds) for k, v in spent.items()}

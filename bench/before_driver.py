"""Row 9's world of the code before issue 20, driven one burst at a time (bench/before.py).

Run by the old tree's own interpreter, in the old tree (`runpy`, so that every `bench`,
`devstack` and `functions` module imported is the old tree's), never imported by ours:

    <old>/.venv/bin/python -c "<bench/before.py's _RUN_DRIVER>" <this file>    # cwd: the old tree

It sets up the old row 9's world with the old code's own `_setup` (one ModelDeployment of 2
replicas, the same adapters, each function in its own process), writes `{"ready": true}`,
then answers each line `{"step": ..., "count": ...}` on stdin with one JSON line: the burst's
events per second, how many were answered 2xx, and the CPU per event of that step's function
processes. The nudges are the old code's own (`_nudge`); the burst is timed as ours is
(bench/throughput.py): every nudge published at once, done when the broker's log holds each
one's final outcome, the log read from a cursor. The old log's `since` scans every entry under
the broker's lock, so it is read from its newest end here: the measuring must not cost the
old broker more than ours costs ours. Everything else the old stack prints goes to stderr.
"""

from __future__ import annotations

import importlib
import itertools
import json
import os
import sys
import time
from typing import Any

FINAL = ("delivered", "dead-lettered", "failed")
POLL_S = 0.01
BURST_TIMEOUT_S = 120.0


def _tail(log: Any, seq: int) -> list[dict[str, Any]]:
    """The entries after `seq`, read from the newest end (what a tail returns, not the log)."""
    newer: list[dict[str, Any]] = []
    with log._lock:
        for entry in reversed(log._entries):
            if entry["seq"] <= seq:
                break
            newer.append(entry)
    newer.reverse()
    return newer


def _last_seq(log: Any) -> int:
    with log._lock:
        return int(log._entries[-1]["seq"]) if log._entries else 0


def _function_cpu_s(step: str) -> float:
    """CPU seconds of this process's descendants serving `step` (the server and its worker),
    read here: the old tree has no bench/cpu.py, and nothing of ours is imported."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    stats: dict[int, tuple[list[str], list[bytes]]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as stat, open(f"/proc/{name}/cmdline", "rb") as cmd:
                fields = stat.read().rsplit(")", 1)[1].split()
                stats[int(name)] = (fields, cmd.read().split(b"\0"))
        except OSError:
            continue
        parents[int(name)] = int(fields[1])

    def ours(pid: int) -> bool:
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == os.getpid():
                return True
        return False

    total = 0
    for pid, (fields, argv) in stats.items():
        serves = any(a == b"--target" and b == step.encode() for a, b in itertools.pairwise(argv))
        if serves and ours(pid):
            total += sum(int(f) for f in fields[11:13])
    return total / tick


def main() -> None:
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever the old stack prints, and every process it starts, to stderr
    throughput = importlib.import_module("bench.throughput")
    stack_module = importlib.import_module("devstack.stack")
    adapters = [f"t{i:02d}" for i in range(int(os.environ.get("ADAPTERS", "20")))]
    with stack_module.Stack(ping_period=None, function_processes=True) as stack:
        throughput._setup(stack, adapters, replicas=2)
        answers.write(json.dumps({"ready": True}) + "\n")
        for line in sys.stdin:
            ask = json.loads(line)
            step, count = str(ask["step"]), int(ask["count"])
            events = [throughput._nudge(step, adapters[i % len(adapters)]) for i in range(count)]
            ids = {event["id"] for event in events}
            seq = _last_seq(stack.broker.log)
            done: dict[str, dict[str, Any]] = {}
            cpu_before = _function_cpu_s(step)
            started = time.perf_counter()
            for event in events:
                stack.broker.publish(event)
            deadline = started + BURST_TIMEOUT_S
            while len(done) < count and time.perf_counter() < deadline:
                time.sleep(POLL_S)
                for entry in _tail(stack.broker.log, seq):
                    seq = entry["seq"]
                    if entry["id"] in ids and entry["outcome"] in FINAL:
                        done.setdefault(entry["id"], entry)
            elapsed = time.perf_counter() - started
            cpu_after = _function_cpu_s(step)
            stack.settle(timeout=30, quiet=0.3)
            ok = sum(
                1
                for e in done.values()
                if e["outcome"] == "delivered" and 200 <= int(e.get("status") or 0) < 300
            )
            answers.write(
                json.dumps(
                    {
                        "events": count,
                        "answered": len(done),
                        "ok": ok,
                        "events_per_s": round(count / elapsed, 1),
                        "function_cpu_ms_per_event": round((cpu_after - cpu_before) * 1000 / count, 2),
                    }
                )
                + "\n"
            )


if __name__ == "__main__":
    main()

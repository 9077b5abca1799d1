"""devstack/supervisor.py: a process that will not stop on its signal is killed with what it forked.

A function's server (granian) is a main process and the worker it forked; SIGKILLed alone, the
main process would leave the worker running, orphaned, after the stack has stopped."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from devstack.supervisor import Supervisor
from tests.support.wait import eventually

STUBBORN = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.fork() == 0:
    time.sleep(600)  # the worker: it inherits the ignored SIGTERM
    os._exit(0)
print("ready", flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has stopped; only its reaping is left


def test_a_child_ignoring_its_stop_signal_is_killed_with_its_worker() -> None:
    launched: list[subprocess.Popen[bytes]] = []

    def launch() -> subprocess.Popen[bytes]:
        process = subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE)
        launched.append(process)
        return process

    supervisor = Supervisor()
    try:
        child = supervisor.add("stubborn", launch)
        assert child.process is not None and child.process.stdout is not None
        assert child.process.stdout.readline() == b"ready\n"
        main = child.process.pid
        worker = int(Path(f"/proc/{main}/task/{main}/children").read_text().split()[0])
        started = time.monotonic()
        supervisor.stop(grace=0.5)
        assert time.monotonic() - started < 10
        assert not _alive(main)
        eventually(lambda: not _alive(worker), timeout=5, what="the worker gone")
    finally:
        supervisor.stop(grace=0.5)  # nothing left to stop once the test has stopped it
        for process in launched:  # stopped and reaped by the supervisor: only the pipes are left
            assert process.stdout is not None
            process.stdout.close()

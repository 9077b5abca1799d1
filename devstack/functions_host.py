"""Serve loraflow's functions through functions-framework over real HTTP.

`FunctionHost`: in this process, each function on its own werkzeug server on 127.0.0.1 (an
ephemeral port), built by `functions_framework.create_app` from `main.py` exactly as
`functions-framework --target` builds it in the container, so requests go through the same
Flask app as in production. `ProcessFunctionHost`: each function in its own
process served as the container serves it (functions/edge/server.py), so the functions share no
interpreter with each other or the stand-ins, as each Knative Service's pods in a cluster.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import IO

import functions_framework
import httpx
from werkzeug.serving import BaseWSGIServer, make_server

from devstack.ports import free_port
from devstack.processes import kill_tree
from devstack.supervisor import Supervisor

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "main.py"
FUNCTIONS = ("admit", "stat", "verify", "load", "reload", "unload", "resync", "ingest")


class FunctionHost:
    def __init__(self, names: tuple[str, ...] = FUNCTIONS, host: str = "127.0.0.1") -> None:
        self.names = names
        self.host = host
        self.urls: dict[str, str] = {}
        self._servers: list[tuple[BaseWSGIServer, threading.Thread]] = []

    def start(self) -> FunctionHost:
        for name in self.names:
            app = functions_framework.create_app(  # type: ignore[no-untyped-call]
                target=name, source=str(SOURCE), signature_type="http"
            )
            server = make_server(self.host, 0, app, threaded=True)
            thread = threading.Thread(target=server.serve_forever, name=f"fn-{name}", daemon=True)
            thread.start()
            self._servers.append((server, thread))
            self.urls[name] = f"http://{self.host}:{server.server_port}/"
        return self

    def stop(self) -> None:
        # together: each shutdown waits up to the server's poll interval for its loop to notice
        stopping = [threading.Thread(target=server.shutdown) for server, _ in self._servers]
        for thread in stopping:
            thread.start()
        for thread in stopping:
            thread.join(timeout=5)
        for server, thread in self._servers:
            server.server_close()
            thread.join(timeout=5)
        self._servers.clear()


class ProcessFunctionHost:
    """The same interface as FunctionHost; the functions read their configuration from this
    process's environment at start (as a container does), and log to `log_dir` if given. With a
    `supervisor`, a function process that dies is started again on its port (as a kubelet
    restarts a container) and `pids()` names each one."""

    def __init__(
        self,
        names: tuple[str, ...] = FUNCTIONS,
        host: str = "127.0.0.1",
        log_dir: Path | None = None,
        supervisor: Supervisor | None = None,
    ) -> None:
        self.names = names
        self.host = host
        self.log_dir = log_dir
        self.supervisor = supervisor
        self.urls: dict[str, str] = {}
        self._processes: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []

    def start(self, timeout: float = 60.0) -> ProcessFunctionHost:
        env = dict(os.environ)  # as at start: a restarted function gets the same configuration
        for name in self.names:
            port = free_port(self.host)
            out = self._log(name)
            if self.supervisor is not None:
                start = partial(launch, name, SOURCE, port, self.host, env=env, out=out)
                self.supervisor.add(f"function/{name}", start, stop_signal=signal.SIGINT)
            else:
                self._processes.append(launch(name, SOURCE, port, self.host, out=out))
            self.urls[name] = f"http://{self.host}:{port}/"
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=5) as http:
            for name, url in self.urls.items():
                _await_health(http, name, url + "healthz", deadline)
        return self

    def _log(self, name: str) -> IO[bytes] | int:
        if self.log_dir is None:
            return subprocess.DEVNULL
        self.log_dir.mkdir(parents=True, exist_ok=True)
        handle = (self.log_dir / f"{name}.log").open("ab")
        self._logs.append(handle)
        return handle

    def stop(self) -> None:
        if self.supervisor is not None:
            for name in self.names:
                self.supervisor.remove(f"function/{name}")
        for process in self._processes:
            process.send_signal(signal.SIGINT)  # stops as SIGTERM does, the requests in flight finished
        for process in self._processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                kill_tree(process, 5)  # the worker too: killed alone, granian's main leaves it
        for handle in self._logs:
            handle.close()
        self._processes.clear()
        self._logs.clear()


def launch(
    target: str,
    source: Path,
    port: int,
    host: str = "127.0.0.1",
    python: str | None = None,
    env: dict[str, str] | None = None,
    out: IO[bytes] | int = subprocess.DEVNULL,
) -> subprocess.Popen[bytes]:
    """`<target>`'s functions-framework app from `source` in its own process, served as the
    container serves it (functions/edge/server.py; run by `python`, default this interpreter;
    this process's environment, else `env`)."""
    command = [python or sys.executable, "-m", "functions.edge.server", "--target", target]
    command += ["--source", str(source), "--host", host, "--port", str(port)]
    return subprocess.Popen(command, cwd=ROOT, env=process_environment(env), stdout=out, stderr=out)


IMAGE_ENVIRONMENT = {"MALLOC_ARENA_MAX": "2"}
"""What the functions' image sets for the interpreter beside its own settings (Dockerfile ENV):
a function started here runs as in the container."""


def process_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (none or empty: this process's environment) over the image's own."""
    return {**IMAGE_ENVIRONMENT, **(env or os.environ)}


def launch_source(env: dict[str, str], out: IO[bytes] | int = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
    """`python -m functions.filer_source`, the ContainerSource's command, with `env`."""
    command = [sys.executable, "-m", "functions.filer_source"]
    return subprocess.Popen(command, cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out)


def _await_health(http: httpx.Client, name: str, url: str, deadline: float) -> None:
    while True:
        try:
            if http.get(url).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"function {name} did not answer {url} in time")
        time.sleep(0.02)

"""Scale from zero on one machine: each function behind an activator, its process started by
the first request that reaches it (bench/pipeline_cold.py).

What it mirrors in Knative Serving, for a Service at `min-scale: 0` with no pod left:
- the activator is in the request path; it holds (buffers) a request while the revision has
  no ready pod and forwards it once one is ready (knative.dev/docs/serving/services/
  configure-probing; activator/handler);
- readiness is the user container's readiness probe, run by queue-proxy. Knative probes
  aggressively until the first success: every 50 ms, each attempt timing out after 100 ms
  (knative/serving pkg/queue/readiness/probe.go: retryInterval, aggressiveProbeTimeout);
  ours is `GET /healthz` (knative/services/*.yaml);
- once ready, requests keep going through the activator (with the default
  target-burst-capacity a low-traffic revision keeps it in the path), so the warm figure
  pays the same extra hop as the cold one.
What it leaves out, being one machine: scheduling, image pull and container creation (1-4 s
on a cluster, more than the process start measured here) and the autoscaler's decision.

`ActivatedFunctionHost` has the interface of devstack's ProcessFunctionHost; `ActivatedStack`
is the embedded stack with its functions behind activators. `scale_to_zero(names)` stops
those functions' processes; the next event to each starts it again, cold.
"""

from __future__ import annotations

import http.server
import subprocess
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx

from devstack.functions_host import FUNCTIONS, SOURCE, ProcessFunctionHost, launch
from devstack.ports import free_port
from devstack.processes import descendants, kill_tree
from devstack.stack import Stack

PROBE_INTERVAL_S = 0.05
PROBE_TIMEOUT_S = 0.1
START_TIMEOUT_S = 60.0
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "host",
    "content-length",
}


class Revision:
    """One function's pods, zero or one: its process, started on demand and probed until ready."""

    def __init__(self, name: str, host: str, python: str | None, log_dir: Path | None) -> None:
        self.name = name
        self.host = host
        self.python = python
        self.log_dir = log_dir
        self.starts = 0
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._logs: list[Any] = []
        self._url: str | None = None
        self._ready = threading.Event()

    def ready_url(self) -> str:
        """The URL of a ready pod, starting one first when there is none (the held request)."""
        with self._lock:
            if self._process is None:
                port = free_port(self.host)
                self._process = launch(
                    self.name, SOURCE, port, self.host, python=self.python, out=self._log()
                )
                self._url = f"http://{self.host}:{port}/"
                self._ready.clear()
                self.starts += 1
                threading.Thread(target=self._probe, args=(self._url,), daemon=True).start()
        if not self._ready.wait(START_TIMEOUT_S):
            raise RuntimeError(f"{self.name} did not become ready in {START_TIMEOUT_S:.0f} s")
        assert self._url is not None
        return self._url

    def _probe(self, url: str) -> None:
        with httpx.Client(timeout=PROBE_TIMEOUT_S) as http:
            deadline = time.monotonic() + START_TIMEOUT_S
            while time.monotonic() < deadline:
                started = time.monotonic()
                try:
                    if http.get(url + "healthz").status_code == 200:
                        self._ready.set()
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(max(0.0, PROBE_INTERVAL_S - (time.monotonic() - started)))

    def _log(self) -> Any:
        if self.log_dir is None:
            return subprocess.DEVNULL
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._logs.append((self.log_dir / f"{self.name}.log").open("ab"))
        return self._logs[-1]

    def memory_mib(self) -> float:
        """Memory of the running pod's processes (the server's parent and worker), MiB, as their
        proportional set sizes (pages the fork shares counted once); 0 when scaled to zero."""
        process = self._process
        if process is None:
            return 0.0
        total_kib = 0
        for pid in [process.pid, *descendants(process.pid)]:
            try:
                rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
            except OSError:
                continue
            total_kib += next((int(line.split()[1]) for line in rollup if line.startswith("Pss:")), 0)
        return total_kib / 1024

    def scale_to_zero(self) -> None:
        with self._lock:
            process, self._process, self._url = self._process, None, None
            self._ready.clear()
        if process is not None:
            kill_tree(process)  # no graceful stop: a pod scaled to zero has nothing to flush
        for log in self._logs:
            log.close()
        self._logs.clear()


class Activator(http.server.ThreadingHTTPServer):
    """A reverse proxy in front of one Revision (HTTP/1.1, keep-alive both ways)."""

    daemon_threads = True

    def __init__(self, revision: Revision, host: str) -> None:
        self.revision = revision
        self.http = httpx.Client(timeout=120)  # the Services' timeoutSeconds
        super().__init__((host, 0), _Forward)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}/"


class _Forward(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Activator

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        try:
            target = self.server.revision.ready_url() + self.path.lstrip("/")
            answer = self.server.http.request(self.command, target, headers=headers, content=body)
        except (httpx.HTTPError, RuntimeError) as err:  # the activator's 502/503
            self.send_error(503, f"activator: {err}")
            return
        self.send_response(answer.status_code)
        for key, value in answer.headers.multi_items():
            if key.lower() not in HOP_BY_HOP:
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(answer.content)))
        self.end_headers()
        self.wfile.write(answer.content)

    do_GET = do_POST = do_PUT = do_DELETE = _forward

    def log_message(self, format: str, *args: Any) -> None:
        pass


class ActivatedFunctionHost(ProcessFunctionHost):
    """Every function behind its own activator. `warm` ones are started at once (min-scale: 1),
    the others on their first request."""

    def __init__(
        self,
        names: tuple[str, ...] = FUNCTIONS,
        host: str = "127.0.0.1",
        log_dir: Path | None = None,
        python: str | None = None,
        warm: Iterable[str] = FUNCTIONS,
    ) -> None:
        super().__init__(names, host, log_dir)
        self.python = python
        self.warm = set(warm)
        self.revisions = {name: Revision(name, host, python, log_dir) for name in names}
        self._activators: list[tuple[Activator, threading.Thread]] = []

    def start(self, timeout: float = START_TIMEOUT_S) -> ActivatedFunctionHost:
        for name, revision in self.revisions.items():
            activator = Activator(revision, self.host)
            thread = threading.Thread(target=activator.serve_forever, name=f"activator-{name}", daemon=True)
            thread.start()
            self._activators.append((activator, thread))
            self.urls[name] = activator.url
        for name in self.warm & set(self.revisions):
            self.revisions[name].ready_url()
        return self

    def scale_to_zero(self, names: Iterable[str]) -> None:
        for name in names:
            self.revisions[name].scale_to_zero()

    def stop(self) -> None:
        for revision in self.revisions.values():
            revision.scale_to_zero()
        for activator, thread in self._activators:
            activator.shutdown()
            activator.server_close()
            activator.http.close()
            thread.join(timeout=5)
        self._activators.clear()


class ActivatedStack(Stack):
    """The embedded stack with every function behind an activator (bench only: the default
    stack, `make serve` and the tests keep their hosts)."""

    def __init__(
        self, *args: Any, python: str | None = None, warm: Iterable[str] = FUNCTIONS, **kwargs: Any
    ) -> None:
        super().__init__(*args, function_processes=True, **kwargs)
        self.python = python
        self.warm = tuple(warm)

    def _function_host(self) -> ActivatedFunctionHost:
        return ActivatedFunctionHost(log_dir=self.base / "functions", python=self.python, warm=self.warm)

    @property
    def activated(self) -> ActivatedFunctionHost:
        assert isinstance(self.functions, ActivatedFunctionHost)
        return self.functions

"""14. Notification latency: a file written -> its `io.loraflow.file.changed.v1` at the Broker, by
the filer's webhook queue (-> ingest) and by the filer source (the metadata log), side by side.

The real SeaweedFS of the process (devstack.seaweedfs.shared()), whose webhook posts to ingest
(its own functions-framework process, as a Knative Service's pod) through the session's relay
(one loopback hop more than in a cluster, ~1 ms), and the filer source as its own process
(`python -m functions.filer_source`, its Lease in a Kubernetes stand-in); both publish to one
sink standing for the Broker, which notes when each event arrives. Files are written one at a time, spaced out
(latency, not throughput), and each write's clock starts when its PUT is sent: both paths are
timed on the very same writes. Reported: p50 and p99 per path, and the PUT's own time.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from bench.common import Result, median_of, percentile
from devstack.functions_host import SOURCE, launch
from devstack.ports import free_port
from devstack.seaweedfs import shared
from functions.adapters.storage import quote_path
from tests.support.filer_source import SourceRig, source_kube
from tests.support.wait import eventually

SENDERS = {"/loraflow/ingest": "webhook", "/loraflow/filer-source": "source"}


class ArrivalSink:
    """The Broker's ingress as far as latency goes: 202 to every POST, and when each arrived."""

    def __init__(self) -> None:
        self.arrivals: dict[tuple[str, str], float] = {}
        lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def do_POST(self) -> None:
                now = time.perf_counter()
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                sender = SENDERS.get(self.headers.get("ce-source") or "")
                subject = self.headers.get("ce-subject") or ""
                if sender and self.headers.get("ce-type") == "io.loraflow.file.changed.v1":
                    with lock:
                        sink.arrivals.setdefault((sender, subject), now)  # a replay is not a new one
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def run(smoke: bool) -> Result:
    count, spacing = (10, 0.05) if smoke else (200, 0.05)
    work = Path(tempfile.mkdtemp(prefix="loraflow-bench-notify-"))
    seaweed = shared()
    server = seaweed.server
    sink = ArrivalSink()
    port = free_port()
    env = {
        **os.environ,
        "LORAFLOW_WEBHOOK_TOKEN": seaweed.webhook_token,
        "K_SINK": sink.url,
        "LORAFLOW_BROKER_URL": sink.url,
    }
    ingest_log = (work / "ingest.log").open("ab")
    ingest = launch("ingest", SOURCE, port, env=env, out=ingest_log)
    kube = source_kube()
    rig = None
    subscriptions = contextlib.ExitStack()
    try:
        eventually(lambda: _answers(f"http://127.0.0.1:{port}/healthz"), 60, what="ingest up")
        subscriptions.enter_context(seaweed.relay.subscribed(f"http://127.0.0.1:{port}/"))
        rig = SourceRig(server, kube, sink.url, work, env={"LORAFLOW_SOURCE_CHECKPOINT": "1"}).start()
        rig.wait_logged("following the filer's metadata log", timeout=60)
        directory = f"/loraadapters/bench-{secrets.token_hex(3)}/m/a"
        sent: dict[str, float] = {}
        put_s: list[float] = []
        with httpx.Client(base_url=server.url, timeout=30) as http:
            http.put(quote_path(f"{directory}/warm-up.bin"), content=b"w").raise_for_status()
            eventually(lambda: len(sink.arrivals) >= 2, 30, what="the warm-up on both paths")
            for i in range(count):
                path = f"{directory}/f{i:04d}.bin"
                started = time.perf_counter()
                http.put(quote_path(path), content=b"x" * 64).raise_for_status()
                put_s.append(time.perf_counter() - started)
                sent[path] = started
                time.sleep(spacing)
        wanted = {(sender, path) for sender in SENDERS.values() for path in sent}
        eventually(lambda: wanted <= set(sink.arrivals), 60, what="every file by both paths")
        latencies = {
            sender: [(sink.arrivals[(sender, path)] - at) * 1000 for path, at in sent.items()]
            for sender in SENDERS.values()
        }
        httpx.delete(server.url + quote_path(directory), params={"recursive": "true"})
    finally:
        subscriptions.close()
        if rig is not None:
            rig.stop()
        kube.stop()
        ingest.terminate()
        ingest.wait(10)
        ingest_log.close()
        sink.stop()
        shutil.rmtree(work, ignore_errors=True)
    source, webhook = latencies["source"], latencies["webhook"]
    figures = {
        name: {
            "p50_ms": round(median_of(samples), 2),
            "p99_ms": round(percentile(samples, 99), 2),
            "max_ms": round(max(samples), 2),
        }
        for name, samples in latencies.items()
    }
    ratio = median_of(source) / median_of(webhook)
    return Result(
        name="notification_latency",
        title="Notification latency: a file written -> file.changed at the Broker, source and webhook",
        value=figures["source"]["p50_ms"],
        unit="ms",
        reference=figures["webhook"]["p50_ms"],
        ratio=round(ratio, 2),
        target="reported (no target); every write arrives by both paths",
        met=True,
        details={
            "files": count,
            "spacing_s": spacing,
            "put_p50_ms": round(median_of(put_s) * 1000, 2),
            **figures,
        },
        note=(
            f"{count} writes, both paths on the same writes; source p50 {figures['source']['p50_ms']} / "
            f"p99 {figures['source']['p99_ms']} ms, webhook p50 {figures['webhook']['p50_ms']} / "
            f"p99 {figures['webhook']['p99_ms']} ms; the PUT itself {round(median_of(put_s) * 1000, 1)} ms"
        ),
    )


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False

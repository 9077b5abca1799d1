"""The container's HTTP server: one step's functions-framework app, served by granian.

    python -m functions.edge.server --target stat --port 8080 [--source main.py]

The app is the one `functions-framework --target` serves: `functions_framework.create_app`
from `main.py`, its Flask app, decorators and execution-id middleware included. Only the WSGI
server under it differs. The `functions-framework` command runs gunicorn's gthread worker,
whose pure-Python event loop, request parser and thread hand-over were a large share of a step's
CPU per event; granian parses HTTP/1.1 and keeps connections in Rust, off the GIL, and calls the
WSGI app on a pool of Python threads (the two measured against each other: docs/benchmarks.md).

What stays as functions-framework configures gunicorn:
- one worker process (`WORKERS`), forked from a small parent that restarts nothing;
- `THREADS` request threads, default 4 per CPU, so eight requests run at once on two cores;
- no request timeout (`CLOUD_RUN_TIMEOUT_SECONDS`): Knative's queue-proxy enforces the
  revision's timeout in front of the container;
- `FUNCTION_TARGET`, `PORT` and `HOST` from the environment, the flags over them;
- the request body is streamed to the app (`wsgi.input` reads from the socket), so the shell
  still refuses an oversized body with 413 before reading it.

Only HTTP/1.1 is served: a Knative queue-proxy and the Broker speak it to the user container.
Access logs are off: the shell logs each event once. SIGTERM (Knative scaling a pod down) lets
the requests in flight finish, then exits; SIGINT too.
"""

from __future__ import annotations

import argparse
import gc
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import functions_framework
from granian.constants import HTTPModes, Interfaces
from granian.log import LogLevels
from granian.server import Server

SOURCE = Path(__file__).resolve().parents[2] / "main.py"
YOUNG_COLLECTION = 50_000
"""New container objects (net) between two young collections of the cycle collector; CPython's
default is 700. A page of 500 adapters decodes into thousands of dicts and lists that live until
the page is judged and then die together: at 700 they are scanned many times over while alive,
which made the collector a large share of a resync tick's CPU (docs/benchmarks.md). Memory is
not held by it: what a request frees is freed at once (reference counts); only garbage in
reference cycles waits for a collection."""


def loader(source: str) -> Callable[[str], Any]:
    """What builds, in the worker, the WSGI app `functions-framework --target <target>` builds."""

    def app(target: str) -> Any:
        built = functions_framework.create_app(  # type: ignore[no-untyped-call]
            target=target, source=source, signature_type="http"
        )
        settle_collector()
        return built

    return app


def settle_collector() -> None:
    """Tune the worker's cycle collector once its app is built: the app lives as long as the
    worker, so it is frozen out of the collector's generations as the step's modules were
    (main.py) and a full collection walks only what requests made; young collections wait for
    YOUNG_COLLECTION new objects."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION, middle, old)


def threads() -> int:
    """Request threads: `THREADS`, else functions-framework's default of 4 per CPU."""
    return int(os.environ.get("THREADS", (os.cpu_count() or 1) * 4))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m functions.edge.server", description="Serve one loraflow function over HTTP."
    )
    parser.add_argument("--target", default=os.environ.get("FUNCTION_TARGET"))
    parser.add_argument("--host", default=os.environ.get("HOST", "0.0.0.0"))  # every address: a pod's port
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8080")))
    parser.add_argument("--source", default=os.environ.get("FUNCTION_SOURCE", str(SOURCE)))
    options = parser.parse_args(argv)
    if not options.target:
        parser.error("name the function: --target or FUNCTION_TARGET")
    server = Server(
        options.target,
        address=options.host,
        port=options.port,
        interface=Interfaces.WSGI,
        workers=int(os.environ.get("WORKERS", "1")),
        blocking_threads=threads(),
        http=HTTPModes.http1,
        websockets=False,
        # error, not warning: the one warning it gives is at start, that 8 threads are many for
        # two cores; they are what functions-framework runs, for steps that mostly wait on I/O
        log_level=LogLevels.error,
    )
    server.serve(target_loader=loader(options.source))


if __name__ == "__main__":
    main()

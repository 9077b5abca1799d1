"""Serve loraflow's functions through functions-framework over real HTTP, in this process.

Each function gets its own werkzeug server on 127.0.0.1 (an ephemeral port), built by
`functions_framework.create_app` from `main.py` exactly as `functions-framework --target`
builds it in the container, so requests go through the same Flask app as in production.
"""

from __future__ import annotations

import threading
from pathlib import Path

import functions_framework
from werkzeug.serving import BaseWSGIServer, make_server

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
        for server, thread in self._servers:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)
        self._servers.clear()

"""A CloudEvent sink that keeps what it receives: the dead-letter sink of the embedded
stack, and the place tests point K_SINK at to see what a function published."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cloudevents.http import CloudEvent, from_http


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver listens with a backlog of 5: a tick's parts publishing side by side (10
    # each) overflow it, and the kernel resets the connections it had no room for. A Broker's
    # ingress is a Go server, whose listen backlog is the kernel's somaxconn (4096 here).
    request_queue_size = 256


class EventSink:
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.events: list[CloudEvent] = []
        self.on_event: Callable[[CloudEvent], bool] | None = None
        """Called with each event before it is kept; True: it was taken elsewhere (not kept)."""
        self._lock = threading.Condition()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed ACK

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    event = from_http(dict(self.headers.items()), body)
                except Exception:
                    self.send_response(400)
                else:
                    taken = sink.on_event is not None and sink.on_event(event)
                    if not taken:
                        with sink._lock:
                            sink.events.append(event)
                            sink._lock.notify_all()
                    self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = _Server((host, port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="event-sink", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/"

    def start(self) -> EventSink:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def clear(self) -> None:
        with self._lock:
            self.events.clear()

    def of_type(self, type_: str) -> list[CloudEvent]:
        with self._lock:
            return [e for e in self.events if e["type"] == type_]

    def wait_for(self, type_: str, count: int = 1, timeout: float = 5.0) -> list[CloudEvent]:
        deadline = time.monotonic() + timeout
        with self._lock:
            while len([e for e in self.events if e["type"] == type_]) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._lock.wait(remaining)
            return [e for e in self.events if e["type"] == type_]


def main(argv: list[str] | None = None) -> None:
    """`python -m devstack.eventing.sink --port 8099`: a subscriber for a Trigger of your own,
    printing one line per event it takes (time, type, subject, id)."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8099)
    options = parser.parse_args(argv)
    sink = EventSink(options.host, options.port)

    def show(event: CloudEvent) -> bool:
        print(event.get("time") or "-", event["type"], event.get("subject") or "-", event["id"], flush=True)
        return True  # printed, not kept: a long-running receiver holds nothing

    sink.on_event = show
    print(f"receiving on {sink.url}", file=sys.stderr, flush=True)
    try:
        sink._server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        sink._server.server_close()


if __name__ == "__main__":
    main()

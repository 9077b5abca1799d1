"""Engines' load, unload, health and listing over keep-alive connections, on real sockets.

The pod is a raw HTTP/1.1 server on loopback that answers each request with the next scripted
answer and counts the connections it accepts, so reuse, a close between calls, a request sent
twice and a connection closed after a bad answer are all seen from the engine's side. The
normal answers are vLLM's (vllm/entrypoints/serve/lora/api_router.py: a plain-text 200 for
load and unload; /v1/models an OpenAI model list); the bad ones are a hostile pod's.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import NamedTuple

import pytest

from functions.adapters.engines import ANSWER_MAX_BYTES, LISTING_MAX_BYTES, Engines
from functions.logic import reasons
from functions.logic.pods import Endpoint
from functions.logic.serving import ListingFailure
from functions.observability import ENGINE_FAILURES

TIMEOUT = 0.5
"""The engines' deadline per call here: what a cut-off call may take, at most, plus slack."""


class Request(NamedTuple):
    connection: int
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


Action = Callable[[socket.socket], bool]
"""Answers one request on the socket; False: the connection is over (closed by the pod)."""


def answer(status: int = 200, body: bytes = b"", **headers: str) -> Action:
    def send(conn: socket.socket) -> bool:
        head = [f"HTTP/1.1 {status} X"] + [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
        if "Content_Length" not in headers and "Transfer_Encoding" not in headers:
            head.append(f"Content-Length: {len(body)}")
        conn.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        return True

    return send


def then_close(action: Action) -> Action:
    """Answer, then close without saying so (no Connection: close): uvicorn's idle timeout."""

    def send(conn: socket.socket) -> bool:
        action(conn)
        return False

    return send


def unanswered(conn: socket.socket) -> bool:
    """Read the request and close: the pod restarted, or closed its idle connection, under it."""
    return False


def trickle(head: bytes, interval: float = 0.1) -> Action:
    """Send `head`, then one more byte every `interval`, until the client hangs up."""

    def send(conn: socket.socket) -> bool:
        conn.sendall(head)
        while True:
            time.sleep(interval)
            conn.sendall(b"x")

    return send


def endless_chunks(conn: socket.socket) -> bool:
    conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    while True:
        conn.sendall(b"10000\r\n" + b" " * 0x10000 + b"\r\n")


def silent(conn: socket.socket) -> bool:
    conn.recv(1)  # until the client hangs up
    return False


LOADED = answer(200, b"Success: LoRA adapter 'a1' added successfully.", Content_Type="text/plain")
LISTING = answer(
    200,
    json.dumps(
        {"object": "list", "data": [{"id": "m", "root": "m"}, {"id": "a1", "root": "/p/a1", "parent": "m"}]}
    ).encode(),
    Content_Type="application/json",
)


class Pod:
    """A scripted HTTP/1.1 server: each request gets the next action of `script` (LOADED once it
    runs out)."""

    def __init__(self, host: str, script: list[Action]) -> None:
        self.script = script
        self.requests: list[Request] = []
        self.accepted = 0
        self.closed = 0
        self._listener = socket.create_server((host, 0))
        self.url = f"http://{host}:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def wait_closed(self, count: int, timeout: float = 5.0) -> bool:
        """Until `count` of its connections are over (closed by either side)."""
        deadline = time.monotonic() + timeout
        while self.closed < count:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.accepted += 1
                number = self.accepted
            threading.Thread(target=self._serve, args=(conn, number), daemon=True).start()

    def _serve(self, conn: socket.socket, number: int) -> None:
        reader = conn.makefile("rb")
        try:
            while True:
                line = reader.readline()
                if not line:
                    return  # the client closed it
                method, path, _ = line.decode().split(" ", 2)
                headers: dict[str, str] = {}
                while (header := reader.readline()) not in (b"\r\n", b""):
                    name, value = header.decode().split(":", 1)
                    headers[name.strip().lower()] = value.strip()
                body = reader.read(int(headers.get("content-length", "0")))
                with self._lock:
                    self.requests.append(Request(number, method, path, headers, body))
                    action = self.script.pop(0) if self.script else LOADED
                if not action(conn):
                    return
        except OSError:
            return  # the client hung up on an answer it did not want
        finally:
            reader.close()
            conn.close()
            with self._lock:
                self.closed += 1


@pytest.fixture
def pods() -> Iterator[Callable[..., Pod]]:
    started: list[Pod] = []

    def start(*script: Action, host: str = "127.0.0.1") -> Pod:
        started.append(Pod(host, list(script)))
        return started[-1]

    yield start
    for pod in started:
        pod.close()


def at(pod: Pod) -> Endpoint:
    return Endpoint("ns", "pod-0", pod.url, "vllm", 0)


def failures(operation: str, reason: str) -> float:
    return ENGINE_FAILURES.labels("vllm", operation, reason).value


@pytest.fixture
def engines() -> Iterator[Engines]:
    made = Engines(TIMEOUT, keepalive_per_pod=2)
    yield made
    made.close()


def test_calls_to_one_pod_share_one_connection(pods: Callable[..., Pod], engines: Engines) -> None:
    pod = pods(LISTING, answer(200, b"", Content_Type="text/plain"), LOADED, answer(200, b"Success"), LISTING)
    endpoint = at(pod)
    assert engines.listing(endpoint) == {"a1": "/p/a1"}
    assert engines.healthy(endpoint)
    assert engines.load(endpoint, "a1", "/p/a1").reason == reasons.POD_LOADED
    assert engines.unload(endpoint, "a1").reason == reasons.POD_UNLOADED
    assert engines.listing(endpoint) == {"a1": "/p/a1"}
    assert pod.accepted == 1
    assert [(r.method, r.path) for r in pod.requests] == [
        ("GET", "/v1/models"),
        ("GET", "/health"),
        ("POST", "/v1/load_lora_adapter"),
        ("POST", "/v1/unload_lora_adapter"),
        ("GET", "/v1/models"),
    ]
    assert {r.headers["accept-encoding"] for r in pod.requests} == {"identity"}
    load = pod.requests[2]
    assert load.headers["content-type"] == "application/json"
    assert json.loads(load.body) == {"lora_name": "a1", "lora_path": "/p/a1"}


def test_each_pod_gets_its_own_connections(pods: Callable[..., Pod], engines: Engines) -> None:
    first, second = pods(host="127.0.0.1"), pods(host="127.0.0.2")
    for _ in range(3):
        assert engines.load(at(first), "a1", "/p/a1").ok
        assert engines.load(at(second), "a1", "/p/a1").ok
    assert (first.accepted, second.accepted) == (1, 1)
    assert {r.connection for r in first.requests + second.requests} == {1}


def test_a_pod_that_closed_its_connection_between_calls_gets_a_new_one(
    pods: Callable[..., Pod], engines: Engines
) -> None:
    pod = pods(then_close(LOADED), then_close(LOADED), then_close(LOADED))
    for closed in (1, 2, 3):
        assert engines.load(at(pod), "a1", "/p/a1").reason == reasons.POD_LOADED
        assert pod.wait_closed(closed)  # so the kept socket shows it before the next call
    assert pod.accepted == 3
    assert len(pod.requests) == 3  # each load sent once


def test_a_load_that_may_have_reached_the_engine_is_never_sent_again(
    pods: Callable[..., Pod], engines: Engines
) -> None:
    """The kept connection is dropped with the load unanswered after it was written: it is the
    pod's failure to answer (the event's retry repeats it), not a second load on a new one."""
    pod = pods(LOADED, unanswered, LOADED)
    before = failures("load", reasons.ENGINE_UNREACHABLE)
    assert engines.load(at(pod), "a1", "/p/a1").ok
    failed = engines.load(at(pod), "a2", "/p/a2")
    assert (failed.ok, failed.reason, failed.retryable) == (False, reasons.ENGINE_UNREACHABLE, True)
    assert failures("load", reasons.ENGINE_UNREACHABLE) == before + 1
    assert [json.loads(r.body)["lora_name"] for r in pod.requests] == ["a1", "a2"]
    assert engines.load(at(pod), "a3", "/p/a3").ok  # on a new connection
    assert pod.accepted == 2


def test_a_listing_dropped_unanswered_on_a_kept_connection_is_sent_once_more(
    pods: Callable[..., Pod], engines: Engines
) -> None:
    pod = pods(LISTING, unanswered, LISTING)
    assert engines.listing(at(pod)) == {"a1": "/p/a1"}
    assert engines.listing(at(pod)) == {"a1": "/p/a1"}
    assert [r.connection for r in pod.requests] == [1, 1, 2]


def test_a_new_connection_dropped_unanswered_is_a_failure_not_a_retry(
    pods: Callable[..., Pod], engines: Engines
) -> None:
    pod = pods(unanswered, unanswered)
    found = engines.listing(at(pod))
    assert isinstance(found, ListingFailure) and found.reason == reasons.ENGINE_UNREACHABLE
    assert len(pod.requests) == 1


BAD_ANSWERS = {
    "declared-too-large": (
        trickle(f"HTTP/1.1 200 OK\r\nContent-Length: {ANSWER_MAX_BYTES + 1}\r\n\r\n".encode()),
        reasons.ENGINE_ANSWER_TOO_LARGE,
    ),
    "endless": (endless_chunks, reasons.ENGINE_ANSWER_TOO_LARGE),
    "compressed": (
        answer(200, b"\x1f\x8b" + b"\0" * 20, Content_Encoding="gzip"),
        reasons.ENGINE_ANSWER_INVALID,
    ),
    "trickled-body": (trickle(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"), reasons.ENGINE_TIMEOUT),
    "trickled-headers": (trickle(b"HTTP/1.1 200 OK\r\nX-Slow: "), reasons.ENGINE_TIMEOUT),
    "silent": (silent, reasons.ENGINE_TIMEOUT),
}


@pytest.mark.parametrize("bad", sorted(BAD_ANSWERS))
def test_a_bad_answer_is_cut_off_and_its_connection_never_reused(
    pods: Callable[..., Pod], engines: Engines, bad: str
) -> None:
    action, reason = BAD_ANSWERS[bad]
    pod = pods(LOADED, action, LOADED)
    assert engines.load(at(pod), "a1", "/p/a1").ok  # a connection is kept...
    before = failures("load", reason)
    started = time.monotonic()
    failed = engines.load(at(pod), "a2", "/p/a2")  # ...and the bad answer arrives on it
    elapsed = time.monotonic() - started
    assert (failed.ok, failed.reason) == (False, reason), failed
    assert elapsed < TIMEOUT + 2, elapsed  # the deadline holds, whatever the pod trickles
    assert failures("load", reason) == before + 1
    assert engines.load(at(pod), "a3", "/p/a3").ok
    assert [r.connection for r in pod.requests] == [1, 1, 2]  # that connection was closed
    assert len(pod.requests) == 3  # and nothing was sent twice


def test_a_listing_over_its_cap_is_refused_before_it_is_read(
    pods: Callable[..., Pod], engines: Engines
) -> None:
    declared = f"HTTP/1.1 200 OK\r\nContent-Length: {LISTING_MAX_BYTES + 1}\r\n\r\n".encode()
    pod = pods(trickle(declared))
    found = engines.listing(at(pod))
    assert isinstance(found, ListingFailure) and found.reason == reasons.ENGINE_ANSWER_TOO_LARGE
    assert str(LISTING_MAX_BYTES + 1) in found.message


def test_an_answer_that_closes_the_connection_is_read_to_its_end(
    pods: Callable[..., Pod], engines: Engines
) -> None:
    """HTTP/1.0-style: no length, the body ends when the pod closes (RFC 9112 6.3)."""

    def until_closed(conn: socket.socket) -> bool:
        conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nSuccess")
        return False

    pod = pods(until_closed, LOADED)
    assert engines.unload(at(pod), "a1").reason == reasons.POD_UNLOADED
    assert engines.load(at(pod), "a1", "/p/a1").ok
    assert pod.accepted == 2

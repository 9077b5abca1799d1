"""devstack/http_handler.py: the stand-ins' request head, read without the email package.

Over generated well-formed heads it gives the headers `http.client.parse_headers` gives; on a
real server and real sockets, a malformed head gets the verdict Go's net/http gives it (the
real servers are Go) and a well-formed one keeps HTTP/1.1's keep-alive and 100-continue."""

from __future__ import annotations

import http.client
import io
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devstack.http_handler import MAX_HEADERS, MAX_LINE, StandInHandler, read_headers

TCHAR = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
NAMES = st.text(st.sampled_from(TCHAR), min_size=1, max_size=12)
# a value as a client sends it: visible characters and inner spaces, none around it
VALUES = st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=20).map(
    lambda v: v.replace("~", " ").strip()
)


@given(st.lists(st.tuples(NAMES, VALUES), max_size=MAX_HEADERS), st.sampled_from(["\r\n", "\n"]))
def test_a_well_formed_head_reads_as_http_client_reads_it(pairs: list[tuple[str, str]], eol: str) -> None:
    raw = "".join(f"{name}:{' ' if i % 2 else ''}{value}{eol}" for i, (name, value) in enumerate(pairs))
    block = (raw + eol).encode("iso-8859-1") + b"BODY"
    ours, theirs = io.BufferedReader(io.BytesIO(block)), io.BufferedReader(io.BytesIO(block))
    read = read_headers(ours)
    expected = http.client.parse_headers(theirs)
    assert read.items() == expected.items()
    assert (read.keys(), read.values(), list(read), len(read)) == (
        expected.keys(),
        expected.values(),
        list(expected),
        len(expected),
    )
    for name, _ in pairs:
        for asked in (name, name.upper(), name.lower()):
            assert read.get_all(asked) == expected.get_all(asked)
            assert read.get(asked) == expected.get(asked) == read[asked] == expected[asked]
            assert asked in read
    assert read.get("X-Never-Sent", "none") == expected.get("X-Never-Sent", "none") == "none"
    assert read.get_all("X-Never-Sent") is expected.get_all("X-Never-Sent") is None
    assert "X-Never-Sent" not in read and read["X-Never-Sent"] is None
    assert ours.read() == theirs.read() == b"BODY"  # the body is where both left it


class _Quiet(StandInHandler):
    protocol_version = "HTTP/1.1"
    server_version = "stand-in"

    def __init__(self) -> None:  # no socket: only the writer is used
        self.written = io.BytesIO()
        self.wfile = self.written
        self.request_version, self.requestline, self.command = "HTTP/1.1", "GET / HTTP/1.1", "GET"
        self.close_connection = False

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.mark.parametrize("stamped", [True, False])
@given(
    st.sampled_from([200, 201, 202, 204, 400, 404, 409, 422, 499, 500, 503]),
    st.lists(st.tuples(NAMES, VALUES), max_size=8),
    st.sampled_from([[], [("Connection", "close")], [("connection", "Keep-Alive")]]),
    st.binary(max_size=64),
)
def test_respond_writes_what_send_response_send_header_and_end_headers_write(
    stamped: bool, status: int, pairs: list[tuple[str, str]], connection: list[tuple[str, str]], body: bytes
) -> None:
    ours, theirs = _Quiet(), _Quiet()
    fields = pairs + connection
    frozen = 1_767_225_600.25
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(time, "time", lambda: frozen)
        ours.respond(status, fields, body, stamped=stamped)
        (theirs.send_response if stamped else theirs.send_response_only)(status)
        for name, value in fields:
            theirs.send_header(name, value)
        theirs.end_headers()
        theirs.wfile.write(body)
    assert ours.written.getvalue() == theirs.written.getvalue()
    assert ours.close_connection == theirs.close_connection


class _Echo(StandInHandler):
    """Answers every request with its method, target and headers as JSON."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        return

    def do_GET(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        payload = json.dumps(
            {
                "method": self.command,
                "target": self.path,
                "headers": self.headers.items(),
                "body": body.decode(),
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_POST = do_GET


@pytest.fixture
def server() -> Iterator[tuple[str, int]]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield "127.0.0.1", int(httpd.server_address[1])
    httpd.shutdown()
    httpd.server_close()


class _Received(io.BytesIO):
    """What a connection received, for `http.client` to read answer after answer from: each
    response closes its file when read, which must not end the ones after it."""

    def makefile(self, mode: str) -> _Received:
        return self

    def close(self) -> None:
        return


def _exchange(address: tuple[str, int], raw: bytes) -> list[http.client.HTTPResponse]:
    """Send `raw`, read until the server closes the connection, then parse the answers."""
    with socket.create_connection(address, timeout=5) as conn:
        conn.sendall(raw)
        received = b"".join(iter(lambda: conn.recv(65536), b""))
    replay, answers = _Received(received), list[http.client.HTTPResponse]()
    while True:
        response = http.client.HTTPResponse(replay)  # type: ignore[arg-type]  # a socket's stand-in
        try:
            response.begin()
        except http.client.RemoteDisconnected:
            return answers
        response.read()
        answers.append(response)


def _head(*lines: str) -> bytes:
    return ("\r\n".join(lines) + "\r\n\r\n").encode("iso-8859-1")


def test_requests_on_one_connection_each_get_their_answer(server: tuple[str, int]) -> None:
    body = b'{"a":1}'
    raw = (
        _head("GET /one HTTP/1.1", "Host: x", "X-Repeat: 1", "x-repeat: 2")
        + _head("POST //two?q=1 HTTP/1.1", "Host: x", f"Content-Length: {len(body)}")
        + body
        + _head("GET /three HTTP/1.1", "Host: x", "Connection: close")
    )
    answers = _exchange(server, raw)
    assert [a.status for a in answers] == [200, 200, 200]  # and then closed: `_exchange` read to EOF


def test_the_echo_sees_what_was_sent(server: tuple[str, int]) -> None:
    conn = http.client.HTTPConnection(*server, timeout=5)
    conn.request("POST", "//double/slash", body=b"hi", headers={"X-Folded": "a", "X-Repeat": "1"})
    echoed = json.loads(conn.getresponse().read())
    conn.close()
    assert echoed["target"] == "/double/slash"  # as the stdlib reduces it (gh-87389)
    assert ["X-Folded", "a"] in echoed["headers"]
    assert echoed["body"] == "hi"


def test_an_obsolete_line_folding_becomes_one_space(server: tuple[str, int]) -> None:
    raw = _head(
        "POST / HTTP/1.1", "Host: x", "X-Folded: first", " \tsecond", "Content-Length: 0", "Connection: close"
    )
    (answer,) = _exchange(server, raw)
    assert answer.status == 200


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (("GET / HTTP/1.1", "Host: x", "no colon here"), 400),
        (("GET / HTTP/1.1", "Bad Name: x"), 400),
        (("GET / HTTP/1.1", "Host : x"), 400),
        (("GET / HTTP/1.1", " Host: x"), 400),
        (("GET / HTTP/1.1", "X-Smuggled: a\rTransfer-Encoding: chunked"), 400),
        (("GET / HTTP/1.1", "X-Nul: a\x00b"), 400),
        (("GET / HTTP/1.1", "X-Folded: a", " b\x00c"), 400),
        (("GET /",), 400),  # HTTP/0.9: Go's server refuses it too
        (("GET  / HTTP/1.1", "Host: x"), 400),
        (("GET / HTTP/1.1 extra", "Host: x"), 400),
        (("GET / HTTX/1.1", "Host: x"), 400),
        (("GET / HTTP/2.0", "Host: x"), 505),
        (("GET / HTTP/1.1", "X-Big: " + "v" * MAX_LINE), 431),
        (("GET / HTTP/1.1", *(f"X-{i}: v" for i in range(MAX_HEADERS + 1))), 431),
    ],
)
def test_a_malformed_head_gets_its_verdict_and_the_connection_closes(
    server: tuple[str, int], head: tuple[str, ...], status: int
) -> None:
    # a good request behind the bad one: never answered, the connection closes first
    answers = _exchange(server, _head(*head) + _head("GET / HTTP/1.1", "Host: x"))
    assert [a.status for a in answers] == [status]


def test_http_1_0_closes_unless_asked_to_keep_alive(server: tuple[str, int]) -> None:
    two = _head("GET / HTTP/1.0") + _head("GET / HTTP/1.0")
    assert [a.status for a in _exchange(server, two)] == [200]
    kept = _head("GET / HTTP/1.0", "Connection: keep-alive") + _head("GET / HTTP/1.0")
    assert [a.status for a in _exchange(server, kept)] == [200, 200]


def test_expect_100_continue_is_answered_before_the_body_is_sent(server: tuple[str, int]) -> None:
    with socket.create_connection(server, timeout=5) as conn:
        conn.sendall(_head("POST / HTTP/1.1", "Host: x", "Content-Length: 2", "Expect: 100-continue"))
        assert conn.recv(100).startswith(b"HTTP/1.1 100")
        conn.sendall(b"ok")
        assert b'"body": "ok"' in conn.recv(65536)

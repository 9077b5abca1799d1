"""SeaweedFS filer HTTP stand-in (listing JSON with Md5, uploads, downloads, moves, notifications).

Usage::

    filer = FilerServer(data_dir=Path(...), host="127.0.0.1", port=0)
    filer.start(); filer.url; ...; filer.stop()

Each HTTP rule below names the upstream source it mirrors (seaweedfs/seaweedfs, ``weed/...``).
Content is stored on disk under ``data_dir`` mirroring the filer path (what a ``weed mount`` shows
the engines); metadata lives in memory (:mod:`devstack.standins.filer_store`). Not mirrored: ``namePattern``,
Range requests, TTLs, chunk lists (``chunks`` is always omitted), ``-disableDirListing``.
"""

from __future__ import annotations

import base64
import binascii
import html
import json
import logging
import mimetypes
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from devstack.standins.filer_store import Entry, FilerError, FilerStore, http_date, normalize
from devstack.standins.filer_upload import (
    BodyError,
    boundary_of,
    multipart_file,
    read_chunked,
    read_length,
)
from devstack.standins.notifications import Publisher, SqsPublisher, WebhookPublisher
from functions.logic.seaweed_event import EventType, Notification

__all__ = ["FilerServer"]

log = logging.getLogger(__name__)

VERSION = "30GB 4.00 loraflow-standin"


@dataclass
class _Fault:
    status: int | None
    delay_s: float
    remaining: int | None  # None = until clear_faults()
    methods: frozenset[str] | None
    path_prefix: str | None


class FilerServer:
    """In-process SeaweedFS filer. Thread-safe; every public method may be called while serving."""

    def __init__(
        self,
        data_dir: Path,
        host: str = "127.0.0.1",
        port: int = 0,
        page_limit_default: int = 100000,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port
        self.page_limit_default = page_limit_default
        self.store = FilerStore(self.data_dir, self._emit)
        self._publishers: list[Publisher] = []
        self._faults: list[_Fault] = []
        self._lock = threading.Lock()
        self._request_count = 0
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------------------ lifecycle

    def start(self) -> FilerServer:
        httpd = _HTTPServer((self.host, self.port), _Handler)
        httpd.filer = self
        self._httpd = httpd
        self.port = httpd.server_address[1]
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="filer-http",
            daemon=True,
        )
        self._thread.start()
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(5)
        self._httpd = self._thread = None
        for pub in self._publishers:
            pub.close()

    def __enter__(self) -> FilerServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------------------ direct helpers

    def put_file(self, path: str, data: bytes) -> dict[str, Any]:
        """Store a file as a filer upload would (Md5 set, notifications sent); returns its Entry
        JSON."""
        entry, _, _ = self.store.write(path, iter([data]))
        return entry.to_json()

    def mkdir(self, path: str) -> dict[str, Any]:
        return self.store.mkdir(path).to_json()

    def delete(self, path: str, recursive: bool = False) -> bool:
        return self.store.delete(path, recursive)

    def move(self, src: str, dst: str) -> dict[str, Any]:
        return self.store.move(src, dst).to_json()

    def entry(self, path: str) -> dict[str, Any] | None:
        e = self.store.get(path)
        return e.to_json() if e is not None else None

    def set_md5_missing(self, path: str, missing: bool = True) -> None:
        self.store.set_md5_missing(path, missing)

    # ------------------------------------------------------------------------------ faults

    def inject(
        self,
        status: int | None = None,
        delay_s: float = 0.0,
        times: int | None = 1,
        *,
        methods: tuple[str, ...] | None = None,
        path_prefix: str | None = None,
    ) -> None:
        """The next ``times`` matching requests (None = all until cleared) wait ``delay_s`` and,
        when ``status`` is set, answer it with ``{"error": "injected fault"}``."""
        fault = _Fault(
            status,
            delay_s,
            times,
            frozenset(m.upper() for m in methods) if methods else None,
            path_prefix,
        )
        with self._lock:
            self._faults.append(fault)

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def _take_fault(self, method: str, path: str) -> _Fault | None:
        with self._lock:
            self._request_count += 1
            for fault in self._faults:
                if fault.methods is not None and method not in fault.methods:
                    continue
                if fault.path_prefix is not None and not path.startswith(fault.path_prefix):
                    continue
                if fault.remaining is not None:
                    fault.remaining -= 1
                    if fault.remaining <= 0:
                        self._faults.remove(fault)
                return fault
        return None

    @property
    def request_count(self) -> int:
        with self._lock:
            return self._request_count

    # ------------------------------------------------------------------------------ notifications

    def subscribe_webhook(
        self,
        url: str,
        bearer_token: str | None = None,
        max_retries: int = 3,
        backoff_seconds: float = 0.05,
        **options: Any,
    ) -> WebhookPublisher:
        """``[notification.webhook]``. The real filer allows exactly one queue; we allow several."""
        pub = WebhookPublisher(
            url, bearer_token, max_retries=max_retries, backoff_seconds=backoff_seconds, **options
        )
        self._publishers.append(pub)
        return pub

    def subscribe_sqs(
        self, sqs_client_or_endpoint: Any, queue_url: str, delay_seconds: int = 0
    ) -> SqsPublisher:
        """``[notification.aws_sqs]`` (upstream DelaySeconds is 10)."""
        pub = SqsPublisher(sqs_client_or_endpoint, queue_url, delay_seconds=delay_seconds)
        self._publishers.append(pub)
        return pub

    def flush_notifications(self, timeout: float = 10.0) -> bool:
        """Wait until every queued notification was delivered (or given up)."""
        deadline = time.monotonic() + timeout
        return all(p.flush(max(0.0, deadline - time.monotonic())) for p in self._publishers)

    def _emit(self, key: str, event_type: EventType, notification: Notification) -> None:
        for pub in list(self._publishers):
            pub.publish(key, event_type, notification)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128
    filer: FilerServer


def _json_bytes(obj: Any, pretty: bool = False) -> bytes:
    if pretty:
        return json.dumps(obj, indent=2).encode()
    return json.dumps(obj, separators=(",", ":")).encode()


def _parse_content_md5(value: str) -> bytes:
    """``Content-MD5`` as base64 (RFC 1864) or hex (the filer accepts both)."""
    value = value.strip()
    if len(value) == 32:
        try:
            return bytes.fromhex(value)
        except ValueError:
            pass
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise FilerError(400, f"invalid Content-MD5 {value!r}") from exc
    if len(raw) != 16:
        raise FilerError(400, f"invalid Content-MD5 {value!r}")
    return raw


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed ACK
    server: _HTTPServer
    server_version = "SeaweedFS Filer"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("filer: " + format, *args)

    # ------------------------------------------------------------------------------ plumbing

    @property
    def filer(self) -> FilerServer:
        return self.server.filer

    def _send(
        self,
        status: int,
        body: bytes = b"",
        content_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        if content_type:
            self.send_header("Content-Type", content_type)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def _send_error_json(self, status: int, message: str) -> None:
        self._send(status, _json_bytes({"error": message}), "application/json")

    def _route(self) -> tuple[str, dict[str, list[str]], bool]:
        parts = urlsplit(self.path)
        raw_path = unquote(parts.path) or "/"
        return normalize(raw_path), parse_qs(parts.query, keep_blank_values=True), raw_path.endswith("/")

    def _faulted(self, path: str) -> bool:
        fault = self.filer._take_fault(self.command, path)
        if fault is None:
            return False
        if fault.delay_s:
            time.sleep(fault.delay_s)
        if fault.status is None:
            return False
        self.close_connection = True  # the request body (if any) is left unread
        self._send_error_json(fault.status, "injected fault")
        return True

    def _handle(self, fn: Any) -> None:
        path, query, trailing = self._route()
        if self._faulted(path):
            return
        try:
            fn(path, query, trailing)
        except FilerError as exc:
            self.close_connection = True
            self._send_error_json(exc.status, exc.message)
        except BodyError as exc:
            self.close_connection = True
            self._send_error_json(400, str(exc))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def do_GET(self) -> None:
        self._handle(self._get)

    def do_HEAD(self) -> None:
        self._handle(self._get)

    def do_PUT(self) -> None:
        self._handle(self._write)

    def do_POST(self) -> None:
        self._handle(self._write)

    def do_DELETE(self) -> None:
        self._handle(self._delete)

    # ------------------------------------------------------------------------------ reads

    def _get(self, path: str, query: dict[str, list[str]], trailing: bool) -> None:
        """``GetOrHeadHandler`` (weed/server/filer_server_handlers_read.go): a missing path is a 404
        with an empty body; a directory is listed; ``metadata=true`` returns the Entry JSON."""
        entry = self.filer.store.get(path)
        if entry is None:
            self._send(404)
            return
        pretty = bool(query.get("pretty", [""])[0])
        if query.get("metadata", [""])[0] == "true":
            self._send(200, _json_bytes(entry.to_json(), pretty), "application/json")
            return
        if entry.is_dir:
            self._list(entry, query, pretty)
            return
        self._download(entry)

    def _list(self, entry: Entry, query: dict[str, list[str]], pretty: bool) -> None:
        """``listDirectoryHandler`` (weed/server/filer_server_handlers_read_dir.go): JSON only when
        ``Accept`` is exactly ``application/json``, else the HTML UI. ``limit`` defaults to
        ``-dirListLimit``; ``lastFileName`` is exclusive; ``Entries`` is null for an empty page."""
        try:
            limit = int(query.get("limit", [""])[0])
        except ValueError:
            limit = self.filer.page_limit_default
        if limit <= 0:
            limit = self.filer.page_limit_default
        last = query.get("lastFileName", [""])[0]
        page = self.filer.store.list_dir(entry.path, last, limit)
        if page.entries:
            last = page.entries[-1].name
        if self.headers.get("Accept") == "application/json":
            body = {
                "Version": VERSION,
                "Path": "" if entry.path == "/" else entry.path,
                "Entries": [e.to_json() for e in page.entries] or None,
                "Limit": limit,
                "LastFileName": last,
                "ShouldDisplayLoadMore": page.should_display_load_more,
                "EmptyFolder": not page.entries,
            }
            self._send(200, _json_bytes(body, pretty), "application/json")
            return
        self._send(
            200,
            self._html(entry, page.entries, limit, last, page.should_display_load_more),
            "text/html; charset=utf-8",
        )

    def _html(self, entry: Entry, entries: list[Entry], limit: int, last: str, more: bool) -> bytes:
        rows = []
        base = entry.path.rstrip("/")
        for e in entries:
            href = quote(base + "/" + e.name + ("/" if e.is_dir else ""))
            size = "" if e.is_dir else str(e.size)
            rows.append(
                f'<tr><td><a href="{href}">{html.escape(e.name)}</a></td>'
                f"<td>{size}</td><td>{html.escape(http_date(e.mtime_ns))}</td></tr>"
            )
        more_link = ""
        if more:
            more_link = (
                f'<a href="{quote(base + "/")}?limit={limit}&lastFileName={quote(last)}">Load more</a>'
            )
        page = (
            "<!DOCTYPE html><html><head><title>SeaweedFS Filer</title></head><body>"
            f"<h1>{html.escape(entry.path)}</h1><table>{''.join(rows)}</table>{more_link}"
            "</body></html>"
        )
        return page.encode()

    def _download(self, entry: Entry) -> None:
        """Streams the file (``filer_server_handlers_read.go``): ``ETag`` (``filer.ETagEntry``),
        ``Content-Length``, ``Last-Modified``; HEAD sends the headers only."""
        mime = entry.mime or mimetypes.guess_type(entry.name)[0] or "application/octet-stream"
        disk = self.filer.store.disk_path(entry.path)
        try:
            fh = open(disk, "rb")  # noqa: SIM115 - closed below, after sendfile
        except FileNotFoundError:
            self._send(404)
            return
        with fh:
            self.send_response(200)
            self.send_header("Content-Type", mime)
            self.send_header("Content-Length", str(entry.size))
            self.send_header("ETag", entry.etag())
            self.send_header("Last-Modified", http_date(entry.mtime_ns))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            if self.command == "HEAD" or entry.size == 0:
                return
            self.wfile.flush()
            sent = self.connection.sendfile(fh, 0, entry.size)
            if sent < entry.size:  # the file shrank under us: the framing is broken, close
                self.close_connection = True

    # ------------------------------------------------------------------------------ writes

    def _body_blocks(self) -> Any:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return read_chunked(self.rfile)
        length = int(self.headers.get("Content-Length") or 0)
        return read_length(self.rfile, length)

    def _write(self, path: str, query: dict[str, list[str]], trailing: bool) -> None:
        """``PostHandler`` (weed/server/filer_server_handlers_write.go + ``_autochunk.go``):
        ``mv.from`` moves (204); otherwise the raw body (PUT/POST) or the multipart ``file`` part
        (POST) is stored, MD5 computed while streaming, a request ``Content-MD5`` verified
        (400 BadDigest), ``op=append`` appends (Md5 reset to null). Reply 201, header
        ``Content-MD5: <base64>``, body ``{"name", "size"}``."""
        store = self.filer.store
        if "mv.from" in query:
            for _ in self._body_blocks():
                pass
            store.move(query["mv.from"][0], path)
            self._send(204)
            return
        expected = None
        if self.headers.get("Content-MD5"):
            expected = _parse_content_md5(self.headers["Content-MD5"])
        append = query.get("op", [""])[0] == "append"
        content_type = self.headers.get("Content-Type", "")
        blocks = self._body_blocks()
        mime = ""
        boundary = boundary_of(content_type) if self.command == "POST" else None
        if boundary is not None:
            part = multipart_file(blocks, boundary)
            if part is None:
                if trailing:
                    store.mkdir(path)
                    self._send(201, _json_bytes({"name": "", "size": 0}), "application/json")
                    return
                raise FilerError(400, "multipart form has no file part")
            if trailing:
                if not part.filename:
                    raise FilerError(400, "multipart file part has no filename")
                path = normalize(path + "/" + part.filename)
            blocks = part.content
            if part.content_type and part.content_type != "application/octet-stream":
                mime = part.content_type
        else:
            if trailing:
                for _ in blocks:
                    pass
                entry = store.mkdir(path)
                self._send(201, _json_bytes({"name": entry.name, "size": 0}), "application/json")
                return
            if content_type and content_type not in (
                "application/octet-stream",
                "application/x-www-form-urlencoded",
            ):
                mime = content_type
        entry, md5, size = store.write(path, blocks, expected_md5=expected, append=append, mime=mime)
        self._send(
            201,
            _json_bytes({"name": entry.name, "size": size}),
            "application/json",
            {"Content-MD5": base64.b64encode(md5).decode("ascii")},
        )

    def _delete(self, path: str, query: dict[str, list[str]], trailing: bool) -> None:
        """``DeleteHandler`` (weed/server/filer_server_handlers_write.go): 204, also for a missing
        path; a non-empty folder without ``recursive=true`` is a 500 with ``{"error"}``."""
        recursive = query.get("recursive", [""])[0] == "true"
        self.filer.store.delete(path, recursive)
        self._send(204)

"""The filer's metadata log: its gRPC subscription, its configuration, where its files begin.

Facts it relies on (SeaweedFS 4.48 measured, weed/server/filer_grpc_server_sub_meta.go read):
- `SubscribeMetadata(SubscribeMetadataRequest)` streams `SubscribeMetadataResponse`s in ts_ns
  order from `since_ns`, inclusive; then live changes. The filter is `path_prefix` OR any of
  `path_prefixes`, and an empty `path_prefix` matches every path, so it is always set.
- with `client_supports_idle_heartbeat` a caught-up subscriber gets, every 5 s, a response
  without a notification carrying the filer's now, and one with ts_ns 0 (a flush report);
- a filer that stops gracefully ends the stream with UNAVAILABLE (GOAWAY); one that is down
  refuses the connection (UNAVAILABLE too);
- the gRPC port is the HTTP port + 10000 unless set (`-filer.port.grpc`);
- the log's files are /topics/.system/log/YYYY-MM-DD/HH-MM.<filer id> (UTC), each
  [4-byte big-endian size | LogEntry] repeated, so the first record of the oldest file says
  where the retained log begins; they are read through the filer's HTTP API.
- keepalive as SeaweedFS's own clients (weed/pb/grpc_client_server.go): a ping after 60 s
  without traffic, 20 s to answer, none without a call (the server refuses pings more often
  than every 20 s).
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urlencode, urlsplit

from functions import transport
from functions.adapters.storage import quote_path

if TYPE_CHECKING:
    import grpc

    from functions.proto import filer_pb2

SYSTEM_LOG_DIR = "/topics/.system/log"
_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")
_MINUTE_FILE = re.compile(r"\d{2}-\d{2}\.[0-9a-f]+")
MAX_MESSAGE_BYTES = 64 << 20
"""One response is one metadata event (an entry's chunk list at most): bounded, never a file."""
FIRST_RECORD_BYTES = 64 << 10
SUBSCRIBE = "/filer_pb.SeaweedFiler/SubscribeMetadata"
CONFIGURATION = "/filer_pb.SeaweedFiler/GetFilerConfiguration"


class FilerConfiguration(NamedTuple):
    signature: int
    version: str
    dir_buckets: str


def grpc_target(filer_url: str, explicit: str | None = None) -> str:
    """`host:port` of the filer's gRPC API: `explicit` if given, else the HTTP port + 10000."""
    if explicit:
        return explicit
    parts = urlsplit(filer_url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port + 10000}"


class FilerLog:
    """One gRPC channel to the filer (plain text, as SeaweedFS serves gRPC by default) and one
    HTTP client for its log files."""

    def __init__(self, target: str, filer_url: str, timeout: float = 10.0) -> None:
        import grpc

        from functions.proto import filer_pb2

        self._pb = filer_pb2
        self._timeout = timeout
        self._channel = grpc.insecure_channel(
            target,
            options=[
                ("grpc.keepalive_time_ms", 60_000),
                ("grpc.keepalive_timeout_ms", 20_000),
                ("grpc.keepalive_permit_without_calls", 0),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ],
        )
        self._configuration = self._channel.unary_unary(
            CONFIGURATION,
            request_serializer=filer_pb2.GetFilerConfigurationRequest.SerializeToString,
            response_deserializer=filer_pb2.GetFilerConfigurationResponse.FromString,
        )
        # Responses stay bytes: a response that does not decode is logged and skipped by the
        # source, where a deserializer's failure would end the whole stream.
        self._subscribe: grpc.UnaryStreamMultiCallable[filer_pb2.SubscribeMetadataRequest, bytes] = (
            self._channel.unary_stream(SUBSCRIBE, request_serializer=_serialize)
        )
        self._http = transport.connect(filer_url.rstrip("/"), timeout=timeout)

    def configuration(self) -> FilerConfiguration:
        answer: filer_pb2.GetFilerConfigurationResponse = self._configuration(
            self._pb.GetFilerConfigurationRequest(), timeout=self._timeout
        )
        return FilerConfiguration(answer.signature, answer.version, answer.dir_buckets)

    def subscribe(
        self, client_name: str, client_id: int, since_ns: int, prefixes: Sequence[str]
    ) -> grpc.Call:
        """The stream of raw responses (an iterator of bytes that is also a gRPC Call: `cancel()`
        ends it from another thread)."""
        request = self._pb.SubscribeMetadataRequest(
            client_name=client_name,
            path_prefix=prefixes[0],
            path_prefixes=list(prefixes),
            since_ns=since_ns,
            client_id=client_id,
            client_epoch=1,
            client_supports_idle_heartbeat=True,
        )
        call: grpc.Call = self._subscribe(request)
        return call

    def decode(self, raw: bytes) -> filer_pb2.SubscribeMetadataResponse:
        """Raises google.protobuf.message.DecodeError for bytes that are not a response."""
        response: filer_pb2.SubscribeMetadataResponse = self._pb.SubscribeMetadataResponse.FromString(raw)
        return response

    def log_begins_ns(self) -> int | None:
        """The ts_ns of the oldest record in the log's files; None when there is no file."""
        day = self._first(SYSTEM_LOG_DIR, _DAY)
        if day is None:
            return None
        minute = self._first(f"{SYSTEM_LOG_DIR}/{day}", _MINUTE_FILE)
        if minute is None:
            return None
        return self._first_record_ts(f"{SYSTEM_LOG_DIR}/{day}/{minute}")

    def _first(self, directory: str, pattern: re.Pattern[str]) -> str | None:
        """The first name in `directory` (the filer lists by name: days and minutes in time
        order) that matches `pattern`, paging until one does."""
        last = ""
        while True:
            params = {"limit": "100", **({"lastFileName": last} if last else {})}
            target = f"{quote_path(directory)}/?{urlencode(params)}"
            answer = self._http.request("GET", target, {"Accept": "application/json"}, None)
            if answer.status == 404:
                return None
            _raise_for_status(answer, target)
            listing: dict[str, Any] = json.loads(answer.body)
            for entry in listing.get("Entries") or []:
                name = str(entry.get("FullPath", "")).rsplit("/", 1)[-1]
                if pattern.fullmatch(name):
                    return name
            last = str(listing.get("LastFileName") or "")
            if not listing.get("ShouldDisplayLoadMore") or not last:
                return None

    def _first_record_ts(self, path: str) -> int | None:
        head = self._range(path, 0, FIRST_RECORD_BYTES)
        if len(head) < 4:
            return None
        (size,) = struct.unpack(">I", head[:4])
        if size > MAX_MESSAGE_BYTES:
            raise ValueError(f"{path}: first log record claims {size} bytes")
        record = head[4 : 4 + size]
        if len(record) < size:
            record = self._range(path, 4, size)
        entry: filer_pb2.LogEntry = self._pb.LogEntry.FromString(record)
        return entry.ts_ns or None

    def _range(self, path: str, start: int, length: int) -> bytes:
        answer = self._http.request(
            "GET", quote_path(path), {"Range": f"bytes={start}-{start + length - 1}"}, None
        )
        if answer.status == 404:
            return b""
        _raise_for_status(answer, path)
        return answer.body[:length]

    def close(self) -> None:
        self._channel.close()
        self._http.close()


def _raise_for_status(answer: transport.Answer, target: str) -> None:
    if answer.status >= 300:
        raise transport.TransportError(f"GET {target[:200]}: HTTP {answer.status}")


def _serialize(request: filer_pb2.SubscribeMetadataRequest) -> bytes:
    return request.SerializeToString()


def iterate(call: grpc.Call) -> Iterator[bytes]:
    """The call's responses, typed (grpc's stream Call is an untyped iterator)."""
    stream: Iterator[bytes] = iter(call)  # type: ignore[call-overload]
    yield from stream

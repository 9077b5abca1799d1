"""Shared machinery of the engine stand-ins: HTTP server, adapter checks, replica state.

One replica = one ``ThreadingHTTPServer`` bound to its own loopback address (127.0.0.x), speaking
HTTP/1.1 with keep-alive, one daemon thread per connection. Engine-specific routes live in
``vllm.py`` / ``sglang.py``; the ``/_devstack/`` admin API in ``admin.py``; answers in
``answers.py``; faults in
``faults.py``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import socket
import struct
import threading
import time
import urllib.parse
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from email.message import Message
from http.server import ThreadingHTTPServer
from pathlib import Path
from socketserver import TCPServer
from typing import Any, ClassVar, Literal

from devstack.http_handler import StandInHandler
from devstack.keepalive import Pools, SendError
from devstack.standins.engines.admin import handle_admin
from devstack.standins.engines.answers import DROP, JSON, Answer, Drop, Response
from devstack.standins.engines.faults import Fault, FaultSet

# --------------------------------------------------------------------------------------------
# Adapter checks
# --------------------------------------------------------------------------------------------


class AdapterNotFound(Exception):
    """No ``adapter_config.json`` under the path (vLLM ``LoRAAdapterNotFoundError``)."""


class AdapterInvalid(Exception):
    """``adapter_config.json`` unreadable / not LoRA."""


class AdapterRankTooHigh(Exception):
    """``r`` above ``max_lora_rank``."""

    def __init__(self, rank: int, max_rank: int) -> None:
        super().__init__(f"rank {rank} > {max_rank}")
        self.rank = rank
        self.max_rank = max_rank


@dataclass(frozen=True)
class AdapterConfig:
    rank: int
    peft_type: str
    raw: Mapping[str, Any]
    md5s: Mapping[str, str]
    """MD5 of each file of the directory as read (AdapterFiles.md5s)."""


@dataclass(frozen=True)
class AdapterFiles:
    """What the engine read of an adapter directory at load time: adapter_config.json's bytes
    (None when the directory has none) and the MD5 of every file in it, by name."""

    config: bytes | None
    md5s: Mapping[str, str]


CONFIG_NAME = "adapter_config.json"
CONFIG_MAX_BYTES = 1 << 20


def check_adapter_dir(files: AdapterFiles | None, max_lora_rank: int) -> AdapterConfig:
    """Read ``adapter_config.json`` as an engine would.

    Mirrors vllm/lora/peft_helper.py ``PEFTHelper.from_local_dir`` (reads adapter_config.json,
    FileNotFoundError -> LoRAAdapterNotFoundError in vllm/lora/worker_manager.py
    ``WorkerLoRAManager._load_adapter``) and ``PEFTHelper.validate_legacy`` (rank check), and
    sglang/srt/lora/lora_config.py ``LoRAConfig`` + lora_manager.py ``validate_new_adapter``.
    ``peft_type`` must be ``LORA`` (PEFT's LoraConfig; other PEFT types are not LoRA weights).
    """
    if files is None or files.config is None:
        raise AdapterNotFound()
    try:
        raw = json.loads(files.config.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise AdapterInvalid(f"adapter_config.json is not UTF-8: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise AdapterInvalid(f"adapter_config.json is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise AdapterInvalid("adapter_config.json is not a JSON object")
    peft_type = raw.get("peft_type")
    if str(peft_type).upper() != "LORA":
        raise AdapterInvalid(f"peft_type {peft_type!r} is not supported, only 'LORA'")
    rank = raw.get("r", 8)  # PEFT LoraConfig default r=8
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise AdapterInvalid(f"invalid LoRA rank {rank!r}")
    if rank > max_lora_rank:
        raise AdapterRankTooHigh(rank, max_lora_rank)
    return AdapterConfig(rank=rank, peft_type="LORA", raw=raw, md5s=dict(files.md5s))


def read_local_dir(directory: Path) -> AdapterFiles | None:
    """The files of a directory on the engine's own disk (not recursive, as the engines read)."""
    if not directory.is_dir():
        return None
    config: bytes | None = None
    md5s: dict[str, str] = {}
    for path in sorted(directory.iterdir()):
        if not path.is_file():
            continue
        digest = hashlib.md5(usedforsecurity=False)
        with path.open("rb") as stream:
            while chunk := stream.read(1 << 20):
                digest.update(chunk)
        md5s[path.name] = digest.hexdigest()
        if path.name == CONFIG_NAME and path.stat().st_size <= CONFIG_MAX_BYTES:
            config = path.read_bytes()
    return AdapterFiles(config, md5s)


class FilerUnreadable(Exception):
    """The filer could not be read (connection refused or reset, a 5xx): the mount's I/O error."""


class MountCache:
    """What one node's SeaweedFS mount keeps of the files it has read, shared by the engines on
    the node (every replica of a fleet runs on this one machine). A file's chunks are immutable:
    a write makes new ones, under new file ids, so a listing entry naming the chunks of a file
    read before names the same bytes, and `weed mount` serves them from its chunk cache instead
    of the volume servers. Kept of them: what an engine takes from the bytes (their MD5, and an
    adapter config's bytes), never the weights; the least recently used go past MAX_FILES.

    An upload storm loads 1,000 adapters into 10 replicas: 20,000 file reads, of which 18,000
    are files another replica has just read."""

    MAX_FILES = 20_000

    def __init__(self) -> None:
        self._files: OrderedDict[tuple[object, ...], tuple[str, bytes | None]] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def identity(entry: Mapping[str, Any]) -> tuple[object, ...] | None:
        """The chunks a listing entry names (file id, offset, size of each), with its size; None
        when it names none (content kept in the entry itself, or a filer that lists no chunks)."""
        chunks = entry.get("chunks")
        if not isinstance(chunks, list) or not chunks:
            return None
        named: list[object] = [entry.get("FileSize")]
        for chunk in chunks:
            file_id = chunk.get("file_id") if isinstance(chunk, dict) else None
            if not isinstance(file_id, str) or not file_id:
                return None
            named += (file_id, chunk.get("offset") or 0, chunk.get("size"))
        return tuple(named)

    def get(self, identity: tuple[object, ...]) -> tuple[str, bytes | None] | None:
        with self._lock:
            found = self._files.get(identity)
            if found is not None:
                self._files.move_to_end(identity)
            return found

    def put(self, identity: tuple[object, ...], md5: str, config: bytes | None) -> None:
        with self._lock:
            self._files[identity] = (md5, config)
            self._files.move_to_end(identity)
            while len(self._files) > self.MAX_FILES:
                self._files.popitem(last=False)


class FilerReader:
    """Adapter directories read through the SeaweedFS filer's HTTP API, as an engine reads them
    through a SeaweedFS mount in a cluster: a path under the mount root is that path on the
    filer (`weed mount -filer.path=/` maps the mount root to the filer root). Names are
    percent-encoded in every URL; a directory listing is `Accept: application/json`.

    The requests go out on the standard library's keep-alive connections (devstack/keepalive.py),
    not the functions' transport, so the two sides of every read are independent code. The
    listing is always read from the filer; a file whose chunks `cache` (the node's mount) has
    seen is not read again."""

    def __init__(
        self, filer_url: str, root: str = "", timeout: float = 30.0, cache: MountCache | None = None
    ) -> None:
        self._cache = cache
        self._filer = filer_url.rstrip("/")
        self._client = Pools(timeout)
        self._root = root.rstrip("/")
        """The filer directory the mount shows (`-filer.path`): a bucket's folder for S3."""

    def _get(
        self, path: str, accept: str | None = None, sink: Callable[[bytes], None] | None = None
    ) -> tuple[int, bytes]:
        """GET `path` (already quoted): the status, and the body (a 2xx body streams to `sink`
        in 1 MiB pieces when given: weights are never held whole)."""
        headers = {"Accept": accept} if accept else {}
        try:
            answer = self._client.request("GET", self._filer + path, headers, None, sink=sink)
        except SendError as err:
            raise FilerUnreadable(f"GET {path}: {err}") from err
        return answer.status, answer.body

    def read(self, directory: str) -> AdapterFiles | None:
        base = self._root + "/" + directory.strip("/") + "/"
        status, raw = self._get(urllib.parse.quote(base) + "?limit=1000", accept=JSON)
        if status == 404:
            return None
        if not 200 <= status < 300:
            raise FilerUnreadable(f"listing {base}: HTTP {status}")
        try:
            body = json.loads(raw)
        except ValueError:
            return None  # a file, not a directory: the filer sent its content
        if not isinstance(body, dict) or "Entries" not in body:
            return None
        config: bytes | None = None
        md5s: dict[str, str] = {}
        for entry in body.get("Entries") or []:
            if int(entry.get("Mode") or 0) & 0x80000000:  # os.ModeDir
                continue
            name = str(entry["FullPath"]).rsplit("/", 1)[-1]
            identity = MountCache.identity(entry) if self._cache is not None else None
            cached = self._cache.get(identity) if self._cache is not None and identity else None
            if cached is not None:
                md5s[name] = cached[0]
                if name == CONFIG_NAME and cached[1] is not None:
                    config = cached[1]
                continue
            digest = hashlib.md5(usedforsecurity=False)
            kept = bytearray()

            def take(chunk: bytes, digest: Any = digest, kept: bytearray = kept, name: str = name) -> None:
                digest.update(chunk)
                if name == CONFIG_NAME and len(kept) <= CONFIG_MAX_BYTES:
                    kept.extend(chunk)

            status, _ = self._get(urllib.parse.quote(base + name), sink=take)
            if status == 404:
                continue  # deleted between the listing and the read
            if not 200 <= status < 300:
                raise FilerUnreadable(f"reading {base + name}: HTTP {status}")
            md5s[name] = digest.hexdigest()
            kept_config = bytes(kept) if name == CONFIG_NAME and len(kept) <= CONFIG_MAX_BYTES else None
            if kept_config is not None:
                config = kept_config
            if self._cache is not None and identity:
                self._cache.put(identity, md5s[name], kept_config)
        return AdapterFiles(config, md5s)

    def close(self) -> None:
        self._client.close()


# --------------------------------------------------------------------------------------------
# HTTP server
# --------------------------------------------------------------------------------------------


class _Handler(StandInHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    server_version = "uvicorn"
    sys_version = ""
    disable_nagle_algorithm = True
    timeout = 120  # idle keep-alive connections are closed after this

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _handle(self) -> None:
        server: _Server = self.server  # type: ignore[assignment]
        try:
            body = self._read_body()
        except ValueError:
            self.send_error(400)
            return
        answer = server.replica.dispatch(self.command, self.path, self.headers, body)
        if isinstance(answer, Drop):
            self._drop()
            return
        head = [("Content-Length", str(len(answer.body)))]
        if answer.content_type is not None:
            head.insert(0, ("Content-Type", answer.content_type))
        self.respond(answer.status, head, b"" if self.command == "HEAD" else answer.body, stamped=False)

    def _drop(self) -> None:
        self.close_connection = True
        conn = self.connection
        with contextlib.suppress(OSError):
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.shutdown(socket.SHUT_RDWR)

    do_GET = _handle
    do_POST = _handle
    do_PUT = _handle
    do_DELETE = _handle
    do_PATCH = _handle
    do_HEAD = _handle


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, address: tuple[str, int], replica: EngineReplica) -> None:
        self.replica = replica
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls socket.getfqdn() (a reverse DNS lookup): skip it.
        TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._conns_lock:
            self._conns.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._conns_lock:
            self._conns.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        with self._conns_lock:
            conns = list(self._conns)
            self._conns.clear()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                conn.close()


# --------------------------------------------------------------------------------------------
# Replica
# --------------------------------------------------------------------------------------------


@dataclass
class LoadedAdapter:
    name: str
    path: str  # engine-side path as given by the client (shown as `root` in /v1/models)
    static: bool = False
    pinned: bool = False
    md5s: Mapping[str, str] = field(default_factory=dict)
    """MD5 of each file of the adapter directory as read at load time (empty: static)."""


class Adapters(OrderedDict[str, LoadedAdapter]):
    """A replica's loaded adapters, counting its changes (`version`): the /v1/models answer is
    encoded once per state, not once per request (5,000 replicas share this process's
    interpreter, where each would have a machine of its own). Tests that set the state
    directly go through these methods too."""

    version = 0

    def _changed(self) -> None:
        self.version += 1

    def __setitem__(self, key: str, value: LoadedAdapter) -> None:
        super().__setitem__(key, value)
        self._changed()

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self._changed()

    def pop(self, key: str, *default: Any) -> Any:
        self._changed()
        return super().pop(key, *default)

    def popitem(self, last: bool = True) -> tuple[str, LoadedAdapter]:
        self._changed()
        return super().popitem(last)

    def clear(self) -> None:
        super().clear()
        self._changed()

    def move_to_end(self, key: str, last: bool = True) -> None:
        super().move_to_end(key, last)
        self._changed()

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)
        self._changed()

    def setdefault(self, key: str, default: Any = None) -> Any:
        self._changed()
        return super().setdefault(key, default)


@dataclass(frozen=True)
class LoadInterval:
    """One load call as seen by the replica (``time.monotonic()`` clock)."""

    name: str
    start: float
    end: float
    ok: bool


class EngineReplica:
    """Base class of an engine stand-in replica (see ``VllmReplica`` / ``SglangReplica``).

    Subclasses implement ``route`` (engine routes) and ``error_answer`` (engine-shaped error).
    State is guarded by ``self._lock``; per-adapter-name locks serialise operations on one name
    (vllm/entrypoints/openai/models/serving.py ``OpenAIServingModels.lora_resolver_lock``)
    while unrelated names overlap.
    """

    engine: ClassVar[str] = "engine"
    #: settings ``POST /_devstack/config`` may change, with their types
    CONFIGURABLE: ClassVar[dict[str, type]] = {
        "load_latency_s": float,
        "unload_latency_s": float,
        "max_lora_rank": int,
    }
    poll_interval_s: float | None = 0.05
    """How often the serving loop looks for a stop; None: it sleeps until a connection arrives
    (stop() then connects to wake it): 5,000 idle replicas of a benchmark, each waking 20 times
    a second, would contend for one interpreter lock with what is measured."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        served_model: str = "base-model",
        mount_root: Path | str | None = None,
        max_lora_rank: int = 64,
        static_adapters: Mapping[str, str] | None = None,
        load_latency_s: float = 0.0,
        unload_latency_s: float = 0.0,
        model_path: str | None = None,
        engine_mount_prefix: str | None = None,
        max_model_len: int = 4096,
        filer_url: str | None = None,
        filer_root: str = "",
        filer_cache: MountCache | None = None,
        poll_interval_s: float | Literal["default"] | None = "default",
    ) -> None:
        self.host = host
        self.port = port
        self.served_model = served_model
        self.model_path = model_path or served_model
        self.mount_root = Path(mount_root) if mount_root is not None else None
        self.engine_mount_prefix = engine_mount_prefix.rstrip("/") if engine_mount_prefix else None
        self.filer = FilerReader(filer_url, filer_root, cache=filer_cache) if filer_url else None
        self.max_lora_rank = max_lora_rank
        self.static_adapters: dict[str, str] = dict(static_adapters or {})
        self.load_latency_s = load_latency_s
        self.unload_latency_s = unload_latency_s
        self.max_model_len = max_model_len
        self.created = int(time.time())
        if poll_interval_s != "default":
            self.poll_interval_s = poll_interval_s

        self.faults = FaultSet()
        self.restarts = 0
        self.calls: dict[str, int] = {
            "load": 0,
            "unload": 0,
            "models": 0,
            "health": 0,
            "completion": 0,
            "info": 0,
        }
        self.restarted_at = time.monotonic()
        """When the engine last (re)started, on the clock of `load_log`."""
        self.evictions = 0
        """Adapters the engine put out of memory to make room (its capacity at work)."""
        self.reloads = 0
        """Adapters the engine read again from their lora_path because a request named them."""
        self.load_log: deque[LoadInterval] = deque(maxlen=10_000)
        self.presence_log: deque[tuple[float, str, bool]] = deque(maxlen=10_000)
        """(time.monotonic(), name, served): every moment a name came or went (a restart included),
        so a test can see how long a replacement left a name unserved."""

        self._lock = threading.Lock()
        self._name_locks: dict[str, threading.Lock] = {}
        self._adapters: Adapters = Adapters()
        self._listing: tuple[tuple[int, int], Response] | None = None
        self._generation = 0
        self._unhealthy_until = 0.0
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._reset_adapters()

    # ---- lifecycle ---------------------------------------------------------------------

    def start(self) -> EngineReplica:
        """Bind and serve (raises OSError if the address is taken). Returns self."""
        if self._server is not None:
            return self
        server = _Server((self.host, self.port), self)
        self.port = server.server_port
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": self.poll_interval_s},
            name=f"{self.engine}@{self.host}:{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, reset open keep-alive connections, free the port."""
        server, thread = self._server, self._thread
        if server is None:
            return
        self._server = self._thread = None
        if self.poll_interval_s is None:
            self._wake_and_shutdown(server)
        else:
            server.shutdown()
        server.server_close()
        server.close_connections()
        if thread is not None:
            thread.join(timeout=5)

    def _wake_and_shutdown(self, server: _Server) -> None:
        """shutdown() waits for a serving loop that sleeps until a connection arrives: connect
        until it has seen the request to stop."""
        stopping = threading.Thread(target=server.shutdown, daemon=True)
        stopping.start()
        while stopping.is_alive():
            with contextlib.suppress(OSError), socket.create_connection((self.host, self.port), timeout=1):
                pass
            stopping.join(0.05)

    def release(self) -> None:
        """Stop for good: also close the connections the replica reads adapter files on."""
        self.stop()
        if self.filer is not None:
            self.filer.close()

    def __enter__(self) -> EngineReplica:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.release()

    @property
    def running(self) -> bool:
        return self._server is not None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def restart(self, unhealthy_for_s: float = 0.2) -> None:
        """Simulate the engine container restarting (same pod IP, as in Kubernetes).

        Every dynamically loaded adapter is forgotten, static ones (vLLM ``--lora-modules``,
        SGLang ``--lora-paths``) come back; health answers 503 for ``unhealthy_for_s`` seconds;
        loads in flight are lost (their connection is dropped). Returns immediately.
        """
        with self._lock:
            self._generation += 1
            self.restarts += 1
            self.restarted_at = time.monotonic()
            self._unhealthy_until = time.monotonic() + max(0.0, unhealthy_for_s)
            self._reset_adapters()
            self.forget_memory()

    def forget_memory(self) -> None:
        """What a restart loses beyond the listed adapters (caller holds the lock): an engine's
        caches of weights and of names it may reload."""

    def _reset_adapters(self) -> None:
        now = time.monotonic()
        for name in getattr(self, "_adapters", {}):
            self.presence_log.append((now, name, False))
        self._adapters = Adapters(
            (n, LoadedAdapter(n, p, static=True)) for n, p in self.static_adapters.items()
        )

    def put_adapter(self, adapter: LoadedAdapter) -> None:
        """Serve `adapter` under its name (caller holds the lock); the moment is logged."""
        self._adapters[adapter.name] = adapter
        self.presence_log.append((time.monotonic(), adapter.name, True))

    def drop_adapter(self, name: str) -> None:
        """Stop serving `name` (caller holds the lock); the moment is logged."""
        if self._adapters.pop(name, None) is not None:
            self.presence_log.append((time.monotonic(), name, False))

    def listing_answer(self, payload: Callable[[], dict[str, Any]]) -> Response:
        """`GET /v1/models` encoded once per state of the adapters (see `Adapters`)."""
        with self._lock:
            key, cached = (id(self._adapters), self._adapters.version), self._listing
        if cached is not None and cached[0] == key:
            return cached[1]
        answer = Response.json(200, payload())  # takes the lock itself to read the adapters
        with self._lock:
            if (id(self._adapters), self._adapters.version) == key:
                self._listing = (key, answer)
        return answer

    @property
    def healthy(self) -> bool:
        return time.monotonic() >= self._unhealthy_until

    @property
    def loaded(self) -> dict[str, str]:
        with self._lock:
            return {a.name: a.path for a in self._adapters.values()}

    def serving(self, names: Iterable[str]) -> set[str]:
        """Those of `names` served now: a probe's question, without copying every adapter."""
        with self._lock:
            return {name for name in names if name in self._adapters}

    def adapters(self) -> list[LoadedAdapter]:
        with self._lock:
            return list(self._adapters.values())

    # ---- faults & config ---------------------------------------------------------------

    def inject(self, fault: Fault | None = None, **kwargs: Any) -> Fault:
        """Add a fault: ``r.inject(status=500, times=3, routes=["load"])`` or a ``Fault``."""
        return self.faults.add(fault if fault is not None else Fault(**kwargs))

    def clear_faults(self) -> None:
        self.faults.clear()

    def configure(self, **settings: Any) -> None:
        """Change settings listed in ``CONFIGURABLE`` (raises ValueError/TypeError)."""
        for key, value in settings.items():
            kind = self.CONFIGURABLE.get(key)
            if kind is None:
                raise ValueError(f"unknown setting {key!r}; known {sorted(self.CONFIGURABLE)}")
            if kind is bool:
                if not isinstance(value, bool):
                    raise TypeError(f"{key} must be a boolean")
            elif kind is int:
                if not isinstance(value, int) or isinstance(value, bool):
                    raise TypeError(f"{key} must be an integer")
            elif kind is float:
                if not isinstance(value, int | float) or isinstance(value, bool):
                    raise TypeError(f"{key} must be a number")
                value = float(value)
            elif not isinstance(value, kind):
                raise TypeError(f"{key} must be {kind.__name__}")
            self._validate_setting(key, value)
            setattr(self, key, value)

    def _validate_setting(self, key: str, value: Any) -> None:
        if key in ("load_latency_s", "unload_latency_s") and value < 0:
            raise ValueError(f"{key} must be >= 0")

    def config(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in self.CONFIGURABLE}

    def state(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "url": self.url,
            "served_model": self.served_model,
            "loaded": self.loaded,
            "files": {a.name: dict(a.md5s) for a in self.adapters() if a.md5s},
            "healthy": self.healthy,
            "restarts": self.restarts,
            "calls": dict(self.calls),
            "evictions": self.evictions,
            "restarted_at": self.restarted_at,
            "reloads": self.reloads,
            "memory": self.memory(),
            "faults": self.faults.snapshot(),
            "config": self.config(),
            "loads": [
                {"name": i.name, "start": i.start, "end": i.end, "ok": i.ok} for i in list(self.load_log)
            ],
            "presence": [
                {"at": at, "name": name, "served": served} for at, name, served in list(self.presence_log)
            ],
        }

    def memory(self) -> dict[str, Any]:
        """What the engine holds beyond its listing (weights resident, names it may reload)."""
        return {}

    # ---- request path ------------------------------------------------------------------

    def dispatch(self, method: str, raw_path: str, headers: Message, body: bytes) -> Answer:
        path = raw_path.split("?", 1)[0]
        if path.startswith("/_devstack/"):
            return handle_admin(self, method, path, body)
        route = self.route_name(method, path)
        if route is not None:
            self.calls[route] = self.calls.get(route, 0) + 1  # GIL-atomic enough for counters
            fault = self.faults.take(route)
            if fault is not None:
                answer = self._apply_fault(fault, route)
                if answer is not None:
                    return answer
            if not self.healthy:
                return self.unhealthy_answer(route)
        return self.route(method, path, headers, body)

    def _apply_fault(self, fault: Fault, route: str) -> Answer | None:
        if fault.delay_s:
            time.sleep(fault.delay_s)
        if fault.refuse:
            return DROP
        if fault.restart_mid_load:
            if self.load_latency_s:
                time.sleep(self.load_latency_s / 2)
            self.restart(fault.unhealthy_for_s)
            if fault.status is None:
                return DROP
        if fault.status is not None:
            return self.error_answer(route, fault.status, fault.message)
        return None

    def route_name(self, method: str, path: str) -> str | None:
        """Counter/fault name of an engine route (``load``/``unload``/``models``/``health``)."""
        raise NotImplementedError

    def route(self, method: str, path: str, headers: Message, body: bytes) -> Answer:
        raise NotImplementedError

    def error_answer(self, route: str, status: int, message: str) -> Response:
        """Engine-shaped error body for an injected ``status``."""
        raise NotImplementedError

    def unhealthy_answer(self, route: str) -> Response:
        """Answer while the engine is (re)starting: 503 (health: empty body)."""
        if route == "health":
            return Response(503)
        return self.error_answer(route, 503, "The engine is starting (devstack restart).")

    # ---- helpers for subclasses --------------------------------------------------------

    def read_adapter(self, lora_path: str) -> AdapterFiles | None:
        """Read the adapter directory an engine-side ``lora_path`` names (None: nothing there).

        An absolute path that exists on this machine is read from disk (the pod's own volume);
        otherwise a path under ``engine_mount_prefix`` or ``mount_root`` (the SeaweedFS mount)
        is re-rooted there, and anything else is taken relative to the mount. With a filer the
        mount is read through the filer's HTTP API, else from the ``mount_root`` directory.
        """
        if not lora_path:
            return None
        p = Path(lora_path)
        if p.is_absolute() and p.is_dir():
            return read_local_dir(p)
        rel = lora_path
        for prefix in (
            self.engine_mount_prefix,
            str(self.mount_root).rstrip("/") if self.mount_root else None,
        ):
            if prefix and (lora_path == prefix or lora_path.startswith(prefix + "/")):
                rel = lora_path[len(prefix) :]
                break
        if self.filer is not None:
            try:
                return self.filer.read(rel)
            except FilerUnreadable as err:  # the mount's I/O error: what reading a local file raised
                raise AdapterInvalid(f"cannot read {lora_path}: {err}") from err
        if self.mount_root is None:
            return None
        return read_local_dir(self.mount_root / rel.lstrip("/"))

    @contextlib.contextmanager
    def name_lock(self, name: str) -> Iterator[None]:
        with self._lock:
            lock = self._name_locks.setdefault(name, threading.Lock())
        with lock:
            yield

    def generation(self) -> int:
        return self._generation

    @contextlib.contextmanager
    def load_window(self) -> Iterator[tuple[int, float]]:
        """A load's time: yields the generation seen before it and its start; on leaving, sleeps
        what is left of ``load_latency_s``. The configured latency is the load's whole time, the
        adapter's files read through the mount included (a real engine's load time is mostly
        that read), so 10 loads at once answer after the latency, not after it plus the time
        their reads waited for this process's other replicas (they share one interpreter)."""
        gen, start = self._generation, time.monotonic()
        try:
            yield gen, start
        finally:
            left = self.load_latency_s - (time.monotonic() - start)
            if left > 0:
                time.sleep(left)

    def record_load(self, name: str, start: float, ok: bool) -> None:
        self.load_log.append(LoadInterval(name, start, time.monotonic(), ok))


def parse_json_object(body: bytes) -> dict[str, Any] | None:
    """Body as a JSON object, or None when it is not one."""
    try:
        data = json.loads(body or b"null")
    except (ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def completion_body(
    replica: EngineReplica, model: str, adapter: LoadedAdapter | None, reloaded: bool
) -> dict[str, Any]:
    """An OpenAI text completion (the engines' `POST /v1/completions`), with one field no real
    engine answers: `served_by`, the adapter weights that served it (its path and the MD5s of
    the files the replica read for it) and whether they were read again for this request."""
    body: dict[str, Any] = {
        "id": f"cmpl-{replica.host.replace('.', '')}{replica.port}-{replica.calls.get('completion', 0)}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": "ok", "logprobs": None, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
    body["served_by"] = (
        None
        if adapter is None
        else {
            "lora_name": adapter.name,
            "lora_path": adapter.path,
            "md5s": dict(adapter.md5s),
            "reloaded": reloaded,
        }
    )
    return body


def media_type(headers: Message) -> str:
    """Media type of Content-Type, lower-cased, parameters stripped."""
    return (headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()

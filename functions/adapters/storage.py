"""Storage backends behind one small interface: list a directory, hash or read a file.

- SeaweedFS filer over HTTP: JSON listing (only for `Accept: application/json`, exactly),
  paginated by `limit`/`lastFileName`; `Md5` is base64 of the raw digest, or null
  (weed/server/filer_server_handlers_read_dir.go).
- S3 (SeaweedFS S3 gateway, AWS, MinIO) via boto3: a plain 32-hex ETag is the MD5; an
  ETag with `-N` (multipart) is not (weed/s3api/filer_multipart.go, AWS docs).
A missing MD5 is reported as None; the caller decides to hash by streaming or to wait.

Every filer URL carries its path percent-encoded (`quote_path`): the filer decodes the URL
path, so a name with `?`, `#`, `%` or a space sent raw would name another file (`w?x=1` read
as `w` with a query) or none.

A filer started with `[jwt.filer_signing]` refuses every write and delete without a bearer JWT
(reads stay open): `FilerStorage` sends loraflow's token from `Settings.filer_token_file` on
each, and a tenant's token, scoped to its upload folder, cannot write the frozen sets.
"""

from __future__ import annotations

import binascii
import contextlib
import hashlib
import json
import queue
import re
import threading
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, Protocol, Required

from pydantic import TypeAdapter, ValidationError
from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before 3.12

from functions import transport
from functions.errors import StorageUnavailable
from functions.observability import HASHED_BYTES
from functions.ports import StoredFile
from functions.settings import Settings

CHUNK = 4 << 20
RING_BUFFERS = 3
"""Buffers a streamed hash cycles through: one being received, one hashed, one spare."""
ANSWER_MAX_BYTES = 64 << 10
"""What the filer's answer to a write may take (its JSON of name and size)."""
TRANSFER_S = 600.0
IDENTITY = {"Accept-Encoding": "identity"}
DIRECTORY_BIT = 0x80000000
_PLAIN_ETAG = re.compile(r"^[0-9a-f]{32}$")


class ChunkRef(TypedDict, total=False):
    """The fields of a filer chunk that name its bytes (a rewrite always gets new file ids)."""

    file_id: str
    offset: int
    size: int


class ListedEntry(TypedDict, total=False):
    """The fields of a filer listing entry that loraflow reads (filer.Entry's JSON names)."""

    FullPath: Required[str]
    Mode: int | None
    FileSize: int | None
    Md5: str | None
    Mtime: str | None
    Inode: int | None
    chunks: list[ChunkRef] | None


class ListingPage(TypedDict, total=False):
    """The fields of a filer listing page that loraflow reads (ListDirectoryHandler's JSON)."""

    Entries: list[ListedEntry] | None
    LastFileName: str | None
    ShouldDisplayLoadMore: bool | None


_LISTING_PAGE = TypeAdapter(ListingPage)
"""Decodes a page straight from its bytes into the fields above: an entry of the real filer has
some 25 fields (times, Inode, `chunks` with their file ids), and json.loads would build every
one of them as Python objects where this skips what it does not keep."""


class Storage(Protocol):
    def stat_dir(self, directory: str) -> list[StoredFile]:
        """Every file under `directory` (recursively), sorted by path; [] when it does not exist."""
        ...

    def hash_file(self, path: str, max_bytes: int) -> str | None:
        """Hex MD5 of the content, streamed in chunks; None when larger than `max_bytes` or gone."""
        ...

    def read_small(self, path: str, max_bytes: int) -> bytes | None:
        """The content of a small file (e.g. adapter_config.json); None when missing.
        ContentTooLarge past `max_bytes`: never read further, never decompressed."""
        ...

    copy_checks_md5: bool
    """True when `copy_file` stores the copy only if its bytes hash to `md5`."""

    def copy_file(self, source: str, target: str, size: int, md5: str) -> bool:
        """Copy `source` to `target` (replaced if there); False when the source is gone, no
        longer `size` bytes long, or (when `copy_checks_md5`) does not hash to `md5`."""
        ...

    def delete_tree(self, directory: str) -> None:
        """Delete `directory` and everything under it (nothing there is no error)."""
        ...


class ContentTooLarge(ValueError):
    """A file read with a byte cap was larger (or came compressed, which no cap can bound)."""


def quote_path(path: str) -> str:
    """A storage path as a URL path: every byte but unreserved characters and `/` percent-encoded
    (RFC 3986; non-ASCII as UTF-8), so the filer decodes it back to exactly this path."""
    return urllib.parse.quote(path, safe="/")


def md5_from_base64(value: str | None) -> str | None:
    """The filer's `Md5` (base64 of the 16 raw bytes) as hex; None for null or malformed values."""
    if not value:
        return None
    try:
        # what base64.b64decode(validate=True) does, without its per-call wrapping: stat
        # decodes one per listed file (10,000 in a large adapter directory)
        raw = binascii.a2b_base64(value, strict_mode=True)
    except (binascii.Error, ValueError, TypeError):
        return None
    return raw.hex() if len(raw) == 16 else None


def entry_version(entry: Any) -> str | None:
    """What changes whenever a filer entry's bytes do: its chunks' file ids (a write, an append,
    a copy or an upload always stores new ones), inode and mtime, as a short digest.

    A rename over a file keeps the source's chunks but not the target's: it is another entry.
    None when the entry names none of these (not a real filer's listing).
    """
    parts: list[str] = []
    chunks = entry.get("chunks")
    for chunk in chunks if isinstance(chunks, list) else []:
        if isinstance(chunk, dict):
            parts.append(f"{chunk.get('file_id')}@{chunk.get('offset') or 0}+{chunk.get('size') or 0}")
    inode, mtime = entry.get("Inode"), entry.get("Mtime")
    if not parts and inode is None and mtime is None:
        return None
    text = f"{inode}|{mtime}|{entry.get('FileSize')}|" + ",".join(parts)
    return "fv1:" + hashlib.sha256(text.encode()).hexdigest()[:24]


def etag_version(etag: str | None) -> str | None:
    """An S3 ETag as a change token: a multipart ETag is the MD5 of its parts' MD5s, so other
    bytes give another one (AWS and the SeaweedFS gateway, weed/s3api/filer_multipart.go)."""
    bare = (etag or "").strip().strip('"').lower()
    return "etag:" + bare if bare else None


def md5_from_etag(etag: str | None) -> str | None:
    """An S3 ETag is the MD5 only in its plain 32-hex form (`"...-N"` is a multipart digest)."""
    if not etag:
        return None
    bare = etag.strip().strip('"').lower()
    return bare if _PLAIN_ETAG.match(bare) else None


class ContentCache:
    """Small files by (path, MD5), kept for the process's life (least recently used first out).

    Keyed by content, so never stale: an entry is stored only when the bytes read hash to the
    MD5 asked for, and a changed file has another MD5. A restarted replica reloads the same
    adapters, so `reload` needs the same adapter_config.json files again, each a read before
    the first load.
    """

    def __init__(self, read: Callable[[str], bytes | None], entries: int = 512) -> None:
        self._read = read
        self._entries = entries
        self._items: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, path: str, md5: str | None) -> bytes | None:
        if md5 is None:
            return self._read(path)
        key = (path, md5.lower())
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        content = self._read(path)
        if content is not None and hashlib.md5(content, usedforsecurity=False).hexdigest() == key[1]:
            with self._lock:
                self._items[key] = content
                while len(self._items) > self._entries:
                    self._items.popitem(last=False)
        return content


def bearer(token_file: str | None) -> dict[str, str]:
    """`Authorization: Bearer` with the token in `token_file` ({} when there is none): read at
    each use, since a mounted Secret is replaced in place when it rotates."""
    if not token_file:
        return {}
    try:
        token = Path(token_file).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as err:
        raise StorageUnavailable(f"filer token file {token_file}: {err}") from err
    return {"Authorization": f"Bearer {token}"} if token else {}


class FilerStorage:
    def __init__(
        self,
        base_url: str,
        page_size: int,
        timeout: float = 30.0,
        through: transport.Transport | None = None,
        token_file: str | None = None,
    ) -> None:
        """`through`: the transport to send on (default: one made for `base_url`); `token_file`:
        the filer write token sent on writes and deletes (Settings.filer_token_file)."""
        self._base = base_url.rstrip("/")
        self._transport = through or transport.connect(self._base, timeout=timeout)
        self._page_size = page_size
        self._timeout = timeout
        self._token_file = token_file

    def stat_dir(self, directory: str) -> list[StoredFile]:
        files: list[StoredFile] = []
        pending = [directory.rstrip("/") + "/"]
        while pending:
            current = pending.pop()
            for entry in self._entries(current):
                if int(entry.get("Mode") or 0) & DIRECTORY_BIT:
                    pending.append(str(entry["FullPath"]).rstrip("/") + "/")
                else:
                    path, size = str(entry["FullPath"]), int(entry.get("FileSize") or 0)
                    md5 = md5_from_base64(entry.get("Md5"))
                    version = None if md5 else entry_version(entry)
                    files.append(StoredFile(path, size, md5, version))
        return sorted(files, key=lambda f: f.path)

    def _entries(self, directory: str) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = []
        last = ""
        while True:
            params = {"limit": str(self._page_size)}
            if last:
                params["lastFileName"] = last
            status, content = self._list_page(directory, params)
            if status == 404:
                return []
            page = _listing_page(content)
            if not isinstance(page, dict) or "Entries" not in page:
                return []  # a file at that path, not a directory: the filer sent its content
            entries.extend(page.get("Entries") or [])
            if not page.get("ShouldDisplayLoadMore") or not page.get("LastFileName"):
                return entries
            last = page["LastFileName"]

    def hash_file(self, path: str, max_bytes: int) -> str | None:
        """Stream the file and hash it while the next piece is being received: one thread
        receives, the caller hashes (hashlib releases the GIL), so throughput approaches the
        slower of the two rather than their sum; memory stays bounded by the queue."""
        try:
            with self._transport.exchange("GET", quote_path(path), IDENTITY, None, self._long()) as got:
                if got.status == 404:
                    return None
                _raise_for_status(got.status, "GET", path)
                if int(got.headers.get("content-length") or 0) > max_bytes:
                    return None
                return _pipelined_md5(got.readinto, max_bytes, "filer")
        except transport.TransportError as err:
            raise StorageUnavailable(f"filer GET {path}: {err}") from err

    def read_small(self, path: str, max_bytes: int) -> bytes | None:
        """The file's bytes (None: not there); ContentTooLarge past `max_bytes` or compressed.
        The whole exchange ends within the client's timeout."""
        deadline = transport.Deadline(time.monotonic() + self._timeout, time.monotonic)
        try:
            with self._transport.exchange("GET", quote_path(path), IDENTITY, None, deadline) as got:
                if got.status == 404:
                    return None  # its page unread: that connection is closed, not kept
                _raise_for_status(got.status, "GET", path)
                return got.read(max_bytes)
        except (transport.BodyTooLarge, transport.BodyEncoded) as err:
            raise ContentTooLarge(f"{path}: {err}") from err
        except transport.TransportError as err:
            raise StorageUnavailable(f"filer GET {path}: {err}") from err

    copy_checks_md5 = True
    """The filer checks a PUT's Content-MD5 against the bytes it stores (400 BadDigest)."""

    def copy_file(self, source: str, target: str, size: int, md5: str) -> bool:
        """Stream `source` into a PUT of `target` with `Content-MD5`: the filer stores it only
        when the bytes hash to `md5`, so the copy is checked as it is written. The filer's own
        copy (`cp.from`) keeps the source's Md5 attribute unchecked and failed on large files
        (docs/benchmarks.md), so this one reads the source once and writes it once."""
        digest = binascii.b2a_base64(bytes.fromhex(md5), newline=False).decode()
        headers = {
            "Content-MD5": digest,
            "Content-Type": "application/octet-stream",
            "Content-Length": str(size),
            **bearer(self._token_file),
        }
        try:
            with self._transport.exchange("GET", quote_path(source), IDENTITY, None, self._long()) as got:
                if got.status == 404:
                    return False
                _raise_for_status(got.status, "GET", source)
                if int(got.headers.get("content-length") or -1) != size:
                    return False  # changed since it was verified
                body = _pieces(got, size)
                with self._transport.exchange("PUT", quote_path(target), headers, body, self._long()) as put:
                    put.read(ANSWER_MAX_BYTES)
                    if put.status == 400:
                        return False  # BadDigest: the bytes are not the ones verified
                    _raise_for_status(put.status, "PUT", target)
                    return True
        except (transport.BodyTooLarge, transport.BodyEncoded) as err:
            raise StorageUnavailable(f"filer PUT {target}: {err}") from err
        except transport.TransportError as err:
            raise StorageUnavailable(f"filer copy {source} -> {target}: {err}") from err

    def delete_tree(self, directory: str) -> None:
        target = f"{quote_path(directory.rstrip('/'))}?recursive=true"
        try:
            status = self._transport.request("DELETE", target, bearer(self._token_file), None).status
        except transport.TransportError as err:
            raise StorageUnavailable(f"filer DELETE {directory}: {err}") from err
        if status >= 300 and status != 404:
            raise StorageUnavailable(f"filer DELETE {directory}: HTTP {status}")

    def close(self) -> None:
        self._transport.close()

    def _long(self) -> transport.Deadline:
        """The deadline of a file's whole transfer (a gigabyte at a slow filer's pace)."""
        return transport.Deadline(time.monotonic() + max(self._timeout, TRANSFER_S), time.monotonic)

    def _list_page(self, directory: str, params: dict[str, str]) -> tuple[int, bytes]:
        """(status, body) of one listing page; StorageUnavailable for 5xx/4xx but 404."""
        target = f"{quote_path(directory)}?{urllib.parse.urlencode(params)}"
        try:
            status, content, _ = self._transport.request("GET", target, {"Accept": "application/json"}, None)
        except transport.TransportError as err:
            raise StorageUnavailable(f"filer GET {directory}: {err}") from err
        if status >= 400 and status != 404:
            raise StorageUnavailable(f"filer GET {directory}: HTTP {status}")
        return status, content


def _raise_for_status(status: int, method: str, path: str) -> None:
    if status >= 300:
        raise StorageUnavailable(f"filer {method} {path}: HTTP {status}")


def _pieces(got: transport.Streamed, size: int) -> Iterator[bytes]:
    """A file's body as the pieces of a streamed PUT: exactly `size` bytes, or a failure."""
    sent = 0
    while sent < size:
        piece = got.read1(CHUNK)
        if not piece:
            raise transport.TransportError(f"the source ended after {sent} of {size} bytes")
        sent += len(piece)
        yield piece


def _listing_page(content: bytes) -> Any:
    """A listing page as a dict of the fields loraflow reads; anything else (not JSON: a file's
    content; JSON of another shape, or odd types) decoded as it is, None when not JSON, so that
    the caller decides on it exactly as on any document."""
    try:
        # strict: a value of exactly the type declared, so that nothing is coerced ("0" is no
        # False); the real filer's pages always are, odd ones take the generic decode below
        return _LISTING_PAGE.validate_json(content, strict=True)
    except ValidationError:
        pass
    try:
        return json.loads(content)
    except ValueError:
        return None


def _pipelined_md5(
    readinto: Callable[[memoryview], int], max_bytes: int, backend: Literal["filer", "s3"]
) -> str | None:
    """The MD5 of the body `readinto` reads, None past `max_bytes`; what was read is counted for
    `backend`. One thread receives straight into a buffer while the caller hashes the one before
    it (hashlib lets go of the GIL): no piece is made, joined or freed per receive, and memory
    is the ring's few buffers however long the file."""
    empty: queue.Queue[bytearray | None] = queue.Queue()
    for _ in range(RING_BUFFERS):
        empty.put(bytearray(CHUNK))
    full: queue.Queue[tuple[bytearray, int] | BaseException] = queue.Queue()
    stop = threading.Event()

    def receive() -> None:
        try:
            while (buffer := empty.get()) is not None and not stop.is_set():
                filled = _fill(readinto, memoryview(buffer))
                full.put((buffer, filled))
                if filled < len(buffer):
                    return  # the body's end
        except BaseException as err:  # handed to the hashing side, which raises it
            full.put(err)

    receiver = threading.Thread(target=receive, name="md5-receive", daemon=True)
    receiver.start()
    digest = hashlib.md5(usedforsecurity=False)
    seen = 0
    try:
        while True:
            item = full.get()
            if isinstance(item, BaseException):
                raise StorageUnavailable(f"storage stream broke: {item}") from item
            buffer, filled = item
            seen += filled
            if seen > max_bytes:
                return None
            digest.update(memoryview(buffer)[:filled])
            if filled < len(buffer):
                return digest.hexdigest()
            empty.put(buffer)
    finally:
        stop.set()  # past the cap or failed: the receiver stops before its next buffer
        empty.put(None)
        receiver.join()
        HASHED_BYTES.labels(backend).inc(seen)


def _fill(readinto: Callable[[memoryview], int], view: memoryview) -> int:
    """Fill `view` from `readinto`, which may bring fewer bytes than asked before the end."""
    filled = 0
    while filled < len(view) and (got := readinto(view[filled:])):
        filled += got
    return filled


class S3Storage:
    """Paths map to keys without the leading slash: `/loraadapters/a/b` -> `loraadapters/a/b`."""

    def __init__(self, s3: Any, bucket: str) -> None:
        self._s3 = s3
        self._bucket = bucket

    def stat_dir(self, directory: str) -> list[StoredFile]:
        from botocore.exceptions import BotoCoreError, ClientError

        prefix = directory.strip("/") + "/"
        files: list[StoredFile] = []
        try:
            for page in self._s3.get_paginator("list_objects_v2").paginate(
                Bucket=self._bucket, Prefix=prefix
            ):
                for item in page.get("Contents") or []:
                    md5 = md5_from_etag(item.get("ETag"))
                    version = None if md5 else etag_version(item.get("ETag"))
                    files.append(StoredFile("/" + item["Key"], int(item["Size"]), md5, version))
        except (BotoCoreError, ClientError) as err:
            if _s3_code(err) == "NoSuchBucket":
                return []
            raise StorageUnavailable(f"S3 list {prefix}: {err}") from err
        return sorted(files, key=lambda f: f.path)

    def close(self) -> None:
        self._s3.close()

    def hash_file(self, path: str, max_bytes: int) -> str | None:
        body = self._open(path)
        if body is None:
            return None
        with contextlib.closing(body["Body"]):
            if int(body["ContentLength"]) > max_bytes:
                return None
            return _pipelined_md5(body["Body"].readinto, max_bytes, "s3")

    def read_small(self, path: str, max_bytes: int) -> bytes | None:
        body = self._open(path)
        if body is None:
            return None
        with contextlib.closing(body["Body"]):
            if int(body["ContentLength"]) > max_bytes:
                raise ContentTooLarge(f"{path} is {body['ContentLength']} bytes, more than {max_bytes}")
            content: bytes = body["Body"].read(max_bytes + 1)
        if len(content) > max_bytes:
            raise ContentTooLarge(f"{path} is more than {max_bytes} bytes")
        return content

    copy_checks_md5 = False
    """CopyObject checks nothing: freeze hashes the copy."""

    def copy_file(self, source: str, target: str, size: int, md5: str) -> bool:
        """CopyObject: the gateway copies server-side (objects up to 5 GiB in one call), only
        while the source still has the ETag it has now (`CopySourceIfMatch`)."""
        from botocore.exceptions import BotoCoreError, ClientError

        key = source.lstrip("/")
        try:
            head = self._s3.head_object(Bucket=self._bucket, Key=key)
            if int(head["ContentLength"]) != size:
                return False
            self._s3.copy_object(
                Bucket=self._bucket,
                Key=target.lstrip("/"),
                CopySource={"Bucket": self._bucket, "Key": key},
                CopySourceIfMatch=head["ETag"],
            )
        except (BotoCoreError, ClientError) as err:
            if _s3_code(err) in ("NoSuchKey", "404", "NoSuchBucket", "PreconditionFailed", "412"):
                return False
            raise StorageUnavailable(f"S3 copy {source} -> {target}: {err}") from err
        return True

    def delete_tree(self, directory: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        prefix = directory.strip("/") + "/"
        try:
            for page in self._s3.get_paginator("list_objects_v2").paginate(
                Bucket=self._bucket, Prefix=prefix
            ):
                keys = [{"Key": item["Key"]} for item in page.get("Contents") or []]
                if keys:
                    self._s3.delete_objects(Bucket=self._bucket, Delete={"Objects": keys, "Quiet": True})
        except (BotoCoreError, ClientError) as err:
            if _s3_code(err) == "NoSuchBucket":
                return
            raise StorageUnavailable(f"S3 delete {prefix}: {err}") from err

    def _open(self, path: str) -> dict[str, Any] | None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            result: dict[str, Any] = self._s3.get_object(Bucket=self._bucket, Key=path.lstrip("/"))
        except (BotoCoreError, ClientError) as err:
            if _s3_code(err) in ("NoSuchKey", "404", "NoSuchBucket"):
                return None
            raise StorageUnavailable(f"S3 get {path}: {err}") from err
        return result


def _s3_code(err: Exception) -> str:
    response = getattr(err, "response", None) or {}
    return str((response.get("Error") or {}).get("Code", ""))


def build_storage(settings: Settings) -> Storage:
    if settings.storage == "s3":
        import boto3

        # a session of its own reads the credentials now: the default session keeps the first it read
        session = boto3.session.Session()
        s3 = session.client("s3", endpoint_url=settings.s3_endpoint, region_name=settings.s3_region)
        return S3Storage(s3, settings.s3_bucket)
    return FilerStorage(settings.filer_url, settings.filer_page_size, token_file=settings.filer_token_file)

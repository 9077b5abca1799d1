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
"""

from __future__ import annotations

import binascii
import hashlib
import http.client
import json
import queue
import re
import threading
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, Required

import httpx
import urllib3
from pydantic import TypeAdapter, ValidationError
from typing_extensions import TypedDict  # pydantic reads TypedDicts from here before 3.12

from functions.adapters.keepalive import Deadline, KeepAlive, Streamed
from functions.adapters.tls import verify_for
from functions.errors import StorageUnavailable
from functions.settings import Settings

CHUNK = 4 << 20
DIRECTORY_BIT = 0x80000000
_PLAIN_ETAG = re.compile(r"^[0-9a-f]{32}$")


class StoredFile(NamedTuple):
    path: str
    size: int
    md5: str | None
    """Hex MD5 as the backend reported it; None when it reported none."""
    version: str | None = None
    """For a file listed without an MD5: a token that changes whenever its bytes do (the filer's
    chunk file ids, inode and mtime; the S3 ETag), so that a same-size replacement is seen."""


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
"""Decodes a page straight from its bytes into the fields above. An entry of the real filer is
~680 bytes of ~25 fields (times, Inode, `chunks` with their file ids); json.loads builds all
of them as Python objects, ~3x the time of this decode, which skips what it does not keep."""


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
    adapters, so `reload` needs the same adapter_config.json files again (50 reads of ~10 ms
    each before the first load, measured).
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


class FilerStorage:
    def __init__(self, base_url: str, page_size: int, timeout: float = 30.0) -> None:
        self._base = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self._base, timeout=timeout, verify=verify_for(self._base))
        # listings (stat's every event, load's configs) over keep-alive http.client when plain
        # http, as the filer is inside a cluster: httpx's client costs more than the exchange
        self._direct = KeepAlive(self._base, read_timeout=timeout) if self._base.startswith("http:") else None
        self._pool = urllib3.PoolManager(timeout=urllib3.Timeout(connect=5.0, read=timeout), retries=False)
        self._page_size = page_size
        self._timeout = timeout

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
        """Stream the file and hash it while the next chunk is being received.

        One thread receives (urllib3 reads straight into large buffers), the caller hashes
        (hashlib releases the GIL), so throughput approaches the slower of the two rather
        than their sum; memory stays bounded by the queue (a few chunks).
        """
        response = self._stream(path)
        if response is None:
            return None
        try:
            if int(response.headers.get("Content-Length") or 0) > max_bytes:
                return None
            return _pipelined_md5(response, max_bytes)
        finally:
            response.release_conn()

    def _stream(self, path: str) -> urllib3.BaseHTTPResponse | None:
        """The file's bytes, not yet read (the caller releases the connection); None: not there."""
        try:
            response = self._pool.request("GET", self._base + quote_path(path), preload_content=False)
        except urllib3.exceptions.HTTPError as err:
            raise StorageUnavailable(f"filer GET {path}: {err}") from err
        if response.status < 400:
            return response
        response.release_conn()
        if response.status == 404:
            return None
        raise StorageUnavailable(f"filer GET {path}: HTTP {response.status}")

    def read_small(self, path: str, max_bytes: int) -> bytes | None:
        """The file's bytes (None: not there); ContentTooLarge past `max_bytes` or compressed."""
        if self._direct is not None:
            return self._read_small_direct(path, max_bytes)
        try:
            with self._http.stream(
                "GET", quote_path(path), headers={"Accept-Encoding": "identity"}
            ) as response:
                if response.status_code == 404:
                    return None
                _raise_for_unavailable(response, path)
                return _bounded(response, max_bytes, path)
        except httpx.HTTPError as err:
            raise StorageUnavailable(f"filer GET {path}: {err}") from err

    def _read_small_direct(self, path: str, max_bytes: int) -> bytes | None:
        """`read_small` over the keep-alive connections (load reads each new adapter's
        adapter_config.json before its first engine call; httpx's stream cost ~0.5-0.8 ms of
        CPU a read). The whole exchange ends within the client's timeout."""
        assert self._direct is not None
        deadline = Deadline(time.monotonic() + self._timeout, time.monotonic)
        try:
            with self._direct.exchange(
                "GET", quote_path(path), {"Accept-Encoding": "identity"}, None, deadline
            ) as response:
                if response.status == 404:
                    return None  # its page unread: that connection is closed, not kept
                if response.status >= 400:
                    raise StorageUnavailable(f"filer GET {path}: HTTP {response.status}")
                return _bounded_direct(response, max_bytes, path)
        except (OSError, http.client.HTTPException) as err:  # TimeoutError is an OSError
            raise StorageUnavailable(f"filer GET {path}: {str(err) or type(err).__name__}") from err

    copy_checks_md5 = True
    """The filer checks a PUT's Content-MD5 against the bytes it stores (400 BadDigest)."""

    def copy_file(self, source: str, target: str, size: int, md5: str) -> bool:
        """Stream `source` into a PUT of `target` with `Content-MD5`: the filer stores it only
        when the bytes hash to `md5`, so the copy is checked as it is written.

        Measured on the real SeaweedFS 4.48 (bench/freeze.py): the filer's own copy
        (`cp.from`) moves no byte through this client but failed with a 500 on a 1 GiB file
        after ~11 s ("context canceled" writing a chunk), and its copy keeps the source's Md5
        attribute, so the copy's bytes would need a second read to be checked; this one reads
        the source once and writes once, and is checked by the filer on the way in.
        """
        got = self._stream(source)
        if got is None:
            return False
        try:
            if int(got.headers.get("Content-Length") or -1) != size:
                return False  # changed since it was verified
            digest = binascii.b2a_base64(bytes.fromhex(md5), newline=False).decode()
            try:
                put = self._pool.request(
                    "PUT",
                    self._base + quote_path(target),
                    body=got.stream(CHUNK),
                    headers={"Content-MD5": digest, "Content-Type": "application/octet-stream"},
                    chunked=True,
                    timeout=urllib3.Timeout(connect=5.0, read=max(self._timeout, 600.0)),
                )
            except urllib3.exceptions.HTTPError as err:
                raise StorageUnavailable(f"filer PUT {target}: {err}") from err
            if put.status == 400:
                return False  # BadDigest: the bytes are not the ones verified
            if put.status >= 300:
                raise StorageUnavailable(f"filer PUT {target}: HTTP {put.status}")
            return True
        finally:
            got.release_conn()

    def delete_tree(self, directory: str) -> None:
        try:
            response = self._http.delete(quote_path(directory.rstrip("/")), params={"recursive": "true"})
        except httpx.HTTPError as err:
            raise StorageUnavailable(f"filer DELETE {directory}: {err}") from err
        if response.status_code >= 300 and response.status_code != 404:
            raise StorageUnavailable(f"filer DELETE {directory}: HTTP {response.status_code}")

    def _list_page(self, directory: str, params: dict[str, str]) -> tuple[int, bytes]:
        """(status, body) of one listing page; StorageUnavailable for 5xx/4xx but 404."""
        headers = {"Accept": "application/json"}
        try:
            if self._direct is not None:
                target = f"{quote_path(directory)}?{urllib.parse.urlencode(params)}"
                status, content, _ = self._direct.request("GET", target, headers, None)
            else:
                response = self._http.get(quote_path(directory), params=params, headers=headers)
                status, content = response.status_code, response.content
        except httpx.HTTPError as err:
            raise StorageUnavailable(f"filer GET {directory}: {err}") from err
        if status >= 400 and status != 404:
            raise StorageUnavailable(f"filer GET {directory}: HTTP {status}")
        return status, content


def _bounded(response: httpx.Response, max_bytes: int, path: str) -> bytes:
    encoding = response.headers.get("content-encoding", "identity").lower()
    if encoding not in ("", "identity"):
        raise ContentTooLarge(f"{path} came compressed ({encoding}); its size cannot be bounded")
    declared = response.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise ContentTooLarge(f"{path} is {declared} bytes, more than {max_bytes}")
    content = bytearray()
    for chunk in response.iter_raw():  # as each read returns: the cap is checked per read
        content += chunk
        if len(content) > max_bytes:
            raise ContentTooLarge(f"{path} is more than {max_bytes} bytes")
    return bytes(content)


def _bounded_direct(response: Streamed, max_bytes: int, path: str) -> bytes:
    """`_bounded` for a keep-alive exchange: no decompression, the cap checked per receive."""
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise ContentTooLarge(f"{path} came compressed ({encoding}); its size cannot be bounded")
    declared = response.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise ContentTooLarge(f"{path} is {declared} bytes, more than {max_bytes}")
    content = bytearray()
    while chunk := response.body.read1(1 << 16):  # what one receive returns
        content += chunk
        if len(content) > max_bytes:
            raise ContentTooLarge(f"{path} is more than {max_bytes} bytes")
    return bytes(content)


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


def _pipelined_md5(response: urllib3.BaseHTTPResponse, max_bytes: int) -> str | None:
    chunks: queue.Queue[bytes | BaseException] = queue.Queue(maxsize=4)

    def receive() -> None:
        try:
            while chunk := response.read(CHUNK):
                chunks.put(chunk)
            chunks.put(b"")
        except BaseException as err:  # handed to the hashing side, which raises it
            chunks.put(err)

    receiver = threading.Thread(target=receive, name="md5-receive", daemon=True)
    receiver.start()
    digest = hashlib.md5(usedforsecurity=False)
    seen = 0
    try:
        while True:
            item = chunks.get()
            if isinstance(item, BaseException):
                raise StorageUnavailable(f"filer stream broke: {item}") from item
            if not item:
                return digest.hexdigest()
            seen += len(item)
            if seen > max_bytes:
                return None
            digest.update(item)
    finally:
        response.drain_conn() if seen <= max_bytes else response.close()
        receiver.join(timeout=30)


def _raise_for_unavailable(response: httpx.Response, path: str) -> None:
    if response.status_code >= 400:
        raise StorageUnavailable(f"filer GET {path}: HTTP {response.status_code}")


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

    def hash_file(self, path: str, max_bytes: int) -> str | None:
        body = self._open(path)
        if body is None or int(body["ContentLength"]) > max_bytes:
            return None
        digest = hashlib.md5(usedforsecurity=False)
        for chunk in body["Body"].iter_chunks(CHUNK):
            digest.update(chunk)
        return digest.hexdigest()

    def read_small(self, path: str, max_bytes: int) -> bytes | None:
        body = self._open(path)
        if body is None:
            return None
        if int(body["ContentLength"]) > max_bytes:
            body["Body"].close()
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

        s3 = boto3.client("s3", endpoint_url=settings.s3_endpoint, region_name=settings.s3_region)
        return S3Storage(s3, settings.s3_bucket)
    return FilerStorage(settings.filer_url, settings.filer_page_size)

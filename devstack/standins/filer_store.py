"""In-memory metadata index + on-disk content for the SeaweedFS filer stand-in.

Content lives under ``data_dir`` mirroring the filer path (``/a/b.txt`` -> ``data_dir/a/b.txt``) so
engine replicas read it there, as through a ``weed mount``. Metadata (md5, times, mode, mime) lives
in memory. Every directory keeps a sorted list of child names, so a page of a listing is one
``bisect`` + a slice (``weed/filer/filer_search.go`` lists ``limit+1`` from ``lastFileName``).

Files found on disk at start are indexed with ``Md5`` null: their digest was never computed by a
filer upload, which is exactly how SeaweedFS reports files written through a FUSE mount.
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import os
import posixpath
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

from functions.logic.seaweed_event import EntryInfo, EventType, Notification

# os.FileMode bits as Go encodes them (weed/filer/entry.go: Mode os.FileMode).
MODE_DIR = 0x80000000
FILE_MODE = 0o660  # filer HTTP uploads: os.FileMode(0660) (filer_server_handlers_write_autochunk.go)
DIR_MODE = MODE_DIR | FILE_MODE | 0o111  # auto-created parents: ModeDir | mode | 0111 -> 0771
TMP_DIR_NAME = ".filer-tmp"
_BLOCK = 1 << 20

Emit = Callable[[str, EventType, Notification], None]


class FilerError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def normalize(path: str) -> str:
    """Clean a filer path: absolute, no trailing slash (root is ``/``), no ``.``/``..``."""
    cleaned = posixpath.normpath("/" + path.lstrip("/"))
    if cleaned.startswith("//"):
        cleaned = "/" + cleaned.lstrip("/")
    return cleaned


def _now_ns() -> int:
    return time.time_ns()


def go_time(ns: int) -> str:
    """Go ``time.Time`` JSON (RFC3339Nano, trailing zeros of the fraction trimmed), in UTC."""
    seconds, frac = divmod(ns, 1_000_000_000)
    base = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    if frac:
        base += "." + f"{frac:09d}".rstrip("0")
    return base + "Z"


def http_date(ns: int) -> str:
    return datetime.fromtimestamp(ns // 1_000_000_000, UTC).strftime("%a, %d %b %Y %H:%M:%S GMT")


@dataclass
class Entry:
    path: str
    is_dir: bool
    mtime_ns: int
    crtime_ns: int
    mode: int
    size: int = 0
    md5: bytes | None = None
    mime: str = ""
    extended: dict[str, bytes] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return posixpath.basename(self.path)

    @property
    def parent(self) -> str:
        return posixpath.dirname(self.path) or "/"

    def info(self, name: str | None = None) -> EntryInfo:
        """``filer.Entry.ToProtoEntry`` reduced to what notifications carry (times in seconds)."""
        return EntryInfo(
            name=self.name if name is None else name,
            is_directory=self.is_dir,
            file_size=self.size,
            md5=self.md5,
            mtime=self.mtime_ns // 1_000_000_000,
            crtime=self.crtime_ns // 1_000_000_000,
            file_mode=self.mode,
            mime=self.mime,
        )

    def etag(self) -> str:
        """``filer.ETagEntry`` (weed/filer/filechunks.go): quoted hex(Md5) when set. Without Md5 the
        real filer derives a chunk ETag (``hex(md5(chunk md5s))-N``), never the file MD5; we have no
        chunks, so we return a value of that ``-N`` shape derived from size and mtime."""
        if self.md5:
            return f'"{self.md5.hex()}"'
        digest = hashlib.md5(f"{self.path}:{self.size}:{self.mtime_ns}".encode()).hexdigest()
        return f'"{digest}-1"'

    def to_json(self) -> dict[str, Any]:
        """Go ``encoding/json`` of ``filer.Entry``: embedded FullPath and Attr fields promoted."""
        return {
            "FullPath": self.path,
            "Mtime": go_time(self.mtime_ns),
            "Crtime": go_time(self.crtime_ns),
            "Ctime": go_time(self.mtime_ns),
            "Atime": go_time(self.mtime_ns),
            "Mode": self.mode,
            "Uid": 0,
            "Gid": 0,
            "Mime": self.mime,
            "TtlSec": 0,
            "UserName": "",
            "GroupNames": None,
            "SymlinkTarget": "",
            "Md5": base64.b64encode(self.md5).decode("ascii") if self.md5 else None,
            "FileSize": self.size,
            "Rdev": 0,
            "Inode": 0,
            "Extended": (
                {k: base64.b64encode(v).decode("ascii") for k, v in self.extended.items()}
                if self.extended
                else None
            ),
            "HardLinkId": None,
            "HardLinkCounter": 0,
            "Content": None,
            "Remote": None,
            "Quota": 0,
            "WORMEnforcedAtTsNs": 0,
        }


@dataclass(frozen=True)
class Page:
    entries: list[Entry]
    should_display_load_more: bool


class FilerStore:
    def __init__(self, data_dir: Path, emit: Emit) -> None:
        self.data_dir = Path(data_dir)
        self._emit = emit
        self._lock = threading.RLock()
        self._entries: dict[str, Entry] = {}
        self._children: dict[str, list[str]] = {}
        self._md5_missing: set[str] = set()
        now = _now_ns()
        self._entries["/"] = Entry("/", True, now, now, DIR_MODE)
        self._children["/"] = []
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.tmp_dir = self.data_dir / TMP_DIR_NAME
        shutil.rmtree(self.tmp_dir, ignore_errors=True)
        self.tmp_dir.mkdir()
        self._scan_disk()

    # ----------------------------------------------------------------------------- helpers

    def disk_path(self, path: str) -> Path:
        path = normalize(path)
        return self.data_dir / path.lstrip("/") if path != "/" else self.data_dir

    def _scan_disk(self) -> None:
        for root, dirs, files in os.walk(self.data_dir):
            rel = os.path.relpath(root, self.data_dir)
            if rel == TMP_DIR_NAME or rel.startswith(TMP_DIR_NAME + os.sep):
                continue
            base = "/" if rel == "." else "/" + rel.replace(os.sep, "/")
            for d in dirs:
                if base == "/" and d == TMP_DIR_NAME:
                    continue
                p = normalize(base + "/" + d)
                st = os.stat(os.path.join(root, d))
                self._insert(Entry(p, True, st.st_mtime_ns, st.st_mtime_ns, DIR_MODE))
            for f in files:
                p = normalize(base + "/" + f)
                st = os.stat(os.path.join(root, f))
                self._insert(Entry(p, False, st.st_mtime_ns, st.st_mtime_ns, FILE_MODE, size=st.st_size))

    def _insert(self, entry: Entry) -> None:
        """Add/replace an entry in the index (parents must exist). Lock held by caller."""
        if entry.path not in self._entries:
            names = self._children.setdefault(entry.parent, [])
            bisect.insort(names, entry.name)
        self._entries[entry.path] = entry
        if entry.is_dir:
            self._children.setdefault(entry.path, [])

    def _remove(self, path: str) -> None:
        entry = self._entries.pop(path)
        names = self._children.get(entry.parent)
        if names is not None:
            i = bisect.bisect_left(names, entry.name)
            if i < len(names) and names[i] == entry.name:
                del names[i]
        self._children.pop(path, None)

    def _ensure_parents(self, path: str) -> None:
        """``Filer.ensureParentDirectoryEntry`` (weed/filer/filer.go): create missing parent
        directories, each with its own create notification. Lock held by caller."""
        parent = posixpath.dirname(path) or "/"
        if parent in self._entries:
            if not self._entries[parent].is_dir:
                raise FilerError(409, f"{parent} is a file")
            return
        self._ensure_parents(parent)
        now = _now_ns()
        self.disk_path(parent).mkdir(parents=True, exist_ok=True)
        entry = Entry(parent, True, now, now, DIR_MODE)
        self._insert(entry)
        self._notify(None, entry, entry.parent)

    def _notify(
        self,
        old: Entry | None,
        new: Entry | None,
        new_parent: str,
        delete_chunks: bool = False,
        new_name: str | None = None,
    ) -> None:
        """``Filer.NotifyUpdateEvent`` (weed/filer/filer_notify.go): key = old full path if any."""
        key = old.path if old is not None else (new.path if new is not None else "/")
        if old is None:
            event_type: EventType = "create"
        elif new is None:
            event_type = "delete"
        elif old.path != (new.path if new_name is None else posixpath.join(new_parent, new_name)):
            event_type = "rename"
        else:
            event_type = "update"
        notification = Notification(
            old_entry=old.info() if old is not None else None,
            new_entry=new.info(new_name) if new is not None else None,
            new_parent_path=new_parent if new is not None else "",
            delete_chunks=delete_chunks,
        )
        self._emit(key, event_type, notification)

    # ----------------------------------------------------------------------------- reads

    def get(self, path: str) -> Entry | None:
        with self._lock:
            entry = self._entries.get(normalize(path))
            return replace(entry) if entry is not None else None

    def list_dir(self, path: str, last_file_name: str, limit: int) -> Page:
        """``Filer.ListDirectoryEntries``: names strictly after ``last_file_name``, fetching
        ``limit+1`` to decide ``ShouldDisplayLoadMore`` (weed/server/filer_server_handlers_read_dir.go)."""
        with self._lock:
            names = self._children.get(normalize(path), [])
            start = bisect.bisect_right(names, last_file_name) if last_file_name else 0
            chunk = names[start : start + limit + 1]
            base = normalize(path)
            entries = [replace(self._entries[(base.rstrip("/") + "/" + n)]) for n in chunk[:limit]]
            return Page(entries, len(chunk) > limit)

    def iter_content(self, path: str) -> Iterator[bytes]:
        with open(self.disk_path(path), "rb") as fh:
            while block := fh.read(_BLOCK):
                yield block

    # ----------------------------------------------------------------------------- writes

    def write(
        self,
        path: str,
        body: BinaryIO | Iterator[bytes],
        *,
        expected_md5: bytes | None = None,
        append: bool = False,
        mime: str = "",
        md5_missing: bool = False,
    ) -> tuple[Entry, bytes, int]:
        """Stream ``body`` to disk computing MD5 (``filer_server_handlers_write_autochunk.go``).
        A mismatching ``expected_md5`` (request Content-MD5) raises 400 BadDigest and stores
        nothing. ``append`` (``op=append``) appends and resets Md5 to null. Returns the new entry,
        the MD5 and the size of the uploaded bytes (what the reply reports)."""
        path = normalize(path)
        if path == "/":
            raise FilerError(400, "cannot write to /")
        tmp = self.tmp_dir / uuid.uuid4().hex
        digest = hashlib.md5()
        size = 0
        try:
            with open(tmp, "wb") as out:
                blocks: Iterator[bytes]
                if hasattr(body, "read"):  # a file object (iterating it would yield lines)
                    stream: Any = body
                    blocks = iter(lambda: stream.read(_BLOCK), b"")
                else:
                    blocks = body
                for block in blocks:
                    out.write(block)
                    digest.update(block)
                    size += len(block)
            md5 = digest.digest()
            if expected_md5 is not None and expected_md5 != md5:
                raise FilerError(
                    400,
                    f"BadDigest: Content-MD5 {base64.b64encode(expected_md5).decode()} does not "
                    f"match the computed {base64.b64encode(md5).decode()}",
                )
            with self._lock:
                old = self._entries.get(path)
                if old is not None and old.is_dir:
                    raise FilerError(409, f"{path} is a directory")
                self._ensure_parents(path)
                target = self.disk_path(path)
                now = _now_ns()
                if append and old is not None:
                    with open(target, "ab") as dst, open(tmp, "rb") as src:
                        shutil.copyfileobj(src, dst, _BLOCK)
                    new = replace(old, mtime_ns=now, size=old.size + size, md5=None)
                else:
                    os.replace(tmp, target)
                    new = Entry(
                        path,
                        False,
                        now,
                        old.crtime_ns if old is not None else now,
                        FILE_MODE,
                        size=size,
                        md5=None if (append or md5_missing or path in self._md5_missing) else md5,
                        mime=mime or (old.mime if old is not None else ""),
                    )
                self._insert(new)
                self._notify(replace(old) if old else None, replace(new), new.parent)
                return replace(new), md5, size
        finally:
            tmp.unlink(missing_ok=True)

    def set_md5_missing(self, path: str, missing: bool) -> None:
        """Leave Md5 null for ``path`` (as for S3 multipart / appends / mount writes), now and for
        later uploads to it. Turning it back off recomputes the digest from disk. Metadata only:
        no notification. The path need not exist yet."""
        path = normalize(path)
        with self._lock:
            if missing:
                self._md5_missing.add(path)
            else:
                self._md5_missing.discard(path)
            entry = self._entries.get(path)
            if entry is None or entry.is_dir:
                return
            if missing:
                entry.md5 = None
                return
        digest = hashlib.md5()
        for block in self.iter_content(path):
            digest.update(block)
        with self._lock:
            entry = self._entries.get(path)
            if entry is not None:
                entry.md5 = digest.digest()

    def mkdir(self, path: str) -> Entry:
        path = normalize(path)
        with self._lock:
            existing = self._entries.get(path)
            if existing is not None:
                if not existing.is_dir:
                    raise FilerError(409, f"{path} is a file")
                return replace(existing)
            self._ensure_parents(path)
            self.disk_path(path).mkdir(parents=True, exist_ok=True)
            now = _now_ns()
            entry = Entry(path, True, now, now, DIR_MODE)
            self._insert(entry)
            self._notify(None, entry, entry.parent)
            return replace(entry)

    def _subtree(self, path: str) -> list[Entry]:
        """Descendants, children before their directory (deepest first)."""
        out: list[Entry] = []
        for name in list(self._children.get(path, [])):
            child = self._entries[path.rstrip("/") + "/" + name]
            if child.is_dir:
                out.extend(self._subtree(child.path))
            out.append(child)
        return out

    def delete(self, path: str, recursive: bool) -> bool:
        """``Filer.DeleteEntryMetaAndData`` (weed/filer/filer_delete_entry.go): a non-empty folder
        needs ``recursive``; every deleted child gets its own delete notification. Returns False
        when the path did not exist (the HTTP handler still answers 204)."""
        path = normalize(path)
        if path == "/":
            raise FilerError(400, "cannot delete /")
        with self._lock:
            entry = self._entries.get(path)
            if entry is None:
                return False
            victims: list[Entry] = []
            if entry.is_dir:
                if self._children.get(path) and not recursive:
                    raise FilerError(500, f"folder {path} is not empty")
                victims = self._subtree(path)
            victims.append(entry)
            for v in victims:
                self._remove(v.path)
            disk = self.disk_path(path)
            if entry.is_dir:
                shutil.rmtree(disk, ignore_errors=True)
            else:
                disk.unlink(missing_ok=True)
            for v in victims:
                self._notify(v, None, "", delete_chunks=not v.is_dir)
            return True

    def move(self, src: str, dst: str) -> Entry:
        """``mv.from`` (weed/server/filer_server_handlers_write.go -> AtomicRenameEntry): moving
        onto an existing directory moves *into* it. Each moved entry emits a rename notification
        (old entry, new entry with the new name, new_parent_path)."""
        src, dst = normalize(src), normalize(dst)
        with self._lock:
            entry = self._entries.get(src)
            if entry is None:
                raise FilerError(404, f"{src} not found")
            target = self._entries.get(dst)
            if target is not None and target.is_dir:
                dst = normalize(dst + "/" + entry.name)
                target = self._entries.get(dst)
            if dst == src:
                return replace(entry)
            if dst.startswith(src.rstrip("/") + "/"):
                raise FilerError(400, f"cannot move {src} into itself")
            if target is not None:
                if target.is_dir or entry.is_dir:
                    raise FilerError(409, f"{dst} already exists")
                self._remove(dst)
            self._ensure_parents(dst)
            moved = [*reversed(self._subtree(src)), entry] if entry.is_dir else [entry]
            # parents first so that the directory exists before its children in the index
            moved.sort(key=lambda e: e.path.count("/"))
            os.replace(self.disk_path(src), self.disk_path(dst))
            events: list[tuple[Entry, Entry]] = []
            for old in moved:
                self._remove(old.path)
            for old in moved:
                new_path = dst + old.path[len(src) :]
                new = replace(old, path=new_path)
                self._insert(new)
                events.append((old, new))
            for old, new in events:
                self._notify(old, new, new.parent)
            return replace(self._entries[dst])

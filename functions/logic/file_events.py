"""A filer change as our `io.loraflow.file.changed.v1` (pure): one mapping for both sources.

Two paths bring SeaweedFS's changes in: ingest (the filer's webhook queue, and the aws_sqs
queue) and the filer source (python -m functions.filer_source, the filer's replayable metadata
log). Both classify a notification into a `FileChange` (functions.logic.seaweed_event) and
then come here, so that the same change makes the same payload whichever way it arrived; the
event's `source` attribute says which one sent it (and the source's `id` and `time` name the
log entry).

Paths: with the filer backend a filer path is a storage path. With the S3 backend the filer
keeps the S3 gateway's objects in the bucket's folder (`<buckets dir>/<bucket>/<key>`, weed/s3api),
so that folder is taken off: `/buckets/loraadapters/loraadapters/ns/m/a/f` is the storage path
`/loraadapters/ns/m/a/f`. A path that is not absolute and normalised is refused in any spelling
(`..`, `.`, `//`, percent-encoded dots or slashes, NUL): a file with such a name is never ours.
"""

from __future__ import annotations

import posixpath
import threading
from uuid import uuid4

from cloudevents.http import CloudEvent
from pydantic import ValidationError

from events.domain import FILE_CHANGED, FileChanged
from events.schema_urls import DEFAULT_SCHEMA_BASE_URL, schema_url
from functions.errors import Reject, problems
from functions.logic.paths import STORAGE_ROOT, is_under
from functions.logic.seaweed_event import FileChange
from functions.settings import Settings

_ENCODED = ("%2e", "%2f", "%5c", "%00")


def check_path(path: str, what: str) -> str:
    """Reject a path that is not absolute and normalised (no traversal in any spelling)."""
    lowered = path.lower()
    if "\x00" in path:
        raise Reject(f"{what} {path!r} contains a NUL byte")
    if any(code in lowered for code in _ENCODED):
        raise Reject(f"{what} {path!r} contains percent-encoded dots, slashes or NUL")
    if not path.startswith("/"):
        raise Reject(f"{what} {path!r} is not absolute")
    if path != "/" and posixpath.normpath(path) != path:
        raise Reject(f"{what} {path!r} is not normalised ('.', '..', '//' or a trailing slash)")
    return path


def bucket_dir(buckets_dir: str, bucket: str) -> str:
    """The filer folder of an S3 bucket (weed/s3api: `<buckets folder>/<bucket>`)."""
    return posixpath.join(buckets_dir, bucket)


def bucket_folder(settings: Settings) -> str | None:
    """The folder to take off notified paths: the bucket's (S3 backend), or None (filer)."""
    return bucket_dir(settings.s3_buckets_dir, settings.s3_bucket) if settings.storage == "s3" else None


def watched_prefixes(settings: Settings) -> tuple[str, ...]:
    """The filer paths whose changes can be ours: the adapter layout in the filer, or in the
    bucket's folder with the S3 backend (where the filer's own /loraadapters/ is not read)."""
    folder = bucket_folder(settings)
    return (f"{STORAGE_ROOT}/",) if folder is None else (f"{folder.rstrip('/')}{STORAGE_ROOT}/",)


def storage_path(path: str, folder: str | None) -> str | None:
    """The path in our storage layout of a notified filer path, or None when it has none.

    `folder` is the S3 bucket's filer folder (S3 backend) or None (filer backend: the filer
    path is the storage path). An S3 key `loraadapters/ns/m/a/f` is stored as
    `<folder>/loraadapters/ns/m/a/f` and is the storage path `/loraadapters/ns/m/a/f`."""
    if folder is None:
        return path
    if is_under(path, folder):
        return path[len(folder.rstrip("/")) :]
    return None


def file_changed(change: FileChange, folder: str | None = None) -> FileChanged | None:
    """Our payload for a classified notification; None when it is none of our business."""
    check_path(change.path, "notification path")
    if change.new_path is not None:
        check_path(change.new_path, "notification new path")
    if change.is_directory:
        return None
    md5 = change.md5_hex if change.md5_hex and len(change.md5_hex) == 32 else None
    path = storage_path(change.path, folder)
    new_path = storage_path(change.new_path, folder) if change.new_path is not None else None
    try:
        if path is not None and is_under(path, STORAGE_ROOT):
            return FileChanged(
                path=path,
                event_type=change.event_type,
                new_path=new_path if new_path is not None else change.new_path,
                size=change.size,
                md5=md5,
            )
        if new_path is not None and is_under(new_path, STORAGE_ROOT):
            return FileChanged(path=new_path, event_type="create", size=change.size, md5=md5)
    except ValidationError as err:
        raise Reject(
            f"notification for {change.path!r} is not a valid file.changed: {problems(err)}"
        ) from err
    return None


def cloud_event(
    payload: FileChanged,
    sender: str,
    schema_base_url: str = DEFAULT_SCHEMA_BASE_URL,
    event_id: str | None = None,
    time: str | None = None,
) -> CloudEvent:
    """file.changed as a sender outside the HTTP shell publishes it (the filer source): the
    envelope functions.edge.messages.reply gives ingest's (subject = the storage path, the old one for a
    rename; source `/loraflow/<sender>`; `dataschema`; JSON data by alias with unset optionals
    omitted), without importing the shell (tests/unit/test_file_events.py holds the two equal).

    `event_id` and `time`: the filer source names the change itself (its store's signature and
    log position; when it happened), so that a replayed change is the same CloudEvent again
    (source + id, as the CloudEvents spec identifies one); without them, a fresh UUID and now."""
    attributes = {
        "type": FILE_CHANGED,
        "source": f"/loraflow/{sender}",
        "subject": payload.path,
        "id": event_id or str(uuid4()),
        "datacontenttype": "application/json",
        "dataschema": schema_url(FILE_CHANGED, schema_base_url),
        **({"time": time} if time else {}),
    }
    return CloudEvent(attributes, payload.model_dump(mode="json", exclude_none=True))


def top_folder(path: str) -> str:
    """`/a/b/c` -> `/a`: how unmapped notifications are grouped in the log."""
    return "/" + path.strip("/").split("/", 1)[0]


class Once:
    """Remembers what was logged already (bounded: a hostile filer cannot grow it forever)."""

    def __init__(self, limit: int = 1024) -> None:
        self._seen: set[str] = set()
        self._limit = limit
        self._lock = threading.Lock()

    def first(self, key: str) -> bool:
        with self._lock:
            if key in self._seen or len(self._seen) >= self._limit:
                return False
            self._seen.add(key)
            return True

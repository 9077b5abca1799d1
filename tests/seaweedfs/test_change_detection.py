"""A file the real SeaweedFS lists without an MD5, replaced by other bytes of the same size, is
seen as changed and hashed again: through the filer (appends, then a rename over it) and
through the S3 gateway (two multipart uploads, boto3).

stat records a `version` for such a file (the filer's chunk file ids, inode and mtime; the S3
ETag); these tests run the real listings through stat's and verify's decisions, so what they
show is the verdict an adapter gets, not only what a listing holds.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from devstack.seaweedfs import Shared
from functions import stat, verify
from functions.adapters.storage import FilerStorage, S3Storage, quote_path
from functions.logic import facts
from functions.ports import StoredFile
from functions.resources.rackai import LoRAAdapter
from tests.support.filer import FilerClient

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def md5(content: bytes) -> str:
    return hashlib.md5(content, usedforsecurity=False).hexdigest()


@pytest.fixture
def directory(seaweed: Shared) -> Iterator[str]:
    found = f"/loraadapters/cd-{secrets.token_hex(3)}/m/a/"
    yield found
    httpx.delete(seaweed.server.url + quote_path(found.rstrip("/")), params={"recursive": "true"})


def adapter_of(directory: str, declared: dict[str, str], status: dict[str, Any] | None = None) -> LoRAAdapter:
    namespace = directory.split("/")[2]
    body: dict[str, Any] = {
        "metadata": {"name": "a", "namespace": namespace, "generation": 1},
        "spec": {"model": "m", "integrity": {"md5": declared}},
        "status": status or {"storageRef": {"path": directory}},
    }
    return LoRAAdapter.model_validate(body)


def verified(
    directory: str, declared: dict[str, str], listing: list[StoredFile], hashed: dict[str, str]
) -> LoRAAdapter:
    """The adapter as stat then verify leave it after `listing` (files without an MD5 hashed)."""
    observed = adapter_of(directory, declared)
    after_stat = observed.model_copy(update={"status": stat.decide(observed, listing, NOW)})
    after_verify = after_stat.model_copy(update={"status": verify.decide(after_stat, hashed, NOW)})
    assert after_verify.status is not None
    return after_verify


def ready(adapter: LoRAAdapter) -> tuple[str, str]:
    found = next(c for c in adapter.status.conditions or [] if c.type == "Ready")  # type: ignore[union-attr]
    return found.status, found.reason


def rejudged(adapter: LoRAAdapter, listing: list[StoredFile], hash_of: Any) -> LoRAAdapter:
    """stat on the new listing, then verify hashing what stat records without an MD5 (its cache
    is keyed by path, size and version, as verify's is)."""
    after_stat = adapter.model_copy(update={"status": stat.decide(adapter, listing, NOW)})
    hashed = {f.path: hash_of(f.path) for f in listing if f.md5 is None}
    return after_stat.model_copy(update={"status": verify.decide(after_stat, hashed, NOW)})


def test_a_rename_over_a_file_of_the_same_size_is_verified_again(
    directory: str, filer: FilerClient, storage: FilerStorage
) -> None:
    weights = directory + "adapter_model.safetensors"
    good, bad = secrets.token_bytes(4096), secrets.token_bytes(4096)
    filer.write_without_md5(weights, good)
    declared = {weights: md5(good)}
    (first,) = storage.stat_dir(directory)
    assert first.md5 is None and first.version is not None
    adapter = verified(directory, declared, [first], {weights: md5(good)})
    assert ready(adapter) == ("True", "IntegrityVerified")
    assert adapter.status is not None and adapter.status.file_set == facts.file_set(declared)

    filer.write_without_md5(directory + "upload.tmp", bad)  # a retrain's file, written aside
    filer.move(directory + "upload.tmp", weights)  # then renamed over the verified one
    (second,) = storage.stat_dir(directory)
    assert (second.size, second.md5) == (first.size, None)  # all the size and MD5 say: unchanged
    assert second.version != first.version

    after_stat = adapter.model_copy(update={"status": stat.decide(adapter, [second], NOW)})
    assert ready(after_stat) == ("Unknown", "AwaitingVerification")
    after = rejudged(adapter, [second], lambda p: storage.hash_file(p, 1 << 20))
    assert ready(after) == ("False", "IntegrityCheckFailed")
    assert after.status is not None and after.status.file_set is None


def test_an_append_that_keeps_no_md5_changes_the_version(
    directory: str, filer: FilerClient, storage: FilerStorage
) -> None:
    """Appends: each stores a new chunk, so the version moves even before the size tells."""
    path = directory + "w.bin"
    filer.write_without_md5(path, b"abcdefgh")
    (before,) = storage.stat_dir(directory)
    filer.write_without_md5(path, b"ABCDEFGH")  # deleted and written again by two appends
    (after,) = storage.stat_dir(directory)
    assert before.size == after.size and before.version != after.version
    (again,) = storage.stat_dir(directory)
    assert again.version == after.version  # listing twice is no change


def test_a_file_with_an_md5_records_no_version(
    directory: str, filer: FilerClient, storage: FilerStorage
) -> None:
    filer.put_file(directory + "c.json", b"{}")
    (listed,) = storage.stat_dir(directory)
    assert (listed.md5, listed.version) == (md5(b"{}"), None)


def multipart(s3: Any, bucket: str, key: str, content: bytes, part: int = 5 << 20) -> str:
    upload = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    parts = []
    for number, start in enumerate(range(0, len(content), part), start=1):
        body = content[start : start + part]
        etag = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=number, Body=body)["ETag"]
        parts.append({"PartNumber": number, "ETag": etag})
    s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts})
    return str(s3.head_object(Bucket=bucket, Key=key)["ETag"])


def test_a_second_multipart_upload_of_the_same_size_is_verified_again(s3: Any) -> None:
    bucket = f"cd-{secrets.token_hex(4)}"
    s3.create_bucket(Bucket=bucket)
    storage = S3Storage(s3, bucket)
    directory = f"/loraadapters/cd-{secrets.token_hex(3)}/m/a/"
    weights = directory + "adapter_model.safetensors"
    size = (5 << 20) + 4096  # two parts: the gateway reports no MD5 for the object
    good, bad = secrets.token_bytes(size), secrets.token_bytes(size)
    try:
        first_etag = multipart(s3, bucket, weights.lstrip("/"), good)
        assert first_etag.strip('"').endswith("-2")
        (first,) = storage.stat_dir(directory)
        assert first.md5 is None and first.version is not None
        declared = {weights: md5(good)}
        adapter = verified(directory, declared, [first], {weights: md5(good)})
        assert ready(adapter) == ("True", "IntegrityVerified")

        multipart(s3, bucket, weights.lstrip("/"), bad)
        (second,) = storage.stat_dir(directory)
        assert (second.size, second.md5) == (first.size, None)
        assert second.version != first.version
        after = rejudged(adapter, [second], lambda p: storage.hash_file(p, 1 << 30))
        assert ready(after) == ("False", "IntegrityCheckFailed")
    finally:
        for item in s3.list_objects_v2(Bucket=bucket).get("Contents") or []:
            s3.delete_object(Bucket=bucket, Key=item["Key"])
        s3.delete_bucket(Bucket=bucket)

"""Freezing on the real SeaweedFS: verify's copy into /loraflow-frozen/, checked by the filer's
Content-MD5 (filer) or by hashing the copy (S3 CopyObject), and what the engines then read.

The vLLM stand-in reads through the real filer as through a SeaweedFS mount and re-reads an
evicted adapter from its `lora_path` on the next request, reporting the MD5s it loaded: after
Ready, the tenant overwrites the upload in place and traffic forces that re-read; what is
served stays the verified bytes.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from devstack.seaweedfs import MOUNT_ROOT, Shared
from devstack.standins.engines import EngineFleet, VllmReplica
from functions.adapters.storage import FilerStorage, S3Storage, quote_path
from functions.freeze import Refusal, freeze
from functions.logic.facts import file_set
from functions.resources.rackai import FrozenSet
from tests.support.filer import FilerClient

NOW = datetime(2026, 12, 1, tzinfo=UTC)
CONFIG = b'{"peft_type": "LORA", "r": 8}'


def md5(content: bytes) -> str:
    return hashlib.md5(content, usedforsecurity=False).hexdigest()


@pytest.fixture
def names(seaweed: Shared) -> Iterator[tuple[str, str]]:
    """(namespace, upload directory) of a fresh adapter; both trees removed afterwards."""
    namespace = f"fz-{secrets.token_hex(3)}"
    yield namespace, f"/loraadapters/{namespace}/m/a/"
    for root in ("/loraadapters/", "/loraflow-frozen/"):
        httpx.delete(seaweed.server.url + quote_path(root + namespace), params={"recursive": "true"})


def frozen_on(
    storage: Any, namespace: str, upload: str, declared: dict[str, str], sizes: dict[str, int]
) -> FrozenSet | Refusal:
    return freeze(storage, namespace, "m", "a", upload, declared, sizes, file_set(declared), 1 << 30, NOW)


def test_a_verified_set_is_frozen_by_its_digest_and_checked_by_the_filer(
    names: tuple[str, str], filer: FilerClient, storage: FilerStorage
) -> None:
    namespace, upload = names
    weights = secrets.token_bytes((9 << 20) + 5)  # three 4 MiB chunks
    filer.put_file(upload + "adapter_config.json", CONFIG)
    filer.write_without_md5(upload + "adapter_model.safetensors", weights)  # the harder case
    declared = {
        upload + "adapter_config.json": md5(CONFIG),
        upload + "adapter_model.safetensors": md5(weights),
    }
    sizes = {upload + "adapter_config.json": len(CONFIG), upload + "adapter_model.safetensors": len(weights)}
    made = frozen_on(storage, namespace, upload, declared, sizes)
    assert isinstance(made, FrozenSet)
    digest = file_set(declared).removeprefix("md5set:")
    assert made.path == f"/loraflow-frozen/{namespace}/m/a/{digest}/"
    assert made.size == len(CONFIG) + len(weights)
    assert filer.read(made.path + "adapter_model.safetensors") == weights
    listed = {f.path.removeprefix(made.path): f.md5 for f in storage.stat_dir(made.path)}
    # the filer computed the copies' MD5s as it stored them
    assert listed == {"adapter_config.json": md5(CONFIG), "adapter_model.safetensors": md5(weights)}
    # a second freeze (a redelivery) keeps the copies that are there and hash right
    again = frozen_on(storage, namespace, upload, declared, sizes)
    assert isinstance(again, FrozenSet) and again.path == made.path


def test_the_filer_refuses_a_copy_whose_bytes_are_not_the_declared_ones(
    names: tuple[str, str], filer: FilerClient, storage: FilerStorage
) -> None:
    """The upload replaced (same size) between verification and the copy: the filer's
    Content-MD5 check refuses the copy, nothing is stored, and the set is never Ready."""
    namespace, upload = names
    verified, replaced = secrets.token_bytes(4096), secrets.token_bytes(4096)
    filer.put_file(upload + "adapter_model.safetensors", replaced)
    target = f"/loraflow-frozen/{namespace}/m/a/0123456789abcdef/adapter_model.safetensors"
    assert not storage.copy_file(upload + "adapter_model.safetensors", target, 4096, md5(verified))
    assert filer.entry(target) is None
    declared = {upload + "adapter_model.safetensors": md5(verified)}
    made = frozen_on(storage, namespace, upload, declared, {upload + "adapter_model.safetensors": 4096})
    assert isinstance(made, Refusal) and made.reason == "FreezeFailed"


def test_files_planted_in_the_frozen_directory_are_thrown_away(
    names: tuple[str, str], filer: FilerClient, storage: FilerStorage
) -> None:
    """Someone writes where the set will be frozen before loraflow does (its name is the digest
    of declared MD5s, which anyone can compute): freeze starts again from an empty directory."""
    namespace, upload = names
    weights = secrets.token_bytes(4096)
    filer.put_file(upload + "adapter_model.safetensors", weights)
    declared = {upload + "adapter_model.safetensors": md5(weights)}
    directory = f"/loraflow-frozen/{namespace}/m/a/{file_set(declared).removeprefix('md5set:')}/"
    filer.put_file(directory + "adapter_model.safetensors", secrets.token_bytes(4096))  # same size
    filer.put_file(directory + "adapter_model.bin", b"planted weights")
    made = frozen_on(storage, namespace, upload, declared, {upload + "adapter_model.safetensors": 4096})
    assert isinstance(made, FrozenSet)
    assert [f.path for f in storage.stat_dir(directory)] == [directory + "adapter_model.safetensors"]
    assert filer.read(directory + "adapter_model.safetensors") == weights


def test_an_s3_set_is_copied_server_side_and_its_copy_hashed(s3: Any) -> None:
    bucket = f"fz-{secrets.token_hex(4)}"
    s3.create_bucket(Bucket=bucket)
    storage = S3Storage(s3, bucket)
    namespace = f"fz-{secrets.token_hex(3)}"
    upload = f"/loraadapters/{namespace}/m/a/"
    weights = secrets.token_bytes((5 << 20) + 17)
    key = (upload + "adapter_model.safetensors").lstrip("/")
    created = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    parts = []
    for number, start in enumerate(range(0, len(weights), 5 << 20), start=1):
        body = weights[start : start + (5 << 20)]
        etag = s3.upload_part(Bucket=bucket, Key=key, UploadId=created, PartNumber=number, Body=body)["ETag"]
        parts.append({"PartNumber": number, "ETag": etag})
    s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=created, MultipartUpload={"Parts": parts})
    try:
        declared = {"/" + key: md5(weights)}
        made = frozen_on(storage, namespace, upload, declared, {"/" + key: len(weights)})
        assert isinstance(made, FrozenSet) and made.path.startswith(f"/loraflow-frozen/{namespace}/")
        copy = s3.get_object(Bucket=bucket, Key=(made.path + "adapter_model.safetensors").lstrip("/"))
        assert copy["Body"].read() == weights
        storage.delete_tree(made.path)
        assert storage.stat_dir(made.path) == []
        wrong = {"/" + key: md5(b"not these bytes")}  # the copy is hashed: a wrong MD5 is refused
        refused = frozen_on(storage, namespace, upload, wrong, {"/" + key: len(weights)})
        assert isinstance(refused, Refusal)
    finally:
        for item in s3.list_objects_v2(Bucket=bucket).get("Contents") or []:
            s3.delete_object(Bucket=bucket, Key=item["Key"])
        s3.delete_bucket(Bucket=bucket)


def test_an_evicted_adapter_is_read_again_from_the_frozen_copy(
    seaweed: Shared, names: tuple[str, str], filer: FilerClient, storage: FilerStorage
) -> None:
    """vLLM keeps `--max-cpu-loras` adapters in memory and re-reads an evicted one from its
    lora_path when a request names it. Loaded from the frozen copy, a tenant overwriting the
    upload in place changes nothing that is served; loaded from the upload (before freezing),
    the same overwrite is what the next request gets."""
    namespace, upload = names
    weights, tampered = secrets.token_bytes(8192), secrets.token_bytes(8192)
    filer.put_file(upload + "adapter_config.json", CONFIG)
    filer.put_file(upload + "adapter_model.safetensors", weights)
    for other in ("b", "c"):
        filer.put_file(f"/loraadapters/{namespace}/m/{other}/adapter_config.json", CONFIG)
        filer.put_file(f"/loraadapters/{namespace}/m/{other}/adapter_model.safetensors", other.encode() * 10)
    declared = {
        upload + "adapter_config.json": md5(CONFIG),
        upload + "adapter_model.safetensors": md5(weights),
    }
    sizes = {upload + "adapter_config.json": len(CONFIG), upload + "adapter_model.safetensors": len(weights)}
    made = frozen_on(storage, namespace, upload, declared, sizes)
    assert isinstance(made, FrozenSet)
    mount = str(MOUNT_ROOT)
    with EngineFleet(port=0) as fleet, httpx.Client(timeout=10) as client:
        replica = fleet.create(
            f"fz-{secrets.token_hex(3)}",
            "vllm",
            served_model="base",
            engine_mount_prefix=mount,
            filer_url=seaweed.server.url,
            max_loras=1,
            max_cpu_loras=1,
        )
        assert isinstance(replica, VllmReplica)
        paths = {
            "frozen": mount + made.path.rstrip("/"),
            "upload": mount + upload.rstrip("/"),
            "b": f"{mount}/loraadapters/{namespace}/m/b",
        }
        for lora, path in paths.items():
            answer = client.post(
                replica.url + "/v1/load_lora_adapter", json={"lora_name": lora, "lora_path": path}
            )
            assert answer.status_code == 200, answer.text
        roots = {c["id"]: c["root"] for c in client.get(replica.url + "/v1/models").json()["data"]}
        assert roots["frozen"].endswith(file_set(declared).removeprefix("md5set:"))  # root names the digest
        filer.put_file(upload + "adapter_model.safetensors", tampered)  # in place, after Ready
        served: dict[str, Any] = {}
        for lora in ("frozen", "upload"):
            answer = client.post(
                replica.url + "/v1/completions", json={"model": lora, "prompt": "x", "max_tokens": 1}
            )
            assert answer.status_code == 200, answer.text
            served[lora] = answer.json()["served_by"]
        assert served["frozen"]["reloaded"] is True  # evicted by the later loads, read again
        assert served["frozen"]["md5s"]["adapter_model.safetensors"] == md5(weights)
        assert served["upload"]["md5s"]["adapter_model.safetensors"] == md5(
            tampered
        )  # what freezing prevents

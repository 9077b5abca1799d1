"""The whole flow on the real SeaweedFS, both backends: a file stored -> the filer's webhook ->
ingest -> broker -> stat -> verify -> Ready -> load into every replica, which reads the files
through the filer (as through a SeaweedFS mount) and reports their MD5s.

Filer backend: HTTP uploads, a file larger than the filer's chunk size (-filer.maxMB=4), an
overwrite that fixes a wrong file, a rename into place, a directory deleted. S3 backend:
PutObject and a multipart upload through the real gateway (its Md5 is null: verify streams).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from devstack.seaweedfs import shared
from devstack.stack import Stack
from functions.resources.kinds import MODEL_DEPLOYMENT_LABEL, VLLM_ADAPTER
from tests.support.cluster import Cluster, serving_a1
from tests.support.filer import FilerClient
from tests.support.wait import eventually

CONFIG = b'{"peft_type": "LORA", "r": 8}'
SELECTOR = f"{MODEL_DEPLOYMENT_LABEL}=d1"


def md5(content: bytes) -> str:
    return hashlib.md5(content, usedforsecurity=False).hexdigest()


@pytest.fixture(scope="module", params=["filer", "s3"])
def stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    with Stack(ping_period=None, time_scale=0.1, storage=request.param, seaweed=shared()) as running:
        yield running


@pytest.fixture
def cluster(stack: Stack) -> Cluster:
    return serving_a1(stack, "sw")


def directory(cluster: Cluster) -> str:
    return f"/loraadapters/{cluster.namespace}/llama/a1/"


def declare(cluster: Cluster, files: dict[str, bytes]) -> None:
    md5s = {directory(cluster) + name: md5(content) for name, content in files.items()}
    cluster.create(VLLM_ADAPTER, "a1", {"model": "llama", "integrity": {"md5": md5s}})


def phase(cluster: Cluster) -> str:
    return str(((cluster.get(VLLM_ADAPTER, "a1") or {}).get("status") or {}).get("phase", ""))


def served_from(stack: Stack, cluster: Cluster, files: dict[str, bytes]) -> None:
    """Ready, loaded in both pods, and each engine read exactly these bytes at load time."""
    eventually(lambda: phase(cluster) == "Ready", 30, what=f"Ready (now {phase(cluster)!r})")
    eventually(lambda: cluster.loaded_in(SELECTOR, "a1", 2), 30, what="loaded in 2 pods")
    wanted = {name: md5(content) for name, content in files.items()}
    for pod in cluster.pods(SELECTOR):
        read = stack.workload.replica(cluster.namespace, pod["metadata"]["name"]).state()["files"]
        assert read["a1"] == wanted


def test_uploaded_files_become_ready_and_loaded(stack: Stack, cluster: Cluster) -> None:
    files = {"adapter_config.json": CONFIG, "adapter_model.safetensors": os.urandom(4096)}
    declare(cluster, files)
    for name, content in files.items():
        cluster.upload(directory(cluster) + name, content)
    served_from(stack, cluster, files)


def test_a_file_larger_than_the_filer_chunk_size(stack: Stack, cluster: Cluster) -> None:
    files = {"adapter_config.json": CONFIG, "adapter_model.safetensors": os.urandom(9 << 20)}
    declare(cluster, files)
    for name, content in files.items():
        cluster.upload(directory(cluster) + name, content)
    served_from(stack, cluster, files)


def test_an_overwrite_fixes_a_wrong_file(stack: Stack, cluster: Cluster) -> None:
    files = {"adapter_config.json": CONFIG, "adapter_model.safetensors": os.urandom(2048)}
    declare(cluster, files)
    cluster.upload(directory(cluster) + "adapter_config.json", CONFIG)
    cluster.upload(directory(cluster) + "adapter_model.safetensors", b"not the declared weights")
    eventually(lambda: phase(cluster) == "Failed", 30, what="Failed on the wrong file")
    assert cluster.unloaded_everywhere(SELECTOR, "a1")
    cluster.upload(directory(cluster) + "adapter_model.safetensors", files["adapter_model.safetensors"])
    served_from(stack, cluster, files)


def s3_client(stack: Stack) -> Any:
    storage = stack.storage_endpoints()["s3"]
    return boto3.client(
        "s3",
        endpoint_url=storage["url"],
        region_name="us-east-1",
        aws_access_key_id=storage["access_key_id"],
        aws_secret_access_key=storage["secret_access_key"],
    )


@pytest.mark.parametrize("stack", ["s3"], indirect=True)
def test_a_multipart_upload_through_the_s3_gateway(stack: Stack, cluster: Cluster) -> None:
    weights = os.urandom((5 << 20) + 4096)  # two parts: 5 MiB (the minimum) and the rest
    files = {"adapter_config.json": CONFIG, "adapter_model.safetensors": weights}
    declare(cluster, files)
    s3 = s3_client(stack)
    cluster.upload(directory(cluster) + "adapter_config.json", CONFIG)
    key = (directory(cluster) + "adapter_model.safetensors").lstrip("/")
    upload = s3.create_multipart_upload(Bucket=stack.bucket, Key=key)["UploadId"]
    parts = []
    for number, start in enumerate((0, 5 << 20), start=1):
        body = weights[start : start + (5 << 20)]
        etag = s3.upload_part(Bucket=stack.bucket, Key=key, UploadId=upload, PartNumber=number, Body=body)
        parts.append({"PartNumber": number, "ETag": etag["ETag"]})
    s3.complete_multipart_upload(
        Bucket=stack.bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts}
    )
    assert s3.head_object(Bucket=stack.bucket, Key=key)["ETag"].strip('"').endswith("-2")
    served_from(stack, cluster, files)


@pytest.mark.parametrize("stack", ["filer"], indirect=True)
def test_a_rename_into_place_and_a_directory_delete(stack: Stack, cluster: Cluster) -> None:
    """Filer operations (S3 has neither a rename nor directories)."""
    files = {"adapter_config.json": CONFIG, "adapter_model.safetensors": os.urandom(2048)}
    declare(cluster, files)
    cluster.upload(directory(cluster) + "adapter_config.json", CONFIG)
    cluster.upload(directory(cluster) + "weights.partial", files["adapter_model.safetensors"])
    stack.settle()
    assert phase(cluster) != "Ready"
    with FilerClient(stack.seaweed.url) as filer:
        filer.move(directory(cluster) + "weights.partial", directory(cluster) + "adapter_model.safetensors")
        served_from(stack, cluster, files)
        assert filer.delete(directory(cluster).rstrip("/"), recursive=True) == 204
    eventually(lambda: phase(cluster) not in ("Ready", ""), 30, what="no longer Ready")
    status = (cluster.get(VLLM_ADAPTER, "a1") or {}).get("status") or {}
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] != "True", ready

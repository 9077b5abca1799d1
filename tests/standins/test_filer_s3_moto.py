"""S3 facts our S3 storage backend relies on, checked against moto's S3 (real boto3 client):
a PutObject ETag is the quoted hex MD5 of the body; a multipart ETag is
``md5(concat(part md5 digests))-N`` and is NOT the file MD5; ListObjectsV2 reports the same ETags."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

PART = 5 * 1024 * 1024  # S3_UPLOAD_PART_MIN_SIZE default


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    client = boto3.client(
        "s3",
        endpoint_url=f"http://{host}:{port}",
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    client.create_bucket(Bucket="loraadapters")
    yield client
    server.stop()


def test_put_object_etag_is_md5(s3: Any) -> None:
    body = b'{"r": 8, "lora_alpha": 16}'
    resp = s3.put_object(Bucket="loraadapters", Key="loraadapters/ns/m/a/adapter_config.json", Body=body)
    assert resp["ETag"] == f'"{hashlib.md5(body).hexdigest()}"'
    listed = s3.list_objects_v2(Bucket="loraadapters", Prefix="loraadapters/ns/m/a/")
    (obj,) = listed["Contents"]
    assert obj["ETag"].strip('"') == hashlib.md5(body).hexdigest()
    assert obj["Size"] == len(body)


def test_multipart_etag_has_part_count_and_is_not_the_md5(s3: Any) -> None:
    parts = [b"a" * PART, b"b" * PART, b"tail"]
    key = "loraadapters/ns/m/a/adapter_model.safetensors"
    upload = s3.create_multipart_upload(Bucket="loraadapters", Key=key)
    done = []
    for i, data in enumerate(parts, start=1):
        r = s3.upload_part(
            Bucket="loraadapters", Key=key, UploadId=upload["UploadId"], PartNumber=i, Body=data
        )
        assert r["ETag"] == f'"{hashlib.md5(data).hexdigest()}"'
        done.append({"ETag": r["ETag"], "PartNumber": i})
    s3.complete_multipart_upload(
        Bucket="loraadapters", Key=key, UploadId=upload["UploadId"], MultipartUpload={"Parts": done}
    )
    etag = s3.head_object(Bucket="loraadapters", Key=key)["ETag"].strip('"')
    expected = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest()
    assert etag == f"{expected}-3"
    assert etag.split("-")[0] != hashlib.md5(b"".join(parts)).hexdigest()
    listed = s3.list_objects_v2(Bucket="loraadapters", Prefix=key)["Contents"][0]
    assert listed["ETag"].strip('"').endswith("-3")

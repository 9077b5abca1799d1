"""The frozen area of the S3 backend on the real SeaweedFS 4.48 gateway, with scoped identities.

With the S3 backend the frozen sets are keys of the adapters' bucket (`loraflow-frozen/...`),
beside the tenants' uploads (`loraadapters/<namespace>/...`), so the filer's write-signing key
does not cover them: the gateway's identities do (devstack.seaweedfs.s3_iam). loraflow's reads
and lists the bucket and writes only under `loraflow-frozen/`; a tenant's reads, lists and
writes only its namespace's uploads. Each identity here is added to the running gateway as an
operator adds one (`weed shell s3.configure -apply`), and loraflow's own `freeze()` and
`collect()` run on `S3Storage` signed as loraflow, as the functions do.
"""

from __future__ import annotations

import hashlib
import secrets
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from devstack.seaweedfs import Shared, s3_iam
from functions.adapters.storage import S3Storage
from functions.freeze import collect, freeze
from functions.logic.facts import file_set
from functions.resources.rackai import FrozenSet

CONFIG = b'{"peft_type": "LORA", "r": 8}'
REFUSED = ("AccessDenied", "InvalidRequest")
"""What the gateway answers a write outside an identity's actions, or a key with `..` in it."""


def md5(content: bytes) -> str:
    return hashlib.md5(content, usedforsecurity=False).hexdigest()


@dataclass(frozen=True)
class Bucket:
    """A bucket of the session's gateway, with loraflow's identity and two tenants' for it."""

    name: str
    url: str
    operator: Any
    loraflow: Any
    loraflow_identity: s3_iam.S3Identity
    tenants: dict[str, Any]


@pytest.fixture(scope="module")
def bucket(seaweed: Shared) -> Iterator[Bucket]:
    server = seaweed.server
    name = f"iam-{secrets.token_hex(4)}"
    clients: list[Any] = []

    def client(identity: s3_iam.S3Identity) -> Any:
        made = boto3.client("s3", endpoint_url=server.s3_url, **identity.boto())
        clients.append(made)
        return made

    operator = client(server.s3_operator)
    operator.create_bucket(Bucket=name)
    tenants = {
        ns: client(server.add_s3_identity(s3_iam.tenant(ns, name)))
        for ns in (f"t-{secrets.token_hex(3)}", f"t-{secrets.token_hex(3)}")
    }
    loraflow = server.add_s3_identity(s3_iam.loraflow(name))
    try:
        yield Bucket(name, server.s3_url, operator, client(loraflow), loraflow, tenants)
    finally:
        for made in clients:
            made.close()


def code(attempt: Callable[[], object]) -> str:
    """The error code the gateway answered `attempt` with ("" when it was done)."""
    try:
        attempt()
    except ClientError as err:
        return str(err.response["Error"]["Code"])
    return ""


class FrozenAdapter:
    """A tenant's upload (the weights by a multipart upload, whose ETag is no MD5) frozen by
    loraflow's own `freeze()` on S3Storage signed as loraflow."""

    def __init__(self, bucket: Bucket) -> None:
        self.bucket = bucket
        self.ns, self.tenant = next(iter(bucket.tenants.items()))
        self.upload = f"/loraadapters/{self.ns}/m-{secrets.token_hex(3)}/a1/"
        self.weights = secrets.token_bytes((5 << 20) + 4096)  # two parts: 5 MiB and the rest
        key = self.upload.lstrip("/")
        self.tenant.put_object(Bucket=bucket.name, Key=key + "adapter_config.json", Body=CONFIG)
        self.multipart(self.tenant, key + "adapter_model.safetensors", self.weights)
        self.declared = {
            self.upload + "adapter_config.json": md5(CONFIG),
            self.upload + "adapter_model.safetensors": md5(self.weights),
        }
        sizes = {self.upload + "adapter_config.json": len(CONFIG)}
        sizes[self.upload + "adapter_model.safetensors"] = len(self.weights)
        signed_as_loraflow = boto3.client("s3", endpoint_url=bucket.url, **bucket.loraflow_identity.boto())
        self.storage = S3Storage(signed_as_loraflow, bucket.name)
        frozen = freeze(
            self.storage, self.ns, "m1", "a1", self.upload, self.declared, sizes,
            file_set(self.declared), 1 << 30, datetime(2026, 12, 1, tzinfo=UTC),
        )  # fmt: skip
        assert isinstance(frozen, FrozenSet), frozen
        self.record = frozen.model_copy(update={"retired_at": frozen.frozen_at})
        self.frozen_key = frozen.path.lstrip("/")

    def multipart(self, client: Any, key: str, content: bytes) -> None:
        started = client.create_multipart_upload(Bucket=self.bucket.name, Key=key)
        parts = []
        for number, piece in enumerate((content[: 5 << 20], content[5 << 20 :]), start=1):
            part = client.upload_part(
                Bucket=self.bucket.name, Key=key, UploadId=started["UploadId"], PartNumber=number, Body=piece
            )
            parts.append({"ETag": part["ETag"], "PartNumber": number})
        client.complete_multipart_upload(
            Bucket=self.bucket.name, Key=key, UploadId=started["UploadId"], MultipartUpload={"Parts": parts}
        )

    def served(self) -> dict[str, bytes | str]:
        """What the engines read from the frozen set now (an error code for a missing key)."""
        found: dict[str, bytes | str] = {}
        for name in ("adapter_config.json", "adapter_model.safetensors"):
            try:
                got = self.bucket.operator.get_object(Bucket=self.bucket.name, Key=self.frozen_key + name)
                found[name] = got["Body"].read()
            except ClientError as err:
                found[name] = str(err.response["Error"]["Code"])
        return found


@pytest.fixture
def adapter(bucket: Bucket) -> Iterator[FrozenAdapter]:
    made = FrozenAdapter(bucket)
    with closing(made.storage):
        yield made


def test_loraflow_freezes_and_collects_with_its_scoped_identity(adapter: FrozenAdapter) -> None:
    assert adapter.served() == {"adapter_config.json": CONFIG, "adapter_model.safetensors": adapter.weights}
    grace = timedelta(minutes=10)
    later = datetime(2026, 12, 1, tzinfo=UTC) + grace * 2
    assert collect(adapter.storage, [adapter.record], {}, later, grace) == []
    assert adapter.served() == {"adapter_config.json": "NoSuchKey", "adapter_model.safetensors": "NoSuchKey"}


def test_loraflow_cannot_change_a_tenants_uploads(adapter: FrozenAdapter, bucket: Bucket) -> None:
    key = adapter.upload.lstrip("/") + "adapter_config.json"
    assert code(lambda: bucket.loraflow.put_object(Bucket=bucket.name, Key=key, Body=b"{}")) == "AccessDenied"
    deleted = bucket.loraflow.delete_objects(Bucket=bucket.name, Delete={"Objects": [{"Key": key}]})
    assert [e["Code"] for e in deleted.get("Errors", [])] == ["AccessDenied"]
    assert bucket.operator.get_object(Bucket=bucket.name, Key=key)["Body"].read() == CONFIG


def test_a_tenant_cannot_change_a_frozen_set(adapter: FrozenAdapter, bucket: Bucket) -> None:
    before = adapter.served()
    tenant, name = adapter.tenant, bucket.name
    config = adapter.frozen_key + "adapter_config.json"
    model = adapter.frozen_key + "adapter_model.safetensors"
    own = adapter.upload.lstrip("/") + "adapter_config.json"
    attempts: dict[str, Callable[[], object]] = {
        "put": lambda: tenant.put_object(Bucket=name, Key=config, Body=b'{"r": 666}'),
        "put a new key": lambda: tenant.put_object(Bucket=name, Key=model + ".extra", Body=b"x"),
        "copy into": lambda: tenant.copy_object(
            Bucket=name, Key=config, CopySource={"Bucket": name, "Key": own}
        ),
        "multipart": lambda: adapter.multipart(tenant, model, secrets.token_bytes(len(adapter.weights))),
        "delete": lambda: tenant.delete_object(Bucket=name, Key=model),
        "read": lambda: tenant.get_object(Bucket=name, Key=model),
        "list": lambda: tenant.list_objects_v2(Bucket=name, Prefix=adapter.frozen_key),
    }
    for what, attempt in attempts.items():
        assert code(attempt) in REFUSED, what
    deleted = tenant.delete_objects(Bucket=name, Delete={"Objects": [{"Key": config}, {"Key": model}]})
    assert sorted(e["Code"] for e in deleted.get("Errors", [])) == ["AccessDenied", "AccessDenied"]
    assert adapter.served() == before


@pytest.mark.parametrize(
    "spelling",
    [
        "loraadapters/{ns}/../../{rest}",
        "loraadapters/{ns}/./../../{rest}",
        "loraadapters/{ns}//../../{rest}",
        "loraadapters/{ns}/%2e%2e/%2e%2e/{rest}",
        "loraadapters/{ns}/..%2f..%2f{rest}",
        "loraadapters/{ns}/..\\..\\{rest}",
        "/{rest}",
        "%6coraflow-frozen/{rest_in_root}",
    ],
)
def test_no_key_spelling_reaches_the_frozen_area(
    adapter: FrozenAdapter, bucket: Bucket, spelling: str
) -> None:
    """A key is refused (`..`), or a literal name inside the tenant's own prefix, never a frozen key."""
    before = adapter.served()
    rest = adapter.frozen_key + "adapter_config.json"
    key = spelling.format(ns=adapter.ns, rest=rest, rest_in_root=rest.removeprefix("loraflow-frozen/"))
    outcome = code(lambda: adapter.tenant.put_object(Bucket=bucket.name, Key=key, Body=b"evil"))
    if outcome == "":
        assert key.startswith(f"loraadapters/{adapter.ns}/"), key
    else:
        assert outcome in REFUSED, (key, outcome)
    assert adapter.served() == before


def test_a_tenant_reaches_only_its_own_uploads(bucket: Bucket) -> None:
    (own, tenant), (other, _) = bucket.tenants.items()
    mine = f"loraadapters/{own}/m1/a1/adapter_config.json"
    theirs = f"loraadapters/{other}/m1/a1/adapter_config.json"
    bucket.operator.put_object(Bucket=bucket.name, Key=theirs, Body=CONFIG)
    assert code(lambda: tenant.put_object(Bucket=bucket.name, Key=mine, Body=CONFIG)) == ""
    assert tenant.get_object(Bucket=bucket.name, Key=mine)["Body"].read() == CONFIG
    listed = tenant.list_objects_v2(Bucket=bucket.name, Prefix=f"loraadapters/{own}/")
    keys = [o["Key"] for o in listed["Contents"]]
    assert mine in keys and all(k.startswith(f"loraadapters/{own}/") for k in keys)
    for attempt in (
        lambda: tenant.put_object(Bucket=bucket.name, Key=theirs, Body=b"evil"),
        lambda: tenant.put_object(Bucket=bucket.name, Key=f"loraadapters/{own}x/a", Body=b"evil"),
        lambda: tenant.get_object(Bucket=bucket.name, Key=theirs),
        lambda: tenant.list_objects_v2(Bucket=bucket.name, Prefix=f"loraadapters/{other}/"),
        lambda: tenant.list_objects_v2(Bucket=bucket.name),
        lambda: tenant.create_bucket(Bucket=f"mine-{secrets.token_hex(3)}"),
    ):
        assert code(attempt) == "AccessDenied"
    assert bucket.operator.get_object(Bucket=bucket.name, Key=theirs)["Body"].read() == CONFIG


def test_unsigned_requests_and_unknown_keys_are_refused(bucket: Bucket) -> None:
    key = f"loraadapters/{next(iter(bucket.tenants))}/m1/a1/anonymous.json"
    anyone = {"aws_access_key_id": "any", "aws_secret_access_key": "any", "region_name": s3_iam.REGION}
    stranger = boto3.client("s3", endpoint_url=bucket.url, **anyone)
    with closing(stranger):
        refused = code(lambda: stranger.put_object(Bucket=bucket.name, Key=key, Body=b"x"))
    assert refused == "InvalidAccessKeyId"
    unsigned = urllib.request.Request(f"{bucket.url}/{bucket.name}/{key}", data=b"x", method="PUT")
    with pytest.raises(urllib.error.HTTPError) as unsigned_refused:
        urllib.request.urlopen(unsigned, timeout=30)
    unsigned_refused.value.close()
    assert unsigned_refused.value.code == 403
    assert code(lambda: bucket.operator.head_object(Bucket=bucket.name, Key=key)) == "404"

"""The frozen area on a real SeaweedFS 4.48 filer started with a write-signing key.

With `[jwt.filer_signing]` in its security.toml the filer takes a write (anything but GET and
HEAD) only with a bearer JWT signed with that key; a token's `allowed_prefixes` confine it to
paths under them, compared component by component after the filer has decoded and cleaned the
path, and `mv.from`/`cp.from` are checked too. loraflow's storage identity holds a token without
prefixes; a tenant's is scoped to `/loraadapters/<namespace>` (devstack.seaweedfs.tokens). So a
tenant can neither change a frozen set nor reach another namespace's uploads, whatever the name
encoding, and reads stay open to the engines' mount.

The session's shared server (tests/seaweedfs/conftest.py) has no key: every other test writes
without tokens. This module starts a signed server of its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import secrets
from collections.abc import Iterator
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest

from devstack.seaweedfs import SeaweedServer
from devstack.seaweedfs.tokens import loraflow_token, mint, tenant_token
from functions.adapters.storage import FilerStorage
from functions.errors import StorageUnavailable
from functions.freeze import collect, freeze
from functions.logic.facts import file_set
from functions.resources.rackai import FrozenSet

KEY = "filer-signing-" + secrets.token_hex(16)
CONFIG = b'{"peft_type": "LORA", "r": 8}'
WRONG_JWT = 401


def md5(content: bytes) -> str:
    return hashlib.md5(content, usedforsecurity=False).hexdigest()


@pytest.fixture(scope="module")
def signed() -> Iterator[SeaweedServer]:
    with SeaweedServer(signing_key=KEY, s3=True) as server:
        yield server


def send(server: SeaweedServer, method: str, target: str, body: bytes = b"", token: str | None = None) -> int:
    """One request with `target` sent exactly as written (httpx would resolve `..` first)."""
    connection = http.client.HTTPConnection(server.host, server.ports["filer"], timeout=30)
    try:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        connection.request(method, target, body=body, headers=headers)
        answer = connection.getresponse()
        answer.read()
        return answer.status
    finally:
        connection.close()


def read(server: SeaweedServer, path: str) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection(server.host, server.ports["filer"], timeout=30)
    try:
        connection.request("GET", path)
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


class FrozenAdapter:
    """An upload of tenant `ns` frozen by loraflow's own `freeze()` with its token file."""

    def __init__(self, server: SeaweedServer, token_dir: Path) -> None:
        self.server = server
        self.ns = f"wt-{secrets.token_hex(3)}"
        self.tenant = tenant_token(KEY, self.ns)
        self.upload = f"/loraadapters/{self.ns}/m1/a1/"
        self.weights = secrets.token_bytes(1 << 20)
        for name, content in (("adapter_config.json", CONFIG), ("adapter_model.safetensors", self.weights)):
            assert send(server, "PUT", self.upload + name, content, self.tenant) == 201
        self.declared = {
            self.upload + "adapter_config.json": md5(CONFIG),
            self.upload + "adapter_model.safetensors": md5(self.weights),
        }
        self.sizes = {
            self.upload + "adapter_config.json": len(CONFIG),
            self.upload + "adapter_model.safetensors": len(self.weights),
        }
        self.file_set = file_set(self.declared)
        self.token_file = token_dir / "token"
        self.token_file.write_text(loraflow_token(KEY) + "\n")
        self.storage = FilerStorage(server.url, page_size=1000, token_file=str(self.token_file))
        frozen = self.freeze()
        assert isinstance(frozen, FrozenSet), frozen
        # retired at once: `collect` may delete it when the grace has passed
        self.record = frozen.model_copy(update={"retired_at": frozen.frozen_at})
        self.frozen = frozen.path

    def freeze(self) -> Any:
        return freeze(
            self.storage, self.ns, "m1", "a1", self.upload, self.declared, self.sizes,
            self.file_set, 1 << 30, datetime(2026, 12, 1, tzinfo=UTC),
        )  # fmt: skip

    def served(self) -> dict[str, bytes | int]:
        """What the engines read from the frozen set now (a status for a file that is not there)."""
        found: dict[str, bytes | int] = {}
        for name in ("adapter_config.json", "adapter_model.safetensors"):
            status, body = read(self.server, self.frozen + name)
            found[name] = body if status == 200 else status
        return found


@pytest.fixture
def adapter(signed: SeaweedServer, tmp_path: Path) -> Iterator[FrozenAdapter]:
    made = FrozenAdapter(signed, tmp_path)
    with closing(made.storage):
        yield made


def test_loraflow_token_freezes_and_deletes_a_retired_set(adapter: FrozenAdapter) -> None:
    assert adapter.served() == {"adapter_config.json": CONFIG, "adapter_model.safetensors": adapter.weights}
    grace = timedelta(minutes=10)
    later = datetime(2026, 12, 1, tzinfo=UTC) + grace * 2
    assert collect(adapter.storage, [adapter.record], {}, later, grace) == []
    assert adapter.served() == {"adapter_config.json": 404, "adapter_model.safetensors": 404}


def test_without_loraflow_token_nothing_is_frozen(adapter: FrozenAdapter) -> None:
    """The token file is read at each write, so a rotated (here: a wrong, then a missing)
    token takes effect at once; a refused copy is StorageUnavailable, never a silent success."""
    assert (
        collect(adapter.storage, [adapter.record], {}, datetime(2027, 1, 1, tzinfo=UTC), timedelta(0)) == []
    )
    adapter.token_file.write_text(mint("not-the-key", (), 600))
    with pytest.raises(StorageUnavailable, match="HTTP 401"):
        adapter.freeze()
    adapter.token_file.unlink()
    with pytest.raises(StorageUnavailable, match="HTTP 401"):
        adapter.freeze()
    adapter.token_file.write_text(loraflow_token(KEY))
    assert isinstance(adapter.freeze(), FrozenSet)


def test_a_tenant_cannot_change_a_frozen_set(adapter: FrozenAdapter) -> None:
    before = adapter.served()
    config, model = adapter.frozen + "adapter_config.json", adapter.frozen + "adapter_model.safetensors"
    own = adapter.upload + "adapter_config.json"
    attempts = [
        ("PUT", config, b'{"r": 666}'),
        ("PUT", config + "?op=append", b"X"),
        ("PUT", adapter.frozen + "extra.bin", b"x"),
        ("POST", config + "?mv.from=" + own, b""),  # move into the set
        ("POST", adapter.upload + "stolen.json?mv.from=" + model, b""),  # move out of the set
        ("POST", adapter.upload + "copied.json?cp.from=" + model, b""),
        ("DELETE", model, b""),
        ("DELETE", adapter.frozen.rstrip("/") + "?recursive=true", b""),
        ("DELETE", f"/loraflow-frozen/{adapter.ns}?recursive=true", b""),
    ]
    for method, target, body in attempts:
        assert send(adapter.server, method, target, body, adapter.tenant) == WRONG_JWT, (method, target)
        assert send(adapter.server, method, target, body) == WRONG_JWT, ("no token", method, target)
    assert adapter.served() == before
    assert read(adapter.server, own)[1] == CONFIG, "the tenant's own file did not move either"


@pytest.mark.parametrize(
    "spelling",
    [
        "/loraadapters/{ns}/../../loraflow-frozen/{rest}",
        "/loraadapters/{ns}/./../../loraflow-frozen/{rest}",
        "/loraadapters/{ns}//../../loraflow-frozen/{rest}",
        "/loraadapters/{ns}/%2e%2e/%2e%2e/loraflow-frozen/{rest}",
        "/loraadapters/{ns}/%2E%2E%2F%2E%2E%2Floraflow-frozen/{rest}",
        "/loraadapters/{ns}/..%2f..%2floraflow-frozen/{rest}",
        "//loraflow-frozen/{rest}",
        "/%6coraflow-frozen/{rest}",
    ],
)
def test_no_name_encoding_reaches_the_frozen_area(adapter: FrozenAdapter, spelling: str) -> None:
    before = adapter.served()
    rest = adapter.frozen.removeprefix("/loraflow-frozen/") + "adapter_config.json"
    target = spelling.format(ns=adapter.ns, rest=rest)
    for method in ("PUT", "DELETE"):
        assert send(adapter.server, method, target, b"evil", adapter.tenant) == WRONG_JWT, (method, target)
    mv_from = f"{adapter.upload}stolen.json?mv.from={target}"
    assert send(adapter.server, "POST", mv_from, b"", adapter.tenant) == WRONG_JWT
    assert adapter.served() == before


def test_a_tenant_writes_its_own_uploads_only(signed: SeaweedServer) -> None:
    ns = f"wt-{secrets.token_hex(3)}"
    token = tenant_token(KEY, ns)
    own = f"/loraadapters/{ns}/m1/a1/adapter_config.json"
    assert send(signed, "PUT", own, CONFIG, token) == 201
    assert send(signed, "PUT", own + "?op=append", b" ", token) == 201
    assert send(signed, "DELETE", own, b"", token) == 204
    for other in (
        f"/loraadapters/{ns}x/m1/a1/adapter_config.json",  # shares the name's first characters
        "/loraadapters/wt-other/m1/a1/adapter_config.json",
        f"/loraadapters/{ns}/../wt-other/m1/a1/adapter_config.json",
        "/loraadapters/adapter_config.json",
        "/etc/anything",
    ):
        assert send(signed, "PUT", other, CONFIG, token) == WRONG_JWT, other
    assert read(signed, "/loraadapters/wt-other/m1/a1/adapter_config.json")[0] == 404
    expired = mint(KEY, [f"/loraadapters/{ns}"], ttl=-60)
    assert send(signed, "PUT", own, CONFIG, expired) == WRONG_JWT
    assert send(signed, "PUT", own, CONFIG) == WRONG_JWT


def test_the_s3_gateway_has_no_way_into_the_filers_frozen_area(adapter: FrozenAdapter) -> None:
    """The gateway keeps its buckets under /buckets: a key with `..` stays inside the bucket
    (or is refused), and a bucket named like the frozen folder is another folder."""
    before = adapter.served()
    client = boto3.client("s3", endpoint_url=adapter.server.s3_url, **adapter.server.s3_operator.boto())
    with closing(client):
        bucket = f"b-{secrets.token_hex(4)}"
        client.create_bucket(Bucket=bucket)
        rest = adapter.frozen.removeprefix("/") + "adapter_config.json"
        for key in ("../../" + rest, "%2e%2e/%2e%2e/" + rest):
            with contextlib.suppress(client.exceptions.ClientError):  # refused, or kept in the bucket
                client.put_object(Bucket=bucket, Key=key, Body=b"evil")
        with pytest.raises(client.exceptions.NoSuchBucket):
            client.get_object(Bucket="loraflow-frozen", Key=rest.split("/", 1)[1])
    assert adapter.served() == before

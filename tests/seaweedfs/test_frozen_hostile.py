"""A tenant against the frozen area, on the real SeaweedFS 4.48.

Through the S3 gateway no key reaches `/loraflow-frozen/` (`..` in any encoding is refused or
stored as a literal name inside the bucket). The filer's HTTP API without a signing key (the
session's shared server; test_filer_write_tokens.py shows a signed filer refusing all of this)
resolves `..` and writes there: loraflow notices the change on its next stat (a nudge, a full
resync), takes Ready back and freezes the set again from verified storage, or fails the adapter
with the reason. stat, verify and load run here as
handlers on the real storage (the Kubernetes API and the engines are fakes).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from cloudevents.http import CloudEvent

from devstack.seaweedfs import Shared
from events.domain import ADAPTER_ADMITTED, ADAPTER_READY, ADAPTER_STAT_COMPLETED
from functions import load, stat, unload, verify
from functions.adapters.storage import FilerStorage, quote_path
from functions.edge.bootstrap import Deps
from functions.logic.facts import file_set
from functions.resources.kinds import VLLM_ADAPTER
from functions.settings import Settings
from tests.support.fakes import FakeBroker, FakeConfigs, FakeEngines, FakeKube
from tests.support.filer import FilerClient
from tests.support.objects import MOUNT, model_deployment, pod, url_of

CONFIG = b'{"peft_type": "LORA", "r": 8}'


def md5(content: bytes) -> str:
    return hashlib.md5(content, usedforsecurity=False).hexdigest()


class Adapter:
    """One adapter whose files are in the real filer, run through stat -> verify -> load."""

    def __init__(self, filer: FilerClient, storage: FilerStorage) -> None:
        self.ns = f"hz-{secrets.token_hex(3)}"
        self.upload = f"/loraadapters/{self.ns}/m1/a1/"
        self.filer = filer
        self.weights = secrets.token_bytes(6 << 20)
        self.filer.put_file(self.upload + "adapter_config.json", CONFIG)
        self.filer.write_without_md5(self.upload + "adapter_model.safetensors", self.weights)
        declared = {
            self.upload + "adapter_config.json": md5(CONFIG),
            self.upload + "adapter_model.safetensors": md5(self.weights),
        }
        self.frozen = f"/loraflow-frozen/{self.ns}/m1/a1/{file_set(declared).removeprefix('md5set:')}/"
        md = model_deployment(self.ns, "d1", ["a1"])
        self.pod = pod(self.ns, "d1-0", md, "10.0.0.1")
        obj = {
            "apiVersion": VLLM_ADAPTER.api_version,
            "kind": VLLM_ADAPTER.kind,
            "metadata": {
                "name": "a1",
                "namespace": self.ns,
                "generation": 1,
                "finalizers": ["loraflow.io/unload"],
            },
            "spec": {"model": "m1", "integrity": {"md5": declared}},
            "status": {"observedGeneration": 1, "storageRef": {"path": self.upload}},
        }
        self.kube = FakeKube(obj, md, self.pod)
        self.engines = FakeEngines()
        self.deps = Deps(
            Settings(mount_root=MOUNT, loopback_engines="allow"),
            kube=self.kube,
            storage=storage,
            configs=FakeConfigs(storage),  # type: ignore[arg-type]
            engines=self.engines,
            broker=FakeBroker(),
            clock=lambda: datetime(2026, 12, 1, tzinfo=UTC),
        )

    def event(self, type_: str) -> CloudEvent:
        data: dict[str, Any] = {
            "adapter": {"apiVersion": VLLM_ADAPTER.api_version, "namespace": self.ns, "name": "a1"}
        }
        if type_ == ADAPTER_ADMITTED:
            data["generation"] = 1
        if type_ == ADAPTER_STAT_COMPLETED:
            data |= {"files": 2, "size": "1"}
        return CloudEvent({"type": type_, "source": "/tests", "id": secrets.token_hex(8)}, data)

    def run(self) -> None:
        """stat (as a nudge or a full resync runs it), then verify, then load or unload, each on
        the previous one's reply as the Broker hands it over."""
        observed = stat.handle(self.event(ADAPTER_ADMITTED), self.deps)
        verdict = verify.handle(observed, self.deps) if observed is not None else None
        if verdict is not None:
            (load if verdict["type"] == ADAPTER_READY else unload).handle(verdict, self.deps)

    def ready(self) -> tuple[str, str, str]:
        obj = self.kube.get(VLLM_ADAPTER, self.ns, "a1")
        assert obj is not None
        found = next(c for c in obj["status"]["conditions"] if c["type"] == "Ready")
        return found["status"], found["reason"], found["message"]

    def served_root(self) -> str:
        return self.engines.engine(url_of(self.pod)).loaded.get("a1", "")

    def remove(self) -> None:
        for root in ("/loraadapters/", "/loraflow-frozen/"):
            httpx.delete(self.filer.url + quote_path(root + self.ns), params={"recursive": "true"})


@pytest.fixture
def adapter(filer: FilerClient, storage: FilerStorage) -> Iterator[Adapter]:
    made = Adapter(filer, storage)
    made.run()
    assert made.ready()[:2] == ("True", "IntegrityVerified")
    assert made.served_root() == MOUNT + made.frozen.rstrip("/")
    yield made
    made.remove()


def raw_put(url: str, raw_path: str, content: bytes) -> int:
    with httpx.Client(timeout=30) as client:
        request = client.build_request("PUT", url + "/", content=content)
        request.url = request.url.copy_with(raw_path=raw_path.encode())
        return client.send(request).status_code


def test_no_s3_key_reaches_the_frozen_area(seaweed: Shared, adapter: Adapter, s3: Any) -> None:
    bucket = f"hz-{secrets.token_hex(4)}"
    s3.create_bucket(Bucket=bucket)
    target = adapter.frozen.lstrip("/") + "adapter_model.safetensors"
    keys = [
        "../../" + target,
        "loraadapters/../../../" + target,
        "/" + target,
        "%2e%2e/%2e%2e/" + target,
        "..%2f..%2f" + target,
        "..\\..\\" + target,
    ]
    try:
        for key in keys:
            try:
                s3.put_object(Bucket=bucket, Key=key, Body=b"tampered through S3")
            except Exception as err:  # refused (InvalidRequest): as good as ignored
                assert "InvalidRequest" in str(err) or "AccessDenied" in str(err), err
        for raw in (
            f"/{bucket}/..%2F..%2F{target.replace('/', '%2F')}",
            f"/{bucket}/../../{target}",
            f"/{bucket}/%2e%2e/%2e%2e/{target}",
        ):
            assert raw_put(seaweed.server.s3_url, raw, b"tampered through S3") in (400, 403, 404)
        assert adapter.filer.read(adapter.frozen + "adapter_model.safetensors") == adapter.weights
        adapter.run()
        assert adapter.ready()[:2] == ("True", "IntegrityVerified")
    finally:
        httpx.delete(seaweed.server.url + f"/buckets/{bucket}", params={"recursive": "true"})


def test_a_filer_write_into_the_frozen_area_is_noticed_and_undone(seaweed: Shared, adapter: Adapter) -> None:
    """`..` from the tenant's own directory, in any encoding, resolves into /loraflow-frozen/
    on the filer: the next stat sees the copy changed, Ready goes back until verify has frozen
    the verified bytes again, and what the engines are told to load never changes."""
    escape = "../" * 4 + adapter.frozen.lstrip("/") + "adapter_model.safetensors"
    tampered = b"T" * len(adapter.weights)
    assert raw_put(seaweed.server.url, adapter.upload + escape, tampered) == 201  # no signing key here
    assert adapter.filer.read(adapter.frozen + "adapter_model.safetensors") == tampered
    assert stat.handle(adapter.event(ADAPTER_ADMITTED), adapter.deps) is not None
    status, reason, message = adapter.ready()
    assert (status, reason) == ("Unknown", "AwaitingVerification") and "freezing the verified set" in message
    assert verify.handle(adapter.event(ADAPTER_STAT_COMPLETED), adapter.deps) is not None
    assert adapter.ready()[:2] == ("True", "IntegrityVerified")
    assert adapter.filer.read(adapter.frozen + "adapter_model.safetensors") == adapter.weights
    assert adapter.served_root() == MOUNT + adapter.frozen.rstrip("/")
    # encoded dots and slashes: wherever the filer puts them, the frozen copy ends up the verified one
    for encoded in (
        escape.replace("..", "%2e%2e"),
        escape.replace("..", "%252e%252e"),
        escape.replace("../", "..%2f"),
        escape.replace("/", "%2F"),
    ):
        raw_put(seaweed.server.url, adapter.upload + encoded, tampered)
        adapter.run()
        assert adapter.ready()[:2] == ("True", "IntegrityVerified")
        assert adapter.filer.read(adapter.frozen + "adapter_model.safetensors") == adapter.weights
        assert adapter.served_root() == MOUNT + adapter.frozen.rstrip("/")


def test_a_same_size_rewrite_that_leaves_no_md5_is_noticed_and_undone(adapter: Adapter) -> None:
    """Two appends of other bytes of the same size leave the filer no MD5 to compare; every copy
    loraflow makes has one (written with Content-MD5), so a copy without one was rewritten."""
    frozen_weights = adapter.frozen + "adapter_model.safetensors"
    adapter.filer.write_without_md5(frozen_weights, secrets.token_bytes(len(adapter.weights)))
    assert stat.handle(adapter.event(ADAPTER_ADMITTED), adapter.deps) is not None
    status, reason, message = adapter.ready()
    assert (status, reason) == ("Unknown", "AwaitingVerification") and "rewritten" in message
    assert verify.handle(adapter.event(ADAPTER_STAT_COMPLETED), adapter.deps) is not None
    assert adapter.ready()[:2] == ("True", "IntegrityVerified")
    assert adapter.filer.read(frozen_weights) == adapter.weights


def test_a_frozen_set_deleted_behind_our_back_is_frozen_again_or_fails(adapter: Adapter) -> None:
    assert adapter.filer.delete(adapter.frozen.rstrip("/"), recursive=True) == 204
    adapter.run()
    assert adapter.ready()[:2] == ("True", "IntegrityVerified")
    assert adapter.filer.read(adapter.frozen + "adapter_model.safetensors") == adapter.weights
    # gone again, and the upload replaced meanwhile (same size): never frozen from it, never served
    assert adapter.filer.delete(adapter.frozen.rstrip("/"), recursive=True) == 204
    adapter.filer.write_without_md5(
        adapter.upload + "adapter_model.safetensors", secrets.token_bytes(6 << 20)
    )
    adapter.run()
    assert adapter.ready()[:2] == ("False", "IntegrityCheckFailed")
    assert adapter.filer.entry(adapter.frozen + "adapter_model.safetensors") is None
    assert adapter.served_root() == ""  # unloaded: not Ready, nothing verified to serve

"""verify on fakes (tests/support/fakes.py): the integrity verdict, the ready and failed replies,
and what its status write does around a conflict: the storage work (hashing, freezing, deleting
retired copies) is done before the write and never inside its callback.

The same step over real HTTP is tests/functions/test_stat_verify.py; freezing end to end is
tests/handlers/test_freeze.py; the verdict by table is tests/unit/test_verify_decide.py and
test_verification.py.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cloudevents.http import CloudEvent

from events.domain import ADAPTER_ADMITTED, ADAPTER_FAILED, ADAPTER_READY, ADAPTER_STAT_COMPLETED
from events.schema_urls import schema_file
from functions import verify
from functions.edge.bootstrap import Deps
from functions.errors import KubeConflict, Reject, StorageUnavailable
from functions.logic import reasons
from functions.logic.facts import file_set
from functions.resources.kinds import SGLANG_ADAPTER, VLLM_ADAPTER, Kind
from functions.settings import Settings
from tests.support.fakes import FakeKube, FakeStorage, watch_callbacks

NS, MODEL, NAME = "team-a", "m1", "a1"
UPLOAD = f"/loraadapters/{NS}/{MODEL}/{NAME}/"
WEIGHTS, CONFIG = UPLOAD + "adapter_model.safetensors", UPLOAD + "adapter_config.json"
W, C = b"weights", b"{}"
NOW = datetime(2026, 6, 1, tzinfo=UTC)
SCHEMAS = "https://schemas.example/loraflow/"
Obj = dict[str, Any]


def md5(content: bytes) -> str:
    return hashlib.md5(content, usedforsecurity=False).hexdigest()


DECLARED = {WEIGHTS: md5(W), CONFIG: md5(C)}


def frozen_dir(declared: dict[str, str]) -> str:
    return f"/loraflow-frozen/{NS}/{MODEL}/{NAME}/{file_set(declared).removeprefix('md5set:')}/"


def observed(files: dict[str, bytes], without_md5: tuple[str, ...] = ()) -> Obj:
    """The observation stat writes for these files (`without_md5`: listed without one)."""
    return {
        "files": [{"path": p, "size": len(c)} for p, c in sorted(files.items())],
        "size": str(sum(len(c) for c in files.values())),
        "integrity": {
            "files": {
                p: {"size": len(c), **({"version": "v1"} if p in without_md5 else {"md5": md5(c)})}
                for p, c in files.items()
            }
        },
    }


def stat_adapter(declared: dict[str, str] | None = None, **status: Any) -> Obj:
    """A vllm LoRAAdapter as stat leaves it: its upload observed, no verdict yet."""
    return {
        "apiVersion": VLLM_ADAPTER.api_version,
        "kind": VLLM_ADAPTER.kind,
        "metadata": {"name": NAME, "namespace": NS, "generation": 1, "finalizers": ["loraflow.io/unload"]},
        "spec": {"model": MODEL, "integrity": {"md5": DECLARED if declared is None else declared}},
        "status": {
            "observedGeneration": 1,
            "storageRef": {"path": UPLOAD},
            "conditions": [
                {
                    "type": "Ready",
                    "status": "Unknown",
                    "reason": reasons.ADMITTED,
                    "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
            **observed({WEIGHTS: W, CONFIG: C}),
            **status,
        },
    }


class CountingStorage(FakeStorage):
    """Counts what verify asks of storage: hashes by path, copies, deleted trees."""

    def __init__(self, files: dict[str, bytes]) -> None:
        super().__init__(files)
        self.hashed: list[str] = []
        self.copies = 0
        self.deleted: list[str] = []

    def hash_file(self, path: str, max_bytes: int) -> str | None:
        self.hashed.append(path)
        return super().hash_file(path, max_bytes)

    def copy_file(self, source: str, target: str, size: int, md5: str) -> bool:
        self.copies += 1
        return super().copy_file(source, target, size, md5)

    def delete_tree(self, directory: str) -> None:
        self.deleted.append(directory)
        super().delete_tree(directory)


class BrokenStorage(CountingStorage):
    """The filer answering 503 to every read of a file."""

    def hash_file(self, path: str, max_bytes: int) -> str | None:
        raise StorageUnavailable("filer answered 503")


class Cluster:
    def __init__(
        self, adapter: Obj | None = None, storage: CountingStorage | None = None, **settings: Any
    ) -> None:
        self.kube = FakeKube(adapter if adapter is not None else stat_adapter())
        self.storage = storage if storage is not None else CountingStorage({WEIGHTS: W, CONFIG: C})
        self.now = NOW
        self.deps = Deps(
            Settings(schema_base_url=SCHEMAS, **settings),
            kube=self.kube,
            storage=self.storage,
            clock=lambda: self.now,
        )
        self.inside = watch_callbacks(self.kube, self.storage)

    def run(self, event: CloudEvent | None = None) -> CloudEvent | None:
        return verify.handle(event or completed(), self.deps)

    def status(self) -> Obj:
        obj = self.kube.get(VLLM_ADAPTER, NS, NAME)
        assert obj is not None
        return dict(obj["status"])

    def ready(self) -> tuple[str, str]:
        found = next(c for c in self.status()["conditions"] if c["type"] == "Ready")
        return found["status"], found["reason"]

    def uploads_hashed(self) -> list[str]:
        return [p for p in self.storage.hashed if p.startswith(UPLOAD)]


def completed(kind: Kind = VLLM_ADAPTER, name: str = NAME) -> CloudEvent:
    ref = {"apiVersion": kind.api_version, "namespace": NS, "name": name}
    attributes = {"type": ADAPTER_STAT_COMPLETED, "source": "/tests", "id": secrets.token_hex(8)}
    return CloudEvent(attributes, {"adapter": ref, "files": 2, "size": "9"})


# -- verdicts -------------------------------------------------------------------------------------
def test_matching_md5s_are_frozen_then_ready() -> None:
    cluster = Cluster()
    reply = cluster.run()
    assert reply is not None and reply["type"] == ADAPTER_READY
    assert reply["subject"] == VLLM_ADAPTER.path(NS, NAME) and reply["source"] == "/loraflow/verify"
    assert reply["dataschema"] == SCHEMAS + schema_file(ADAPTER_READY)
    assert reply.get_data() == {
        "adapter": {"apiVersion": VLLM_ADAPTER.api_version, "namespace": NS, "name": NAME}
    }
    status = cluster.status()
    assert cluster.ready() == ("True", reasons.INTEGRITY_VERIFIED)
    assert (status["fileSet"], status["uploadComplete"], status["phase"]) == (
        file_set(DECLARED),
        True,
        "Ready",
    )
    (record,) = status["frozen"]
    assert record["path"] == frozen_dir(DECLARED)
    assert cluster.storage.files[frozen_dir(DECLARED) + "adapter_model.safetensors"] == W
    assert cluster.inside == []
    # the same verdict again: nothing written, nothing replied, nothing copied
    copies = cluster.storage.copies
    assert cluster.run() is None and cluster.storage.copies == copies


def test_a_mismatch_fails_once_with_a_warning() -> None:
    cluster = Cluster(stat_adapter({WEIGHTS: "0" * 32, CONFIG: md5(C)}))
    reply = cluster.run()
    assert reply is not None and reply["type"] == ADAPTER_FAILED
    data = reply.get_data()
    assert data["reason"] == reasons.INTEGRITY_CHECK_FAILED and WEIGHTS in data["message"]  # type: ignore[index]
    assert reply["dataschema"] == SCHEMAS + schema_file(ADAPTER_FAILED)
    assert cluster.status()["phase"] == "Failed" and "fileSet" not in cluster.status()
    assert [e[2] for e in cluster.kube.events] == [reasons.INTEGRITY_CHECK_FAILED]
    assert cluster.run() is None and len(cluster.kube.events) == 1
    assert not [p for p in cluster.storage.files if p.startswith("/loraflow-frozen/")]


def test_a_file_not_uploaded_yet_waits_without_a_reply() -> None:
    adapter = stat_adapter()
    adapter["status"].update(observed({CONFIG: C}))
    cluster = Cluster(adapter)
    assert cluster.run() is None
    assert cluster.ready() == ("False", reasons.AWAITING_FILES)
    assert cluster.status()["phase"] == "Processing"


def test_admits_verdict_is_kept() -> None:
    adapter = stat_adapter()
    adapter["status"]["conditions"][0].update(status="False", reason=reasons.MODEL_NOT_FOUND)
    cluster = Cluster(adapter)
    assert cluster.run() is None
    assert cluster.ready() == ("False", reasons.MODEL_NOT_FOUND)


def test_a_file_listed_without_an_md5_is_hashed_once_by_streaming() -> None:
    adapter = stat_adapter()
    adapter["status"].update(observed({WEIGHTS: W, CONFIG: C}, without_md5=(WEIGHTS,)))
    cluster = Cluster(adapter)
    reply = cluster.run()
    assert reply is not None and reply["type"] == ADAPTER_READY
    assert cluster.uploads_hashed() == [WEIGHTS]


def test_a_file_too_large_to_hash_fails_as_md5_unavailable() -> None:
    adapter = stat_adapter()
    adapter["status"].update(observed({WEIGHTS: W, CONFIG: C}, without_md5=(WEIGHTS,)))
    cluster = Cluster(adapter, hash_max_bytes=0)
    reply = cluster.run()
    assert reply is not None and reply["type"] == ADAPTER_FAILED
    assert cluster.ready() == ("False", reasons.MD5_UNAVAILABLE) and cluster.storage.hashed == []


def test_storage_unavailable_while_hashing_is_retryable_and_writes_nothing() -> None:
    adapter = stat_adapter()
    adapter["status"].update(observed({WEIGHTS: W, CONFIG: C}, without_md5=(WEIGHTS,)))
    cluster = Cluster(adapter, BrokenStorage({WEIGHTS: W, CONFIG: C}))
    with pytest.raises(StorageUnavailable):
        cluster.run()
    assert cluster.kube.writes == 0


def retired_record(declared: dict[str, str]) -> dict[str, object]:
    """The status record of a frozen set retired long ago (past any grace)."""
    return {
        "fileSet": file_set(declared),
        "path": frozen_dir(declared),
        "size": 9,
        "frozenAt": "2026-05-01T00:00:00Z",
        "retiredAt": "2026-05-30T00:00:00Z",
    }


def test_a_retired_copy_past_its_grace_is_deleted_before_the_write() -> None:
    old = {WEIGHTS: "1" * 32, CONFIG: md5(C)}
    retired = retired_record(old)
    storage = CountingStorage({WEIGHTS: W, CONFIG: C, frozen_dir(old) + "adapter_model.safetensors": b"old"})
    cluster = Cluster(stat_adapter(frozen=[retired]), storage, frozen_grace=3600)
    assert cluster.run() is not None
    assert [r["path"] for r in cluster.status()["frozen"]] == [frozen_dir(DECLARED)]
    assert frozen_dir(old) in cluster.storage.deleted and cluster.inside == []
    assert not [p for p in cluster.storage.files if p.startswith(frozen_dir(old))]


def test_a_retired_copy_a_pod_serves_is_kept() -> None:
    old = {WEIGHTS: "1" * 32, CONFIG: md5(C)}
    retired = retired_record(old)
    served = [{"pod": "d1-0", "fileSet": file_set(old)}]
    cluster = Cluster(stat_adapter(frozen=[retired], served=served), frozen_grace=3600)
    cluster.run()
    assert frozen_dir(old) in [r["path"] for r in cluster.status()["frozen"]]
    assert cluster.storage.deleted == []


# -- races ---------------------------------------------------------------------------------------
def another_writer(obj: Obj) -> None:
    """load's status write, landing first: a field verify does not write."""
    obj["status"]["usedBy"] = ["d1"]


def test_a_conflict_is_decided_again_without_hashing_or_copying_again() -> None:
    adapter = stat_adapter()
    adapter["status"].update(observed({WEIGHTS: W, CONFIG: C}, without_md5=(WEIGHTS,)))
    cluster = Cluster(adapter)
    cluster.kube.meddle(VLLM_ADAPTER, NS, NAME, another_writer, times=3)
    reply = cluster.run()
    assert reply is not None and reply["type"] == ADAPTER_READY
    assert cluster.kube.conflicts == 3
    assert cluster.status()["usedBy"] == ["d1"]
    assert cluster.uploads_hashed() == [WEIGHTS] and cluster.storage.copies == 2
    assert cluster.inside == []


def test_a_newer_object_that_needs_another_hash_gets_it_before_the_next_write() -> None:
    cluster = Cluster()

    def listed_without_md5(obj: Obj) -> None:
        obj["status"].update(observed({WEIGHTS: W, CONFIG: C}, without_md5=(CONFIG,)))

    cluster.kube.meddle(VLLM_ADAPTER, NS, NAME, listed_without_md5)
    reply = cluster.run()
    assert reply is not None and reply["type"] == ADAPTER_READY
    assert cluster.uploads_hashed() == [CONFIG] and cluster.inside == []


def test_a_newer_spec_declaring_another_set_is_frozen_before_the_next_write() -> None:
    other = {WEIGHTS: md5(W)}
    cluster = Cluster()

    def declared_anew(obj: Obj) -> None:
        obj["spec"]["integrity"]["md5"] = other
        obj["metadata"]["generation"] = 2

    cluster.kube.meddle(VLLM_ADAPTER, NS, NAME, declared_anew)
    assert cluster.run() is not None
    status = cluster.status()
    assert status["fileSet"] == file_set(other)
    assert [r["path"] for r in status["frozen"]] == [frozen_dir(other)]
    assert frozen_dir(DECLARED) + "adapter_model.safetensors" in cluster.storage.files  # made, never used
    assert cluster.inside == []


def test_a_newer_object_that_keeps_needing_work_is_retried_later() -> None:
    cluster = Cluster()
    versions = iter(range(2, 100))
    write = cluster.kube.write_status

    def relisted(obj: Obj) -> None:
        obj["status"]["integrity"]["files"][WEIGHTS] = {"size": len(W), "version": f"v{next(versions)}"}

    def relisted_first(kind: Kind, namespace: str, name: str, desired: Any, current: Any = None) -> Any:
        cluster.kube.meddle(kind, namespace, name, relisted)
        return write(kind, namespace, name, desired, current=current)

    cluster.kube.write_status = relisted_first  # type: ignore[method-assign]
    with pytest.raises(KubeConflict):
        cluster.run()
    assert cluster.kube.conflicts == verify.WORK_ROUNDS
    assert cluster.ready() == ("Unknown", reasons.ADMITTED)


def test_conflicts_that_outlast_the_attempts_are_retryable() -> None:
    cluster = Cluster()
    cluster.kube.meddle(VLLM_ADAPTER, NS, NAME, another_writer, times=5)
    with pytest.raises(KubeConflict):
        cluster.run()
    assert cluster.ready() == ("Unknown", reasons.ADMITTED)
    assert cluster.storage.copies == 2  # frozen once, before the first attempt


# -- what is not verify's business, and hostile input ---------------------------------------------
def test_sglang_gone_and_deleting_adapters_are_answered_without_a_write() -> None:
    cluster = Cluster()
    assert cluster.run(completed(SGLANG_ADAPTER)) is None
    assert cluster.run(completed(name="gone")) is None
    cluster.kube.delete(VLLM_ADAPTER, NS, NAME)
    assert cluster.run() is None
    assert cluster.kube.writes == 0 and cluster.storage.copies == 0


def test_an_admitted_event_verifies_too() -> None:
    attributes = {"type": ADAPTER_ADMITTED, "source": "/tests", "id": "1"}
    ref = {"apiVersion": VLLM_ADAPTER.api_version, "namespace": NS, "name": NAME}
    reply = Cluster().run(CloudEvent(attributes, {"adapter": ref, "generation": 1}))
    assert reply is not None and reply["type"] == ADAPTER_READY


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"adapter": {"apiVersion": VLLM_ADAPTER.api_version, "namespace": NS, "name": "../x"}}, "name"),
        ({"adapter": {"apiVersion": "evil.example/v1", "namespace": NS, "name": NAME}}, "apiVersion"),
        (
            {"adapter": {"apiVersion": VLLM_ADAPTER.api_version, "namespace": "x" * 64, "name": NAME}},
            "namespace",
        ),
        (b"\xff\xfe not json", "not JSON"),
        ({"files": 2}, "adapter"),
    ],
    ids=["dotdot", "api-version", "long-namespace", "not-json", "no-adapter"],
)
def test_hostile_events_are_rejected_before_any_read(data: Any, needle: str) -> None:
    cluster = Cluster()
    event = CloudEvent({"type": ADAPTER_STAT_COMPLETED, "source": "/t", "id": "1"}, data)
    with pytest.raises(Reject, match=needle):
        cluster.run(event)
    assert cluster.kube.writes == 0 and cluster.storage.hashed == []


def test_the_clock_is_the_deps_clock() -> None:
    """Freezing and retirement times, and the grace, come from Deps.clock, never the wall clock."""
    cluster = Cluster(frozen_grace=60)
    cluster.run()
    retrained = {WEIGHTS: md5(W)}
    cluster.kube.put({**stat_adapter(retrained), "status": cluster.status()})
    cluster.run()  # the new set is frozen, the first one retired now
    status = cluster.status()
    assert [(r["path"], r["frozenAt"], r.get("retiredAt")) for r in status["frozen"]] == [
        (frozen_dir(retrained), "2026-06-01T00:00:00Z", None),
        (frozen_dir(DECLARED), "2026-06-01T00:00:00Z", "2026-06-01T00:00:00Z"),
    ]
    cluster.run(completed())
    assert frozen_dir(DECLARED) not in cluster.storage.deleted  # within its grace
    cluster.now = NOW + timedelta(seconds=61)
    cluster.run()
    assert cluster.storage.deleted == [frozen_dir(DECLARED)]
    assert [r["path"] for r in cluster.status()["frozen"]] == [frozen_dir(retrained)]

"""stat on fakes (tests/support/fakes.py): what storage lists becomes the status observation,
the statcompleted reply, the refusals of hostile paths, and the races of its status write.

The same step over real HTTP is tests/functions/test_stat_verify.py; the observation by table is
tests/unit/test_stat_decide.py.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import UTC, datetime
from typing import Any

import pytest
from cloudevents.http import CloudEvent

from events.domain import (
    ADAPTER_ADMITTED,
    ADAPTER_DRIFTED,
    ADAPTER_STAT_COMPLETED,
    FILE_CHANGED,
    STEP_EXTENSION,
)
from events.schema_urls import schema_file
from functions import stat
from functions.edge.bootstrap import Deps
from functions.errors import KubeRefused, Reject, StorageUnavailable
from functions.logic import reasons
from functions.logic.quantity import format_bytes
from functions.ports import StoredFile
from functions.resources.kinds import SGLANG_ADAPTER, VLLM_ADAPTER, Kind
from functions.settings import Settings
from tests.support.fakes import FakeKube, FakeStorage
from tests.support.objects import adapter_event

NS, MODEL, NAME = "team-a", "m1", "a1"
UPLOAD = f"/loraadapters/{NS}/{MODEL}/{NAME}/"
WEIGHTS, CONFIG = UPLOAD + "adapter_model.safetensors", UPLOAD + "adapter_config.json"
NOW = datetime(2026, 6, 1, tzinfo=UTC)
SCHEMAS = "https://schemas.example/loraflow/"
Obj = dict[str, Any]


def md5(content: bytes) -> str:
    return hashlib.md5(content, usedforsecurity=False).hexdigest()


def admitted_adapter(name: str = NAME, md5s: dict[str, str] | None = None) -> Obj:
    """A vllm LoRAAdapter as admit leaves it: Ready Unknown, nothing observed yet."""
    return {
        "apiVersion": VLLM_ADAPTER.api_version,
        "kind": VLLM_ADAPTER.kind,
        "metadata": {"name": name, "namespace": NS, "finalizers": ["loraflow.io/unload"]},
        "spec": {"model": MODEL, "integrity": {"md5": md5s if md5s is not None else {WEIGHTS: md5(b"w")}}},
        "status": {
            "observedGeneration": 1,
            "storageRef": {"path": f"/loraadapters/{NS}/{MODEL}/{name}/"},
            "conditions": [
                {
                    "type": "Ready",
                    "status": "Unknown",
                    "reason": reasons.ADMITTED,
                    "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
            "phase": "Pending",
            "ready": False,
        },
    }


class BrokenStorage(FakeStorage):
    """The filer answering 503 to every listing."""

    def stat_dir(self, directory: str) -> list[StoredFile]:
        raise StorageUnavailable("filer answered 503")


class Cluster:
    def __init__(self, *objects: Obj, files: dict[str, bytes] | None = None, **settings: Any) -> None:
        self.kube = FakeKube(*(objects or (admitted_adapter(),)))
        self.storage = FakeStorage(files)
        self.deps = Deps(
            Settings(schema_base_url=SCHEMAS, **settings),
            kube=self.kube,
            storage=self.storage,
            clock=lambda: NOW,
        )

    def run(self, event: CloudEvent) -> CloudEvent | None:
        return stat.handle(event, self.deps)

    def status(self, name: str = NAME) -> Obj:
        obj = self.kube.get(VLLM_ADAPTER, NS, name)
        assert obj is not None
        return dict(obj["status"])

    def ready(self) -> tuple[str, str]:
        found = next(c for c in self.status()["conditions"] if c["type"] == "Ready")
        return found["status"], found["reason"]


def changed(path: str, event_type: str = "create", **data: Any) -> CloudEvent:
    attributes = {"type": FILE_CHANGED, "source": "/tests", "id": secrets.token_hex(8), "subject": path}
    return CloudEvent(attributes, {"path": path, "eventType": event_type, **data})


def nudged(kind: Kind = VLLM_ADAPTER, name: str = NAME) -> CloudEvent:
    return adapter_event(ADAPTER_DRIFTED, kind, NS, name, **{STEP_EXTENSION: "stat"})


def admitted(kind: Kind = VLLM_ADAPTER, name: str = NAME) -> CloudEvent:
    ref = {"apiVersion": kind.api_version, "namespace": NS, "name": name}
    attributes = {"type": ADAPTER_ADMITTED, "source": "/tests", "id": secrets.token_hex(8)}
    return CloudEvent(attributes, {"adapter": ref, "generation": 1})


# -- the observation ------------------------------------------------------------------------------
def test_a_changed_file_is_observed_and_completed() -> None:
    cluster = Cluster(files={WEIGHTS: b"w", CONFIG: b"{}"})
    reply = cluster.run(changed(WEIGHTS))
    assert reply is not None and reply["type"] == ADAPTER_STAT_COMPLETED
    assert reply["subject"] == VLLM_ADAPTER.path(NS, NAME)
    assert reply["dataschema"] == SCHEMAS + schema_file(ADAPTER_STAT_COMPLETED)
    assert reply.get_data() == {
        "adapter": {"apiVersion": VLLM_ADAPTER.api_version, "namespace": NS, "name": NAME},
        "files": 2,
        "size": format_bytes(3),
    }
    status = cluster.status()
    assert status["files"] == [{"path": CONFIG, "size": 2}, {"path": WEIGHTS, "size": 1}]
    assert status["integrity"]["files"][WEIGHTS]["md5"] == md5(b"w")
    assert (status["size"], status["phase"]) == (format_bytes(3), "Processing")


def test_an_unchanged_observation_replies_nothing_but_a_nudge_always_replies() -> None:
    cluster = Cluster(files={WEIGHTS: b"w"})
    assert cluster.run(changed(WEIGHTS)) is not None
    writes = cluster.kube.writes
    assert cluster.run(changed(WEIGHTS, "update")) is None
    # a nudge means a verify after an earlier observation was lost: it must run again
    reply = cluster.run(nudged())
    assert reply is not None and reply["type"] == ADAPTER_STAT_COMPLETED
    assert cluster.kube.writes == writes


def test_an_admitted_adapter_with_nothing_uploaded_is_observed_empty() -> None:
    cluster = Cluster()
    reply = cluster.run(admitted())
    assert reply is not None and reply.get_data()["files"] == 0  # type: ignore[index]
    status = cluster.status()
    assert (status["size"], status["phase"]) == ("0", "Pending")
    assert "files" not in status and "files" not in (status.get("integrity") or {})


def test_a_deleted_declared_file_takes_ready_back() -> None:
    ready = admitted_adapter()
    ready["status"]["conditions"][0].update(status="True", reason=reasons.INTEGRITY_VERIFIED)
    ready["status"]["files"] = [{"path": WEIGHTS, "size": 1}]
    ready["status"]["integrity"] = {"files": {WEIGHTS: {"md5": md5(b"w"), "size": 1}}}
    cluster = Cluster(ready, files={WEIGHTS: b"w"})
    cluster.run(changed(WEIGHTS))
    assert cluster.ready() == ("True", reasons.INTEGRITY_VERIFIED)  # the same bytes: still verified
    del cluster.storage.files[WEIGHTS]
    assert cluster.run(changed(WEIGHTS, "delete")) is not None
    assert cluster.ready() == ("Unknown", reasons.AWAITING_VERIFICATION)


def test_a_rename_between_adapters_observes_both_and_replies_for_the_new_one() -> None:
    other = admitted_adapter("a2")
    target = f"/loraadapters/{NS}/{MODEL}/a2/w.bin"
    cluster = Cluster(admitted_adapter(), other, files={target: b"moved"})
    reply = cluster.run(changed(UPLOAD + "w.bin", "rename", newPath=target))
    assert reply is not None and reply.get_data()["adapter"]["name"] == "a2"  # type: ignore[index]
    assert cluster.status("a2")["files"] == [{"path": target, "size": 5}]
    assert cluster.status(NAME)["size"] == "0"


def test_more_files_than_a_status_holds_keep_the_declared_and_say_so_once() -> None:
    extras = {f"{UPLOAD}aa-{i:02d}.bin": b"x" for i in range(5)}
    cluster = Cluster(files={WEIGHTS: b"w", **extras}, status_max_files=3)
    reply = cluster.run(changed(WEIGHTS))
    assert reply is not None and reply.get_data()["files"] == 6  # type: ignore[index]
    status = cluster.status()
    assert [f["path"] for f in status["files"]] == sorted([*list(extras)[:2], WEIGHTS])
    assert status["size"] == format_bytes(6)
    assert [e[2:] for e in cluster.kube.events] == [
        (reasons.EVENT_FILES_TRUNCATED, f"status lists 3 of the 6 files in {UPLOAD} (declared ones first)")
    ]
    assert cluster.run(nudged()) is not None
    assert len(cluster.kube.events) == 1  # unchanged: not said again


def test_a_status_the_api_refuses_for_its_size_records_the_declared_files_only() -> None:
    cluster = Cluster(files={WEIGHTS: b"w", UPLOAD + "extra.bin": b"x"})
    write = cluster.kube.write_status
    refused: list[int] = []

    def too_large_once(kind: Kind, namespace: str, name: str, desired: Any, current: Any = None) -> Any:
        if not refused:
            refused.append(413)
            raise KubeRefused("etcdserver: request is too large", 413)
        return write(kind, namespace, name, desired, current)

    cluster.kube.write_status = too_large_once  # type: ignore[method-assign]
    assert cluster.run(changed(WEIGHTS)) is not None
    assert [f["path"] for f in cluster.status()["files"]] == [WEIGHTS]
    assert [e[2] for e in cluster.kube.events] == [reasons.EVENT_STATUS_SHRUNK, reasons.EVENT_FILES_TRUNCATED]


def test_another_refusal_is_not_taken_for_a_size_problem() -> None:
    cluster = Cluster(files={WEIGHTS: b"w"})

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise KubeRefused("forbidden", 403)

    cluster.kube.write_status = forbidden  # type: ignore[method-assign]
    with pytest.raises(KubeRefused, match="forbidden"):
        cluster.run(changed(WEIGHTS))


def test_storage_unavailable_is_retryable_and_writes_nothing() -> None:
    cluster = Cluster(files={WEIGHTS: b"w"})
    cluster.deps = Deps(Settings(), kube=cluster.kube, storage=BrokenStorage(), clock=lambda: NOW)
    before = cluster.status()
    with pytest.raises(StorageUnavailable):
        cluster.run(changed(WEIGHTS))
    assert cluster.status() == before and cluster.kube.writes == 0


# -- races ---------------------------------------------------------------------------------------
def test_a_stat_whose_write_lost_a_race_lists_storage_again() -> None:
    """Another stat recorded a newer listing first: ours, from before it, must not overwrite it."""
    cluster = Cluster(files={WEIGHTS: b"w"})
    newer = UPLOAD + "late.bin"

    def another_stat_first(obj: Obj) -> None:
        cluster.storage.files[newer] = b"late"
        obj["status"]["files"] = [{"path": newer, "size": 4}, {"path": WEIGHTS, "size": 1}]

    cluster.kube.meddle(VLLM_ADAPTER, NS, NAME, another_stat_first)
    assert cluster.run(changed(WEIGHTS)) is not None
    assert cluster.kube.conflicts == 1
    assert [f["path"] for f in cluster.status()["files"]] == [WEIGHTS, newer]


def test_a_directory_moved_under_the_write_is_left_to_the_next_nudge() -> None:
    cluster = Cluster(files={WEIGHTS: b"w"})

    def moved(obj: Obj) -> None:
        obj["status"]["storageRef"] = {"path": f"/loraadapters/{NS}/{MODEL}/elsewhere/"}

    cluster.kube.meddle(VLLM_ADAPTER, NS, NAME, moved)
    assert cluster.run(changed(WEIGHTS)) is None
    assert "files" not in cluster.status()


# -- what is not stat's business, and hostile input ---------------------------------------------------
@pytest.mark.parametrize(
    "event",
    [
        changed(f"/loraadapters/{NS}/{MODEL}/nobody/w.bin"),
        changed(f"/loraadapters/{NS}/other-model/{NAME}/w.bin"),
        changed(f"/loraadapters/{NS}/{MODEL}/w.bin"),
        admitted(SGLANG_ADAPTER),
        admitted(VLLM_ADAPTER, "gone"),
    ],
    ids=["no-adapter", "other-model", "model-dir", "sglang", "gone"],
)
def test_what_is_not_an_adapter_of_ours_is_answered_without_a_write(event: CloudEvent) -> None:
    cluster = Cluster(files={WEIGHTS: b"w"})
    assert cluster.run(event) is None
    assert cluster.kube.writes == 0


def test_an_adapter_being_deleted_is_left_to_unload() -> None:
    cluster = Cluster(files={WEIGHTS: b"w"})
    cluster.kube.delete(VLLM_ADAPTER, NS, NAME)
    assert cluster.run(changed(WEIGHTS)) is None and cluster.kube.writes == 0


def no_path() -> CloudEvent:
    return CloudEvent({"type": FILE_CHANGED, "source": "/t", "id": "1"}, {"eventType": "create"})


@pytest.mark.parametrize(
    ("event", "needle"),
    [
        (changed("/etc/passwd"), "/etc/passwd"),
        (changed(f"{UPLOAD}../../../etc/x"), "normalised"),
        (changed(f"{UPLOAD}%2e%2e/x"), "percent-encoded"),
        (changed(f"{UPLOAD}%2F/x"), "percent-encoded"),
        (changed(f"{UPLOAD}w\x00.bin"), "NUL byte"),
        (changed(UPLOAD + "a" * 5000), "4096"),
        (changed(WEIGHTS, "chmod"), "eventType"),
        (no_path(), "names no path"),
        (CloudEvent({"type": FILE_CHANGED, "source": "/t", "id": "1", "subject": WEIGHTS}, b"{nope"), "JSON"),
    ],
    ids=["outside", "dotdot", "encoded-dots", "encoded-slash", "nul", "long", "event-type",
         "no-path", "not-json"],
)  # fmt: skip
def test_hostile_paths_and_bodies_are_rejected_before_any_io(event: CloudEvent, needle: str) -> None:
    cluster = Cluster(files={WEIGHTS: b"w"})
    cluster.deps = Deps(Settings(), kube=cluster.kube, storage=BrokenStorage(), clock=lambda: NOW)
    with pytest.raises(Reject, match=needle):
        cluster.run(event)
    assert cluster.kube.writes == 0

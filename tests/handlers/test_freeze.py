"""Freezing on fakes: stat -> verify -> load as the steps run them, with the storage a dict.

verify copies a verified file set to `/loraflow-frozen/{ns}/{model}/{name}/{digest}/`, checks
the copies' MD5s and only then says Ready; load hands the engines that directory. A retrain
freezes a new set and replaces the loaded one in place; a retired set is deleted once no pod
serves it and the grace period has passed. The same runs on the real SeaweedFS in
tests/seaweedfs/test_freeze_real.py.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

from cloudevents.http import CloudEvent

from events.domain import (
    ADAPTER_ADMITTED,
    ADAPTER_DRIFTED,
    ADAPTER_READY,
    ADAPTER_STAT_COMPLETED,
    STEP_EXTENSION,
)
from functions import load, reload, resync, stat, verify
from functions.edge.bootstrap import Deps
from functions.logic import drift
from functions.logic.facts import file_set
from functions.resources.kinds import VLLM_ADAPTER
from functions.settings import Settings
from tests.support.fakes import FakeBroker, FakeConfigs, FakeEngines, FakeKube, FakeStorage
from tests.support.objects import MOUNT, api_event, model_deployment, pod, url_of

NS, MODEL, NAME = "team-a", "m1", "a1"
UPLOAD = f"/loraadapters/{NS}/{MODEL}/{NAME}/"
CONFIG, WEIGHTS = UPLOAD + "adapter_config.json", UPLOAD + "adapter_model.safetensors"
CONFIG_BYTES = b'{"peft_type": "LORA", "r": 8}'


def md5(content: bytes) -> str:
    return hashlib.md5(content, usedforsecurity=False).hexdigest()


def fresh_adapter(md5s: dict[str, str]) -> dict[str, Any]:
    """A vllm LoRAAdapter as admit leaves it: admitted, nothing observed yet."""
    return {
        "apiVersion": VLLM_ADAPTER.api_version,
        "kind": VLLM_ADAPTER.kind,
        "metadata": {"name": NAME, "namespace": NS, "generation": 1, "finalizers": ["loraflow.io/unload"]},
        "spec": {"model": MODEL, "integrity": {"md5": md5s}},
        "status": {"observedGeneration": 1, "storageRef": {"path": UPLOAD}},
    }


class Cluster:
    def __init__(self, weights: bytes, replicas: int = 2) -> None:
        md = model_deployment(NS, "d1", [NAME])
        self.pods = [pod(NS, f"d1-{i}", md, f"10.0.0.{i + 1}") for i in range(replicas)]
        declared = {CONFIG: md5(CONFIG_BYTES), WEIGHTS: md5(weights)}
        self.kube = FakeKube(fresh_adapter(declared), md, *self.pods)
        self.storage = FakeStorage({CONFIG: CONFIG_BYTES, WEIGHTS: weights})
        self.engines = FakeEngines()
        self.now = datetime(2026, 6, 1, tzinfo=UTC)
        self.deps = Deps(
            Settings(mount_root=MOUNT, loopback_engines="allow", frozen_grace=60),
            kube=self.kube,
            storage=self.storage,
            configs=FakeConfigs(self.storage),
            engines=self.engines,
            broker=FakeBroker(),
            clock=lambda: self.now,
        )

    def event(self, type_: str) -> CloudEvent:
        data: dict[str, Any] = {
            "adapter": {"apiVersion": VLLM_ADAPTER.api_version, "namespace": NS, "name": NAME}
        }
        if type_ == ADAPTER_ADMITTED:
            data["generation"] = 1
        if type_ == ADAPTER_STAT_COMPLETED:
            data |= {"files": 2, "size": "1"}
        return CloudEvent({"type": type_, "source": "/tests", "id": secrets.token_hex(8)}, data)

    def pipeline(self) -> list[str]:
        """stat, then verify and load as far as the replies lead; the reply types in order."""
        replies: list[str] = []
        reply = stat.handle(self.event(ADAPTER_ADMITTED), self.deps)
        if reply is None:
            return replies
        replies.append(reply["type"])
        reply = verify.handle(self.event(ADAPTER_STAT_COMPLETED), self.deps)
        if reply is None:
            return replies
        replies.append(reply["type"])
        if reply["type"] == ADAPTER_READY:
            loaded = load.handle(self.event(ADAPTER_READY), self.deps)
            replies += [loaded["type"]] if loaded is not None else []
        return replies

    def status(self) -> dict[str, Any]:
        obj = self.kube.get(VLLM_ADAPTER, NS, NAME)
        assert obj is not None
        return dict(obj["status"])

    def ready(self) -> tuple[str, str]:
        found = next(c for c in self.status()["conditions"] if c["type"] == "Ready")
        return found["status"], found["reason"]

    def loaded_roots(self) -> set[str]:
        return {self.engines.engine(url_of(p)).loaded.get(NAME, "") for p in self.pods}

    def retrain(self, weights: bytes) -> None:
        """New weights uploaded and their MD5 declared: a new generation of the spec."""
        obj = self.kube.get(VLLM_ADAPTER, NS, NAME)
        assert obj is not None
        self.storage.files[WEIGHTS] = weights
        obj["spec"]["integrity"]["md5"][WEIGHTS] = md5(weights)
        obj["metadata"]["generation"] += 1
        self.kube.put(obj)


def frozen_dir(declared: dict[str, str]) -> str:
    return f"/loraflow-frozen/{NS}/{MODEL}/{NAME}/{file_set(declared).removeprefix('md5set:')}/"


def test_a_verified_set_is_frozen_and_the_engines_load_the_frozen_copy() -> None:
    weights = b"W" * 4096
    cluster = Cluster(weights)
    assert len(cluster.pipeline()) == 3
    declared = {CONFIG: md5(CONFIG_BYTES), WEIGHTS: md5(weights)}
    directory = frozen_dir(declared)
    assert cluster.ready() == ("True", "IntegrityVerified")
    (record,) = cluster.status()["frozen"]
    assert record["path"] == directory and record["fileSet"] == file_set(declared)
    assert record["size"] == len(weights) + len(CONFIG_BYTES) and "retiredAt" not in record
    assert cluster.storage.files[directory + "adapter_model.safetensors"] == weights
    assert cluster.storage.files[directory + "adapter_config.json"] == CONFIG_BYTES
    # the engines read the frozen copy: its path (vLLM lora_path, /v1/models root) names the digest
    assert cluster.loaded_roots() == {MOUNT + directory.rstrip("/")}


def test_overwriting_the_upload_after_ready_never_changes_the_frozen_bytes() -> None:
    weights = b"W" * 4096
    cluster = Cluster(weights)
    cluster.pipeline()
    directory = frozen_dir({CONFIG: md5(CONFIG_BYTES), WEIGHTS: md5(weights)})
    cluster.storage.files[WEIGHTS] = b"X" * 4096  # the tenant writes over the upload directory
    assert cluster.storage.files[directory + "adapter_model.safetensors"] == weights
    cluster.pipeline()  # stat sees it, verify fails it, load unloads what it can no longer vouch for
    assert cluster.ready()[1] == "IntegrityCheckFailed"
    assert cluster.storage.files[directory + "adapter_model.safetensors"] == weights


def test_a_retrain_freezes_a_new_set_replaces_in_place_and_collects_the_old_one() -> None:
    old, new = b"O" * 4096, b"N" * 4096
    cluster = Cluster(old)
    cluster.pipeline()
    old_dir = frozen_dir({CONFIG: md5(CONFIG_BYTES), WEIGHTS: md5(old)})
    cluster.retrain(new)
    cluster.pipeline()
    new_dir = frozen_dir({CONFIG: md5(CONFIG_BYTES), WEIGHTS: md5(new)})
    status = cluster.status()
    assert [r["path"] for r in status["frozen"]] == [new_dir, old_dir]
    assert "retiredAt" in status["frozen"][1] and "retiredAt" not in status["frozen"][0]
    assert cluster.loaded_roots() == {MOUNT + new_dir.rstrip("/")}
    for p in cluster.pods:  # replaced in place: never unloaded in between (no gap)
        calls = cluster.engines.engine(url_of(p)).calls
        assert ("unload", NAME) not in calls and ("load-inplace", NAME) in calls
    assert {r["fileSet"] for r in status["served"]} == {status["fileSet"]}
    # within the grace period the old copy stays; after it, the next verdict deletes it
    assert cluster.storage.files[old_dir + "adapter_model.safetensors"] == old
    cluster.now += timedelta(seconds=61)
    verify.handle(cluster.event(ADAPTER_STAT_COMPLETED), cluster.deps)
    assert [r["path"] for r in cluster.status()["frozen"]] == [new_dir]
    assert not [p for p in cluster.storage.files if p.startswith(old_dir)]
    assert cluster.storage.files[new_dir + "adapter_model.safetensors"] == new


def test_a_retired_set_a_pod_still_serves_is_kept() -> None:
    old, new = b"O" * 4096, b"N" * 4096
    cluster = Cluster(old)
    cluster.pipeline()
    old_dir = frozen_dir({CONFIG: md5(CONFIG_BYTES), WEIGHTS: md5(old)})
    cluster.retrain(new)
    stat.handle(cluster.event(ADAPTER_ADMITTED), cluster.deps)
    verify.handle(cluster.event(ADAPTER_STAT_COMPLETED), cluster.deps)  # no load yet: pods serve old
    cluster.now += timedelta(hours=1)
    verify.handle(cluster.event(ADAPTER_STAT_COMPLETED), cluster.deps)
    assert old_dir in [r["path"] for r in cluster.status()["frozen"]]
    assert cluster.storage.files[old_dir + "adapter_model.safetensors"] == old


def test_files_planted_in_the_frozen_directory_are_thrown_away_before_freezing() -> None:
    weights = b"W" * 4096
    cluster = Cluster(weights)
    directory = frozen_dir({CONFIG: md5(CONFIG_BYTES), WEIGHTS: md5(weights)})
    cluster.storage.files[directory + "adapter_model.safetensors"] = b"X" * 4096  # same size, wrong
    cluster.storage.files[directory + "adapter_model.bin"] = b"planted"
    assert len(cluster.pipeline()) == 3
    assert sorted(p for p in cluster.storage.files if p.startswith(directory)) == [
        directory + "adapter_config.json",
        directory + "adapter_model.safetensors",
    ]
    assert cluster.storage.files[directory + "adapter_model.safetensors"] == weights


def test_a_copy_that_does_not_hash_to_the_declared_md5_is_never_ready() -> None:
    """The upload changes between verification and the copy: the copy is refused, not served."""
    weights = b"W" * 4096
    cluster = Cluster(weights)
    stat.handle(cluster.event(ADAPTER_ADMITTED), cluster.deps)
    copy = cluster.storage.copy_file

    def racing(source: str, target: str, size: int, md5: str) -> bool:
        cluster.storage.files[WEIGHTS] = b"X" * 4096  # replaced just before the copy reads it
        return copy(source, target, size, md5)

    cluster.storage.copy_file = racing  # type: ignore[method-assign]
    assert verify.handle(cluster.event(ADAPTER_STAT_COMPLETED), cluster.deps) is None
    assert cluster.ready() == ("Unknown", "FreezeFailed")
    assert "does not hash to the declared MD5" in next(
        c["message"] for c in cluster.status()["conditions"] if c["type"] == "Ready"
    )
    assert cluster.status()["phase"] != "Ready" and not cluster.status().get("fileSet")


def test_a_retrain_that_cannot_be_frozen_keeps_the_old_set_served() -> None:
    """A transient failure to freeze the new set is no reason to unload the old one: Ready is
    Unknown (FreezeFailed), the old set is held where it is loaded, and the next try swaps."""
    old, new = b"O" * 4096, b"N" * 4096
    cluster = Cluster(old)
    cluster.pipeline()
    old_dir = frozen_dir({CONFIG: md5(CONFIG_BYTES), WEIGHTS: md5(old)})
    cluster.retrain(new)
    copy = cluster.storage.copy_file
    cluster.storage.copy_file = lambda source, target, size, md5: False  # type: ignore[method-assign]
    assert len(cluster.pipeline()) == 1  # stat replied; verify had nothing to announce
    assert cluster.ready()[:2] == ("Unknown", "FreezeFailed")
    assert cluster.status()["fileSet"] == file_set({CONFIG: md5(CONFIG_BYTES), WEIGHTS: md5(old)})
    load.handle(cluster.event(ADAPTER_READY), cluster.deps)  # held: kept where it is loaded
    assert cluster.loaded_roots() == {MOUNT + old_dir.rstrip("/")}
    cluster.storage.copy_file = copy  # type: ignore[method-assign]
    assert verify.handle(cluster.event(ADAPTER_STAT_COMPLETED), cluster.deps) is not None
    load.handle(cluster.event(ADAPTER_READY), cluster.deps)
    new_dir = frozen_dir({CONFIG: md5(CONFIG_BYTES), WEIGHTS: md5(new)})
    assert cluster.loaded_roots() == {MOUNT + new_dir.rstrip("/")}


def nudged_stat(cluster: Cluster) -> CloudEvent | None:
    """What a resync nudge to stat runs: stat, then verify on its reply."""
    drifted = CloudEvent(
        {"type": ADAPTER_DRIFTED, "source": "/tests", "id": secrets.token_hex(8), STEP_EXTENSION: "stat"},
        {
            "adapter": {"apiVersion": VLLM_ADAPTER.api_version, "namespace": NS, "name": NAME},
            "step": "stat",
            "reason": "test",
        },
    )
    reply = stat.handle(drifted, cluster.deps)
    return verify.handle(cluster.event(ADAPTER_STAT_COMPLETED), cluster.deps) if reply is not None else None


def test_a_frozen_set_deleted_behind_our_back_is_frozen_again_from_verified_storage() -> None:
    weights = b"W" * 4096
    cluster = Cluster(weights)
    cluster.pipeline()
    directory = frozen_dir({CONFIG: md5(CONFIG_BYTES), WEIGHTS: md5(weights)})
    cluster.storage.delete_tree(directory)
    reply = nudged_stat(cluster)
    assert reply is not None and reply["type"] == ADAPTER_READY  # Ready again once frozen again
    assert cluster.storage.files[directory + "adapter_model.safetensors"] == weights
    assert [r["path"] for r in cluster.status()["frozen"]] == [directory]


def test_a_frozen_set_deleted_while_the_upload_changed_fails_with_the_reason() -> None:
    weights = b"W" * 4096
    cluster = Cluster(weights)
    cluster.pipeline()
    directory = frozen_dir({CONFIG: md5(CONFIG_BYTES), WEIGHTS: md5(weights)})
    cluster.storage.delete_tree(directory)
    cluster.storage.files[WEIGHTS] = b"X" * 4096
    nudged_stat(cluster)
    assert cluster.ready() == ("False", "IntegrityCheckFailed")
    assert not cluster.status().get("fileSet")  # nothing verified: load unloads, never serves it


def test_a_file_written_into_the_frozen_set_is_noticed_and_the_set_frozen_again() -> None:
    weights = b"W" * 4096
    cluster = Cluster(weights)
    cluster.pipeline()
    directory = frozen_dir({CONFIG: md5(CONFIG_BYTES), WEIGHTS: md5(weights)})
    cluster.storage.files[directory + "adapter_model.safetensors"] = b"X" * 4096  # a write got through
    obj = cluster.kube.get(VLLM_ADAPTER, NS, NAME)
    assert obj is not None
    reply = stat.handle(cluster.event(ADAPTER_ADMITTED), cluster.deps)
    assert reply is not None
    ready = next(c for c in cluster.status()["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("Unknown", "AwaitingVerification")
    assert "no longer has the verified MD5" in ready["message"]
    assert verify.handle(cluster.event(ADAPTER_STAT_COMPLETED), cluster.deps) is not None
    assert cluster.ready() == ("True", "IntegrityVerified")
    assert cluster.storage.files[directory + "adapter_model.safetensors"] == weights


def test_a_full_resync_collects_sets_no_adapter_accounts_for() -> None:
    """Left by a deleted adapter, by a crash between the copy and the status write, or for a
    model the adapter no longer names: deleted on a full tick. The recorded set stays, and so
    does the set the spec declares now (verify may be freezing it this very moment)."""
    weights = b"W" * 4096
    cluster = Cluster(weights)
    cluster.pipeline()
    current = frozen_dir({CONFIG: md5(CONFIG_BYTES), WEIGHTS: md5(weights)})
    crashed = f"/loraflow-frozen/{NS}/{MODEL}/{NAME}/{'c' * 16}/"
    other_model = f"/loraflow-frozen/{NS}/m0/{NAME}/{'d' * 16}/"
    gone = f"/loraflow-frozen/{NS}/{MODEL}/deleted/{'e' * 16}/"
    for directory in (crashed, other_model, gone):
        cluster.storage.files[directory + "adapter_model.safetensors"] = b"left behind"
    deleted = resync.collect_orphans(cluster.deps, resync.Scope(None))
    assert sorted(deleted) == sorted([crashed, other_model, gone])
    left = {p.rsplit("/", 1)[0] + "/" for p in cluster.storage.files if p.startswith("/loraflow-frozen/")}
    assert left == {current}
    cluster.retrain(b"N" * 4096)  # declared, not frozen yet: kept
    being_frozen = frozen_dir({CONFIG: md5(CONFIG_BYTES), WEIGHTS: md5(b"N" * 4096)})
    cluster.storage.files[being_frozen + "adapter_model.safetensors"] = b"N" * 4096
    assert resync.collect_orphans(cluster.deps, resync.Scope(None)) == []
    cluster.kube.delete(VLLM_ADAPTER, NS, NAME)  # being deleted: unload still takes copies back
    assert resync.collect_orphans(cluster.deps, resync.Scope(None)) == []
    obj = cluster.kube.get(VLLM_ADAPTER, NS, NAME)
    assert obj is not None
    obj["metadata"]["finalizers"] = []  # unload is done: the API server removes it
    cluster.kube.put(obj)
    cluster.kube.delete(VLLM_ADAPTER, NS, NAME)
    assert sorted(resync.collect_orphans(cluster.deps, resync.Scope(None))) == sorted([current, being_frozen])
    assert not [p for p in cluster.storage.files if p.startswith("/loraflow-frozen/")]


def test_a_pod_that_restarts_mid_retrain_loads_one_whole_verified_set() -> None:
    """While a retrain waits for verify the old set is held (kept where it is loaded, loaded
    nowhere new); once verified and frozen, every pod, the restarted one too, loads the new set
    whole from its frozen directory. No pod is ever pointed at the upload directory."""
    old, new = b"O" * 4096, b"N" * 4096
    cluster = Cluster(old)
    cluster.pipeline()
    restarted = cluster.pods[1]
    cluster.engines.engine(url_of(restarted)).loaded.clear()  # its engine forgot everything
    cluster.retrain(new)
    stat.handle(cluster.event(ADAPTER_ADMITTED), cluster.deps)  # Ready Unknown: the old set is held
    reload.handle(api_event("update", restarted), cluster.deps)
    assert cluster.engines.engine(url_of(restarted)).loaded == {}
    verify.handle(cluster.event(ADAPTER_STAT_COMPLETED), cluster.deps)
    load.handle(cluster.event(ADAPTER_READY), cluster.deps)
    new_dir = frozen_dir({CONFIG: md5(CONFIG_BYTES), WEIGHTS: md5(new)})
    assert cluster.loaded_roots() == {MOUNT + new_dir.rstrip("/")}
    for p in cluster.pods:
        paths = [c for c in cluster.engines.engine(url_of(p)).calls if c[0].startswith("load")]
        assert paths  # loaded (or replaced) once the new set was verified
    assert not any(
        root.startswith(MOUNT + "/loraadapters/")
        for p in cluster.pods
        for root in cluster.engines.engine(url_of(p)).loaded.values()
    )


def test_an_adapter_verified_before_sets_were_frozen_is_frozen_and_replaced_in_place() -> None:
    """As an older release left it: Ready, no frozen record, every pod serving the tenant's
    upload directory. resync's nudge to stat leads to verify freezing the verified set, and load
    points every pod at the frozen copy in place (no unload, no gap)."""
    weights = b"W" * 4096
    cluster = Cluster(weights)
    cluster.pipeline()
    directory = frozen_dir({CONFIG: md5(CONFIG_BYTES), WEIGHTS: md5(weights)})
    cluster.storage.delete_tree(directory)
    obj = cluster.kube.get(VLLM_ADAPTER, NS, NAME)
    assert obj is not None
    del obj["status"]["frozen"]
    cluster.kube.put(obj)
    for p in cluster.pods:
        engine = cluster.engines.engine(url_of(p))
        engine.loaded[NAME] = MOUNT + UPLOAD.rstrip("/")
        engine.calls.clear()
    assert drift.frozen_drift(obj) == "the verified file set has no frozen copy yet"
    reply = nudged_stat(cluster)
    assert reply is not None and reply["type"] == ADAPTER_READY
    assert cluster.storage.files[directory + "adapter_model.safetensors"] == weights
    assert [r["path"] for r in cluster.status()["frozen"]] == [directory]
    load.handle(cluster.event(ADAPTER_READY), cluster.deps)
    assert cluster.loaded_roots() == {MOUNT + directory.rstrip("/")}
    for p in cluster.pods:
        calls = [op for op, _ in cluster.engines.engine(url_of(p)).calls]
        assert "unload" not in calls and calls[-1] == "load-inplace"
    settled = cluster.kube.get(VLLM_ADAPTER, NS, NAME)
    assert settled is not None and drift.frozen_drift(settled) is None

"""load, reload and unload on fakes (tests/support/fakes.py): the whole handler, in milliseconds.

Each test builds a cluster of plain objects, hands the step `Deps` with fakes, and asserts what
the engines were asked and what the status says. The same scenarios run over real HTTP against
the stand-ins in tests/functions; these pin the reconciler's decisions one by one.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from cloudevents.http import CloudEvent

from events.domain import (
    ADAPTER_DELETING,
    ADAPTER_DRIFTED,
    ADAPTER_LOADED_V2,
    ADAPTER_READY,
    POD_RELOADED,
    STEP_EXTENSION,
)
from functions import load, reload, unload
from functions.edge.bootstrap import Deps
from functions.errors import EngineUnavailable
from functions.logic import reasons
from functions.logic.facts import file_set
from functions.logic.serving import ListingFailure
from functions.ports import CallResult
from functions.resources.kinds import SGLANG_ADAPTER, VLLM_ADAPTER
from functions.settings import Settings
from tests.support.fakes import FakeBroker, FakeConfigs, FakeEngines, FakeKube, FakeStorage
from tests.support.objects import (
    MOUNT,
    adapter_event,
    api_event,
    inference_service,
    model_deployment,
    pod,
    sglang_adapter,
    url_of,
    vllm_adapter,
)

CONFIG = b'{"peft_type": "LORA", "r": 8}'


class Cluster:
    """Fakes wired into one Deps; `run` hands an event to a step as the edge would."""

    def __init__(self, *objects: dict[str, Any], files: dict[str, bytes] | None = None) -> None:
        self.kube = FakeKube(*objects)
        self.engines = FakeEngines()
        self.storage = FakeStorage(files)
        self.broker = FakeBroker()
        self.deps = Deps(
            Settings(mount_root=MOUNT, loopback_engines="allow"),
            kube=self.kube,
            storage=self.storage,
            configs=FakeConfigs(self.storage),
            engines=self.engines,
            broker=self.broker,
            clock=lambda: datetime(2026, 6, 1, tzinfo=UTC),
        )

    def run(self, step: Any, event: CloudEvent) -> CloudEvent | None:
        reply: CloudEvent | None = step.handle(event, self.deps)
        return reply

    def status(self, kind: Any, namespace: str, name: str) -> dict[str, Any]:
        obj = self.kube.get(kind, namespace, name)
        assert obj is not None
        return dict(obj.get("status") or {})

    def condition(self, kind: Any, namespace: str, name: str, type_: str) -> dict[str, Any]:
        return next(
            c for c in self.status(kind, namespace, name).get("conditions") or [] if c["type"] == type_
        )


def vllm_world(replicas: int = 2, **adapter_status: Any) -> tuple[Cluster, list[dict[str, Any]]]:
    md = model_deployment("team-a", "d1", ["a1"])
    pods = [pod("team-a", f"d1-{i}", md, f"10.0.0.{i + 1}") for i in range(replicas)]
    files = {"/loraadapters/team-a/m1/a1/adapter_config.json": CONFIG}
    return Cluster(vllm_adapter("team-a", "a1", **adapter_status), md, *pods, files=files), pods


def ready(namespace: str = "team-a", name: str = "a1") -> CloudEvent:
    return adapter_event(ADAPTER_READY, VLLM_ADAPTER, namespace, name)


ROOT = f"{MOUNT}/loraadapters/team-a/m1/a1"
FILE_SET = file_set({"/loraadapters/team-a/m1/a1/adapter_model.safetensors": "0" * 32})


# -- vllm -----------------------------------------------------------------------------------------
def test_a_ready_adapter_is_loaded_into_every_replica_and_recorded() -> None:
    cluster, pods = vllm_world()
    reply = cluster.run(load, ready())
    assert reply is not None and reply["type"] == ADAPTER_LOADED_V2
    assert reply.get_data()["pods"] == ["d1-0", "d1-1"]  # type: ignore[index]
    for p in pods:
        assert cluster.engines.pods[url_of(p)].loaded == {"a1": ROOT}
    status = cluster.status(VLLM_ADAPTER, "team-a", "a1")
    assert status["usedBy"] == ["d1"]
    assert status["served"] == [{"pod": "d1-0", "fileSet": FILE_SET}, {"pod": "d1-1", "fileSet": FILE_SET}]
    loaded = cluster.condition(VLLM_ADAPTER, "team-a", "a1", "Loaded")
    assert (loaded["status"], loaded["reason"]) == ("True", "Loaded")
    # a duplicate is answered "already loaded", our record says this set: nothing to do, no listing
    assert cluster.run(load, ready()) is None
    assert [c for c in cluster.engines.pods[url_of(pods[0])].calls if c[0] == "list"] == []


def test_a_pod_serving_an_older_file_set_is_replaced_in_place() -> None:
    cluster, pods = vllm_world(
        served=[{"pod": "d1-0", "fileSet": "md5set:older"}, {"pod": "d1-1", "fileSet": FILE_SET}]
    )
    for p in pods:
        cluster.engines.engine(url_of(p)).loaded["a1"] = ROOT
    drifted = adapter_event(ADAPTER_DRIFTED, VLLM_ADAPTER, "team-a", "a1", **{STEP_EXTENSION: "load"})
    reply = cluster.run(load, drifted)
    assert reply is not None and reply.get_data()["pods"] == ["d1-0"]  # type: ignore[index]
    assert ("load-inplace", "a1") in cluster.engines.pods[url_of(pods[0])].calls
    assert not [c for c in cluster.engines.pods[url_of(pods[1])].calls if c[0].startswith("load")]
    status = cluster.status(VLLM_ADAPTER, "team-a", "a1")
    assert {r["pod"]: r["fileSet"] for r in status["served"]} == {"d1-0": FILE_SET, "d1-1": FILE_SET}


def test_a_record_another_step_wrote_meanwhile_is_not_put_back() -> None:
    """reload into restarted d1-1 observes d1-0 serving an older set; before reload writes, load
    replaces d1-0 and records it (the write it meets is a newer object). reload's status keeps
    load's record of d1-0 beside its own of d1-1; from its own view it would write d1-0's older
    record back, and the pod, serving the current set, would read as stale."""
    cluster, pods = vllm_world(served=[{"pod": "d1-0", "fileSet": "md5set:older"}])
    cluster.engines.engine(url_of(pods[0])).loaded["a1"] = ROOT
    write = cluster.kube.write_status

    def load_writes_first(kind: Any, namespace: str, name: str, desired: Any, current: Any = None) -> Any:
        cluster.kube.write_status = write  # type: ignore[method-assign]
        write(
            kind,
            namespace,
            name,
            lambda obj: {**obj["status"], "served": [{"pod": "d1-0", "fileSet": FILE_SET}]},
        )
        return write(kind, namespace, name, desired, current)

    cluster.kube.write_status = load_writes_first  # type: ignore[method-assign]
    reply = cluster.run(reload, api_event("update", pods[1]))
    assert reply is not None and reply.get_data()["adapters"] == ["a1"]  # type: ignore[index]
    status = cluster.status(VLLM_ADAPTER, "team-a", "a1")
    assert {r["pod"]: r["fileSet"] for r in status["served"]} == {"d1-0": FILE_SET, "d1-1": FILE_SET}
    loaded = cluster.condition(VLLM_ADAPTER, "team-a", "a1", "Loaded")
    assert (loaded["status"], loaded["reason"]) == ("True", "Loaded")


def test_a_static_adapter_of_the_same_name_is_never_touched() -> None:
    cluster, pods = vllm_world(replicas=1)
    cluster.engines.engine(url_of(pods[0])).loaded["a1"] = "/models/static/a1"
    drifted = adapter_event(ADAPTER_DRIFTED, VLLM_ADAPTER, "team-a", "a1", **{STEP_EXTENSION: "load"})
    assert cluster.run(load, drifted) is None
    assert cluster.engines.pods[url_of(pods[0])].loaded == {"a1": "/models/static/a1"}
    assert cluster.condition(VLLM_ADAPTER, "team-a", "a1", "Loaded")["reason"] == reasons.NAME_CONFLICT


def test_one_failing_pod_is_named_and_retried_the_others_are_loaded() -> None:
    cluster, pods = vllm_world(replicas=3)
    cluster.engines.engine(url_of(pods[1])).fail["load"] = CallResult(
        False, reasons.ENGINE_ERROR, "HTTP 500", True
    )
    with pytest.raises(EngineUnavailable, match="d1-1"):
        cluster.run(load, ready())
    assert [bool(cluster.engines.engine(url_of(p)).loaded) for p in pods] == [True, False, True]
    loaded = cluster.condition(VLLM_ADAPTER, "team-a", "a1", "Loaded")
    assert loaded["reason"] == reasons.LOAD_FAILED and "d1-1 (EngineError" in loaded["message"]
    assert [e[2] for e in cluster.kube.events] == [reasons.EVENT_LOAD_FAILED]


def test_a_hostile_listing_is_that_pods_failure_only() -> None:
    cluster, pods = vllm_world(replicas=2)
    bad = cluster.engines.engine(url_of(pods[0]))
    bad.listing_answer = ListingFailure(reasons.ENGINE_ANSWER_INVALID, "GET /v1/models has no list", False)
    drifted = adapter_event(ADAPTER_DRIFTED, VLLM_ADAPTER, "team-a", "a1", **{STEP_EXTENSION: "load"})
    reply = cluster.run(load, drifted)  # not retryable: a 2xx with the verdict, not a 503 loop
    assert reply is not None and reply.get_data()["pods"] == ["d1-1"]  # type: ignore[index]
    loaded = cluster.condition(VLLM_ADAPTER, "team-a", "a1", "Loaded")
    assert loaded["reason"] == reasons.LOAD_FAILED and reasons.ENGINE_ANSWER_INVALID in loaded["message"]
    assert ("d1", "Warning", reasons.ENGINE_ANSWER_INVALID) in {e[:3] for e in cluster.kube.events}


def test_reload_loads_only_the_restarted_pod() -> None:
    cluster, pods = vllm_world(replicas=2)
    reply = cluster.run(reload, api_event("update", pods[1]))
    assert reply is not None and reply["type"] == POD_RELOADED
    assert reply.get_data()["adapters"] == ["a1"]  # type: ignore[index]
    assert cluster.engines.engine(url_of(pods[0])).loaded == {}
    assert cluster.condition(VLLM_ADAPTER, "team-a", "a1", "Loaded")["reason"] == reasons.LOADING


def test_deleting_unloads_everywhere_then_drops_the_finalizer() -> None:
    cluster, pods = vllm_world()
    cluster.run(load, ready())
    cluster.kube.delete(VLLM_ADAPTER, "team-a", "a1")
    deleted = cluster.kube.get(VLLM_ADAPTER, "team-a", "a1")
    assert deleted is not None
    reply = cluster.run(unload, adapter_event(ADAPTER_DELETING, VLLM_ADAPTER, "team-a", "a1"))
    assert reply is not None and reply.get_data()["finalized"] is True  # type: ignore[index]
    assert all(cluster.engines.engine(url_of(p)).loaded == {} for p in pods)
    assert cluster.kube.get(VLLM_ADAPTER, "team-a", "a1") is None


def test_a_deletion_a_pod_cannot_confirm_keeps_the_finalizer_and_says_why() -> None:
    cluster, pods = vllm_world()
    cluster.run(load, ready())
    cluster.engines.engine(url_of(pods[0])).listing_answer = ListingFailure(
        reasons.ENGINE_ANSWER_INVALID, "garbage", False
    )
    cluster.kube.delete(VLLM_ADAPTER, "team-a", "a1")
    deleted = cluster.kube.get(VLLM_ADAPTER, "team-a", "a1")
    assert deleted is not None
    assert cluster.run(unload, adapter_event(ADAPTER_DELETING, VLLM_ADAPTER, "team-a", "a1")) is None
    assert cluster.kube.get(VLLM_ADAPTER, "team-a", "a1") is not None  # the finalizer stays
    loaded = cluster.condition(VLLM_ADAPTER, "team-a", "a1", "Loaded")
    assert loaded["reason"] == reasons.UNLOAD_FAILED and "d1-0" in loaded["message"]
    assert reasons.EVENT_UNLOAD_FAILED in [e[2] for e in cluster.kube.events]


# -- sglang, two tenants ----------------------------------------------------------------------------
@pytest.fixture
def tenants() -> Iterator[Cluster]:
    """Tenant B serves `support` from its own path on its InferenceService, which accepts
    adapters from team-a."""
    isvc = inference_service("team-b", "chat", accepts="team-a")
    pods = [pod("team-b", f"chat-{i}", isvc, f"10.1.0.{i + 1}") for i in range(2)]
    owner = sglang_adapter("team-b", "support", "support", "/models/b/support", ("team-b", "chat"))
    yield Cluster(isvc, owner, *pods)


def test_a_second_tenant_cannot_take_over_a_name(tenants: Cluster) -> None:
    assert tenants.run(load, adapter_event(ADAPTER_READY, SGLANG_ADAPTER, "team-b", "support")) is not None
    thief = sglang_adapter(
        "team-a", "grab", "support", "/models/a/grab", ("team-b", "chat"), created="2026-02-01T00:00:00Z"
    )
    tenants.kube.put(thief)
    assert tenants.run(load, adapter_event(ADAPTER_READY, SGLANG_ADAPTER, "team-a", "grab")) is None
    for engine in tenants.engines.pods.values():
        assert engine.loaded == {"support": "/models/b/support"}
    loaded = tenants.condition(SGLANG_ADAPTER, "team-a", "grab", "Loaded")
    assert loaded["reason"] == reasons.NAME_CONFLICT and "team-b/support" in loaded["message"]
    assert "/models/b" not in loaded["message"] and "chat-" not in loaded["message"]
    # deleting the thief never removes the owner's copy
    tenants.kube.delete(SGLANG_ADAPTER, "team-a", "grab")
    doomed = tenants.kube.get(SGLANG_ADAPTER, "team-a", "grab")
    assert doomed is not None
    tenants.run(unload, adapter_event(ADAPTER_DELETING, SGLANG_ADAPTER, "team-a", "grab"))
    for engine in tenants.engines.pods.values():
        assert engine.loaded == {"support": "/models/b/support"}
    assert tenants.kube.get(SGLANG_ADAPTER, "team-a", "grab") is None


def test_without_consent_nothing_of_another_namespace_is_loaded(tenants: Cluster) -> None:
    stranger = sglang_adapter("team-c", "mine", "mine", "/models/c/mine", ("team-b", "chat"))
    tenants.kube.put(stranger)
    assert tenants.run(load, adapter_event(ADAPTER_READY, SGLANG_ADAPTER, "team-c", "mine")) is None
    assert all("mine" not in e.loaded for e in tenants.engines.pods.values())
    loaded = tenants.condition(SGLANG_ADAPTER, "team-c", "mine", "Loaded")
    assert loaded["reason"] == reasons.REFERENCE_NOT_PERMITTED


def test_a_changed_spec_path_replaces_the_old_copy(tenants: Cluster) -> None:
    tenants.run(load, adapter_event(ADAPTER_READY, SGLANG_ADAPTER, "team-b", "support"))
    moved = tenants.kube.get(SGLANG_ADAPTER, "team-b", "support")
    assert moved is not None and moved["status"]["loadedPath"] == "/models/b/support"
    moved["spec"]["path"] = "/models/b/support-v2"
    tenants.kube.put(moved)
    drifted = adapter_event(ADAPTER_DRIFTED, SGLANG_ADAPTER, "team-b", "support", **{STEP_EXTENSION: "load"})
    reply = tenants.run(load, drifted)
    assert reply is not None and reply.get_data()["pods"] == ["chat-0", "chat-1"]  # type: ignore[index]
    for engine in tenants.engines.pods.values():
        assert engine.loaded == {"support": "/models/b/support-v2"}
        assert engine.calls[-2:] == [("unload", "support"), ("load", "support")]  # SGLang: no in-place
    assert tenants.status(SGLANG_ADAPTER, "team-b", "support")["loadedPath"] == "/models/b/support-v2"


def test_a_load_whose_status_write_was_lost_still_records_its_load_time(tenants: Cluster) -> None:
    """The loads succeed, then the status PATCH fails (a 500): the redelivery finds the adapter
    loaded everywhere (SGLang answers "already loaded"), and must still record lastLoadedAt."""
    before = tenants.kube.get(SGLANG_ADAPTER, "team-b", "support")
    assert before is not None and "lastLoadedAt" not in (before.get("status") or {})
    ready_event = adapter_event(ADAPTER_READY, SGLANG_ADAPTER, "team-b", "support")
    tenants.run(load, ready_event)
    tenants.kube.put(before)  # the lost write: the status is as it was
    tenants.run(load, ready_event)
    assert [e.loaded for e in tenants.engines.pods.values()] == [{"support": "/models/b/support"}] * 2
    status = tenants.status(SGLANG_ADAPTER, "team-b", "support")
    assert status["lastLoadedAt"] == "2026-06-01T00:00:00Z" and status["loadedPath"] == "/models/b/support"
    # a later redelivery keeps the time recorded
    tenants.run(load, ready_event)
    assert tenants.status(SGLANG_ADAPTER, "team-b", "support")["lastLoadedAt"] == "2026-06-01T00:00:00Z"

"""Lost events are repaired by resync's nudges: the repair paths, one per kind of loss."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import httpx
from cloudevents.http import from_http

from devstack.standins.engines.base import EngineReplica
from events.domain import (
    ADAPTER_DRIFTED,
    ADAPTER_FAILED,
    ADAPTER_READY,
    ADAPTER_STAT_COMPLETED,
    ADAPTER_UNLOADED,
    FILE_CHANGED,
    STEP_EXTENSION,
)
from events.external import PING
from functions.resources.kinds import MODEL_DEPLOYMENT, MODEL_DEPLOYMENT_LABEL, SGLANG_ADAPTER, VLLM_ADAPTER
from tests.support.builders import (
    CONFIG,
    WEIGHTS,
    Flow,
    admit,
    delete_before_the_load_lands,
    deployment,
    isvc_pods,
    loaded_condition,
    ready_adapter,
    setup_adapter,
    sglang_adapter,
    sglang_admitted,
    sglang_files,
    sglang_isvc,
    status_of,
)
from tests.support.testbed import READY, Testbed


def test_a_lost_verify_is_repaired_by_the_stat_nudge(world: Testbed) -> None:
    """stat's observation was written but the verify that should follow was lost: the status is
    stuck short of a verdict. A resync nudge to stat must lead on to verify even though the
    observation itself did not change."""
    ns, directory = setup_adapter(world, Flow(world))
    world.upload(directory + "adapter_config.json", CONFIG)
    world.upload(directory + "adapter_model.safetensors", WEIGHTS)
    changed = world.event(
        FILE_CHANGED, {"path": directory + "adapter_model.safetensors", "eventType": "create"}
    )
    assert world.post("stat", changed).status_code == 200  # its statcompleted reply is "lost"
    assert status_of(world, ns)["conditions"][0]["reason"] == "AwaitingFiles"  # stale verdict

    nudge = world.event(
        ADAPTER_DRIFTED,
        world.adapter_data(VLLM_ADAPTER, ns, "a", step="stat", reason="admitted, not Ready"),
        **{STEP_EXTENSION: "stat"},
    )
    response = world.post("stat", nudge)
    assert response.status_code == 200, response.text
    reply = from_http(dict(response.headers), response.content)
    assert reply["type"] == ADAPTER_STAT_COMPLETED

    verdict = world.post("verify", reply)
    assert verdict.status_code == 200
    assert from_http(dict(verdict.headers), verdict.content)["type"] == ADAPTER_READY
    assert status_of(world, ns)["phase"] == "Ready"


def test_an_adapter_that_fails_after_being_ready_leaves_every_engine(world: Testbed) -> None:
    """Files replaced by bad ones after the adapter was Ready and loaded: verify says Failed, and
    the engines must stop serving the old weights; Loaded must say so."""
    ns = world.namespace()
    ready_adapter(world, ns, "a1")
    deployment(world, ns, "d1", 2, ["a1"])
    assert world.post(
        "load", world.event(ADAPTER_READY, world.adapter_data(VLLM_ADAPTER, ns, "a1"))
    ).is_success
    pods = [p["metadata"]["name"] for p in world.workload.pods(ns, f"{MODEL_DEPLOYMENT_LABEL}=d1")]
    assert all("a1" in world.workload.replica(ns, pod).loaded for pod in pods)

    failed = {**READY, "status": "False", "reason": "IntegrityCheckFailed", "message": "md5 mismatch"}
    world.custom.patch_namespaced_custom_object_status(  # verify's verdict
        VLLM_ADAPTER.group,
        VLLM_ADAPTER.version,
        ns,
        VLLM_ADAPTER.plural,
        "a1",
        {"status": {"conditions": [failed, loaded_condition(world, ns, "a1")], "phase": "Failed"}},
        _content_type="application/merge-patch+json",
    )
    event = world.event(
        ADAPTER_FAILED,
        world.adapter_data(VLLM_ADAPTER, ns, "a1", reason="IntegrityCheckFailed", message="md5 mismatch"),
    )
    response = world.post("unload", event)
    assert response.status_code == 200, response.text
    assert from_http(dict(response.headers), response.content)["type"] == ADAPTER_UNLOADED
    assert not any("a1" in world.workload.replica(ns, pod).loaded for pod in pods)
    condition = loaded_condition(world, ns, "a1")
    assert (condition["status"], condition["reason"]) == ("False", "AdapterNotReady")
    assert world.post("unload", event).status_code == 204  # a duplicate finds nothing left to do


def test_a_copy_left_behind_by_a_deleted_adapter_is_found_and_unloaded(world: Testbed) -> None:
    """A load that raced a deletion leaves our copy in an engine after the LoRAAdapter is gone:
    resync names it, unload removes it (our layout marks it ours; a static adapter is kept)."""
    ns = world.namespace()
    ready_adapter(world, ns, "a1")
    world.create(
        MODEL_DEPLOYMENT,
        ns,
        {"metadata": {"name": "d1"}, "spec": {"model": "m1", "replicas": 1, "loraAdapters": []}},
    )
    world.workload.sync()
    world.custom.delete_namespaced_custom_object(
        VLLM_ADAPTER.group, VLLM_ADAPTER.version, ns, VLLM_ADAPTER.plural, "a1"
    )
    (pod,) = [p["metadata"]["name"] for p in world.workload.pods(ns, f"{MODEL_DEPLOYMENT_LABEL}=d1")]
    replica = world.workload.replica(ns, pod)
    path = f"{world.mount_root}/loraadapters/{ns}/m1/a1"
    assert httpx.post(
        f"{replica.url}/v1/load_lora_adapter", json={"lora_name": "a1", "lora_path": path}
    ).is_success
    assert httpx.post(
        f"{replica.url}/v1/load_lora_adapter", json={"lora_name": "mine", "lora_path": path}
    ).is_success  # loaded by someone else under another name: not our layout for that name

    world.sink.clear()
    assert world.post("resync", world.event(PING, {})).status_code == 204
    nudges = [e for e in world.sink.of_type(ADAPTER_DRIFTED) if e.get_data()["adapter"]["namespace"] == ns]
    assert [(e.get_data()["adapter"]["name"], e[STEP_EXTENSION]) for e in nudges] == [("a1", "unload")]

    assert world.post("unload", nudges[0]).status_code == 204
    assert set(replica.loaded) == {"mine"}


def test_a_load_that_lands_after_the_deletion_sweep_is_taken_back(world: Testbed) -> None:
    """The load was in flight when the adapter was deleted: unload's sweep saw nothing to remove
    and dropped the finalizer. load re-reads the adapter after its own loads and undoes them."""
    ns = world.namespace()
    sglang_isvc(world, ns, 1)
    created = sglang_adapter(world, ns, "s1", "s1-v1", sglang_files(world, ns, "s1"))
    admit(world, created)
    (pod,) = isvc_pods(world, ns)
    replica = world.workload.replica(ns, pod)
    replica.configure(load_latency_s=1.0)

    answers: list[httpx.Response] = []
    loading = threading.Thread(
        target=lambda: answers.append(world.post("load", sglang_admitted(world, ns, "s1")))
    )
    loading.start()
    time.sleep(0.3)  # the load call is now waiting in the engine
    delete_before_the_load_lands(world, SGLANG_ADAPTER, ns, "s1")
    loading.join(timeout=10)
    assert answers and answers[0].is_success, answers
    assert "s1-v1" not in replica.loaded


def _finalized_adapter_in_two_slow_replicas(world: Testbed, ns: str) -> list[EngineReplica]:
    """A Ready vllm adapter `a1` (with unload's finalizer) that ModelDeployment `d1` names, and
    its two replicas, each taking 1 s per load."""
    directory = f"/loraadapters/{ns}/m1/a1/"
    world.upload(directory + "adapter_config.json", json.dumps({"peft_type": "LORA", "r": 8}).encode())
    world.upload(directory + "adapter_model.safetensors", WEIGHTS)
    world.create(
        VLLM_ADAPTER,
        ns,
        {"metadata": {"name": "a1", "finalizers": ["loraflow.io/unload"]}, "spec": {"model": "m1"}},
    )
    world.mark_ready(ns, "a1", directory)
    deployment(world, ns, "d1", 2, ["a1"])
    replicas = [
        world.workload.replica(ns, p["metadata"]["name"])
        for p in world.workload.pods(ns, f"{MODEL_DEPLOYMENT_LABEL}=d1")
    ]
    for replica in replicas:
        replica.configure(load_latency_s=1.0)
    return replicas


def _landed(replica: EngineReplica, name: str) -> bool:
    """The engine accepted a load of `name` (whatever came after it)."""
    return any(interval.name == name and interval.ok for interval in replica.load_log)


def _loading_while(world: Testbed, ns: str, name: str, meanwhile: Callable[[], None]) -> httpx.Response:
    """load's answer to `adapter.ready` while `meanwhile` runs during its (slow) engine calls."""
    answers: list[httpx.Response] = []
    event = world.event(ADAPTER_READY, world.adapter_data(VLLM_ADAPTER, ns, name))
    loading = threading.Thread(target=lambda: answers.append(world.post("load", event)))
    loading.start()
    time.sleep(0.3)  # the load calls are now waiting in the engines
    meanwhile()
    loading.join(timeout=10)
    assert answers, "load did not answer"
    return answers[0]


def test_a_vllm_load_that_lands_after_the_deletion_sweep_is_taken_back_from_every_pod(
    world: Testbed,
) -> None:
    """Deleted and swept while the loads wait in two engines: the status write finds the adapter
    gone, so nothing proves it alive after the loads; it is read again and both copies undone."""
    ns = world.namespace()
    replicas = _finalized_adapter_in_two_slow_replicas(world, ns)

    answer = _loading_while(
        world, ns, "a1", lambda: delete_before_the_load_lands(world, VLLM_ADAPTER, ns, "a1")
    )
    assert answer.is_success, answer.text
    assert all(_landed(r, "a1") for r in replicas)  # both loads went through, then were undone
    assert [r for r in replicas if "a1" in r.loaded] == []


def test_a_vllm_load_racing_a_deletion_not_yet_swept_takes_its_copies_back(world: Testbed) -> None:
    """Deleted (the finalizer still holds it) while the loads wait: the guarded status write
    conflicts, the re-read shows the deletionTimestamp, so no Loaded is written and the copies
    are taken back; the finalizer stays for unload's own sweep."""
    ns = world.namespace()
    replicas = _finalized_adapter_in_two_slow_replicas(world, ns)

    def delete() -> None:
        world.custom.delete_namespaced_custom_object(
            VLLM_ADAPTER.group, VLLM_ADAPTER.version, ns, VLLM_ADAPTER.plural, "a1"
        )

    answer = _loading_while(world, ns, "a1", delete)
    assert answer.is_success, answer.text
    assert all(_landed(r, "a1") for r in replicas)  # both loads went through, then were undone
    assert [r for r in replicas if "a1" in r.loaded] == []
    deleting = world.get(VLLM_ADAPTER, ns, "a1")
    assert deleting is not None and deleting["metadata"].get("finalizers") == ["loraflow.io/unload"]
    assert "Loaded" not in {c["type"] for c in deleting.get("status", {}).get("conditions") or []}

"""unload over real HTTP: adapters leave the pods of a deployment that no longer names them, and
every pod when they are deleted (finalizer removed last); static adapters are never touched."""

from __future__ import annotations

import json
from typing import Any

import httpx
from cloudevents.http import from_http

from events.domain import ADAPTER_ADMITTED, ADAPTER_DELETING, ADAPTER_READY, ADAPTER_UNLOADED
from functions.resources.kinds import (
    FINALIZER,
    INFERENCE_SERVICE,
    INFERENCE_SERVICE_LABEL,
    MODEL_DEPLOYMENT,
    MODEL_DEPLOYMENT_LABEL,
    SGLANG_ADAPTER,
    VLLM_ADAPTER,
    Kind,
)
from tests.support.builders import deletion_of
from tests.support.testbed import Testbed

STATIC = {"sys-lora": "/models/sys-lora"}


# -- helpers ----------------------------------------------------------------------------------------
def make_adapter(world: Testbed, ns: str, name: str) -> str:
    """A Ready vllm adapter carrying our finalizer; returns the engine-side lora_path."""
    directory = f"/loraadapters/{ns}/m1/{name}"
    world.upload(f"{directory}/adapter_config.json", json.dumps({"peft_type": "LORA", "r": 8}).encode())
    world.upload(f"{directory}/adapter_model.safetensors", b"weights")
    world.create(
        VLLM_ADAPTER, ns, {"metadata": {"name": name, "finalizers": [FINALIZER]}, "spec": {"model": "m1"}}
    )
    world.mark_ready(ns, name, directory + "/")
    return f"{world.mount_root}{directory}"


def with_static(world: Testbed, ns: str, pods: list[str], static: dict[str, str]) -> None:
    """Restart the replicas' engines as if started with `--lora-modules` (static adapters)."""
    for pod in pods:
        replica = world.workload.replica(ns, pod)
        replica.static_adapters = dict(static)
        replica.restart(unhealthy_for_s=0)


def deployment(world: Testbed, ns: str, name: str, replicas: int, adapters: list[str]) -> list[str]:
    world.create(
        MODEL_DEPLOYMENT,
        ns,
        {"metadata": {"name": name}, "spec": {"model": "m1", "replicas": replicas, "loraAdapters": adapters}},
    )
    world.workload.sync()
    pods = sorted(p["metadata"]["name"] for p in world.workload.pods(ns, f"{MODEL_DEPLOYMENT_LABEL}={name}"))
    with_static(world, ns, pods, STATIC)
    return pods


def load(world: Testbed, ns: str, name: str) -> None:
    response = world.post("load", world.event(ADAPTER_READY, world.adapter_data(VLLM_ADAPTER, ns, name)))
    assert response.status_code == 200, response.text


def loaded(world: Testbed, ns: str, pod: str) -> dict[str, str]:
    return world.workload.replica(ns, pod).loaded


def get(world: Testbed, kind: Kind, ns: str, name: str) -> dict[str, Any]:
    obj = world.get(kind, ns, name)
    assert obj is not None
    return obj


def loaded_condition(obj: dict[str, Any]) -> tuple[str, str, str]:
    c = next(c for c in obj["status"]["conditions"] if c["type"] == "Loaded")
    return c["status"], c["reason"], c["message"]


def unloaded(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, f"{response.status_code} {response.text}"
    event = from_http(dict(response.headers), response.content)
    assert event["type"] == ADAPTER_UNLOADED
    data = event.get_data()
    assert isinstance(data, dict)
    return data


def delete(world: Testbed, kind: Kind, ns: str, name: str) -> dict[str, Any]:
    world.custom.delete_namespaced_custom_object(kind.group, kind.version, ns, kind.plural, name)
    obj = get(world, kind, ns, name)
    assert obj["metadata"].get("deletionTimestamp")
    assert obj["metadata"]["finalizers"] == [FINALIZER]
    return obj


# -- the vllm kind -----------------------------------------------------------------------------------------
def test_removed_from_deployment_spec_is_unloaded_there_only(world: Testbed) -> None:
    ns = world.namespace()
    p1, p2 = make_adapter(world, ns, "a1"), make_adapter(world, ns, "a2")
    d1 = deployment(world, ns, "d1", 2, ["a1", "a2"])
    (d2,) = deployment(world, ns, "d2", 1, ["a1"])
    load(world, ns, "a1")
    load(world, ns, "a2")
    assert get(world, VLLM_ADAPTER, ns, "a1")["status"]["usedBy"] == ["d1", "d2"]

    md = world.patch(MODEL_DEPLOYMENT, ns, "d1", {"spec": {"loraAdapters": ["a2"]}})
    update = world.apiserver_event("update", md)
    assert world.post("unload", update).status_code == 204
    assert world.post("load", update).status_code == 204  # both Triggers fire
    for pod in d1:
        assert loaded(world, ns, pod) == {**STATIC, "a2": p2}
    assert loaded(world, ns, d2) == {**STATIC, "a1": p1}
    a1 = get(world, VLLM_ADAPTER, ns, "a1")
    assert a1["status"]["usedBy"] == ["d2"]
    assert a1["metadata"]["finalizers"] == [FINALIZER]
    assert get(world, VLLM_ADAPTER, ns, "a2")["status"]["usedBy"] == ["d1"]
    status, reason, message = loaded_condition(a1)  # recomputed over the deployments that remain
    assert (status, reason) == ("True", "Loaded") and "d1" not in message and "d2 1/1" in message
    # our own status writes and a repeated event change nothing
    assert world.post("unload", update).status_code == 204

    md = world.patch(MODEL_DEPLOYMENT, ns, "d2", {"spec": {"loraAdapters": []}})
    update = world.apiserver_event("update", md)
    assert world.post("unload", update).status_code == 204
    assert world.post("load", update).status_code == 204
    assert loaded(world, ns, d2) == STATIC
    a1 = get(world, VLLM_ADAPTER, ns, "a1")
    assert "usedBy" not in a1["status"]
    status, reason, _ = loaded_condition(a1)
    assert (status, reason) == ("False", "NotReferenced")


def test_deleted_adapter_is_unloaded_everywhere_then_finalized(world: Testbed) -> None:
    ns = world.namespace()
    p2 = make_adapter(world, ns, "a2")
    make_adapter(world, ns, "a1")
    d1 = deployment(world, ns, "d1", 3, ["a1", "a2"])
    (d2,) = deployment(world, ns, "d2", 1, ["a1"])
    # a third deployment's engine was started with a static adapter of the same name
    (d3,) = deployment(world, ns, "d3", 1, [])
    with_static(world, ns, [d3], {**STATIC, "a1": "/models/a1"})
    load(world, ns, "a1")
    load(world, ns, "a2")

    deleting = delete(world, VLLM_ADAPTER, ns, "a1")
    data = unloaded(world.post("unload", deletion_of(world, deleting)))
    assert data["pods"] == sorted([*d1, d2])
    assert data["finalized"] is True
    for pod in d1:
        assert loaded(world, ns, pod) == {**STATIC, "a2": p2}
    assert loaded(world, ns, d2) == STATIC
    assert loaded(world, ns, d3) == {**STATIC, "a1": "/models/a1"}
    assert world.get(VLLM_ADAPTER, ns, "a1") is None  # finalizer removed: the API server let it go


def test_failed_unload_keeps_the_finalizer_until_a_retry_succeeds(world: Testbed) -> None:
    ns = world.namespace()
    make_adapter(world, ns, "a1")
    pods = deployment(world, ns, "d1", 3, ["a1"])
    load(world, ns, "a1")
    stuck = pods[1]
    replica = world.workload.replica(ns, stuck)
    replica.inject(status=500, routes=["unload"], times=None)

    deletion = deletion_of(world, delete(world, VLLM_ADAPTER, ns, "a1"))
    response = world.post("unload", deletion)
    assert response.status_code == 503, response.text
    assert stuck in response.text
    assert [p for p in pods if "a1" in loaded(world, ns, p)] == [stuck]
    obj = get(world, VLLM_ADAPTER, ns, "a1")
    assert obj["metadata"]["finalizers"] == [FINALIZER]
    status, reason, message = loaded_condition(obj)
    assert (status, reason) == ("False", "UnloadFailed") and stuck in message

    replica.clear_faults()
    data = unloaded(world.post("unload", deletion))  # the broker's redelivery
    assert (data["pods"], data["finalized"]) == ([stuck], True)
    assert all(loaded(world, ns, p) == STATIC for p in pods)
    assert world.get(VLLM_ADAPTER, ns, "a1") is None


def test_a_live_adapter_is_not_taken_back_by_its_update_or_a_forged_deletion(world: Testbed) -> None:
    ns = world.namespace()
    path = make_adapter(world, ns, "a1")
    pods = deployment(world, ns, "d1", 1, ["a1"])
    load(world, ns, "a1")
    obj = get(world, VLLM_ADAPTER, ns, "a1")
    assert world.post("admit", world.apiserver_event("update", obj)).status_code == 204
    assert world.post("unload", world.apiserver_event("update", obj)).status_code == 204
    forged = world.event(ADAPTER_DELETING, world.adapter_data(VLLM_ADAPTER, ns, "a1"))
    assert world.post("unload", forged).status_code == 204  # unload re-reads: not deleted
    assert loaded(world, ns, pods[0]) == {**STATIC, "a1": path}
    assert get(world, VLLM_ADAPTER, ns, "a1")["metadata"]["finalizers"] == [FINALIZER]


# -- the sglang kind -----------------------------------------------------------------------------------------
def test_deleted_sglang_adapter_is_unloaded_and_finalized(world: Testbed) -> None:
    ns = world.namespace()
    world.create(
        INFERENCE_SERVICE,
        ns,
        {"metadata": {"name": "isvc"}, "spec": {"runtime": "sglang", "model": "base", "replicas": 2}},
    )
    world.workload.sync()
    pods = sorted(p["metadata"]["name"] for p in world.workload.pods(ns, f"{INFERENCE_SERVICE_LABEL}=isvc"))
    with_static(world, ns, pods, STATIC)
    path = f"/sglang/{ns}/s1"
    world.upload(f"{path}/adapter_config.json", json.dumps({"peft_type": "LORA", "r": 8}).encode())
    created = world.create(
        SGLANG_ADAPTER,
        ns,
        {
            "metadata": {"name": "s1"},
            "spec": {"inferenceServiceRef": {"name": "isvc"}, "name": "h1", "path": path},
        },
    )
    assert world.post("admit", world.apiserver_event("add", created)).status_code == 200
    admitted = world.event(ADAPTER_ADMITTED, world.adapter_data(SGLANG_ADAPTER, ns, "s1", generation=1))
    assert world.post("load", admitted).status_code == 200
    assert all(loaded(world, ns, p) == {**STATIC, "h1": path} for p in pods)

    deleting = delete(world, SGLANG_ADAPTER, ns, "s1")
    assert world.post("load", world.apiserver_event("update", deleting)).status_code == 204
    data = unloaded(world.post("unload", deletion_of(world, deleting)))
    assert (data["pods"], data["finalized"]) == (pods, True)
    assert all(loaded(world, ns, p) == STATIC for p in pods)
    assert world.get(SGLANG_ADAPTER, ns, "s1") is None


def test_a_live_adapters_update_is_answered_without_a_read(world: Testbed) -> None:
    """Every status write of a live adapter comes back as an update, delivered to admit; one that
    reaches unload anyway (a Trigger of an older release) is answered without a read."""
    ns = world.namespace()
    make_adapter(world, ns, "a")
    live = world.get(VLLM_ADAPTER, ns, "a")
    assert live is not None
    before = sum(n for (verb, _), n in world.kube.requests.items() if verb in ("get", "list"))
    answer = world.post("unload", world.apiserver_event("update", live))
    assert answer.status_code == 204, answer.text
    assert sum(n for (verb, _), n in world.kube.requests.items() if verb in ("get", "list")) == before
    assert world.get(VLLM_ADAPTER, ns, "a") == live

"""reload (the vllm kind) over real HTTP: new replicas after a scale-up and restarted engines get back
the adapters their ModelDeployment serves; pods that already have them are left alone."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
from cloudevents.http import from_http

from events.domain import ADAPTER_READY, POD_RELOADED
from functions.resources.kinds import MODEL_DEPLOYMENT, MODEL_DEPLOYMENT_LABEL, VLLM_ADAPTER
from tests.support.builders import delete_before_the_load_lands, deployment, pod_object
from tests.support.testbed import Testbed


def make_adapter(world: Testbed, ns: str, name: str, model: str = "m1") -> str:
    """A Ready vllm adapter with its files in the filer; returns the engine-side lora_path."""
    directory = f"/loraadapters/{ns}/{model}/{name}"
    world.upload(f"{directory}/adapter_config.json", json.dumps({"peft_type": "LORA", "r": 8}).encode())
    world.upload(f"{directory}/adapter_model.safetensors", b"weights")
    world.create(
        VLLM_ADAPTER,
        ns,
        {"metadata": {"name": name, "finalizers": ["loraflow.io/unload"]}, "spec": {"model": model}},
    )
    world.mark_ready(ns, name, directory + "/")
    return f"{world.mount_root}{directory}"


def pods(world: Testbed, ns: str, md: str) -> list[str]:
    return sorted(p["metadata"]["name"] for p in world.workload.pods(ns, f"{MODEL_DEPLOYMENT_LABEL}={md}"))


def load(world: Testbed, ns: str, name: str) -> None:
    response = world.post("load", world.event(ADAPTER_READY, world.adapter_data(VLLM_ADAPTER, ns, name)))
    assert response.status_code == 200, response.text


def reload(world: Testbed, ns: str, pod: str, verb: str = "update") -> httpx.Response:
    return world.post("reload", world.apiserver_event(verb, pod_object(world, ns, pod)))


def reloaded(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, f"{response.status_code} {response.text}"
    event = from_http(dict(response.headers), response.content)
    assert event["type"] == POD_RELOADED
    data = event.get_data()
    assert isinstance(data, dict)
    return data


def loaded(world: Testbed, ns: str, pod: str) -> dict[str, str]:
    return world.workload.replica(ns, pod).loaded


def loaded_condition(world: Testbed, ns: str, name: str) -> dict[str, Any]:
    obj = world.get(VLLM_ADAPTER, ns, name)
    assert obj is not None
    return next(c for c in obj["status"]["conditions"] if c["type"] == "Loaded")


def test_scale_up_new_pods_get_the_adapter(world: Testbed) -> None:
    ns = world.namespace()
    path = make_adapter(world, ns, "a1")
    deployment(world, ns, "d1", 3, ["a1"])
    load(world, ns, "a1")
    before = pods(world, ns, "d1")
    assert all(loaded(world, ns, p) == {"a1": path} for p in before)

    world.patch(MODEL_DEPLOYMENT, ns, "d1", {"spec": {"replicas": 5}})
    world.workload.sync()
    after = pods(world, ns, "d1")
    new = sorted(set(after) - set(before))
    assert len(after) == 5 and len(new) == 2
    assert all(loaded(world, ns, p) == {} for p in new)

    calls = {p: world.workload.replica(ns, p).calls["load"] for p in before}
    data = reloaded(reload(world, ns, new[0], "add"))
    assert (data["namespace"], data["pod"], data["adapters"]) == (ns, new[0], ["a1"])
    assert loaded(world, ns, new[1]) == {}  # its own Pod event reloads it
    condition = loaded_condition(world, ns, "a1")
    # the other new pod only lacks it because its own reload has not run: Loading, not LoadFailed
    assert (condition["status"], condition["reason"]) == ("False", "Loading")
    assert condition["message"].endswith(f"waiting for {new[1]}")
    data = reloaded(reload(world, ns, new[1], "add"))
    assert (data["namespace"], data["pod"], data["adapters"]) == (ns, new[1], ["a1"])
    for pod in after:
        assert loaded(world, ns, pod) == {"a1": path}
    assert {p: world.workload.replica(ns, p).calls["load"] for p in before} == calls
    condition = loaded_condition(world, ns, "a1")
    assert (condition["status"], condition["reason"]) == ("True", "Loaded")
    assert "d1 5/5" in condition["message"]

    # a pod that already has everything: nothing to do
    assert reload(world, ns, before[0]).status_code == 204


def test_restarted_engine_gets_its_adapters_back(world: Testbed) -> None:
    ns = world.namespace()
    p1 = make_adapter(world, ns, "a1")
    p2 = make_adapter(world, ns, "a2")
    deployment(world, ns, "d1", 3, ["a1", "a2"])
    load(world, ns, "a1")
    load(world, ns, "a2")
    victim, *others = pods(world, ns, "d1")
    world.workload.restart(ns, victim)
    assert loaded(world, ns, victim) == {}

    data = reloaded(reload(world, ns, victim))
    assert (data["pod"], data["adapters"], data["failed"]) == (victim, ["a1", "a2"], [])
    assert loaded(world, ns, victim) == {"a1": p1, "a2": p2}
    for pod in others:
        assert loaded(world, ns, pod) == {"a1": p1, "a2": p2}
    for name in ("a1", "a2"):
        condition = loaded_condition(world, ns, name)
        assert (condition["status"], condition["reason"]) == ("True", "Loaded")
    # the Pod update that follows our own work changes nothing
    assert reload(world, ns, victim).status_code == 204


def test_not_ready_pod_waits_and_unhealthy_ready_pod_is_retried(world: Testbed) -> None:
    ns = world.namespace()
    path = make_adapter(world, ns, "a1")
    deployment(world, ns, "d1", 1, ["a1"])
    load(world, ns, "a1")
    (pod,) = pods(world, ns, "d1")
    replica = world.workload.replica(ns, pod)

    # restarting: the Pod is not Ready yet -> nothing to do (the Ready update will come)
    world.workload.restart(ns, pod, unhealthy_for_s=30, wait=False)
    assert reload(world, ns, pod).status_code == 204
    assert replica.loaded == {}
    replica.restart(unhealthy_for_s=0)  # the engine comes up; the workload marks the Pod Ready
    world.workload.restart(ns, pod, unhealthy_for_s=0)

    # Ready, but /health fails: 503 so that the Broker redelivers
    replica.inject(status=503, routes=["health"], times=1)
    response = reload(world, ns, pod)
    assert response.status_code == 503, response.text
    assert "/health" in response.text
    assert replica.loaded == {}

    data = reloaded(reload(world, ns, pod))
    assert data["adapters"] == ["a1"]
    assert replica.loaded == {"a1": path}


def test_only_adapters_the_deployment_serves_are_reloaded(world: Testbed) -> None:
    ns = world.namespace()
    make_adapter(world, ns, "mine")
    make_adapter(world, ns, "theirs")
    make_adapter(world, ns, "other-model", model="m2")
    deployment(world, ns, "d1", 1, ["mine", "other-model"])
    deployment(world, ns, "d2", 1, ["theirs"])
    load(world, ns, "mine")
    load(world, ns, "theirs")
    (pod,) = pods(world, ns, "d1")
    world.workload.restart(ns, pod)

    data = reloaded(reload(world, ns, pod))
    assert data["adapters"] == ["mine"]
    assert set(loaded(world, ns, pod)) == {"mine"}
    (other,) = pods(world, ns, "d2")
    assert set(loaded(world, ns, other)) == {"theirs"}


def test_pods_that_are_not_serving_pods_are_ignored(world: Testbed) -> None:
    ns = world.namespace()
    world.core.create_namespaced_pod(
        ns,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "plain", "namespace": ns, "labels": {"app": "x"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        },
    )
    assert reload(world, ns, "plain").status_code == 204
    gone = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gone", "namespace": ns}}
    assert world.post("reload", world.apiserver_event("update", gone)).status_code == 204


def test_another_failing_pod_does_not_fail_this_reload(world: Testbed) -> None:
    ns = world.namespace()
    path = make_adapter(world, ns, "a1")
    deployment(world, ns, "d1", 2, ["a1"])
    load(world, ns, "a1")
    victim, broken = pods(world, ns, "d1")
    world.workload.restart(ns, victim)
    other = world.workload.replica(ns, broken)
    other.inject(status=500, routes=["models"], times=None)
    listings = other.calls["models"]
    try:
        data = reloaded(reload(world, ns, victim))
    finally:
        other.clear_faults()
    assert data["adapters"] == ["a1"]
    assert loaded(world, ns, victim) == {"a1": path}
    # a reload reads its own pod's engine only: the other pod stands by its served record
    assert other.calls["models"] == listings
    condition = loaded_condition(world, ns, "a1")
    assert (condition["status"], condition["reason"]) == ("True", "Loaded")
    # the broken pod's own event asks for a retry while it stays unreachable
    world.workload.replica(ns, broken).inject(status=500, routes=["models"], times=1)
    assert reload(world, ns, broken).status_code == 503
    assert reload(world, ns, broken).status_code == 204
    condition = loaded_condition(world, ns, "a1")
    assert (condition["status"], condition["reason"]) == ("True", "Loaded")


def test_a_reload_racing_a_deletion_takes_back_only_the_deleted_adapter(world: Testbed) -> None:
    """Several adapters reloaded into one pod are re-read with one list after the loads: the one
    deleted meanwhile (unload's sweep ran before our load landed) is taken back, the others stay."""
    ns = world.namespace()
    for name in ("keep", "gone"):
        make_adapter(world, ns, name)
    deployment(world, ns, "md", 1, ["keep", "gone"])
    (pod,) = pods(world, ns, "md")
    world.workload.replica(ns, pod).configure(load_latency_s=1.0)

    answers: list[httpx.Response] = []
    reloading = threading.Thread(target=lambda: answers.append(reload(world, ns, pod)))
    reloading.start()
    time.sleep(0.3)  # both load calls are now waiting in the engine
    delete_before_the_load_lands(world, VLLM_ADAPTER, ns, "gone")
    reloading.join(timeout=10)
    assert answers and answers[0].is_success, answers
    assert set(loaded(world, ns, pod)) == {"keep"}

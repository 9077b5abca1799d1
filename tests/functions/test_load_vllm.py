"""load (the vllm kind) over real HTTP against the Kubernetes, filer and vLLM stand-ins."""

from __future__ import annotations

from typing import Any

import httpx

from events.domain import ADAPTER_READY
from functions.resources.kinds import MODEL_DEPLOYMENT, MODEL_DEPLOYMENT_LABEL, VLLM_ADAPTER
from tests.support.builders import drifted, loaded_condition, ready_adapter, reply_pods


def deployment(world: Any, ns: str, adapter: str, replicas: int) -> list[str]:
    """ModelDeployment d1 naming `adapter`, its pods running; their names, sorted."""
    world.create(
        MODEL_DEPLOYMENT,
        ns,
        {
            "metadata": {"name": "d1"},
            "spec": {"model": "m1", "replicas": replicas, "loraAdapters": [adapter]},
        },
    )
    world.workload.sync()
    return sorted(p["metadata"]["name"] for p in world.workload.pods(ns, f"{MODEL_DEPLOYMENT_LABEL}=d1"))


def state(world: Any, ns: str, pod: str) -> dict[str, Any]:
    replica = world.workload.replica(ns, pod)
    result: dict[str, Any] = httpx.get(f"http://{replica.host}:{replica.port}/_devstack/state").json()
    return result


def test_ready_adapter_loaded_into_every_replica(world: Any) -> None:
    ns = world.namespace()
    ready_adapter(world, ns, "a1")
    pods = deployment(world, ns, "a1", replicas=3)
    event = world.event(ADAPTER_READY, world.adapter_data(VLLM_ADAPTER, ns, "a1"))
    response = world.post("load", event)
    assert response.status_code == 200, response.text
    assert len(pods) == 3
    for pod in pods:
        assert "a1" in state(world, ns, pod)["loaded"]
    obj = world.get(VLLM_ADAPTER, ns, "a1")
    assert obj["status"]["usedBy"] == ["d1"]
    assert loaded_condition(world, ns, "a1")["status"] == "True"
    again = world.post("load", world.event(ADAPTER_READY, world.adapter_data(VLLM_ADAPTER, ns, "a1")))
    assert again.status_code == 204


def test_a_new_adapter_is_loaded_without_listing_a_drifted_one_after(world: Any) -> None:
    """adapter.ready announces an adapter no pod should have: one load call per pod and no
    listing. A duplicate is answered "already loaded" and changes nothing. resync's drift nudge
    (most pods have it) lists every pod first and loads only where it is missing."""
    ns = world.namespace()
    ready_adapter(world, ns, "a1")
    pods = deployment(world, ns, "a1", replicas=3)
    replicas = [world.workload.replica(ns, pod) for pod in pods]
    ready = world.event(ADAPTER_READY, world.adapter_data(VLLM_ADAPTER, ns, "a1"))
    assert world.post("load", ready).status_code == 200
    assert [(r.calls["models"], r.calls["load"], len(r.load_log)) for r in replicas] == [(0, 1, 1)] * 3
    before = loaded_condition(world, ns, "a1")
    assert (before["status"], before["reason"]) == ("True", "Loaded")

    assert world.post("load", ready).status_code == 204  # nothing loaded now: no adapter.loaded
    assert [(r.calls["models"], r.calls["load"], len(r.load_log)) for r in replicas] == [(0, 2, 1)] * 3
    assert loaded_condition(world, ns, "a1") == before

    lost = replicas[1]
    assert httpx.post(lost.url + "/v1/unload_lora_adapter", json={"lora_name": "a1"}).status_code == 200
    assert reply_pods(drifted(world, ns)) == [pods[1]]
    assert [(r.calls["models"], r.calls["load"]) for r in replicas] == [(1, 2), (1, 3), (1, 2)]
    assert all("a1" in r.loaded for r in replicas)
    assert loaded_condition(world, ns, "a1")["status"] == "True"


def test_rank_too_high_never_calls_engine(world: Any) -> None:
    ns = world.namespace()
    ready_adapter(world, ns, "big", rank=128)
    (pod,) = deployment(world, ns, "big", replicas=1)
    response = world.post("load", world.event(ADAPTER_READY, world.adapter_data(VLLM_ADAPTER, ns, "big")))
    assert response.status_code == 204, response.text
    condition = loaded_condition(world, ns, "big")
    assert (condition["status"], condition["reason"]) == ("False", "RankTooHigh")
    calls = state(world, ns, pod)["calls"]
    assert isinstance(calls, dict)
    assert not [route for route, count in calls.items() if "load_lora" in route and count], calls

"""load (seed 1) over real HTTP against the Kubernetes, filer and vLLM stand-ins."""

from __future__ import annotations

import json
from typing import Any

import httpx

from events.domain import ADAPTER_READY
from functions.resources.kinds import MODEL_DEPLOYMENT, MODEL_DEPLOYMENT_LABEL, VLLM_ADAPTER


def make_adapter(world: Any, ns: str, name: str, rank: int = 16) -> None:
    world.upload(
        f"/loraadapters/{ns}/m1/{name}/adapter_config.json",
        json.dumps({"peft_type": "LORA", "r": rank}).encode(),
    )
    world.upload(f"/loraadapters/{ns}/m1/{name}/adapter_model.safetensors", b"weights")
    world.create(VLLM_ADAPTER, ns, {"metadata": {"name": name}, "spec": {"model": "m1"}})
    world.mark_ready(ns, name, f"/loraadapters/{ns}/m1/{name}/")


def state(world: Any, ns: str, pod: str) -> dict[str, Any]:
    replica = world.workload.replica(ns, pod)
    result: dict[str, Any] = httpx.get(f"http://{replica.host}:{replica.port}/_devstack/state").json()
    return result


def loaded_condition(world: Any, ns: str, name: str) -> dict[str, Any]:
    obj = world.get(VLLM_ADAPTER, ns, name)
    return next(c for c in obj["status"]["conditions"] if c["type"] == "Loaded")


def test_ready_adapter_loaded_into_every_replica(world: Any) -> None:
    ns = world.namespace()
    make_adapter(world, ns, "a1")
    world.create(
        MODEL_DEPLOYMENT,
        ns,
        {"metadata": {"name": "d1"}, "spec": {"model": "m1", "replicas": 3, "loraAdapters": ["a1"]}},
    )
    world.workload.sync()
    event = world.event(ADAPTER_READY, world.adapter_data(VLLM_ADAPTER, ns, "a1"))
    response = world.post("load", event)
    assert response.status_code == 200, response.text
    pods = [p["metadata"]["name"] for p in world.workload.pods(ns, f"{MODEL_DEPLOYMENT_LABEL}=d1")]
    assert len(pods) == 3
    for pod in pods:
        assert "a1" in state(world, ns, pod)["loaded"]
    obj = world.get(VLLM_ADAPTER, ns, "a1")
    assert obj["status"]["usedBy"] == ["d1"]
    assert loaded_condition(world, ns, "a1")["status"] == "True"
    again = world.post("load", world.event(ADAPTER_READY, world.adapter_data(VLLM_ADAPTER, ns, "a1")))
    assert again.status_code == 204


def test_rank_too_high_never_calls_engine(world: Any) -> None:
    ns = world.namespace()
    make_adapter(world, ns, "big", rank=128)
    world.create(
        MODEL_DEPLOYMENT,
        ns,
        {"metadata": {"name": "d1"}, "spec": {"model": "m1", "replicas": 1, "loraAdapters": ["big"]}},
    )
    world.workload.sync()
    response = world.post("load", world.event(ADAPTER_READY, world.adapter_data(VLLM_ADAPTER, ns, "big")))
    assert response.status_code == 204, response.text
    condition = loaded_condition(world, ns, "big")
    assert (condition["status"], condition["reason"]) == ("False", "RankTooHigh")
    pod = world.workload.pods(ns, f"{MODEL_DEPLOYMENT_LABEL}=d1")[0]["metadata"]["name"]
    calls = state(world, ns, pod)["calls"]
    assert isinstance(calls, dict)
    assert not [route for route, count in calls.items() if "load_lora" in route and count], calls

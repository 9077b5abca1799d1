"""load when one replica of five fails (HTTP 500, a timeout, a dropped connection, an unreachable
listing): the other four get the adapter, the status names the failing pod, the answer is 503 so
that the Broker redelivers; once the fault is gone the redelivery finishes the job."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from events.domain import ADAPTER_ADMITTED, ADAPTER_READY
from functions.resources.kinds import (
    INFERENCE_SERVICE,
    INFERENCE_SERVICE_LABEL,
    MODEL_DEPLOYMENT,
    MODEL_DEPLOYMENT_LABEL,
    SGLANG_ADAPTER,
    VLLM_ADAPTER,
)
from tests.support.builders import drifted, reply_pods
from tests.support.testbed import Testbed

FAULTS: dict[str, tuple[dict[str, Any], str]] = {
    "http-500": ({"status": 500, "routes": ["load"], "times": None}, "EngineError"),
    "timeout": ({"delay_s": 5, "routes": ["load"], "times": 1}, "EngineTimeout"),
    "dropped": ({"refuse": True, "routes": ["load"], "times": None}, "EngineUnreachable"),
}


def vllm_deployment(world: Testbed, replicas: int = 5) -> tuple[str, str, list[str]]:
    ns = world.namespace()
    directory = f"/loraadapters/{ns}/m1/a1"
    world.upload(f"{directory}/adapter_config.json", json.dumps({"peft_type": "LORA", "r": 8}).encode())
    world.upload(f"{directory}/adapter_model.safetensors", b"weights")
    world.create(VLLM_ADAPTER, ns, {"metadata": {"name": "a1"}, "spec": {"model": "m1"}})
    world.mark_ready(ns, "a1", directory + "/")
    world.create(
        MODEL_DEPLOYMENT,
        ns,
        {"metadata": {"name": "d1"}, "spec": {"model": "m1", "replicas": replicas, "loraAdapters": ["a1"]}},
    )
    world.workload.sync()
    pods = sorted(p["metadata"]["name"] for p in world.workload.pods(ns, f"{MODEL_DEPLOYMENT_LABEL}=d1"))
    assert len(pods) == replicas
    return ns, f"{world.mount_root}{directory}", pods


def ready(world: Testbed, ns: str) -> httpx.Response:
    return world.post("load", world.event(ADAPTER_READY, world.adapter_data(VLLM_ADAPTER, ns, "a1")))


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    assert obj is not None
    return next(c for c in obj["status"]["conditions"] if c["type"] == type_)


def warnings(world: Testbed, ns: str) -> list[str]:
    return [e.reason for e in world.core.list_namespaced_event(ns).items if e.type == "Warning"]


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_one_failing_replica_of_five(world: Testbed, fault: str) -> None:
    spec, reason = FAULTS[fault]
    ns, path, pods = vllm_deployment(world)
    bad = pods[2]
    replica = world.workload.replica(ns, bad)
    replica.inject(**spec)

    started = time.monotonic()
    response = ready(world, ns)
    assert response.status_code == 503, response.text
    assert time.monotonic() - started < 4.5  # the engine timeout (2 s) bounds the wait
    assert bad in response.text
    for pod in pods:
        expected = {} if pod == bad else {"a1": path}
        assert world.workload.replica(ns, pod).loaded == expected, pod
    loaded = condition(world.get(VLLM_ADAPTER, ns, "a1"), "Loaded")
    assert (loaded["status"], loaded["reason"]) == ("False", "LoadFailed")
    assert f"{bad} ({reason}" in loaded["message"]
    assert all(p not in loaded["message"] for p in pods if p != bad)
    assert "LoadFailed" in warnings(world, ns)

    replica.clear_faults()
    again = ready(world, ns)
    if fault == "timeout":  # the late request may land first: either way, every pod has it now
        assert again.status_code in (200, 204), again.text
    else:
        assert reply_pods(again) == [bad]
    for pod in pods:
        assert world.workload.replica(ns, pod).loaded == {"a1": path}, pod
    loaded = condition(world.get(VLLM_ADAPTER, ns, "a1"), "Loaded")
    assert (loaded["status"], loaded["reason"]) == ("True", "Loaded")
    assert "d1 5/5" in loaded["message"]


def test_unreachable_listing_is_retried_and_named(world: Testbed) -> None:
    ns, _, pods = vllm_deployment(world)
    bad = pods[0]
    world.workload.replica(ns, bad).inject(status=500, routes=["models"], times=1)
    response = drifted(world, ns)
    assert response.status_code == 503, response.text
    loaded = condition(world.get(VLLM_ADAPTER, ns, "a1"), "Loaded")
    assert loaded["status"] == "False" and f"{bad} (EngineUnreachable" in loaded["message"]
    assert sorted(p for p in pods if world.workload.replica(ns, p).loaded) == pods[1:]
    assert reply_pods(drifted(world, ns)) == [bad]


def test_deployment_event_with_a_failing_replica(world: Testbed) -> None:
    ns, path, pods = vllm_deployment(world)
    bad = pods[4]
    world.workload.replica(ns, bad).inject(status=500, routes=["load"], times=1)
    md = world.get(MODEL_DEPLOYMENT, ns, "d1")
    assert md is not None
    response = world.post("load", world.apiserver_event("update", md))
    assert response.status_code == 503, response.text
    assert bad in response.text
    assert sorted(p for p in pods if world.workload.replica(ns, p).loaded) == pods[:4]
    assert bad in condition(world.get(VLLM_ADAPTER, ns, "a1"), "Loaded")["message"]
    assert world.post("load", world.apiserver_event("update", md)).status_code == 204
    assert all(world.workload.replica(ns, p).loaded == {"a1": path} for p in pods)
    assert condition(world.get(VLLM_ADAPTER, ns, "a1"), "Loaded")["status"] == "True"


def test_sglang_one_failing_replica_of_five(world: Testbed) -> None:
    ns = world.namespace()
    world.create(
        INFERENCE_SERVICE,
        ns,
        {"metadata": {"name": "isvc"}, "spec": {"runtime": "sglang", "model": "base", "replicas": 5}},
    )
    world.workload.sync()
    pods = sorted(p["metadata"]["name"] for p in world.workload.pods(ns, f"{INFERENCE_SERVICE_LABEL}=isvc"))
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
    bad = pods[3]
    replica = world.workload.replica(ns, bad)
    replica.inject(status=500, routes=["load"], times=None)
    admitted = world.event(ADAPTER_ADMITTED, world.adapter_data(SGLANG_ADAPTER, ns, "s1", generation=1))

    response = world.post("load", admitted)
    assert response.status_code == 503, response.text
    assert sorted(p for p in pods if world.workload.replica(ns, p).loaded) == [p for p in pods if p != bad]
    obj = world.get(SGLANG_ADAPTER, ns, "s1")
    loaded, error = condition(obj, "Loaded"), condition(obj, "Error")
    assert (loaded["status"], loaded["reason"]) == ("False", "LoadFailed") and bad in loaded["message"]
    assert (error["status"], error["reason"]) == ("True", "EngineError") and bad in error["message"]
    assert obj is not None and obj["status"]["loadedPath"] == path

    replica.clear_faults()
    assert reply_pods(world.post("load", admitted)) == [bad]
    assert all(world.workload.replica(ns, p).loaded == {"h1": path} for p in pods)
    obj = world.get(SGLANG_ADAPTER, ns, "s1")
    assert condition(obj, "Loaded")["status"] == "True"
    assert (condition(obj, "Error")["status"], condition(obj, "Error")["reason"]) == ("False", "NoError")

"""load answers a serving Pod's deletion: the target's Loaded conditions recount its Ready pods.

The race it closes (found by the chaos soak): a scale-down's ModelDeployment/InferenceService
update reaches load while the pod still runs, so Loaded kept counting it; before this only
resync's next tick repaired the count.
"""

from __future__ import annotations

from typing import Any

from events.domain import ADAPTER_READY
from functions.resources.kinds import (
    INFERENCE_SERVICE,
    INFERENCE_SERVICE_LABEL,
    MODEL_DEPLOYMENT,
    MODEL_DEPLOYMENT_LABEL,
    SGLANG_ADAPTER,
    VLLM_ADAPTER,
)
from tests.support.builders import (
    admit,
    condition,
    isvc_pods,
    loaded_condition,
    pod_object,
    ready_adapter,
    sglang_adapter,
    sglang_admitted,
    sglang_files,
    sglang_isvc,
)
from tests.support.testbed import Testbed


def scale_down(
    world: Testbed, kind: Any, ns: str, name: str, replicas: int, selector: str
) -> list[dict[str, Any]]:
    """Scale the target down; the last state of each pod that went (what the delete event carries)."""
    before = {
        p["metadata"]["name"]: pod_object(world, ns, p["metadata"]["name"])
        for p in world.workload.pods(ns, selector)
    }
    world.patch(kind, ns, name, {"spec": {"replicas": replicas}})
    world.workload.sync()
    left = {p["metadata"]["name"] for p in world.workload.pods(ns, selector)}
    return [obj for pod, obj in before.items() if pod not in left]


def served_by_d1(world: Testbed, ns: str, replicas: int) -> None:
    """Adapter a1 (files in storage, Ready) named by ModelDeployment d1 with `replicas` pods."""
    ready_adapter(world, ns, "a1")
    spec = {"model": "m1", "replicas": replicas, "loraAdapters": ["a1"]}
    world.create(MODEL_DEPLOYMENT, ns, {"metadata": {"name": "d1"}, "spec": spec})
    world.workload.sync()


def test_a_deleted_replica_is_no_longer_counted_vllm(world: Testbed) -> None:
    ns = world.namespace()
    served_by_d1(world, ns, replicas=3)
    assert world.post(
        "load", world.event(ADAPTER_READY, world.adapter_data(VLLM_ADAPTER, ns, "a1"))
    ).is_success
    assert "3 Ready pod(s)" in loaded_condition(world, ns, "a1")["message"]

    gone = scale_down(world, MODEL_DEPLOYMENT, ns, "d1", 2, f"{MODEL_DEPLOYMENT_LABEL}=d1")
    assert len(gone) == 1
    assert "3 Ready pod(s)" in loaded_condition(world, ns, "a1")["message"]  # stale until told
    response = world.post("load", world.apiserver_event("delete", gone[0]))
    assert response.status_code == 204, response.text
    loaded = loaded_condition(world, ns, "a1")
    assert (loaded["status"], loaded["reason"]) == ("True", "Loaded")
    assert "2 Ready pod(s)" in loaded["message"]


def test_a_deleted_replica_is_no_longer_counted_sglang(world: Testbed) -> None:
    ns = world.namespace()
    sglang_isvc(world, ns, replicas=3)
    admit(world, sglang_adapter(world, ns, "s1", "handle-1", sglang_files(world, ns, "s1")))
    assert world.post("load", sglang_admitted(world, ns, "s1")).is_success
    assert "3 Ready pod(s)" in condition(world.get(SGLANG_ADAPTER, ns, "s1"), "Loaded")["message"]

    selector = f"{INFERENCE_SERVICE_LABEL}=isvc"
    gone = scale_down(world, INFERENCE_SERVICE, ns, "isvc", 2, selector)
    assert len(gone) == 1 and len(isvc_pods(world, ns)) == 2
    assert world.post("load", world.apiserver_event("delete", gone[0])).status_code == 204
    assert "2 Ready pod(s)" in condition(world.get(SGLANG_ADAPTER, ns, "s1"), "Loaded")["message"]


def test_pods_that_name_no_target_or_still_exist_are_left_to_others(world: Testbed) -> None:
    ns = world.namespace()
    served_by_d1(world, ns, replicas=1)
    (pod,) = world.workload.pods(ns, f"{MODEL_DEPLOYMENT_LABEL}=d1")
    obj = pod_object(world, ns, pod["metadata"]["name"])
    status_before = world.get(VLLM_ADAPTER, ns, "a1")["status"]
    # a pod that is added or updated is reload's, not load's
    assert world.post("load", world.apiserver_event("update", obj)).status_code == 204
    # a deleted pod whose label is no object name, or that names no target, changes nothing
    for labels in ({MODEL_DEPLOYMENT_LABEL: "Not_A_Name"}, {"app": "other"}):
        stray = {**obj, "metadata": {**obj["metadata"], "labels": labels}}
        assert world.post("load", world.apiserver_event("delete", stray)).status_code == 204
    assert world.get(VLLM_ADAPTER, ns, "a1")["status"] == status_before

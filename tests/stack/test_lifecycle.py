"""The whole lifecycle of both kinds, through the broker and the real Trigger manifests.

Nothing here calls a function directly: the test acts like a user (kubectl, filer uploads,
engine restarts, scaling) and checks the truth (status, the engines' own /v1/models).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from devstack.stack import Stack
from functions.resources.kinds import (
    INFERENCE_SERVICE,
    INFERENCE_SERVICE_LABEL,
    MODEL,
    MODEL_DEPLOYMENT,
    MODEL_DEPLOYMENT_LABEL,
    SGLANG_ADAPTER,
    VLLM_ADAPTER,
)
from tests.support.builders import upload_vllm_adapter
from tests.support.cluster import Cluster
from tests.support.wait import eventually

CONFIG = json.dumps({"peft_type": "LORA", "r": 8}).encode()


def md5(content: bytes) -> str:
    return hashlib.md5(content, usedforsecurity=False).hexdigest()


def listings(cluster: Cluster, selector: str) -> dict[str, set[str] | None]:
    return {p["metadata"]["name"]: cluster.listing(p) for p in cluster.pods(selector)}


def loaded_in(cluster: Cluster, selector: str, handle: str, pods: int) -> bool:
    found = cluster.listings(selector)
    return len(found) == pods and all(handle in (s or set()) for s in found.values())


def unloaded_everywhere(cluster: Cluster, selector: str, handle: str) -> bool:
    found = cluster.listings(selector)
    return bool(found) and all(s is not None and handle not in s for s in found.values())


def delivered(stack: Stack, trigger: str) -> bool:
    """The broker delivered an event through `trigger` and the subscriber answered 2xx (the
    broker logs a delivery once the answer is back, after the step's writes)."""
    log = stack.broker.log.since(0)
    return any(e["outcome"] == "delivered" and e["trigger"] == trigger and e["status"] < 300 for e in log)


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond["type"] == type_:
            return dict(cond)
    return {}


def test_vllm_whole_lifecycle(stack: Stack, cluster: Cluster) -> None:
    selector = f"{MODEL_DEPLOYMENT_LABEL}=d1"
    cluster.create(MODEL, "llama", {"displayName": "Llama"})
    cluster.create(MODEL_DEPLOYMENT, "d1", {"model": "llama", "replicas": 3, "loraAdapters": ["a1"]})
    upload_vllm_adapter(cluster, "a1")

    # upload -> Ready -> loaded in every pod
    eventually(
        lambda: (cluster.get(VLLM_ADAPTER, "a1") or {}).get("status", {}).get("phase") == "Ready",
        what="Ready",
    )
    eventually(lambda: cluster.loaded_in(selector, "a1", 3), what="loaded in 3 pods")
    # the engines list it before load's status write lands: the condition follows
    eventually(
        lambda: condition(cluster.get(VLLM_ADAPTER, "a1"), "Loaded").get("status") == "True",
        what="Loaded True",
    )
    adapter = cluster.get(VLLM_ADAPTER, "a1")
    assert adapter is not None and adapter["status"]["usedBy"] == ["d1"]

    # an engine restart drops its adapters; the Pod comes back Ready and reload puts it back
    pod = cluster.pods(selector)[0]["metadata"]["name"]
    stack.workload.restart(cluster.namespace, pod)
    eventually(lambda: "a1" in (cluster.listings(selector).get(pod) or set()), what="reloaded after restart")

    # scale-up: the new replicas get it too
    cluster.patch(MODEL_DEPLOYMENT, "d1", {"spec": {"replicas": 4}})
    eventually(lambda: cluster.loaded_in(selector, "a1", 4), what="loaded in 4 pods")

    # scale-down: each Pod's deletion reaches load, which recounts the Ready pods
    cluster.patch(MODEL_DEPLOYMENT, "d1", {"spec": {"replicas": 2}})
    eventually(
        lambda: (
            "in 2 Ready pod(s)" in condition(cluster.get(VLLM_ADAPTER, "a1"), "Loaded").get("message", "")
        ),
        what="Loaded counts 2 pods after the scale-down",
    )
    eventually(lambda: delivered(stack, "loraflow-load-pod-deleted"), what="a Pod deletion delivered to load")

    # removed from the target's spec -> unloaded everywhere
    cluster.patch(MODEL_DEPLOYMENT, "d1", {"spec": {"loraAdapters": []}})
    eventually(lambda: cluster.unloaded_everywhere(selector, "a1"), what="unloaded after leaving the spec")

    # deleted -> the finalizer goes last -> gone
    cluster.delete(VLLM_ADAPTER, "a1")
    eventually(lambda: cluster.get(VLLM_ADAPTER, "a1") is None, what="gone after delete")
    assert stack.broker.counters.dead_lettered == 0, stack.sink.events


def test_vllm_adapter_waits_for_its_model_then_goes_on(stack: Stack, cluster: Cluster) -> None:
    """Created before its Model: ModelNotFound, then the Model's add event re-admits it."""
    selector = f"{MODEL_DEPLOYMENT_LABEL}=d1"
    cluster.create(MODEL_DEPLOYMENT, "d1", {"model": "late", "replicas": 1, "loraAdapters": ["a1"]})
    upload_vllm_adapter(cluster, "a1", model="late")
    eventually(
        lambda: condition(cluster.get(VLLM_ADAPTER, "a1"), "Ready").get("reason") == "ModelNotFound",
        what="ModelNotFound",
    )
    cluster.create(MODEL, "late", {})
    eventually(lambda: cluster.loaded_in(selector, "a1", 1), what="loaded once its Model exists")
    eventually(
        lambda: delivered(stack, "loraflow-admit-model-added"), what="the Model's add delivered to admit"
    )


def test_vllm_wrong_md5_fails_and_is_never_loaded(stack: Stack, cluster: Cluster) -> None:
    selector = f"{MODEL_DEPLOYMENT_LABEL}=d1"
    cluster.create(MODEL, "llama", {})
    cluster.create(MODEL_DEPLOYMENT, "d1", {"model": "llama", "replicas": 1, "loraAdapters": ["bad"]})
    directory = f"/loraadapters/{cluster.namespace}/llama/bad/"
    cluster.create(
        VLLM_ADAPTER,
        "bad",
        {"model": "llama", "integrity": {"md5": {directory + "adapter_config.json": "0" * 32}}},
    )
    cluster.upload(directory + "adapter_config.json", CONFIG)
    eventually(
        lambda: (cluster.get(VLLM_ADAPTER, "bad") or {}).get("status", {}).get("phase") == "Failed",
        what="Failed",
    )
    assert condition(cluster.get(VLLM_ADAPTER, "bad"), "Ready")["reason"] == "IntegrityCheckFailed"
    assert stack.settle()
    assert cluster.unloaded_everywhere(selector, "bad")


def test_sglang_available_loaded_and_reloaded_after_restart(stack: Stack, cluster: Cluster) -> None:
    selector = f"{INFERENCE_SERVICE_LABEL}=svc"
    storage = f"/sglang/{cluster.namespace}/tone"  # the SGLang pods' SeaweedFS mount shows it
    cluster.upload(f"{storage}/adapter_config.json", CONFIG)
    cluster.upload(f"{storage}/adapter_model.safetensors", os.urandom(1024))
    directory = f"{stack.mount_root}{storage}"
    cluster.create(INFERENCE_SERVICE, "svc", {"runtime": "sglang", "model": "qwen", "replicas": 2})
    eventually(lambda: len(cluster.pods(selector)) == 2, what="2 SGLang pods")
    cluster.create(
        SGLANG_ADAPTER,
        "tone",
        {"name": "tone-v1", "path": str(directory), "inferenceServiceRef": {"name": "svc"}},
    )

    eventually(
        lambda: condition(cluster.get(SGLANG_ADAPTER, "tone"), "Available").get("status") == "True",
        what="Available",
    )
    eventually(
        lambda: condition(cluster.get(SGLANG_ADAPTER, "tone"), "Loaded").get("status") == "True",
        what="Loaded",
    )
    eventually(lambda: cluster.loaded_in(selector, "tone-v1", 2), what="loaded in both SGLang pods")
    first = (cluster.get(SGLANG_ADAPTER, "tone") or {})["status"]["lastLoadedAt"]

    stack.workload.restart(
        cluster.namespace, cluster.pods(selector)[0]["metadata"]["name"], unhealthy_for_s=1.1
    )
    eventually(lambda: cluster.loaded_in(selector, "tone-v1", 2), what="reloaded after restart")
    eventually(
        lambda: (cluster.get(SGLANG_ADAPTER, "tone") or {})["status"].get("lastLoadedAt", first) > first,
        what="lastLoadedAt moved",
    )

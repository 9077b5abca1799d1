"""Kubernetes objects and CloudEvents as the API server and the sources hand them to a step,
built as plain dicts for the handler tier (tests/handlers) and the pure tables."""

from __future__ import annotations

import secrets
from typing import Any

from cloudevents.http import CloudEvent

from events.domain import STEP_EXTENSION
from functions.logic.facts import file_set
from functions.logic.paths import frozen_dir
from functions.resources.kinds import (
    INFERENCE_SERVICE,
    INFERENCE_SERVICE_LABEL,
    MODEL_DEPLOYMENT,
    MODEL_DEPLOYMENT_LABEL,
    RUNTIME_LABEL,
    SERVING_LABEL,
    SGLANG_ADAPTER,
    VLLM_ADAPTER,
    Kind,
)

Obj = dict[str, Any]
MOUNT = "/mnt/seaweedfs"
STAMP = "2026-01-01T00:00:00Z"


def condition(type_: str, status: str = "True", reason: str = "R", message: str = "") -> Obj:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": STAMP,
    }


def vllm_adapter(
    namespace: str,
    name: str,
    model: str = "m1",
    md5s: dict[str, str] | None = None,
    ready: bool = True,
    frozen: bool = False,
    **status: Any,
) -> Obj:
    """A vllm LoRAAdapter as verify leaves it when its declared files matched (Ready=True).
    `frozen`: with the record of its verified set's frozen copy, as verify writes today; without
    it the adapter is as a release before frozen copies left it (served from its upload
    directory until resync has it frozen)."""
    md5s = (
        md5s
        if md5s is not None
        else {f"/loraadapters/{namespace}/{model}/{name}/adapter_model.safetensors": "0" * 32}
    )
    base: Obj = {
        "observedGeneration": 1,
        "storageRef": {"path": f"/loraadapters/{namespace}/{model}/{name}/"},
        "conditions": [
            condition(
                "Ready", "True" if ready else "False", "IntegrityVerified" if ready else "AwaitingFiles"
            )
        ],
    }
    if ready:
        base["fileSet"] = file_set(md5s)
    if ready and frozen:
        copy = frozen_dir(namespace, model, name, base["fileSet"])
        base["frozen"] = [{"fileSet": base["fileSet"], "path": copy, "size": 1, "frozenAt": STAMP}]
    return {
        "apiVersion": VLLM_ADAPTER.api_version,
        "kind": VLLM_ADAPTER.kind,
        "metadata": {"name": name, "namespace": namespace, "finalizers": ["loraflow.io/unload"]},
        "spec": {"model": model, "integrity": {"md5": md5s}},
        "status": {**base, **status},
    }


def sglang_adapter(
    namespace: str,
    name: str,
    lora: str,
    path: str,
    target: tuple[str, str],
    created: str = STAMP,
    available: bool = True,
) -> Obj:
    """An sglang LoRAAdapter as admit leaves it once its InferenceService accepted it."""
    available_condition = condition(
        "Available",
        "True" if available else "False",
        "InferenceServiceReady" if available else "ReferenceNotPermitted",
    )
    return {
        "apiVersion": SGLANG_ADAPTER.api_version,
        "kind": SGLANG_ADAPTER.kind,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "creationTimestamp": created,
            "uid": f"uid-{namespace}-{name}",
            "finalizers": ["loraflow.io/unload"],
        },
        "spec": {
            "inferenceServiceRef": {"namespace": target[0], "name": target[1]},
            "name": lora,
            "path": path,
        },
        "status": {"conditions": [available_condition, condition("Error", "False", "NoError", "no error")]},
    }


def model_deployment(namespace: str, name: str, adapters: list[str], model: str = "m1") -> Obj:
    return {
        "apiVersion": MODEL_DEPLOYMENT.api_version,
        "kind": MODEL_DEPLOYMENT.kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"model": model, "replicas": 1, "loraAdapters": adapters},
    }


def inference_service(namespace: str, name: str, accepts: str | None = None, runtime: str = "sglang") -> Obj:
    annotations = {"loraflow.io/accept-adapters-from": accepts} if accepts else {}
    return {
        "apiVersion": INFERENCE_SERVICE.api_version,
        "kind": INFERENCE_SERVICE.kind,
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {"runtime": runtime, "replicas": 1},
    }


def pod(namespace: str, name: str, target: Obj, ip: str, ready: bool = True) -> Obj:
    """A serving Pod of `target` as its kubelet reports it (podIP, Ready, port `http`)."""
    kind = target["kind"]
    label = MODEL_DEPLOYMENT_LABEL if kind == "ModelDeployment" else INFERENCE_SERVICE_LABEL
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                label: target["metadata"]["name"],
                SERVING_LABEL: "true",
                RUNTIME_LABEL: "vllm" if kind == "ModelDeployment" else "sglang",
            },
        },
        "spec": {"containers": [{"name": "engine", "ports": [{"name": "http", "containerPort": 8000}]}]},
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def url_of(pod_obj: Obj) -> str:
    return f"http://{pod_obj['status']['podIP']}:8000"


def adapter_event(type_: str, kind: Kind, namespace: str, name: str, **extensions: str) -> CloudEvent:
    data: Obj = {"adapter": {"apiVersion": kind.api_version, "namespace": namespace, "name": name}}
    if STEP_EXTENSION in extensions:
        data.update(step=extensions[STEP_EXTENSION], reason="test")
    attributes = {"type": type_, "source": "/tests", "id": secrets.token_hex(8), **extensions}
    return CloudEvent(attributes, data)


def api_event(verb: str, obj: Obj) -> CloudEvent:
    """What ApiServerSource (mode Resource) sends for `obj`."""
    meta = obj["metadata"]
    attributes = {
        "type": f"dev.knative.apiserver.resource.{verb}",
        "source": "https://10.96.0.1:443",
        "id": secrets.token_hex(8),
        "kind": obj["kind"],
        "apiversion": obj["apiVersion"],
        "name": meta["name"],
        "namespace": meta["namespace"],
    }
    return CloudEvent(attributes, obj)

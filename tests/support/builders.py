"""Scenario setup the test tiers share: adapters, targets, their files, the events that start a
step, and the reads that check the outcome. Everything here acts through the real clients."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from typing import Any

import httpx
from cloudevents.http import CloudEvent, from_http

from events.domain import (
    ADAPTER_ADMITTED,
    ADAPTER_DELETING,
    ADAPTER_DRIFTED,
    ADAPTER_LOADED_V2,
    ADAPTER_STAT_COMPLETED,
    FILE_CHANGED,
    STEP_EXTENSION,
)
from functions.logic.facts import file_set
from functions.resources.kinds import (
    INFERENCE_SERVICE,
    INFERENCE_SERVICE_LABEL,
    MODEL,
    MODEL_DEPLOYMENT,
    SGLANG_ADAPTER,
    VLLM_ADAPTER,
    Kind,
)
from tests.support.cluster import Cluster
from tests.support.testbed import Testbed


def md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    """The condition of `type_` in a stored object's status (StopIteration when it has none)."""
    return next(c for c in obj["status"]["conditions"] if c["type"] == type_)


def pod_object(world: Testbed, ns: str, pod: str) -> dict[str, Any]:
    """A Pod as ApiServerSource sends it (apiVersion and kind included)."""
    response = world.core.read_namespaced_pod(pod, ns, _preload_content=False)
    obj: dict[str, Any] = json.loads(response.data)
    obj.setdefault("apiVersion", "v1")
    obj.setdefault("kind", "Pod")
    return obj


# -- the vllm kind (LoRAAdapter of rackai.rackspace.com, vLLM) through admit -> stat -> verify -------------
ROUTES = {
    FILE_CHANGED: ("stat",),
    ADAPTER_ADMITTED: ("stat", "verify"),
    ADAPTER_STAT_COMPLETED: ("verify",),
}
CONFIG = b'{"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}'
WEIGHTS = secrets.token_bytes(3000)


class Flow:
    """A broker for the test: replies are routed to the next steps until nothing is left."""

    def __init__(self, world: Testbed, structured: bool = False) -> None:
        self.world = world
        self.structured = structured
        self.replies: list[CloudEvent] = []

    def send(self, function: str, event: CloudEvent) -> list[CloudEvent]:
        queue = [(function, event)]
        out: list[CloudEvent] = []
        while queue:
            target, current = queue.pop(0)
            response = self.world.post(target, current, self.structured)
            assert response.status_code in (200, 204), f"{target}: {response.status_code} {response.text}"
            if response.status_code == 200:
                reply = from_http(dict(response.headers), response.content)
                out.append(reply)
                queue.extend((nxt, reply) for nxt in ROUTES.get(reply["type"], ()))
        self.replies.extend(out)
        return out

    def published(self, prefix: str, count: int, timeout: float = 10.0) -> list[CloudEvent]:
        """file.changed events ingest published to the Broker (the sink) for paths under prefix."""
        deadline = time.monotonic() + timeout
        while True:
            found = [e for e in self.world.sink.of_type(FILE_CHANGED) if str(e["subject"]).startswith(prefix)]
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.05)


def setup_adapter(
    world: Testbed, flow: Flow, integrity: bool = True, weights: bytes = WEIGHTS, name: str = "a"
) -> tuple[str, str]:
    """Model llama and adapter `name` declaring the MD5s of CONFIG and `weights`, admitted;
    returns (namespace, storage directory). Adapter names with unusual characters are not
    DNS names, so the directory's last part is always the adapter's name."""
    ns = world.namespace()
    directory = f"/loraadapters/{ns}/llama/{name}/"
    world.create(MODEL, ns, {"metadata": {"name": "llama"}, "spec": {}})
    spec: dict[str, Any] = {"model": "llama"}
    if integrity:
        spec["integrity"] = {
            "md5": {
                directory + "adapter_config.json": md5(CONFIG),
                directory + "adapter_model.safetensors": md5(weights),
            }
        }
    created = world.create(VLLM_ADAPTER, ns, {"metadata": {"name": name}, "spec": spec})
    replies = flow.send("admit", world.apiserver_event("add", created))
    # admitted, then stat's first observation (nothing stored yet: size 0); no verdict change
    assert [r["type"] for r in replies] == [ADAPTER_ADMITTED, ADAPTER_STAT_COMPLETED]
    return ns, directory


def expected_status(directory: str, weights: bytes = WEIGHTS) -> dict[str, Any]:
    """Every vllm status field after a successful upload (lastTransitionTime aside)."""
    config_path, weights_path = directory + "adapter_config.json", directory + "adapter_model.safetensors"
    return {
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "IntegrityVerified",
                "message": "All 2 declared file(s) match",
                "observedGeneration": 1,
            }
        ],
        "fileSet": file_set({config_path: md5(CONFIG), weights_path: md5(weights)}),
        "frozen": [
            {
                "fileSet": file_set({config_path: md5(CONFIG), weights_path: md5(weights)}),
                "path": frozen_dir_of(directory, {config_path: md5(CONFIG), weights_path: md5(weights)}),
                "size": len(CONFIG) + len(weights),
            }
        ],
        "files": [{"path": config_path, "size": len(CONFIG)}, {"path": weights_path, "size": len(weights)}],
        "integrity": {
            "files": {
                config_path: {"md5": md5(CONFIG), "size": len(CONFIG)},
                weights_path: {"md5": md5(weights), "size": len(weights)},
            }
        },
        "observedGeneration": 1,
        "phase": "Ready",
        "ready": True,
        "size": str(len(CONFIG) + len(weights)),
        "storageRef": {"path": directory},
        "uploadComplete": True,
    }


def status_of(world: Testbed, ns: str, name: str = "a") -> dict[str, Any]:
    stored = world.get(VLLM_ADAPTER, ns, name)
    assert stored is not None
    status: dict[str, Any] = json.loads(json.dumps(stored["status"]))
    for cond in status.get("conditions") or []:
        assert cond.pop("lastTransitionTime")
    for record in status.get("frozen") or []:
        assert record.pop("frozenAt")
    return status


def frozen_dir_of(directory: str, md5s: dict[str, str]) -> str:
    """Where verify freezes the set `md5s` of the adapter whose upload directory is `directory`."""
    _, _, namespace, model, name = directory.rstrip("/").split("/")
    return f"/loraflow-frozen/{namespace}/{model}/{name}/{file_set(md5s).removeprefix('md5set:')}/"


# -- vllm serving: Ready adapters, ModelDeployments, load ----------------------------------------
def ready_adapter(world: Testbed, ns: str, name: str, rank: int = 16) -> None:
    """A vllm adapter of model m1 with its files in storage and the status verify leaves."""
    world.upload(
        f"/loraadapters/{ns}/m1/{name}/adapter_config.json",
        json.dumps({"peft_type": "LORA", "r": rank}).encode(),
    )
    world.upload(f"/loraadapters/{ns}/m1/{name}/adapter_model.safetensors", b"weights")
    world.create(VLLM_ADAPTER, ns, {"metadata": {"name": name}, "spec": {"model": "m1"}})
    world.mark_ready(ns, name, f"/loraadapters/{ns}/m1/{name}/")


def loaded_condition(world: Testbed, ns: str, name: str) -> dict[str, Any]:
    obj = world.get(VLLM_ADAPTER, ns, name)
    assert obj is not None
    return condition(obj, "Loaded")


def deployment(world: Testbed, ns: str, name: str, replicas: int, adapters: list[str]) -> None:
    world.create(
        MODEL_DEPLOYMENT,
        ns,
        {"metadata": {"name": name}, "spec": {"model": "m1", "replicas": replicas, "loraAdapters": adapters}},
    )
    world.workload.sync()


def delete_before_the_load_lands(world: Testbed, kind: Kind, ns: str, name: str) -> None:
    """Delete while our load call waits in the engine: unload's sweep finds nothing loaded yet
    and drops the finalizer, so the adapter is gone before the load lands."""
    world.custom.delete_namespaced_custom_object(kind.group, kind.version, ns, kind.plural, name)
    deleting = world.get(kind, ns, name)
    assert deleting is not None and deleting["metadata"].get("deletionTimestamp")
    assert world.post("unload", deletion_of(world, deleting)).is_success
    assert world.get(kind, ns, name) is None  # finalizer dropped: nothing was loaded yet


def deletion_of(world: Testbed, deleting: dict[str, Any]) -> CloudEvent:
    """What reaches unload for a deletion: admit's reply to the update that shows it."""
    answer = world.post("admit", world.apiserver_event("update", deleting))
    assert answer.status_code == 200, answer.text
    event = from_http(dict(answer.headers), answer.content)
    assert event["type"] == ADAPTER_DELETING
    return event


def drifted(world: Testbed, ns: str) -> httpx.Response:
    """resync's nudge: some pods may have the adapter already, so load lists them first."""
    data = world.adapter_data(VLLM_ADAPTER, ns, "a1", step="load", reason="not loaded in 1 pod")
    return world.post("load", world.event(ADAPTER_DRIFTED, data, **{STEP_EXTENSION: "load"}))


def reply_pods(response: httpx.Response) -> list[str]:
    assert response.status_code == 200, f"{response.status_code} {response.text}"
    event = from_http(dict(response.headers), response.content)
    assert event["type"] == ADAPTER_LOADED_V2
    data = event.get_data()
    assert isinstance(data, dict)
    pods: list[str] = data["pods"]
    return pods


# -- the sglang kind (LoRAAdapter of inference.rackai.rackspace.com, SGLang) -------------------------------
def sglang_isvc(world: Testbed, ns: str, replicas: int, runtime: str = "sglang", name: str = "isvc") -> None:
    world.create(
        INFERENCE_SERVICE,
        ns,
        {"metadata": {"name": name}, "spec": {"runtime": runtime, "model": "base", "replicas": replicas}},
    )
    world.workload.sync()


def sglang_files(world: Testbed, ns: str, name: str, rank: int = 8) -> str:
    """Adapter files the SGLang replicas can read; returns the path to put in spec.path."""
    path = f"/sglang/{ns}/{name}"
    world.upload(f"{path}/adapter_config.json", json.dumps({"peft_type": "LORA", "r": rank}).encode())
    world.upload(f"{path}/adapter_model.safetensors", b"weights")
    return path


def sglang_adapter(
    world: Testbed, ns: str, name: str, handle: str, path: str, target: str = "isvc"
) -> dict[str, Any]:
    return world.create(
        SGLANG_ADAPTER,
        ns,
        {
            "metadata": {"name": name},
            "spec": {"inferenceServiceRef": {"name": target}, "name": handle, "path": path},
        },
    )


def admit(world: Testbed, created: dict[str, Any]) -> None:
    response = world.post("admit", world.apiserver_event("add", created))
    assert response.status_code == 200, response.text


def sglang_admitted(world: Testbed, ns: str, name: str) -> CloudEvent:
    return world.event(ADAPTER_ADMITTED, world.adapter_data(SGLANG_ADAPTER, ns, name, generation=1))


def isvc_pods(world: Testbed, ns: str, name: str = "isvc") -> list[str]:
    return sorted(p["metadata"]["name"] for p in world.workload.pods(ns, f"{INFERENCE_SERVICE_LABEL}={name}"))


# -- on the whole stack, as a user -----------------------------------------------------------------
STACK_CONFIG = json.dumps({"peft_type": "LORA", "r": 8}).encode()


def upload_vllm_adapter(cluster: Cluster, name: str, model: str = "llama") -> None:
    """Create the adapter declaring the MD5s, then upload its files through the filer."""
    directory = f"/loraadapters/{cluster.namespace}/{model}/{name}/"
    weights = os.urandom(2048)
    cluster.create(
        VLLM_ADAPTER,
        name,
        {
            "model": model,
            "integrity": {
                "md5": {
                    directory + "adapter_config.json": md5(STACK_CONFIG),
                    directory + "adapter_model.safetensors": md5(weights),
                }
            },
        },
    )
    cluster.upload(directory + "adapter_config.json", STACK_CONFIG)
    cluster.upload(directory + "adapter_model.safetensors", weights)

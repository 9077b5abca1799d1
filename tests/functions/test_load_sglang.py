"""load and reload of the sglang LoRAAdapter over real HTTP against the stand-ins.

The seed's rules: Available (admit: spec well-formed, target exists and runs sglang, else
RuntimeMismatch), Loaded (SGLang reported success), Error (the underlying reason), loadedPath
(the path SGLang accepted), lastLoadedAt (moves on a re-load after an engine restart). A
duplicate answer (the seed says 409, SGLang answers 400) counts as loaded.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest
from cloudevents.http import from_http

from events.domain import ADAPTER_LOADED_V2, POD_RELOADED
from functions.resources.kinds import INFERENCE_SERVICE, SGLANG_ADAPTER
from tests.support.builders import (
    admit,
    condition,
    isvc_pods,
    pod_object,
    sglang_adapter,
    sglang_admitted,
    sglang_files,
    sglang_isvc,
)
from tests.support.testbed import Testbed

# -- helpers ----------------------------------------------------------------------------------------


def reply(response: httpx.Response, type_: str) -> dict[str, Any]:
    assert response.status_code == 200, f"{response.status_code} {response.text}"
    event = from_http(dict(response.headers), response.content)
    assert event["type"] == type_
    data = event.get_data()
    assert isinstance(data, dict)
    return data


def stored(world: Testbed, ns: str, name: str) -> dict[str, Any]:
    obj = world.get(SGLANG_ADAPTER, ns, name)
    assert obj is not None
    return obj


def conditions(obj: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in obj["status"]["conditions"]}


def listed(world: Testbed, ns: str, pod: str) -> dict[str, dict[str, Any]]:
    """The replica's own GET /v1/models: adapter cards (those with a parent) by id."""
    replica = world.workload.replica(ns, pod)
    cards = httpx.get(f"{replica.url}/v1/models").json()["data"]
    return {c["id"]: c for c in cards if c.get("parent")}


# -- tests ------------------------------------------------------------------------------------------
def test_available_then_loaded_into_every_replica(world: Testbed) -> None:
    ns = world.namespace()
    sglang_isvc(world, ns, replicas=2)
    path = sglang_files(world, ns, "s1")
    admit(world, sglang_adapter(world, ns, "s1", "handle-1", path))
    assert conditions(stored(world, ns, "s1")) == {
        "Available": ("True", "InferenceServiceReady"),
        "Error": ("False", "NoError"),
    }

    data = reply(world.post("load", sglang_admitted(world, ns, "s1")), ADAPTER_LOADED_V2)
    assert data["pods"] == isvc_pods(world, ns)
    assert data["failed"] == []
    for pod in isvc_pods(world, ns):
        assert world.workload.replica(ns, pod).loaded == {"handle-1": path}
        card = listed(world, ns, pod)["handle-1"]
        assert (card["root"], card["parent"]) == (path, "base")
    obj = stored(world, ns, "s1")
    assert conditions(obj) == {
        "Available": ("True", "InferenceServiceReady"),
        "Error": ("False", "NoError"),
        "Loaded": ("True", "Loaded"),
    }
    assert obj["status"]["loadedPath"] == path
    first = obj["status"]["lastLoadedAt"]
    assert "2 Ready pod(s)" in condition(obj, "Loaded")["message"]

    # Nothing to do the second time: each engine answers "already loaded" (a duplicate
    # admitted event loads without listing first), nothing is loaded again, lastLoadedAt stays.
    loads = sum(len(world.workload.replica(ns, p).load_log) for p in isvc_pods(world, ns))
    assert world.post("load", sglang_admitted(world, ns, "s1")).status_code == 204
    assert sum(len(world.workload.replica(ns, p).load_log) for p in isvc_pods(world, ns)) == loads
    assert stored(world, ns, "s1")["status"]["lastLoadedAt"] == first


def test_inference_service_event_loads_available_adapters(world: Testbed) -> None:
    ns = world.namespace()
    sglang_isvc(world, ns, replicas=2)
    path = sglang_files(world, ns, "s1")
    admit(world, sglang_adapter(world, ns, "s1", "handle-1", path))
    target = world.get(INFERENCE_SERVICE, ns, "isvc")
    assert target is not None
    assert world.post("load", world.apiserver_event("update", target)).status_code == 204
    for pod in isvc_pods(world, ns):
        assert "handle-1" in listed(world, ns, pod)
    obj = stored(world, ns, "s1")
    assert conditions(obj)["Loaded"] == ("True", "Loaded")
    assert obj["status"]["loadedPath"] == path
    assert obj["status"].get("lastLoadedAt")


def test_runtime_mismatch_is_not_available_and_never_loaded(world: Testbed) -> None:
    ns = world.namespace()
    sglang_isvc(world, ns, replicas=1, runtime="vllm")
    path = sglang_files(world, ns, "s1")
    admit(world, sglang_adapter(world, ns, "s1", "handle-1", path))
    obj = stored(world, ns, "s1")
    assert conditions(obj) == {
        "Available": ("False", "RuntimeMismatch"),
        "Error": ("True", "RuntimeMismatch"),
    }
    assert world.post("load", sglang_admitted(world, ns, "s1")).status_code == 204
    (pod,) = isvc_pods(world, ns)
    replica = world.workload.replica(ns, pod)
    assert replica.calls["load"] == 0
    assert replica.loaded == {}
    obj = stored(world, ns, "s1")
    assert "Loaded" not in conditions(obj)
    assert "loadedPath" not in obj["status"] and "lastLoadedAt" not in obj["status"]


def test_runtime_changed_after_admission_is_runtime_mismatch_on_load(world: Testbed) -> None:
    ns = world.namespace()
    sglang_isvc(world, ns, replicas=1)
    path = sglang_files(world, ns, "s1")
    admit(world, sglang_adapter(world, ns, "s1", "handle-1", path))
    world.patch(INFERENCE_SERVICE, ns, "isvc", {"spec": {"runtime": "vllm"}})
    assert world.post("load", sglang_admitted(world, ns, "s1")).status_code == 204
    (pod,) = isvc_pods(world, ns)
    assert world.workload.replica(ns, pod).calls["load"] == 0
    obj = stored(world, ns, "s1")
    assert conditions(obj)["Loaded"] == ("False", "RuntimeMismatch")
    assert conditions(obj)["Error"] == ("True", "RuntimeMismatch")
    assert "'vllm'" in condition(obj, "Error")["message"]
    # admit, told about the change, withdraws Available with the same reason
    admit(world, stored(world, ns, "s1"))
    assert conditions(stored(world, ns, "s1"))["Available"] == ("False", "RuntimeMismatch")


def test_engine_rejection_sets_error_with_the_engine_message(world: Testbed) -> None:
    ns = world.namespace()
    sglang_isvc(world, ns, replicas=1)
    admit(world, sglang_adapter(world, ns, "s1", "handle-1", f"/sglang/{ns}/nowhere"))
    response = world.post("load", sglang_admitted(world, ns, "s1"))
    assert response.status_code == 204, response.text  # a verdict, not worth a retry
    obj = stored(world, ns, "s1")
    assert conditions(obj)["Loaded"] == ("False", "LoadFailed")
    assert conditions(obj)["Error"] == ("True", "LoadRejected")
    assert "adapter_config.json" in condition(obj, "Error")["message"]
    assert "loadedPath" not in obj["status"] and "lastLoadedAt" not in obj["status"]


def test_last_loaded_at_moves_on_reload_after_engine_restart(world: Testbed) -> None:
    ns = world.namespace()
    sglang_isvc(world, ns, replicas=2)
    path = sglang_files(world, ns, "s1")
    admit(world, sglang_adapter(world, ns, "s1", "handle-1", path))
    reply(world.post("load", sglang_admitted(world, ns, "s1")), ADAPTER_LOADED_V2)
    first = stored(world, ns, "s1")["status"]["lastLoadedAt"]
    time.sleep(1.05)  # metav1.Time has second resolution

    restarted, other = isvc_pods(world, ns)
    world.workload.restart(ns, restarted)
    assert world.workload.replica(ns, restarted).loaded == {}
    data = reply(
        world.post("reload", world.apiserver_event("update", pod_object(world, ns, restarted))), POD_RELOADED
    )
    assert (data["pod"], data["adapters"]) == (restarted, ["handle-1"])
    assert world.workload.replica(ns, restarted).loaded == {"handle-1": path}
    obj = stored(world, ns, "s1")
    assert obj["status"]["lastLoadedAt"] > first
    assert obj["status"]["loadedPath"] == path
    assert conditions(obj)["Loaded"] == ("True", "Loaded")

    # the pod that kept it: nothing to reload, lastLoadedAt stays
    again = obj["status"]["lastLoadedAt"]
    assert (
        world.post("reload", world.apiserver_event("update", pod_object(world, ns, other))).status_code == 204
    )
    assert stored(world, ns, "s1")["status"]["lastLoadedAt"] == again


@pytest.mark.parametrize("duplicate_status", [409, 400])
def test_duplicate_answer_counts_as_loaded(world: Testbed, duplicate_status: int) -> None:
    """The adapter lands in the engine between our listing and our load call (another writer)."""
    ns = world.namespace()
    sglang_isvc(world, ns, replicas=1)
    path = sglang_files(world, ns, "s1")
    admit(world, sglang_adapter(world, ns, "s1", "handle-1", path))
    (pod,) = isvc_pods(world, ns)
    replica = world.workload.replica(ns, pod)
    replica.configure(duplicate_status=duplicate_status)
    replica.inject(delay_s=1.0, routes=["load"])  # our load call waits; the other writer does not

    answer: list[httpx.Response] = []
    thread = threading.Thread(
        target=lambda: answer.append(world.post("load", sglang_admitted(world, ns, "s1")))
    )
    thread.start()
    deadline = time.monotonic() + 5
    while replica.calls["load"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    preload = httpx.post(
        f"{replica.url}/load_lora_adapter", json={"lora_name": "handle-1", "lora_path": path}
    )
    assert preload.status_code == 200, preload.text
    thread.join(10)
    replica.clear_faults()

    assert replica.calls["load"] == 2
    (response,) = answer
    assert response.status_code == 204, response.text  # loaded, but not by us: no reply
    assert replica.loaded == {"handle-1": path}
    obj = stored(world, ns, "s1")
    assert conditions(obj)["Loaded"] == ("True", "Loaded")
    assert conditions(obj)["Error"] == ("False", "NoError")
    assert obj["status"]["loadedPath"] == path


@pytest.mark.parametrize("duplicate_status", [409, 400])
def test_duplicate_status_is_what_the_stand_in_answers(world: Testbed, duplicate_status: int) -> None:
    """Guard for the test above: the configured status really is the duplicate answer."""
    ns = world.namespace()
    sglang_isvc(world, ns, replicas=1)
    path = sglang_files(world, ns, "s1")
    (pod,) = isvc_pods(world, ns)
    replica = world.workload.replica(ns, pod)
    replica.configure(duplicate_status=duplicate_status)
    body = {"lora_name": "handle-1", "lora_path": path}
    assert httpx.post(f"{replica.url}/load_lora_adapter", json=body).status_code == 200
    second = httpx.post(f"{replica.url}/load_lora_adapter", json=body)
    assert second.status_code == duplicate_status
    assert "already loaded" in second.json()["error_message"]

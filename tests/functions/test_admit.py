"""admit over real HTTP (functions-framework app) against the Kubernetes API stand-in."""

from __future__ import annotations

from typing import Any

import pytest
from cloudevents.http import CloudEvent, from_http

from events.domain import ADAPTER_ADMITTED, ADAPTER_DELETING, ADAPTER_DRIFTED
from functions.resources.kinds import INFERENCE_SERVICE, MODEL, SGLANG_ADAPTER, VLLM_ADAPTER
from tests.support.testbed import Testbed

MODES = [pytest.param(False, id="binary"), pytest.param(True, id="structured")]


def reply_of(response: Any) -> CloudEvent:
    assert response.status_code == 200, response.text
    return from_http(dict(response.headers), response.content)


def conditions(obj: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in obj["status"]["conditions"]}


def warnings(world: Testbed, ns: str) -> list[str]:
    return [e.reason for e in world.core.list_namespaced_event(ns).items if e.type == "Warning"]


def adapter(world: Testbed, ns: str, name: str = "a", **spec: Any) -> dict[str, Any]:
    return world.create(VLLM_ADAPTER, ns, {"metadata": {"name": name}, "spec": {"model": "llama", **spec}})


@pytest.mark.parametrize("structured", MODES)
def test_first_admission_then_own_update_is_a_no_op(world: Testbed, structured: bool) -> None:
    ns = world.namespace()
    world.create(MODEL, ns, {"metadata": {"name": "llama"}, "spec": {}})
    created = adapter(world, ns)
    event = reply_of(world.post("admit", world.apiserver_event("add", created), structured))
    assert event["type"] == ADAPTER_ADMITTED
    assert event["subject"] == VLLM_ADAPTER.path(ns, "a")
    assert event.get_data() == {
        "adapter": {"apiVersion": VLLM_ADAPTER.api_version, "namespace": ns, "name": "a"},
        "generation": 1,
    }
    stored = world.get(VLLM_ADAPTER, ns, "a")
    assert stored is not None
    assert stored["metadata"]["finalizers"] == ["loraflow.io/unload"]
    status = dict(stored["status"])
    (ready,) = status.pop("conditions")
    assert status == {
        "storageRef": {"path": f"/loraadapters/{ns}/llama/a/"},
        "observedGeneration": 1,
        "phase": "Pending",
        "ready": False,
    }
    assert (ready["type"], ready["status"], ready["reason"], ready["observedGeneration"]) == (
        "Ready",
        "Unknown",
        "Admitted",
        1,
    )
    # our own writes come back as update events: they must end in 204, or the flow loops
    for _ in range(2):
        again = world.post("admit", world.apiserver_event("update", stored), structured)
        assert again.status_code == 204, again.text
    assert world.get(VLLM_ADAPTER, ns, "a") == stored


def test_a_first_admission_reads_the_adapter_once(world: Testbed) -> None:
    """The finalizer write starts from the adapter as admit read it, and the status write from
    the object the finalizer write returned (each guarded by its resourceVersion)."""
    ns = world.namespace()
    world.create(MODEL, ns, {"metadata": {"name": "llama"}, "spec": {}})
    created = adapter(world, ns)
    world.kube.reset_counters()
    reply_of(world.post("admit", world.apiserver_event("add", created)))
    assert world.kube.requests == {
        ("get", "loraadapters"): 1,
        ("patch", "loraadapters"): 1,
        ("get", "models"): 1,
        ("patch", "loraadapters/status"): 1,
    }


def test_an_adapter_changed_under_admission_is_read_again(world: Testbed) -> None:
    """A write the API server refuses with 409 (as it refuses a stale resourceVersion) starts
    again from a fresh read, not from the object admit began with."""
    ns = world.namespace()
    world.create(MODEL, ns, {"metadata": {"name": "llama"}, "spec": {}})
    created = adapter(world, ns)
    world.kube.reset_counters()
    world.kube.inject(409, times=1, verb="patch", resource="loraadapters")
    try:
        reply_of(world.post("admit", world.apiserver_event("add", created)))
    finally:
        world.kube.clear_faults()
    assert world.kube.requests[("get", "loraadapters")] == 2
    stored = world.get(VLLM_ADAPTER, ns, "a")
    assert stored is not None
    assert stored["metadata"]["finalizers"] == ["loraflow.io/unload"]
    assert conditions(stored) == {"Ready": ("Unknown", "Admitted")}


def test_missing_model_then_model_appears(world: Testbed) -> None:
    ns = world.namespace()
    created = adapter(world, ns)
    reply_of(world.post("admit", world.apiserver_event("add", created)))
    stored = world.get(VLLM_ADAPTER, ns, "a")
    assert stored is not None
    assert conditions(stored) == {"Ready": ("False", "ModelNotFound")}
    assert stored["status"]["phase"] == "Failed"
    assert stored["status"]["ready"] is False
    assert "ModelNotFound" in warnings(world, ns)
    # a duplicate does not record a second Event
    assert world.post("admit", world.apiserver_event("update", stored)).status_code == 204
    assert warnings(world, ns).count("ModelNotFound") == 1

    world.create(MODEL, ns, {"metadata": {"name": "llama"}, "spec": {}})
    nudge = world.event(
        ADAPTER_DRIFTED,
        world.adapter_data(VLLM_ADAPTER, ns, "a", step="admit", reason="resync"),
        loraflowstep="admit",
    )
    reply_of(world.post("admit", nudge, structured=True))
    stored = world.get(VLLM_ADAPTER, ns, "a")
    assert stored is not None
    assert conditions(stored) == {"Ready": ("Unknown", "Admitted")}
    assert stored["status"]["phase"] == "Pending"


def test_integrity_key_outside_the_adapter(world: Testbed) -> None:
    ns = world.namespace()
    world.create(MODEL, ns, {"metadata": {"name": "llama"}, "spec": {}})
    inside = f"/loraadapters/{ns}/llama/a/w.safetensors"
    outside = f"/loraadapters/{ns}/llama/b/w.safetensors"
    created = adapter(world, ns, integrity={"md5": {inside: "0" * 32, outside: "1" * 32}})
    reply_of(world.post("admit", world.apiserver_event("add", created)))
    stored = world.get(VLLM_ADAPTER, ns, "a")
    assert stored is not None
    assert conditions(stored) == {"Ready": ("False", "IntegrityPathOutsideAdapter")}
    (ready,) = stored["status"]["conditions"]
    assert outside in ready["message"] and inside not in ready["message"]
    assert stored["status"]["phase"] == "Failed"


def sglang(world: Testbed, ns: str, isvc_ns: str | None = None) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": "isvc"}
    if isvc_ns:
        ref["namespace"] = isvc_ns
    return world.create(
        SGLANG_ADAPTER,
        ns,
        {
            "metadata": {"name": "s"},
            "spec": {"inferenceServiceRef": ref, "name": "handle", "path": "/models/s"},
        },
    )


def isvc(world: Testbed, ns: str, runtime: str) -> None:
    world.create(INFERENCE_SERVICE, ns, {"metadata": {"name": "isvc"}, "spec": {"runtime": runtime}})


@pytest.mark.parametrize("structured", MODES)
def test_sglang_available(world: Testbed, structured: bool) -> None:
    ns = world.namespace()
    isvc(world, ns, "sglang")
    created = sglang(world, ns)
    event = reply_of(world.post("admit", world.apiserver_event("add", created), structured))
    assert event.get_data()["adapter"]["apiVersion"] == SGLANG_ADAPTER.api_version
    stored = world.get(SGLANG_ADAPTER, ns, "s")
    assert stored is not None
    assert stored["metadata"]["finalizers"] == ["loraflow.io/unload"]
    assert conditions(stored) == {
        "Available": ("True", "InferenceServiceReady"),
        "Error": ("False", "NoError"),
    }
    assert set(stored["status"]) == {"conditions"}
    assert world.post("admit", world.apiserver_event("update", stored)).status_code == 204


def test_sglang_target_missing_in_other_namespace(world: Testbed) -> None:
    ns, other = world.namespace(), world.namespace()
    isvc(world, ns, "sglang")  # same name, wrong namespace
    created = sglang(world, ns, isvc_ns=other)
    reply_of(world.post("admit", world.apiserver_event("add", created)))
    stored = world.get(SGLANG_ADAPTER, ns, "s")
    assert stored is not None
    assert conditions(stored) == {
        "Available": ("False", "InferenceServiceNotFound"),
        "Error": ("True", "InferenceServiceNotFound"),
    }


def test_sglang_runtime_mismatch_then_fixed(world: Testbed) -> None:
    ns = world.namespace()
    isvc(world, ns, "vllm")
    created = sglang(world, ns)
    reply_of(world.post("admit", world.apiserver_event("add", created)))
    stored = world.get(SGLANG_ADAPTER, ns, "s")
    assert stored is not None
    assert conditions(stored) == {
        "Available": ("False", "RuntimeMismatch"),
        "Error": ("True", "RuntimeMismatch"),
    }
    available = next(c for c in stored["status"]["conditions"] if c["type"] == "Available")
    assert "'vllm'" in available["message"]
    assert warnings(world, ns) == ["RuntimeMismatch"]

    world.patch(INFERENCE_SERVICE, ns, "isvc", {"spec": {"runtime": "sglang"}})
    nudge = world.event(
        ADAPTER_DRIFTED,
        world.adapter_data(SGLANG_ADAPTER, ns, "s", step="admit", reason="resync"),
        loraflowstep="admit",
    )
    reply_of(world.post("admit", nudge))
    stored = world.get(SGLANG_ADAPTER, ns, "s")
    assert stored is not None
    assert conditions(stored) == {
        "Available": ("True", "InferenceServiceReady"),
        "Error": ("False", "NoError"),
    }


def published_admissions(world: Testbed, ns: str) -> list[str]:
    """Names of this namespace's adapters whose adapter.admitted the sink (K_SINK) received."""
    refs = [e.get_data()["adapter"] for e in world.sink.of_type(ADAPTER_ADMITTED)]
    return sorted(ref["name"] for ref in refs if ref["namespace"] == ns)


def test_a_new_model_admits_the_adapters_waiting_for_it(world: Testbed) -> None:
    ns = world.namespace()
    for name, model in (("a", "llama"), ("b", "llama"), ("c", "other")):
        reply_of(world.post("admit", world.apiserver_event("add", adapter(world, ns, name, model=model))))
        assert conditions(world.get(VLLM_ADAPTER, ns, name) or {}) == {"Ready": ("False", "ModelNotFound")}
    world.sink.clear()

    model = world.create(MODEL, ns, {"metadata": {"name": "llama"}, "spec": {}})
    assert world.post("admit", world.apiserver_event("add", model)).status_code == 204
    for name in ("a", "b"):
        assert conditions(world.get(VLLM_ADAPTER, ns, name) or {}) == {"Ready": ("Unknown", "Admitted")}
    assert conditions(world.get(VLLM_ADAPTER, ns, "c") or {}) == {"Ready": ("False", "ModelNotFound")}
    assert published_admissions(world, ns) == ["a", "b"]
    # a duplicate finds nobody waiting: no write, nothing published
    world.sink.clear()
    assert world.post("admit", world.apiserver_event("add", model)).status_code == 204
    assert published_admissions(world, ns) == []


def test_a_deletion_is_passed_on_to_unload_and_other_kinds_are_ignored(world: Testbed) -> None:
    ns = world.namespace()
    world.create(MODEL, ns, {"metadata": {"name": "llama"}, "spec": {}})
    created = adapter(world, ns, name="gone")
    reply_of(world.post("admit", world.apiserver_event("add", created)))
    world.custom.delete_namespaced_custom_object(
        VLLM_ADAPTER.group, VLLM_ADAPTER.version, ns, VLLM_ADAPTER.plural, "gone"
    )
    deleting = world.get(VLLM_ADAPTER, ns, "gone")
    assert deleting is not None and deleting["metadata"].get("deletionTimestamp")
    passed = reply_of(world.post("admit", world.apiserver_event("update", deleting)))
    assert passed["type"] == ADAPTER_DELETING and passed["subject"] == VLLM_ADAPTER.path(ns, "gone")
    assert passed.get_data() == world.adapter_data(VLLM_ADAPTER, ns, "gone")
    # a stale add event of the object (without deletionTimestamp): re-read says deleting -> 204
    assert world.post("admit", world.apiserver_event("add", created)).status_code == 204
    model = world.get(MODEL, ns, "llama")
    assert model is not None
    assert world.post("admit", world.apiserver_event("update", model)).status_code == 204


def test_bad_events_are_rejected(world: Testbed) -> None:
    bad = world.apiserver_event(
        "add",
        {
            "apiVersion": VLLM_ADAPTER.api_version,
            "kind": "LoRAAdapter",
            "metadata": {"name": "../x", "namespace": "ns"},
        },
    )
    response = world.post("admit", bad)
    assert response.status_code == 400 and "'../x'" in response.text
    wrong = world.event("io.loraflow.adapter.ready.v1", {})
    assert world.post("admit", wrong).status_code == 400


def test_conflict_on_status_write_is_retried(world: Testbed) -> None:
    ns = world.namespace()
    world.create(MODEL, ns, {"metadata": {"name": "llama"}, "spec": {}})
    created = adapter(world, ns)
    world.kube.inject(409, times=2, verb="patch", resource="loraadapters/status")
    try:
        reply_of(world.post("admit", world.apiserver_event("add", created)))
    finally:
        world.kube.clear_faults()
    stored = world.get(VLLM_ADAPTER, ns, "a")
    assert stored is not None
    assert conditions(stored) == {"Ready": ("Unknown", "Admitted")}


def reads_of_adapters(world: Testbed) -> int:
    """GETs and LISTs of LoRAAdapters (either kind) the API stand-in has answered so far."""
    return sum(
        n
        for (verb, resource), n in world.kube.requests.items()
        if verb in ("get", "list") and resource in (VLLM_ADAPTER.plural, SGLANG_ADAPTER.plural)
    )


def test_a_later_steps_status_write_is_answered_without_a_read(world: Testbed) -> None:
    """stat, verify and load each write status; every write comes back as an update. Once its
    generation is admitted and our finalizer is on it, admit answers 204 from the event."""
    ns = world.namespace()
    world.create(MODEL, ns, {"metadata": {"name": "llama"}, "spec": {}})
    reply_of(world.post("admit", world.apiserver_event("add", adapter(world, ns))))
    world.mark_ready(ns, "a", f"/loraadapters/{ns}/llama/a/")
    stored = world.get(VLLM_ADAPTER, ns, "a")
    assert stored is not None
    before = reads_of_adapters(world)
    answer = world.post("admit", world.apiserver_event("update", stored))
    assert answer.status_code == 204, answer.text
    assert reads_of_adapters(world) == before
    assert world.get(VLLM_ADAPTER, ns, "a") == stored


def test_an_update_of_a_new_generation_is_admitted(world: Testbed) -> None:
    ns = world.namespace()
    world.create(MODEL, ns, {"metadata": {"name": "llama"}, "spec": {}})
    reply_of(world.post("admit", world.apiserver_event("add", adapter(world, ns))))
    edited = world.patch(VLLM_ADAPTER, ns, "a", {"spec": {"model": "other"}})
    assert edited["metadata"]["generation"] == 2
    event = reply_of(world.post("admit", world.apiserver_event("update", edited)))
    assert event.get_data()["generation"] == edited["metadata"]["generation"]
    stored = world.get(VLLM_ADAPTER, ns, "a")
    assert stored is not None
    assert stored["status"]["observedGeneration"] == edited["metadata"]["generation"]
    assert conditions(stored)["Ready"] == ("False", "ModelNotFound")


def test_an_update_that_lost_our_finalizer_gets_it_back(world: Testbed) -> None:
    """A metadata edit bumps no generation; admission still reads it when our finalizer is gone."""
    ns = world.namespace()
    world.create(MODEL, ns, {"metadata": {"name": "llama"}, "spec": {}})
    reply_of(world.post("admit", world.apiserver_event("add", adapter(world, ns))))
    stripped = world.patch(VLLM_ADAPTER, ns, "a", {"metadata": {"finalizers": None}})
    assert not stripped["metadata"].get("finalizers")
    world.post("admit", world.apiserver_event("update", stripped))
    stored = world.get(VLLM_ADAPTER, ns, "a")
    assert stored is not None
    assert stored["metadata"]["finalizers"] == ["loraflow.io/unload"]


def test_an_old_snapshot_is_no_reason_to_read(world: Testbed) -> None:
    """Reordered updates: the snapshot of generation 1 arrives after generation 2 was admitted.
    Its answer reads nothing and leaves the newer admission as it is."""
    ns = world.namespace()
    world.create(MODEL, ns, {"metadata": {"name": "llama"}, "spec": {}})
    reply_of(world.post("admit", world.apiserver_event("add", adapter(world, ns))))
    old = world.get(VLLM_ADAPTER, ns, "a")
    assert old is not None
    edited = world.patch(VLLM_ADAPTER, ns, "a", {"spec": {"model": "other"}})
    reply_of(world.post("admit", world.apiserver_event("update", edited)))
    newer = world.get(VLLM_ADAPTER, ns, "a")
    before = reads_of_adapters(world)
    assert world.post("admit", world.apiserver_event("update", old)).status_code == 204
    assert reads_of_adapters(world) == before
    assert world.get(VLLM_ADAPTER, ns, "a") == newer

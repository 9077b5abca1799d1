"""resync over real HTTP: one PingSource event, one nudge per drifted (adapter, step), published to
the Broker (the EventSink) with the `loraflowstep` extension; nothing for adapters in sync.

resync lists every namespace, so the sink's events are filtered by this test's namespace.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from cloudevents.http import CloudEvent

from events.domain import ADAPTER_ADMITTED, ADAPTER_DRIFTED, ADAPTER_READY, RESYNC_SHARD, STEP_EXTENSION
from events.external import PING
from functions.logic.paths import FROZEN_ROOT
from functions.resources.kinds import (
    FINALIZER,
    INFERENCE_SERVICE,
    INFERENCE_SERVICE_LABEL,
    MODEL_DEPLOYMENT,
    MODEL_DEPLOYMENT_LABEL,
    SGLANG_ADAPTER,
    VLLM_ADAPTER,
    Kind,
)
from tests.support.testbed import READY, Testbed

ADMITTED = {**READY, "status": "Unknown", "reason": "Admitted", "message": "waiting for files"}
V1, V2 = "v1", "v2"


# -- helpers ----------------------------------------------------------------------------------------
def v1_adapter(world: Testbed, ns: str, name: str, condition: dict[str, Any] | None = READY) -> str:
    """A seed-1 adapter with our finalizer; with a condition it is admitted (files uploaded)."""
    directory = f"/loraadapters/{ns}/m1/{name}"
    world.upload(f"{directory}/adapter_config.json", json.dumps({"peft_type": "LORA", "r": 8}).encode())
    world.create(
        VLLM_ADAPTER, ns, {"metadata": {"name": name, "finalizers": [FINALIZER]}, "spec": {"model": "m1"}}
    )
    if condition is not None:
        status = {"observedGeneration": 1, "conditions": [condition], "storageRef": {"path": directory + "/"}}
        set_status(world, VLLM_ADAPTER, ns, name, status)
    return f"{world.mount_root}{directory}"


def v2_adapter(world: Testbed, ns: str, name: str, handle: str, admit: bool = True) -> str:
    path = f"/sglang/{ns}/{name}"
    world.upload(f"{path}/adapter_config.json", json.dumps({"peft_type": "LORA", "r": 8}).encode())
    created = world.create(
        SGLANG_ADAPTER,
        ns,
        {
            "metadata": {"name": name},
            "spec": {"inferenceServiceRef": {"name": "isvc"}, "name": handle, "path": path},
        },
    )
    if admit:
        assert world.post("admit", world.apiserver_event("add", created)).status_code == 200
    return path


def set_status(world: Testbed, kind: Kind, ns: str, name: str, status: dict[str, Any]) -> None:
    world.custom.patch_namespaced_custom_object_status(
        kind.group,
        kind.version,
        ns,
        kind.plural,
        name,
        {"status": status},
        _content_type="application/merge-patch+json",
    )


def pods(world: Testbed, ns: str, selector: str) -> list[str]:
    return sorted(p["metadata"]["name"] for p in world.workload.pods(ns, selector))


def delete(world: Testbed, kind: Kind, ns: str, name: str) -> None:
    world.custom.delete_namespaced_custom_object(kind.group, kind.version, ns, kind.plural, name)
    obj = world.get(kind, ns, name)
    assert obj is not None and obj["metadata"]["finalizers"] == [FINALIZER]


def resync(world: Testbed, ns: str, data: dict[str, Any] | None = None) -> list[CloudEvent]:
    world.sink.clear()
    ping = world.event(PING, data or {"resync": True})
    response = world.post("resync", ping)
    assert response.status_code == 204, response.text
    return [e for e in world.sink.of_type(ADAPTER_DRIFTED) if data_of(e)["adapter"]["namespace"] == ns]


def data_of(event: CloudEvent) -> dict[str, Any]:
    data = event.get_data()
    assert isinstance(data, dict)
    return data


def summary(events: list[CloudEvent]) -> list[tuple[str, str, str]]:
    seeds = {VLLM_ADAPTER.api_version: V1, SGLANG_ADAPTER.api_version: V2}
    found = []
    for event in events:
        data = data_of(event)
        assert event[STEP_EXTENSION] == data["step"]
        assert event["source"] == "/loraflow/resync"
        ref = data["adapter"]
        kind = VLLM_ADAPTER if seeds[ref["apiVersion"]] == V1 else SGLANG_ADAPTER
        assert event["subject"] == kind.path(ref["namespace"], ref["name"])
        found.append((seeds[ref["apiVersion"]], ref["name"], data["step"]))
    return sorted(found)


def reasons(events: list[CloudEvent]) -> dict[tuple[str, str], str]:
    return {(data_of(e)["adapter"]["name"], data_of(e)["step"]): data_of(e)["reason"] for e in events}


# -- the world with one adapter per kind of drift -----------------------------------------------------
def drifted_world(world: Testbed) -> tuple[str, dict[str, Any]]:
    ns = world.namespace()
    world.create(
        MODEL_DEPLOYMENT,
        ns,
        {
            "metadata": {"name": "d1"},
            "spec": {"model": "m1", "replicas": 2, "loraAdapters": ["synced", "missing", "stale"]},
        },
    )
    world.create(
        INFERENCE_SERVICE,
        ns,
        {"metadata": {"name": "isvc"}, "spec": {"runtime": "sglang", "model": "base", "replicas": 2}},
    )
    world.workload.sync()
    md_pods = pods(world, ns, f"{MODEL_DEPLOYMENT_LABEL}=d1")
    isvc_pods = pods(world, ns, f"{INFERENCE_SERVICE_LABEL}=isvc")

    for name in ("synced", "missing", "stale"):
        v1_adapter(world, ns, name)
        ready = world.event(ADAPTER_READY, world.adapter_data(VLLM_ADAPTER, ns, name))
        assert world.post("load", ready).status_code == 200
    v1_adapter(world, ns, "never", condition=None)  # never admitted
    v1_adapter(world, ns, "unverified", condition=ADMITTED)  # admitted, Ready never came
    v1_adapter(world, ns, "deleting", condition=None)
    delete(world, VLLM_ADAPTER, ns, "deleting")  # still carrying our finalizer
    extra = v1_adapter(world, ns, "extra")  # Ready, named by no deployment, yet loaded in d1
    pushed = httpx.post(
        f"{world.workload.replica(ns, md_pods[0]).url}/v1/load_lora_adapter",
        json={"lora_name": "extra", "lora_path": extra},
    )
    assert pushed.status_code == 200, pushed.text
    # a Ready adapter missing from one pod
    victim = world.workload.replica(ns, md_pods[1])
    assert (
        httpx.post(f"{victim.url}/v1/unload_lora_adapter", json={"lora_name": "missing"}).status_code == 200
    )
    # usedBy that no longer matches the deployments
    set_status(world, VLLM_ADAPTER, ns, "stale", {"usedBy": ["d1", "ghost"]})

    for name, handle in (("s-synced", "h-synced"), ("s-missing", "h-missing")):
        v2_adapter(world, ns, name, handle)
        admitted = world.event(ADAPTER_ADMITTED, world.adapter_data(SGLANG_ADAPTER, ns, name, generation=1))
        assert world.post("load", admitted).status_code == 200
    v2_adapter(world, ns, "s-never", "h-never", admit=False)
    v2_adapter(world, ns, "s-deleting", "h-deleting")
    delete(world, SGLANG_ADAPTER, ns, "s-deleting")
    sg_victim = world.workload.replica(ns, isvc_pods[0])
    assert (
        httpx.post(f"{sg_victim.url}/unload_lora_adapter", json={"lora_name": "h-missing"}).status_code == 200
    )
    return ns, {"md_pods": md_pods, "isvc_pods": isvc_pods}


EXPECTED = [
    (V1, "deleting", "unload"),
    (V1, "extra", "load"),
    (V1, "extra", "unload"),
    (V1, "missing", "load"),
    (V1, "never", "admit"),
    (V1, "stale", "load"),
    (V1, "unverified", "stat"),
    (V2, "s-deleting", "unload"),
    (V2, "s-missing", "load"),
    (V2, "s-never", "admit"),
]


def test_one_nudge_per_drift_and_none_for_adapters_in_sync(world: Testbed) -> None:
    ns, seen = drifted_world(world)
    events = resync(world, ns)
    assert summary(events) == EXPECTED
    why = reasons(events)
    assert why[("never", "admit")] == "never admitted"
    assert why[("s-never", "admit")] == "never admitted"
    assert why[("missing", "load")] == f"missing in Ready pod(s) d1/{seen['md_pods'][1]}"
    assert why[("s-missing", "load")] == f"missing in Ready pod(s) {seen['isvc_pods'][0]}"
    assert why[("stale", "load")] == "usedBy is stale (should be ['d1'])"
    assert why[("deleting", "unload")] == "deleting and still carrying our finalizer"
    assert why[("extra", "unload")] == "loaded in d1 which should not serve it"
    assert why[("extra", "load")] == "Loaded is stale or missing: no ModelDeployment names it"


def test_a_tick_dealt_into_parts_nudges_as_the_whole_tick(world: Testbed) -> None:
    """LORAFLOW_RESYNC_SHARDS=3: the tick lists the namespaces and publishes its parts (no nudge
    of its own); each part, posted as the Broker delivers it, judges its namespaces; together
    they nudge exactly what one whole tick does."""
    ns, _ = drifted_world(world)
    whole = summary(resync(world, ns))
    world.sink.clear()
    with world.settings(LORAFLOW_RESYNC_SHARDS="3"):
        assert world.post("resync", world.event(PING, {"resync": True})).status_code == 204
        parts = world.sink.of_type(RESYNC_SHARD)
        assert world.sink.of_type(ADAPTER_DRIFTED) == []
        dealt = [name for part in parts for name in data_of(part)["namespaces"]]
        assert ns in dealt and len(dealt) == len(set(dealt)) and len(parts) == min(3, len(dealt))
        for part in parts:
            assert world.post("resync", part).status_code == 204
    nudged = [e for e in world.sink.of_type(ADAPTER_DRIFTED) if data_of(e)["adapter"]["namespace"] == ns]
    assert summary(nudged) == whole == EXPECTED


def test_nudges_repair_the_drift(world: Testbed) -> None:
    """Deliver the load/unload nudges to their steps (as the Broker would): the next resync is quiet
    for them."""
    ns, _ = drifted_world(world)
    events = resync(world, ns)
    for event in events:
        step = event[STEP_EXTENSION]
        if step in ("load", "unload"):
            response = world.post(step, event)
            assert response.status_code in (200, 204), f"{step} {data_of(event)}: {response.text}"
    after = summary(resync(world, ns))
    assert after == [e for e in EXPECTED if e[2] in ("admit", "stat")]
    assert world.get(VLLM_ADAPTER, ns, "deleting") is None
    assert world.get(SGLANG_ADAPTER, ns, "s-deleting") is None
    stale = world.get(VLLM_ADAPTER, ns, "stale")
    assert stale is not None and stale["status"]["usedBy"] == ["d1"]


def test_a_full_resync_restats_the_ready_adapters_too(world: Testbed) -> None:
    """The filer source's tick after its log lost events (`full: true`): besides the ordinary
    nudges, stat for every admitted seed-1 adapter, with the source's reason."""
    ns, _ = drifted_world(world)
    reason = "the filer's metadata log starts after the cursor"
    events = resync(world, ns, {"resync": True, "full": True, "reason": reason})
    restats = {(v, name) for v, name, step in summary(events) if step == "stat"}
    assert restats == {(V1, "synced"), (V1, "missing"), (V1, "stale"), (V1, "unverified"), (V1, "extra")}
    assert reasons(events)[("synced", "stat")] == reason
    assert [e for e in summary(events) if e[2] != "stat"] == [e for e in EXPECTED if e[2] != "stat"]


def test_a_full_resync_deletes_the_frozen_sets_no_adapter_accounts_for(world: Testbed) -> None:
    """On the real filer and as resync's own account: a frozen set whose adapter is gone goes, the
    set a live adapter records stays."""
    ns = world.namespace()
    v1_adapter(world, ns, "kept")
    digest = "a" * 32
    kept = f"{FROZEN_ROOT}/{ns}/m1/kept/{digest}/adapter_config.json"
    record = {"fileSet": f"md5set:{digest}", "path": kept.rsplit("/", 1)[0] + "/", "size": 2}
    set_status(world, VLLM_ADAPTER, ns, "kept", {"frozen": [{**record, "frozenAt": "2026-01-01T00:00:00Z"}]})
    gone = f"{FROZEN_ROOT}/{ns}/m1/gone/{digest}/adapter_config.json"
    for path in (kept, gone):
        world.upload(path, b"{}")
    resync(world, ns, {"resync": True, "full": True, "reason": "a test"})
    assert world.http.get(world.seaweed.server.url + gone).status_code == 404
    assert world.http.get(world.seaweed.server.url + kept).status_code == 200

"""load, reload and unload at engine capacity, on fakes: what a pod can hold is planned within,
what ranks out is said on its adapter, and a load never makes an engine evict a wanted adapter.

The fake SGLang engines enforce `max_loaded_loras` as the LRU release does (a load past it evicts
the first loaded and the name leaves the listing): any eviction here is the planner's fault."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from cloudevents.http import CloudEvent

from events.domain import ADAPTER_DELETING, ADAPTER_DRIFTED, ADAPTER_READY, STEP_EXTENSION
from events.external import PING
from functions import load, reload, resync, unload
from functions.edge.bootstrap import Deps
from functions.logic import reasons
from functions.logic.capacity import Capacity
from functions.resources.kinds import SGLANG_ADAPTER, VLLM_ADAPTER
from functions.settings import Settings
from tests.support.fakes import FakeBroker, FakeConfigs, FakeEngines, FakeKube, FakeStorage
from tests.support.objects import (
    MOUNT,
    adapter_event,
    api_event,
    inference_service,
    model_deployment,
    pod,
    sglang_adapter,
    url_of,
    vllm_adapter,
)

CONFIG = b'{"peft_type": "LORA", "r": 8}'
NS = "team-a"


class Cluster:
    def __init__(self, *objects: dict[str, Any], files: dict[str, bytes] | None = None) -> None:
        self.kube = FakeKube(*objects)
        self.engines = FakeEngines()
        self.storage = FakeStorage(files)
        self.deps = Deps(
            Settings(mount_root=MOUNT, loopback_engines="allow"),
            kube=self.kube,
            storage=self.storage,
            configs=FakeConfigs(self.storage),
            engines=self.engines,
            broker=FakeBroker(),
            clock=lambda: datetime(2026, 6, 1, tzinfo=UTC),
        )

    def run(self, step: Any, event: CloudEvent) -> Any:
        return step.handle(event, self.deps)

    def loaded(self, kind: Any, name: str) -> dict[str, Any]:
        obj = self.kube.get(kind, NS, name)
        assert obj is not None
        return next(c for c in obj["status"]["conditions"] if c["type"] == "Loaded")

    def engine_calls(self, op: str) -> int:
        return sum(1 for e in self.engines.pods.values() for c in e.calls if c[0] == op)

    def events(self, reason: str) -> list[tuple[str, str, str, str]]:
        return [e for e in self.kube.events if e[2] == reason]


def sglang_world(
    names: list[str], replicas: int = 3, slots: int = 2, **isvc_spec: Any
) -> tuple[Cluster, list[dict[str, Any]]]:
    isvc = inference_service(NS, "chat")
    isvc["spec"].update(isvc_spec)
    pods = [pod(NS, f"chat-{i}", isvc, f"10.2.0.{i + 1}") for i in range(replicas)]
    adapters = [
        sglang_adapter(NS, n, n, f"/models/{n}", (NS, "chat"), created=f"2026-01-0{i + 1}T00:00:00Z")
        for i, n in enumerate(names)
    ]
    cluster = Cluster(isvc, *pods, *adapters)
    for p in pods:
        engine = cluster.engines.engine(url_of(p), "sglang")
        engine.slots = slots
        if "engineArgs" not in isvc_spec:
            engine.reports = Capacity(slots, True, "engine")
    return cluster, pods


def ready(name: str) -> CloudEvent:
    return adapter_event(ADAPTER_READY, SGLANG_ADAPTER, NS, name)


def drifted(name: str) -> CloudEvent:
    return adapter_event(ADAPTER_DRIFTED, SGLANG_ADAPTER, NS, name, **{STEP_EXTENSION: "load"})


def test_what_does_not_fit_is_left_out_with_its_own_reason_and_nothing_is_evicted() -> None:
    cluster, pods = sglang_world(["a", "b", "c"])
    for name in ("a", "b", "c"):
        cluster.run(load, ready(name))
    for p in pods:
        engine = cluster.engines.pods[url_of(p)]
        assert engine.loaded == {"a": "/models/a", "b": "/models/b"}
        assert engine.evicted == []
    for name in ("a", "b"):
        assert cluster.loaded(SGLANG_ADAPTER, name)["status"] == "True"
    left_out = cluster.loaded(SGLANG_ADAPTER, "c")
    assert (left_out["status"], left_out["reason"]) == ("False", reasons.ENGINE_CAPACITY_EXCEEDED)
    assert "at most 2 adapter(s) (engine)" in left_out["message"] and "wants 3" in left_out["message"]
    assert [e[0] for e in cluster.events(reasons.EVENT_CAPACITY_EXCEEDED)] == ["c"]
    status = cluster.kube.get(SGLANG_ADAPTER, NS, "a")
    assert status is not None and [s["pod"] for s in status["status"]["served"]] == [
        "chat-0",
        "chat-1",
        "chat-2",
    ]


def test_steady_state_at_capacity_makes_no_engine_load() -> None:
    cluster, _ = sglang_world(["a", "b", "c", "d"])
    for name in ("a", "b", "c", "d"):
        cluster.run(load, ready(name))
    loads = cluster.engine_calls("load")
    for _ in range(20):  # twenty resync ticks nudging every adapter
        for name in ("a", "b", "c", "d"):
            cluster.run(load, drifted(name))
    assert cluster.engine_calls("load") == loads == 6  # 2 adapters x 3 pods, once
    assert cluster.engine_calls("unload") == 0
    assert len(cluster.events(reasons.EVENT_CAPACITY_EXCEEDED)) == 2  # c and d, once each


def test_room_appearing_loads_the_next_one_by_itself_and_says_so() -> None:
    cluster, pods = sglang_world(["a", "b", "c"])
    for name in ("a", "b", "c"):
        cluster.run(load, ready(name))
    cluster.kube.delete(SGLANG_ADAPTER, NS, "a")
    doomed = cluster.kube.get(SGLANG_ADAPTER, NS, "a")
    assert doomed is not None
    cluster.run(unload, adapter_event(ADAPTER_DELETING, SGLANG_ADAPTER, NS, "a"))
    cluster.run(load, drifted("c"))
    for p in pods:
        assert cluster.engines.pods[url_of(p)].loaded == {"b": "/models/b", "c": "/models/c"}
    assert cluster.loaded(SGLANG_ADAPTER, "c")["status"] == "True"
    assert [e[:2] for e in cluster.events(reasons.EVENT_CAPACITY_AVAILABLE)] == [("c", "Normal")]


def test_a_higher_priority_adapter_takes_the_room_by_unloading_first() -> None:
    cluster, pods = sglang_world(["a", "b"])
    for name in ("a", "b"):
        cluster.run(load, ready(name))
    vip = sglang_adapter(NS, "vip", "vip", "/models/vip", (NS, "chat"), created="2026-03-01T00:00:00Z")
    vip["metadata"]["annotations"] = {"loraflow.io/serving-priority": "10"}
    cluster.kube.put(vip)
    cluster.run(load, ready("vip"))
    for p in pods:
        engine = cluster.engines.pods[url_of(p)]
        assert engine.loaded == {"a": "/models/a", "vip": "/models/vip"}
        assert engine.evicted == []
        assert engine.calls[-2:] == [("unload", "b"), ("load", "vip")]
    assert cluster.loaded(SGLANG_ADAPTER, "b")["reason"] == reasons.ENGINE_CAPACITY_EXCEEDED


def test_capacity_from_the_spec_when_the_engine_reports_none() -> None:
    cluster, pods = sglang_world(["a", "b", "c"], slots=2, engineArgs=["--max-loaded-loras", "2"])
    for name in ("a", "b", "c"):
        cluster.run(load, ready(name))
    assert all(cluster.engines.pods[url_of(p)].evicted == [] for p in pods)
    assert "(spec.engineArgs)" in cluster.loaded(SGLANG_ADAPTER, "c")["message"]


def test_a_garbage_capacity_is_that_pods_verdict_only() -> None:
    cluster, pods = sglang_world(["a"])
    bad = cluster.engines.pods[url_of(pods[0])]
    bad.reports = Capacity(
        None, True, "engine", (reasons.ENGINE_CAPACITY_INVALID, "max_loaded_loras from engine is 'lots'")
    )
    cluster.run(load, ready("a"))
    assert bad.loaded == {}
    for p in pods[1:]:
        assert cluster.engines.pods[url_of(p)].loaded == {"a": "/models/a"}
    verdict = cluster.loaded(SGLANG_ADAPTER, "a")
    assert verdict["reason"] == reasons.ENGINE_CAPACITY_INVALID and "chat-0" in verdict["message"]
    assert "chat-1" not in verdict["message"]


def test_vllm_residency_per_pod_from_its_engine_args() -> None:
    md = model_deployment(NS, "d1", ["a1", "a2"])
    pods = [pod(NS, f"d1-{i}", md, f"10.3.0.{i + 1}") for i in range(2)]
    pods[0]["spec"]["containers"][0]["args"] = ["--enable-lora", "--max-cpu-loras=1"]
    pods[1]["spec"]["containers"][0]["args"] = ["--max-cpu-loras", "4"]
    files = {f"/loraadapters/{NS}/m1/{n}/adapter_config.json": CONFIG for n in ("a1", "a2")}
    cluster = Cluster(vllm_adapter(NS, "a1"), vllm_adapter(NS, "a2"), md, *pods, files=files)
    cluster.run(load, adapter_event(ADAPTER_READY, VLLM_ADAPTER, NS, "a1"))
    cluster.run(load, adapter_event(ADAPTER_DRIFTED, VLLM_ADAPTER, NS, "a2", **{STEP_EXTENSION: "load"}))
    cluster.run(load, adapter_event(ADAPTER_DRIFTED, VLLM_ADAPTER, NS, "a1", **{STEP_EXTENSION: "load"}))
    for name in ("a1", "a2"):
        obj = cluster.kube.get(VLLM_ADAPTER, NS, name)
        assert obj is not None
        assert {s["pod"]: s.get("residency") for s in obj["status"]["served"]} == {
            "d1-0": "reloadable",
            "d1-1": "resident",
        }
        assert cluster.loaded(VLLM_ADAPTER, name)["status"] == "True"  # the engine serves them all


def test_vllm_residency_of_the_others_follows_a_load_and_an_unload() -> None:
    """A load that makes a pod list more than it keeps resident turns the adapters it already
    listed reloadable on their status too, and the unload that frees the room turns them back."""
    md = model_deployment(NS, "d1", ["a1", "a2"])
    pods = [pod(NS, "d1-0", md, "10.3.0.1")]
    pods[0]["spec"]["containers"][0]["args"] = ["--max-cpu-loras=1"]
    files = {f"/loraadapters/{NS}/m1/{n}/adapter_config.json": CONFIG for n in ("a1", "a2")}
    cluster = Cluster(vllm_adapter(NS, "a1"), vllm_adapter(NS, "a2"), md, *pods, files=files)

    def residency(name: str) -> list[str | None]:
        obj = cluster.kube.get(VLLM_ADAPTER, NS, name)
        assert obj is not None
        return [s.get("residency") for s in obj["status"].get("served") or []]

    cluster.run(load, adapter_event(ADAPTER_READY, VLLM_ADAPTER, NS, "a1"))
    assert residency("a1") == ["resident"]
    cluster.run(load, adapter_event(ADAPTER_READY, VLLM_ADAPTER, NS, "a2"))
    assert residency("a1") == residency("a2") == ["reloadable"]
    cluster.kube.put({**md, "spec": {**md["spec"], "loraAdapters": ["a1"]}})
    cluster.run(unload, adapter_event(ADAPTER_DRIFTED, VLLM_ADAPTER, NS, "a2", **{STEP_EXTENSION: "unload"}))
    assert residency("a1") == ["resident"]
    assert cluster.engine_calls("load") == 2  # the passes over the deployment call no engine


def test_a_lost_residency_write_is_found_by_resync_and_load_writes_it_again() -> None:
    """The pass over the deployment after a load is one more write, and can be lost (a crash,
    a conflict given up): resync judges residency as load would write it, from the pods'
    arguments and listings, and nudges load, which rewrites it without calling an engine."""
    md = model_deployment(NS, "d1", ["a1", "a2"])
    pods = [pod(NS, "d1-0", md, "10.3.0.1")]
    pods[0]["spec"]["containers"][0]["args"] = ["--max-cpu-loras=1"]
    adapters = [vllm_adapter(NS, n, frozen=True) for n in ("a1", "a2")]
    files = {a["status"]["frozen"][0]["path"] + "adapter_config.json": CONFIG for a in adapters}
    cluster = Cluster(*adapters, md, *pods, files=files)
    cluster.run(load, adapter_event(ADAPTER_READY, VLLM_ADAPTER, NS, "a1"))
    cluster.run(load, adapter_event(ADAPTER_READY, VLLM_ADAPTER, NS, "a2"))
    broker = cluster.deps.broker
    assert isinstance(broker, FakeBroker)

    def nudged() -> list[tuple[str, str]]:
        broker.events.clear()
        resync.handle(CloudEvent({"type": PING, "source": "/tests", "id": "tick"}), cluster.deps)
        return sorted((e.get_data()["adapter"]["name"], e[STEP_EXTENSION]) for e in broker.events)  # type: ignore[index]

    assert nudged() == []
    obj = cluster.kube.get(VLLM_ADAPTER, NS, "a1")
    assert obj is not None and obj["status"]["served"][0]["residency"] == "reloadable"
    obj["status"]["served"][0]["residency"] = "resident"  # as load's first write left it
    cluster.kube.put(obj)
    assert nudged() == [("a1", "load")]
    loads = cluster.engine_calls("load")
    cluster.run(load, adapter_event(ADAPTER_DRIFTED, VLLM_ADAPTER, NS, "a1", **{STEP_EXTENSION: "load"}))
    obj = cluster.kube.get(VLLM_ADAPTER, NS, "a1")
    assert obj is not None and obj["status"]["served"][0]["residency"] == "reloadable"
    assert cluster.engine_calls("load") == loads
    assert nudged() == []


def test_a_reload_lists_only_the_restarted_pods_engine() -> None:
    md = model_deployment(NS, "d1", ["a1"])
    pods = [pod(NS, f"d1-{i}", md, f"10.4.0.{i + 1}") for i in range(5)]
    files = {f"/loraadapters/{NS}/m1/a1/adapter_config.json": CONFIG}
    cluster = Cluster(vllm_adapter(NS, "a1"), md, *pods, files=files)
    cluster.run(load, adapter_event(ADAPTER_READY, VLLM_ADAPTER, NS, "a1"))
    restarted = cluster.engines.pods[url_of(pods[2])]
    restarted.loaded.clear()
    before = cluster.engine_calls("list")
    cluster.run(reload, api_event("update", pods[2]))
    assert cluster.engine_calls("list") - before == 1
    assert [c for c in restarted.calls if c[0] == "list"] and restarted.loaded
    assert cluster.loaded(VLLM_ADAPTER, "a1")["status"] == "True"  # the others stand by their records

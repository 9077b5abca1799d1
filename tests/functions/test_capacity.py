"""Engines at capacity over real HTTP: an InferenceService started with `--max-loaded-loras`
(its `spec.engineArgs`, which the workload passes to every replica) is served within it.

The replicas are the SGLang stand-in's LRU release: a load past its capacity would evict an
adapter and drop it from `/v1/models`; the planner must never make one."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from devstack.standins.engines import EngineReplica
from functions.resources.kinds import INFERENCE_SERVICE, SGLANG_ADAPTER
from tests.support import invariant
from tests.support.builders import admit, isvc_pods, sglang_adapter, sglang_admitted, sglang_files
from tests.support.testbed import Testbed

ARGS = ["--enable-lora", "--max-loaded-loras", "2", "--max-loras-per-batch", "2"]


def loaded(world: Testbed, ns: str, name: str) -> dict[str, Any]:
    obj = world.get(SGLANG_ADAPTER, ns, name)
    assert obj is not None
    return next(c for c in obj["status"]["conditions"] if c["type"] == "Loaded")


def evictions_seen(world: Testbed) -> float:
    """load's `loraflow_engine_evictions_total` for SGLang, from its `GET /metrics`."""
    text = world.http.get(world.host.urls["load"] + "metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "loraflow_engine_evictions_total" and sample.labels == {"runtime": "sglang"}:
                return sample.value
    return 0.0


def start_isvc(world: Testbed, ns: str, replicas: int) -> None:
    """InferenceService `isvc` (SGLang, two adapters per replica) and its replicas started."""
    world.create(
        INFERENCE_SERVICE,
        ns,
        {
            "metadata": {"name": "isvc"},
            "spec": {"runtime": "sglang", "model": "base", "replicas": replicas, "engineArgs": ARGS},
        },
    )
    world.workload.sync()


def test_an_inference_service_at_capacity_is_served_within_it_and_never_thrashes(world: Testbed) -> None:
    ns = world.namespace()
    start_isvc(world, ns, replicas=2)
    pods = isvc_pods(world, ns)
    replicas = [world.workload.replica(ns, p) for p in pods]
    names = ["s1", "s2", "s3"]
    for name in names:  # created in this order: s1 is the oldest
        admit(world, sglang_adapter(world, ns, name, name, sglang_files(world, ns, name)))
    for name in names:
        world.post("load", sglang_admitted(world, ns, name))
    for replica in replicas:
        info = httpx.get(replica.url + "/server_info").json()
        assert info["max_loaded_loras"] == 2
        assert sorted(replica.loaded) == ["s1", "s2"]
        assert replica.evictions == 0
    assert [loaded(world, ns, n)["status"] for n in names] == ["True", "True", "False"]
    left_out = loaded(world, ns, "s3")
    assert (
        left_out["reason"] == "EngineCapacityExceeded"
        and "at most 2 adapter(s) (engine)" in left_out["message"]
    )

    # steady state: every adapter nudged again makes no engine load
    loads = sum(len(r.load_log) for r in replicas)
    for name in names:
        world.post("load", sglang_admitted(world, ns, name))
    assert sum(len(r.load_log) for r in replicas) == loads

    # traffic naming the left-out adapter is refused by the engine, the others serve their weights
    answer = httpx.post(replicas[0].url + "/v1/completions", json={"model": "s1", "prompt": "x"}).json()
    assert answer["served_by"]["lora_path"].endswith("/s1") and answer["served_by"]["md5s"]
    assert (
        httpx.post(replicas[0].url + "/v1/completions", json={"model": "s3", "prompt": "x"}).status_code
        == 400
    )

    violations = [
        v
        for v in invariant.check(world, [ns])
        if v.rule in ("over-capacity", "evicted", "load-evict-loop", "missing")
    ]
    assert violations == [], invariant.report(violations)


def one_replica_with_s1(
    world: Testbed, ns: str, admitted: Sequence[str]
) -> tuple[EngineReplica, dict[str, dict[str, Any]]]:
    """A one-replica `isvc` serving s1, and adapters s1, s2, s3 created in this order (s1 ranks
    first, s3 last), of which `admitted` are Available: the replica, and the adapters as created."""
    start_isvc(world, ns, replicas=1)
    (replica,) = [world.workload.replica(ns, p) for p in isvc_pods(world, ns)]
    created = {n: sglang_adapter(world, ns, n, n, sglang_files(world, ns, n)) for n in ("s1", "s2", "s3")}
    for name in admitted:
        admit(world, created[name])
    assert world.post("load", sglang_admitted(world, ns, "s1")).status_code == 200
    assert sorted(replica.loaded) == ["s1"]
    return replica, created


def load_held_at_the_engine(
    world: Testbed, replica: EngineReplica, ns: str, name: str, meanwhile: Callable[[], None]
) -> httpx.Response:
    """load's answer to `name`'s admission, whose engine call is held a second at the engine
    while `meanwhile` acts on the same pod."""
    replica.inject(delay_s=1.0, times=1, routes=["load"])
    loads_before = replica.calls.get("load", 0)
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(world.post, "load", sglang_admitted(world, ns, name))
        deadline = time.monotonic() + 10
        while replica.calls.get("load", 0) == loads_before and time.monotonic() < deadline:
            time.sleep(0.01)
        meanwhile()
        return held.result()


def load_directly(replica: EngineReplica, adapter: dict[str, Any]) -> httpx.Response:
    """What another writer does (a second instance of load, with a view of its own)."""
    spec = adapter["spec"]
    return httpx.post(
        replica.url + "/load_lora_adapter", json={"lora_name": spec["name"], "lora_path": spec["path"]}
    )


def reasons_of(world: Testbed, ns: str) -> list[str]:
    return [loaded(world, ns, n)["reason"] for n in ("s1", "s2", "s3")]


SERVED_WITHIN = ["Loaded", "Loaded", "EngineCapacityExceeded"]


def test_two_loads_racing_for_a_pods_last_slot_take_turns(world: Testbed) -> None:
    """One load plans from a view of the claimants taken before a higher-ranked one became
    Available; the other, with the whole view, lists the pod while the first one's load is still
    in flight. Without an order between them both load into the pod's one free slot, and the
    engine evicts a wanted adapter."""
    ns = world.namespace()
    replica, created = one_replica_with_s1(world, ns, admitted=["s1", "s3"])  # s3 fits beside s1

    def s2_arrives() -> None:
        admit(world, created["s2"])
        assert world.post("load", sglang_admitted(world, ns, "s2")).status_code == 200

    assert load_held_at_the_engine(world, replica, ns, "s3", s2_arrives).status_code == 200
    assert replica.evictions == 0
    assert sorted(replica.loaded) == ["s1", "s2"]
    assert reasons_of(world, ns) == SERVED_WITHIN


def test_an_eviction_that_a_load_answer_shows_is_repaired_at_once(world: Testbed) -> None:
    """Turns order one process only: another writer (a second instance of load, with a view in
    which s2 is not Available yet) loads s3 into the pod while this run's load of s2 is in
    flight. The engine evicts s1 to make room for s2, and its answer no longer lists s1: the
    run lists the InferenceService again and puts it back to what ranks in."""
    ns = world.namespace()
    replica, created = one_replica_with_s1(world, ns, admitted=["s1", "s2", "s3"])
    evictions_before = evictions_seen(world)

    def s3_loaded_by_another_writer() -> None:
        other = load_directly(replica, created["s3"])
        assert other.status_code == 200 and sorted(other.json()["loaded_adapters"]) == ["s1", "s3"]

    assert load_held_at_the_engine(world, replica, ns, "s2", s3_loaded_by_another_writer).status_code == 200
    assert replica.evictions == 1  # s1, the least recently used, when s2 landed
    assert evictions_seen(world) == evictions_before + 1
    assert sorted(replica.loaded) == ["s1", "s2"]
    assert reasons_of(world, ns) == SERVED_WITHIN


def test_a_load_the_engine_refuses_as_full_is_tried_again_from_a_new_listing(world: Testbed) -> None:
    """SGLang before its LRU release refuses a load past `--max-loaded-loras` (400 "Maximum number
    of loaded LoRA adapters is N"). Another writer filled the pod's last slot while this run's load
    of s2 was on its way: the refusal is retried (503, the Broker redelivers), and the next
    attempt lists the pod, unloads s3 (which ranks out) and loads s2."""
    ns = world.namespace()
    replica, created = one_replica_with_s1(world, ns, admitted=["s1", "s2", "s3"])
    replica.configure(capacity_mode="refuse")

    def s3_loaded_by_another_writer() -> None:
        assert load_directly(replica, created["s3"]).status_code == 200

    refused = load_held_at_the_engine(world, replica, ns, "s2", s3_loaded_by_another_writer)
    assert refused.status_code == 503 and "EngineFull" in refused.text
    assert sorted(replica.loaded) == ["s1", "s3"]

    assert world.post("load", sglang_admitted(world, ns, "s2")).status_code == 200  # redelivered
    assert sorted(replica.loaded) == ["s1", "s2"]
    assert replica.evictions == 0
    assert reasons_of(world, ns) == SERVED_WITHIN

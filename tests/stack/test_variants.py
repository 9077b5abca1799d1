"""The stack's options: broker chaos (duplicated and shuffled deliveries), a tick dealt into parts."""

from __future__ import annotations

import secrets

import httpx

from devstack.eventing.broker import Faults
from devstack.seaweedfs import shared
from devstack.stack import Stack
from events.domain import RESYNC_SHARD
from functions.resources.kinds import MODEL, MODEL_DEPLOYMENT, MODEL_DEPLOYMENT_LABEL, VLLM_ADAPTER
from tests.support.builders import upload_vllm_adapter
from tests.support.cluster import Cluster
from tests.support.wait import eventually


def run_to_loaded(stack: Stack, replicas: int) -> Cluster:
    cluster = Cluster(stack, f"v-{secrets.token_hex(3)}")
    stack.core.create_namespace({"metadata": {"name": cluster.namespace}})
    cluster.create(MODEL, "llama", {})
    cluster.create(MODEL_DEPLOYMENT, "d1", {"model": "llama", "replicas": replicas, "loraAdapters": ["a1"]})
    upload_vllm_adapter(cluster, "a1")
    eventually(
        lambda: (cluster.get(VLLM_ADAPTER, "a1") or {}).get("status", {}).get("phase") == "Ready",
        what="Ready",
    )
    eventually(lambda: cluster.loaded_in(f"{MODEL_DEPLOYMENT_LABEL}=d1", "a1", replicas), what="loaded")
    return cluster


def test_duplicated_and_shuffled_deliveries_still_converge() -> None:
    faults = Faults(duplicate=True, shuffle=0.1, seed=3)
    with Stack(faults=faults, ping_period=2.0, time_scale=0.1, seaweed=shared()) as stack:
        cluster = run_to_loaded(stack, replicas=2)
        cluster.delete(VLLM_ADAPTER, "a1")
        eventually(lambda: cluster.get(VLLM_ADAPTER, "a1") is None, what="gone")
        assert cluster.unloaded_everywhere(f"{MODEL_DEPLOYMENT_LABEL}=d1", "a1")
        assert stack.broker.counters.delivered > stack.broker.counters.received


def test_a_tick_dealt_into_parts_repairs_a_lost_copy_in_each_namespace() -> None:
    """LORAFLOW_RESYNC_SHARDS=2: the PingSource's tick is dealt into parts, the broker brings
    each back to resync by its own Trigger, and the parts' nudges put back a copy that an
    engine lost, in each of two namespaces."""
    with Stack(
        ping_period=1.0, time_scale=0.1, seaweed=shared(), function_env={"LORAFLOW_RESYNC_SHARDS": "2"}
    ) as stack:
        clusters = [run_to_loaded(stack, replicas=2) for _ in range(2)]
        selector = f"{MODEL_DEPLOYMENT_LABEL}=d1"
        lost = []
        for cluster in clusters:
            pod = cluster.pods(selector)[0]["metadata"]["name"]
            replica = stack.workload.replica(cluster.namespace, pod)
            loads = replica.calls.get("load", 0)
            unloaded = httpx.post(f"{replica.url}/v1/unload_lora_adapter", json={"lora_name": "a1"})
            assert unloaded.status_code == 200
            lost.append((cluster, replica, loads))
        # the copy comes back by a load into the engine that lost it (a tick may repair it at once)
        for cluster, replica, loads in lost:
            eventually(
                lambda c=cluster, r=replica, n=loads: (
                    r.calls.get("load", 0) > n and c.loaded_in(selector, "a1", 2)
                ),
                30,
                what="the lost copy loaded again",
            )
        parts = [e for e in stack.broker.log.since(0) if e["type"] == RESYNC_SHARD]
        delivered = [e for e in parts if e["outcome"] == "delivered"]
        assert {e["trigger"] for e in delivered} == {"loraflow-resync-shard"}
        assert {e["subject"] for e in delivered} >= {"1/2", "2/2"}
        assert all(e["outcome"] in ("received", "delivered") for e in parts), parts

"""The stack's options: broker chaos (duplicated and shuffled deliveries)."""

from __future__ import annotations

import secrets

from devstack.eventing.broker import Faults
from devstack.seaweedfs import shared
from devstack.stack import Stack
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

"""Many adapters at once (the upload storm of the benchmarks, at a size that runs in seconds).

A pipeline creates its adapters and uploads their files all at once, for a ModelDeployment
that names them all; nothing periodic runs (no resync tick to repair a lost event): every
adapter must end Ready and Loaded, listed by every replica's engine, with every event the
broker delivered answered 2xx in the end and nothing dead-lettered.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from devstack.seaweedfs import shared
from devstack.stack import Stack
from functions.resources.kinds import MODEL, MODEL_DEPLOYMENT, MODEL_DEPLOYMENT_LABEL, VLLM_ADAPTER
from tests.support.builders import upload_vllm_adapter
from tests.support.cluster import Cluster, condition
from tests.support.wait import eventually

ADAPTERS = 40
REPLICAS = 3
PODS = f"{MODEL_DEPLOYMENT_LABEL}=d1"


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with Stack(ping_period=None, seaweed=shared()) as running:
        yield running


def test_many_adapters_at_once_all_end_ready_and_loaded_everywhere(stack: Stack) -> None:
    namespace = f"storm-{secrets.token_hex(3)}"
    stack.core.create_namespace({"metadata": {"name": namespace}})
    cluster = Cluster(stack, namespace)
    names = [f"s{i:02d}" for i in range(ADAPTERS)]
    cluster.create(MODEL, "llama", {})
    cluster.create(MODEL_DEPLOYMENT, "d1", {"model": "llama", "replicas": REPLICAS, "loraAdapters": names})
    eventually(lambda: len(cluster.pods(PODS)) == REPLICAS, 30, what=f"{REPLICAS} pods")
    stack.settle(timeout=30)
    since = max((e["seq"] for e in stack.broker.log.since(0)), default=0)

    with ThreadPoolExecutor(8) as pool:  # every adapter created and uploaded at the same time
        list(pool.map(lambda name: upload_vllm_adapter(cluster, name), names))

    def served(name: str) -> bool:
        obj = cluster.get(VLLM_ADAPTER, name)
        return (
            condition(obj, "Ready").get("status") == "True"
            and condition(obj, "Loaded").get("status") == "True"
        )

    eventually(lambda: all(served(n) for n in names), 90, what="every adapter Ready and Loaded", interval=0.2)
    listings = cluster.listings(PODS)
    assert len(listings) == REPLICAS
    for pod, listed in listings.items():
        assert listed is not None and set(names) <= listed, (pod, sorted(set(names) - (listed or set())))
    for name in names:
        status = (cluster.get(VLLM_ADAPTER, name) or {}).get("status") or {}
        assert status.get("usedBy") == ["d1"], (name, status)
        assert len(status.get("served") or []) == REPLICAS, (name, status.get("served"))

    assert stack.settle(timeout=60)
    log = stack.broker.log.since(since)
    finals = [e for e in log if e["outcome"] in ("delivered", "dead-lettered", "failed")]
    assert finals, "the broker delivered nothing"
    assert [e for e in finals if e["outcome"] != "delivered"] == []
    assert [e for e in finals if not 200 <= int(e["status"]) < 300] == []
    assert stack.sink.events == []

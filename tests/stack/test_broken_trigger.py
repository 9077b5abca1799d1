"""A Trigger with a wrong filter breaks the chain: the lifecycle never converges.

This proves the stack routes by the manifests (not by a hard-wired table): the same run that
converges with knative/ as written stalls when one Trigger's `type` is changed.
"""

from __future__ import annotations

import copy
import secrets
import time
from typing import Any

from devstack.eventing.triggers import render
from devstack.seaweedfs import shared
from devstack.stack import Stack
from functions.resources.kinds import MODEL, MODEL_DEPLOYMENT, MODEL_DEPLOYMENT_LABEL, VLLM_ADAPTER
from tests.support.builders import upload_vllm_adapter
from tests.support.cluster import Cluster
from tests.support.wait import eventually

READY_TYPE = "io.loraflow.adapter.ready.v1"
ADMITTED_TYPE = "io.loraflow.adapter.admitted.v1"


def break_ready_filter(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A copy of the manifests where the load Trigger listens for types nobody sends. Its
    `admitted` goes too: on the real API server, load's answer to `admitted` can finish after
    verify wrote Ready, and then it loads without any ready event."""
    docs = copy.deepcopy(docs)
    changed = 0
    for doc in docs:
        if doc.get("kind") != "Trigger":
            continue
        text = repr(doc["spec"].get("filters") or doc["spec"].get("filter"))
        if READY_TYPE in text and doc["spec"]["subscriber"]["ref"]["name"] == "loraflow-load":
            doc["spec"] = replace_value(doc["spec"], READY_TYPE, "io.loraflow.adapter.ready.v0")
            doc["spec"] = replace_value(doc["spec"], ADMITTED_TYPE, "io.loraflow.adapter.admitted.v0")
            changed += 1
    assert changed == 1, "expected exactly one load Trigger on adapter.ready"
    return docs


def without_ping(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc.get("kind") != "PingSource"]


def replace_value(value: Any, old: str, new: str) -> Any:
    if isinstance(value, dict):
        return {k: replace_value(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [replace_value(v, old, new) for v in value]
    return new if value == old else value


def test_broken_load_trigger_never_loads() -> None:
    # no PingSource at all, so no resync nudge rescues the chain (with its cron schedule, once a
    # minute, a run that straddled a minute was rescued and failed)
    with Stack(
        ping_period=None, manifests=without_ping(break_ready_filter(render())), seaweed=shared()
    ) as stack:
        cluster = Cluster(stack, f"broken-{secrets.token_hex(3)}")
        stack.core.create_namespace({"metadata": {"name": cluster.namespace}})
        selector = f"{MODEL_DEPLOYMENT_LABEL}=d1"
        cluster.create(MODEL, "llama", {})
        cluster.create(MODEL_DEPLOYMENT, "d1", {"model": "llama", "replicas": 2, "loraAdapters": ["a1"]})
        eventually(lambda: len(cluster.pods(selector)) == 2, what="2 pods")
        assert stack.settle()
        upload_vllm_adapter(cluster, "a1")

        eventually(lambda: (cluster.get(VLLM_ADAPTER, "a1") or {}).get("status", {}).get("phase") == "Ready")
        assert stack.settle(quiet=1.0)
        time.sleep(1.0)
        found = cluster.listings(selector)
        assert len(found) == 2
        assert all(s is not None and "a1" not in s for s in found.values()), found
        adapter = cluster.get(VLLM_ADAPTER, "a1") or {}
        assert not [c for c in adapter["status"].get("conditions", []) if c["type"] == "Loaded"]
        delivered = {e["type"] for e in stack.broker.log.since(0) if e["outcome"] == "delivered"}
        received = {e["type"] for e in stack.broker.log.since(0) if e["outcome"] == "received"}
        assert READY_TYPE in received and READY_TYPE not in delivered

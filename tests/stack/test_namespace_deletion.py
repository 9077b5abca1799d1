"""A tenant deletes its namespace: its adapters are unloaded and let go, and the namespace goes.

The stack runs kube-controller-manager's namespace and garbage-collector controllers, as a
cluster does: they delete every object in the namespace, the Pods included, while loraflow's
finalizer holds each adapter until unload has taken it out of the engines.
"""

from __future__ import annotations

from kubernetes import client

from devstack.stack import Stack
from functions.resources.kinds import FINALIZER, VLLM_ADAPTER
from tests.support.builders import upload_vllm_adapter
from tests.support.cluster import D1_PODS, serving_a1
from tests.support.wait import eventually


def namespace_gone(stack: Stack, name: str) -> bool:
    try:
        stack.core.read_namespace(name)
    except client.ApiException as err:
        return err.status == 404
    return False


def test_a_deleted_namespace_unloads_its_adapters_and_goes(stack: Stack) -> None:
    cluster = serving_a1(stack, "nsdel")
    upload_vllm_adapter(cluster, "a1")
    eventually(lambda: cluster.loaded_in(D1_PODS, "a1", 2), what="loaded in both pods")
    adapter = cluster.get(VLLM_ADAPTER, "a1") or {}
    assert FINALIZER in adapter["metadata"]["finalizers"]

    stack.core.delete_namespace(cluster.namespace)
    eventually(lambda: namespace_gone(stack, cluster.namespace), timeout=90, what="the namespace gone")
    # its Pods went with it, and so did the engines that served them
    prefix = cluster.namespace + "/"
    eventually(
        lambda: not [key for key, _ in stack.workload.fleet.items() if key.startswith(prefix)],
        timeout=90,
        what="the namespace's engines stopped",
    )
    assert stack.broker.counters.dead_lettered == 0, stack.sink.events

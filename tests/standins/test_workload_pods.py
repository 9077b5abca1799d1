"""The workload stand-in as a Deployment controller and a kubelet, on the session's real
kube-apiserver (in a namespace of its own): a ModelDeployment's Pods match its replicas, each
Pod's status is what a kubelet reports (Running, its engine's address, Ready, restarts), and a
Pod deleted by someone else is replaced (its engine stopped), as a ReplicaSet replaces one."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from devstack.eventing.triggers import render
from devstack.kubernetes import shared
from devstack.seaweedfs import MOUNT_ROOT
from devstack.workload import Workload
from functions.resources.kinds import MODEL_DEPLOYMENT, MODEL_DEPLOYMENT_LABEL
from tests.support.wait import eventually

Running = tuple[Workload, client.ApiClient, str]


@pytest.fixture
def workload(tmp_path: Path) -> Iterator[Running]:
    plane = shared(render())
    namespace = f"wp-{secrets.token_hex(4)}"
    api = config.new_client_from_config(str(plane.write_kubeconfig(tmp_path / "admin.kubeconfig")))
    client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
    # its own namespace only: the control plane is the session's, shared with other tiers
    running = Workload(api, mount_root=MOUNT_ROOT, namespace_prefix=namespace, filer_url="http://127.0.0.1:9")
    running.run()
    try:
        yield running, api, namespace
    finally:
        running.stop()
        api.close()


def deploy(api: client.ApiClient, namespace: str, replicas: int) -> None:
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        MODEL_DEPLOYMENT.group,
        MODEL_DEPLOYMENT.version,
        namespace,
        MODEL_DEPLOYMENT.plural,
        {
            "apiVersion": MODEL_DEPLOYMENT.api_version,
            "kind": MODEL_DEPLOYMENT.kind,
            "metadata": {"name": "d1", "namespace": namespace},
            "spec": {"model": "llama", "replicas": replicas},
        },
    )


def pods(api: client.ApiClient, namespace: str) -> dict[str, client.V1Pod]:
    listed = client.CoreV1Api(api).list_namespaced_pod(
        namespace, label_selector=f"{MODEL_DEPLOYMENT_LABEL}=d1"
    )
    return {p.metadata.name: p for p in listed.items}


def test_each_pods_status_is_what_a_kubelet_reports(workload: Running) -> None:
    running, api, namespace = workload
    deploy(api, namespace, 1)
    (name,) = eventually(lambda: pods(api, namespace), 20, what="a pod")
    replica = running.replica(namespace, name)
    pod = eventually(
        lambda: pods(api, namespace)[name].status.pod_ip and pods(api, namespace)[name], what="status"
    )
    assert (pod.status.phase, pod.status.pod_ip) == ("Running", replica.host)
    assert {c.type: c.status for c in pod.status.conditions} == {"Ready": "True", "ContainersReady": "True"}
    (port,) = pod.spec.containers[0].ports
    assert (port.name, port.container_port) == ("http", replica.port)
    running.restart(namespace, name)
    restarted = pods(api, namespace)[name].status
    assert restarted.container_statuses[0].restart_count == 1
    assert {c.type: c.status for c in restarted.conditions}["Ready"] == "True"


def test_a_deleted_pod_is_replaced_and_its_engine_stopped(workload: Running) -> None:
    running, api, namespace = workload
    deploy(api, namespace, 2)
    eventually(lambda: len(pods(api, namespace)) == 2, 20, what="2 pods")
    first = sorted(pods(api, namespace))
    assert {key for key, _ in running.fleet.items()} == {f"{namespace}/{p}" for p in first}

    client.CoreV1Api(api).delete_namespaced_pod(first[0], namespace)

    eventually(lambda: len(set(pods(api, namespace)) - {first[0]}) == 2, 20, what="a replacement pod")
    eventually(
        lambda: (
            {key for key, _ in running.fleet.items()} == {f"{namespace}/{p}" for p in pods(api, namespace)}
        ),
        20,
        what="the engines follow the pods",
    )
    assert f"{namespace}/{first[0]}" not in {key for key, _ in running.fleet.items()}
    assert first[1] in pods(api, namespace)


def test_a_pod_scaled_away_around_its_restart_is_let_go(workload: Running) -> None:
    """A Pod deleted before its engine restarts is gone (KeyError, as for an unknown pod); one
    deleted while its engine restarts has no status left to report, and nothing fails."""
    running, api, namespace = workload
    deploy(api, namespace, 2)
    eventually(lambda: len(pods(api, namespace)) == 2, 20, what="2 pods")
    first, second = sorted(pods(api, namespace))
    core = client.CoreV1Api(api)

    core.delete_namespaced_pod(first, namespace)
    if f"{namespace}/{first}" in running.fleet:  # its engine not stopped yet
        with pytest.raises(KeyError):
            running.restart(namespace, first)

    running.restart(namespace, second, unhealthy_for_s=0.3, wait=False)
    core.delete_namespaced_pod(second, namespace)
    waiting = [t for t in threading.enumerate() if t.name == f"ready-{namespace}/{second}"]
    for thread in waiting:
        thread.join(15)
    assert not any(t.is_alive() for t in waiting)

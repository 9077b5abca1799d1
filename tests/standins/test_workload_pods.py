"""The workload stand-in as a Deployment controller: a ModelDeployment's Pods match its
replicas, and a Pod deleted by someone else is replaced (its engine stopped), as a ReplicaSet
replaces a deleted Pod."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from devstack.seaweedfs import MOUNT_ROOT
from devstack.standins.kube import KubeServer
from devstack.workload import Workload
from functions.resources.kinds import MODEL_DEPLOYMENT, MODEL_DEPLOYMENT_LABEL
from tests.support.wait import eventually

ROOT = Path(__file__).resolve().parents[2]
NS = "default"


@pytest.fixture
def workload(tmp_path: Path) -> Iterator[tuple[Workload, client.ApiClient]]:
    kube = KubeServer(crd_dir=ROOT / "knative" / "crds").start()
    api = config.new_client_from_config(str(kube.write_kubeconfig(tmp_path / "admin.kubeconfig")))
    running = Workload(api, mount_root=MOUNT_ROOT, filer_url="http://127.0.0.1:9")
    running.run()
    try:
        yield running, api
    finally:
        running.stop()
        api.close()
        kube.stop()


def _pods(api: client.ApiClient) -> set[str]:
    listed = client.CoreV1Api(api).list_namespaced_pod(NS, label_selector=f"{MODEL_DEPLOYMENT_LABEL}=d1")
    return {p.metadata.name for p in listed.items}


def test_a_deleted_pod_is_replaced_and_its_engine_stopped(
    workload: tuple[Workload, client.ApiClient],
) -> None:
    running, api = workload
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        MODEL_DEPLOYMENT.group,
        MODEL_DEPLOYMENT.version,
        NS,
        MODEL_DEPLOYMENT.plural,
        {
            "apiVersion": f"{MODEL_DEPLOYMENT.group}/{MODEL_DEPLOYMENT.version}",
            "kind": MODEL_DEPLOYMENT.kind,
            "metadata": {"name": "d1", "namespace": NS},
            "spec": {"model": "llama", "replicas": 2},
        },
    )
    eventually(lambda: len(_pods(api)) == 2, 20, what="2 pods")
    first = sorted(_pods(api))
    assert {key for key, _ in running.fleet.items()} == {f"{NS}/{p}" for p in first}

    client.CoreV1Api(api).delete_namespaced_pod(first[0], NS)

    eventually(lambda: len(_pods(api) - {first[0]}) == 2, 20, what="a replacement pod")
    eventually(
        lambda: {key for key, _ in running.fleet.items()} == {f"{NS}/{p}" for p in _pods(api)},
        20,
        what="the engines follow the pods",
    )
    assert f"{NS}/{first[0]}" not in {key for key, _ in running.fleet.items()}
    assert first[1] in _pods(api)

"""The CLI against the Kubernetes stand-in, the real SeaweedFS filer of the test session, and
the workload's engine pods.

The CLI is pointed at them exactly as at the embedded stack: an endpoints file with the
Kubernetes URL + bearer token and the filer URL.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import config

from devstack.seaweedfs import MOUNT_ROOT, shared
from devstack.standins.kube import KubeServer
from devstack.workload import Workload
from tests.support.cli import CliStack
from tests.support.filer import FilerClient

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliStack]:
    base = tmp_path_factory.mktemp("cli")
    kube = KubeServer(crd_dir=ROOT / "knative" / "crds").start()
    filer = FilerClient(shared().server.url)
    admin = kube.write_kubeconfig(base / "admin.kubeconfig")
    api = config.new_client_from_config(str(admin))
    workload = Workload(api, mount_root=MOUNT_ROOT, filer_url=filer.url)
    endpoints = base / "endpoints.json"
    endpoints.write_text(
        json.dumps(
            {
                "kubernetes": {"url": kube.url, "token": kube.admin_token},
                "filer": {"url": filer.url},
                "broker": {"url": "http://127.0.0.1:9"},
                "functions": {},
            }
        )
    )
    try:
        yield CliStack(kube, filer, workload, api, endpoints, MOUNT_ROOT)
    finally:
        workload.stop()
        filer.close()
        kube.stop()

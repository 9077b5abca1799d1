"""The CLI against the stand-ins: a Kubernetes API, a filer, and the workload's engine pods.

The CLI is pointed at them exactly as at the embedded stack: an endpoints file with the
Kubernetes URL + bearer token and the filer URL.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import config

from devstack.standins.filer import FilerServer
from devstack.standins.kube import KubeServer
from devstack.workload import Workload
from tests.support.cli import CliStack

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliStack]:
    base = tmp_path_factory.mktemp("cli")
    data_dir = base / "filer"
    data_dir.mkdir()
    kube = KubeServer(crd_dir=ROOT / "knative" / "crds").start()
    filer = FilerServer(data_dir=data_dir).start()
    admin = kube.write_kubeconfig(base / "admin.kubeconfig")
    api = config.new_client_from_config(str(admin))
    workload = Workload(api, mount_root=data_dir)
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
        yield CliStack(kube, filer, workload, api, endpoints, data_dir)
    finally:
        workload.stop()
        filer.stop()
        kube.stop()

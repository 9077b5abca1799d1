"""The CLI against the test session's real kube-apiserver, its real SeaweedFS filer, and the
workload's engine pods (in the tier's own `cli-*` namespaces).

The CLI is pointed at them exactly as at the embedded stack: an endpoints file with the
Kubernetes URL, bearer token and CA, and the filer URL.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from kubernetes import config

from devstack.eventing.triggers import render
from devstack.kubernetes import Kube
from devstack.kubernetes import shared as shared_control_plane
from devstack.seaweedfs import MOUNT_ROOT, shared
from devstack.workload import Workload
from tests.support.cli import NAMESPACE_PREFIX, CliStack
from tests.support.filer import FilerClient

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliStack]:
    base = tmp_path_factory.mktemp("cli")
    with ExitStack() as opened:  # closed in reverse: the workload, the API client, the filer's, kube
        kube = Kube(shared_control_plane(render()), proxy=False)
        opened.callback(kube.stop)
        filer = opened.enter_context(FilerClient(shared().server.url))
        admin = kube.write_kubeconfig(base / "admin.kubeconfig")
        api = config.new_client_from_config(str(admin))
        opened.callback(api.rest_client.pool_manager.clear)  # its kept connections
        opened.callback(api.close)  # its thread pool
        workload = Workload(
            api, mount_root=MOUNT_ROOT, filer_url=filer.url, namespace_prefix=NAMESPACE_PREFIX
        )
        opened.callback(workload.stop)
        endpoints = base / "endpoints.json"
        endpoints.write_text(
            json.dumps(
                {
                    "kubernetes": {
                        "url": kube.url,
                        "token": kube.admin_token,
                        "certificate_authority": str(kube.tls.ca_file),
                    },
                    "filer": {"url": filer.url},
                    "broker": {"url": "http://127.0.0.1:9"},
                    "functions": {},
                }
            )
        )
        yield CliStack(kube, filer, workload, api, endpoints, MOUNT_ROOT)

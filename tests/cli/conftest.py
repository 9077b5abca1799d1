"""The CLI against the stand-ins: a Kubernetes API, a filer, and the workload's engine pods.

The CLI is pointed at them exactly as at the embedded stack: an endpoints file with the
Kubernetes URL + bearer token and the filer URL.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client, config

from devstack.filer import FilerServer
from devstack.kube import KubeServer
from devstack.workload import Workload
from loraflow.cli import main

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Stack:
    kube: KubeServer
    filer: FilerServer
    workload: Workload
    api: client.ApiClient
    endpoints: Path
    data_dir: Path

    def namespace(self) -> str:
        name = f"cli-{secrets.token_hex(4)}"
        client.CoreV1Api(self.api).create_namespace({"metadata": {"name": name}})
        return name

    def run(self, *argv: str) -> int:
        return main([*argv, "--endpoints", str(self.endpoints)])

    def listing(self, directory: str) -> dict[str, Any]:
        response = httpx.get(
            self.filer.url + directory, params={"limit": "1000"}, headers={"Accept": "application/json"}
        )
        response.raise_for_status()
        return {e["FullPath"]: e for e in response.json().get("Entries") or []}

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
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
        yield Stack(kube, filer, workload, api, endpoints, data_dir)
    finally:
        workload.stop()
        filer.stop()
        kube.stop()

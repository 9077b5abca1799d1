"""The CLI tier's world: a Kubernetes API, a filer and the workload's engine pods, which the CLI
reaches exactly as it reaches the embedded stack (an endpoints file)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client

from devstack.kubernetes import Kube
from devstack.workload import Workload
from loraflow.cli import main
from tests.support.filer import FilerClient

NAMESPACE_PREFIX = "cli-"


@dataclass
class CliStack:
    """The stand-ins the CLI tests point `loraflow` at, through an endpoints file."""

    kube: Kube
    filer: FilerClient
    workload: Workload
    api: client.ApiClient
    endpoints: Path
    mount_root: Path

    def namespace(self) -> str:
        name = f"{NAMESPACE_PREFIX}{secrets.token_hex(4)}"
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

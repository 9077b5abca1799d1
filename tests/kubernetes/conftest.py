"""The tier that proves loraflow's manifests and Kubernetes client against the real kube-apiserver
and etcd (devstack.kubernetes.shared(): the process's one control plane, with Knative's CRDs and
the rendered knative/ tree installed): the CRDs' validations, subresources and printer columns,
each function's RBAC, the optional components accepted by the server, the client's refusals and
TLS. Each test keeps to namespaces of its own (`k-*`), as tenants of one cluster do."""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Callable, Iterator
from contextlib import ExitStack, closing
from pathlib import Path
from typing import Any

import httpx
import pytest

from devstack.eventing.triggers import render
from devstack.kubernetes import ControlPlane, shared
from functions.adapters.kube import Kube, connect

Kubectl = Callable[..., subprocess.CompletedProcess[str]]
NAMESPACE_PREFIX = "k-"


@pytest.fixture(scope="session")
def plane() -> ControlPlane:
    return shared(render())


@pytest.fixture(scope="session")
def kubectl(plane: ControlPlane) -> Kubectl:
    """The real kubectl (built with the server) as the admin; `check` asserts it succeeded."""

    def run(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = plane.kubectl_run(*args, stdin=stdin, check=False)
        if check:
            assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done

    return run


@pytest.fixture
def api(plane: ControlPlane) -> Iterator[httpx.Client]:
    """An HTTP client of the server as the admin."""
    with plane.http() as http:
        yield http


@pytest.fixture
def client_of() -> Iterator[Callable[[Path], Kube]]:
    """Factory: client_of(kubeconfig) -> the functions' own client (functions.adapters.kube) from
    that file, its connections closed when the test ends, passed or failed."""
    with ExitStack() as opened:

        def connected(kubeconfig: Path) -> Kube:
            return Kube(opened.enter_context(closing(connect(str(kubeconfig)))))

        yield connected


@pytest.fixture
def namespace(api: httpx.Client) -> str:
    """A new namespace for this test (left behind: nothing here runs the namespace controller)."""
    name = f"{NAMESPACE_PREFIX}{secrets.token_hex(4)}"
    api.post("/api/v1/namespaces", json={"metadata": {"name": name}}).raise_for_status()
    return name


@pytest.fixture
def vllm_adapter() -> Callable[..., dict[str, Any]]:
    """Factory: vllm_adapter(name, model=..., **spec) -> a LoRAAdapter of rackai.rackspace.com."""

    def make(name: str, model: str = "llama3-8b-base", **spec: Any) -> dict[str, Any]:
        return {
            "apiVersion": "rackai.rackspace.com/v1alpha1",
            "kind": "LoRAAdapter",
            "metadata": {"name": name},
            "spec": {"model": model, **spec},
        }

    return make


@pytest.fixture
def sglang_adapter() -> Callable[..., dict[str, Any]]:
    """Factory: sglang_adapter(name, service=..., **spec) -> a LoRAAdapter of
    inference.rackai.rackspace.com (`spec.name` defaults to the object's name)."""

    def make(object_name: str, /, service: str = "sglang-svc", **spec: Any) -> dict[str, Any]:
        return {
            "apiVersion": "inference.rackai.rackspace.com/v1alpha1",
            "kind": "LoRAAdapter",
            "metadata": {"name": object_name},
            "spec": {
                "inferenceServiceRef": {"name": service},
                "name": object_name,
                "path": f"/models/adapters/{object_name}",
                **spec,
            },
        }

    return make

"""Shared harness: the real functions-framework apps over real HTTP, against the stand-ins.

One `world` per test session (stand-ins start once); each test takes a fresh namespace,
so tests never see each other's objects.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from cloudevents.conversion import to_binary, to_structured
from cloudevents.http import CloudEvent
from kubernetes import client, config

from devstack.filer import FilerServer
from devstack.functions_host import FunctionHost
from devstack.kube import KubeServer
from devstack.sink import EventSink
from devstack.workload import Workload
from events.domain import AdapterRef
from functions._edge import reset_deps
from functions.resources.kinds import Kind

ROOT = Path(__file__).resolve().parents[2]
FUNCTIONS_USER = "system:serviceaccount:loraflow:loraflow-functions"


@dataclass
class World:
    kube: KubeServer
    filer: FilerServer
    sink: EventSink
    workload: Workload
    host: FunctionHost
    api: client.ApiClient
    data_dir: Path
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=30))

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    # -- Kubernetes ------------------------------------------------------------------------------
    def namespace(self) -> str:
        name = f"t-{secrets.token_hex(4)}"
        self.core.create_namespace({"metadata": {"name": name}})
        return name

    def create(self, kind: Kind, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        body = {"apiVersion": kind.api_version, "kind": kind.kind, **body}
        body.setdefault("metadata", {})["namespace"] = namespace
        created: dict[str, Any] = self.custom.create_namespaced_custom_object(
            kind.group, kind.version, namespace, kind.plural, body
        )
        return created

    def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self.custom.get_namespaced_custom_object(
                kind.group, kind.version, namespace, kind.plural, name
            )
        except client.ApiException as err:
            if err.status == 404:
                return None
            raise
        return found

    def patch(self, kind: Kind, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        patched: dict[str, Any] = self.custom.patch_namespaced_custom_object(
            kind.group,
            kind.version,
            namespace,
            kind.plural,
            name,
            body,
            _content_type="application/merge-patch+json",
        )
        return patched

    # -- storage -------------------------------------------------------------------------------
    def upload(self, path: str, content: bytes) -> str:
        """PUT a file to the filer stand-in (fires its notifications); returns the hex MD5."""
        response = self.http.put(self.filer.url + path, content=content)
        response.raise_for_status()
        return hashlib.md5(content, usedforsecurity=False).hexdigest()

    # -- events ----------------------------------------------------------------------------------
    def post(self, function: str, event: CloudEvent, structured: bool = False) -> httpx.Response:
        headers, body = (to_structured if structured else to_binary)(event)
        return self.http.post(self.host.urls[function], headers=headers, content=body)

    @staticmethod
    def event(type_: str, data: Any, subject: str | None = None, **extensions: str) -> CloudEvent:
        attributes = {"type": type_, "source": "/tests", "id": secrets.token_hex(8), **extensions}
        if subject:
            attributes["subject"] = subject
        return CloudEvent(attributes, data)

    @staticmethod
    def apiserver_event(verb: str, obj: dict[str, Any]) -> CloudEvent:
        """What ApiServerSource (mode Resource) sends for `obj` (events.go, delegate.go)."""
        meta = obj["metadata"]
        api_version = obj["apiVersion"]
        plural = obj["kind"].lower() + "s"
        prefix = "/api" if "/" not in api_version else "/apis"
        return CloudEvent(
            {
                "type": f"dev.knative.apiserver.resource.{verb}",
                "source": "https://127.0.0.1:6443",
                "id": secrets.token_hex(8),
                "subject": f"{prefix}/{api_version}/namespaces/{meta['namespace']}/{plural}/{meta['name']}",
                "kind": obj["kind"],
                "apiversion": api_version,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "datacontenttype": "application/json",
            },
            obj,
        )

    @staticmethod
    def adapter_data(kind: Kind, namespace: str, name: str, **extra: Any) -> dict[str, Any]:
        ref = AdapterRef.model_validate(
            {"apiVersion": kind.api_version, "namespace": namespace, "name": name}
        )
        return {"adapter": ref.model_dump(by_alias=True), **extra}

    @contextlib.contextmanager
    def settings(self, **env: str) -> Iterator[None]:
        """Run with extra LORAFLOW_* settings; the functions rebuild their clients around it."""
        saved = {key: os.environ.get(key) for key in env}
        os.environ.update(env)
        reset_deps()
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            reset_deps()


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    base = tmp_path_factory.mktemp("world")
    data_dir = base / "filer"
    data_dir.mkdir()
    kube = KubeServer(crd_dir=ROOT / "knative" / "crds", rbac_dir=ROOT / "knative" / "rbac")
    kube.start()
    filer = FilerServer(data_dir=data_dir)
    filer.start()
    sink = EventSink().start()
    admin_config = base / "admin.kubeconfig"
    kube.write_kubeconfig(admin_config, kube.admin_token)
    functions_config = base / "functions.kubeconfig"
    rbac = (ROOT / "knative" / "rbac").is_dir()
    kube.write_kubeconfig(functions_config, kube.issue_token(FUNCTIONS_USER) if rbac else kube.admin_token)
    env = {
        "KUBECONFIG": str(functions_config),
        "LORAFLOW_FILER_URL": filer.url,
        "LORAFLOW_MOUNT_ROOT": str(data_dir),
        "LORAFLOW_ENGINE_TIMEOUT": "2",
        "LORAFLOW_BROKER_URL": sink.url,
    }
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    reset_deps()
    api = config.new_client_from_config(str(admin_config))
    workload = Workload(api, mount_root=data_dir)
    host = FunctionHost().start()
    world = World(kube, filer, sink, workload, host, api, data_dir)
    try:
        yield world
    finally:
        host.stop()
        workload.stop()
        sink.stop()
        filer.stop()
        kube.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        reset_deps()

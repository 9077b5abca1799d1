"""A testbed: the stand-ins and every function served over real HTTP, in this process.

What the function and reliability tests (the `world` fixture of tests/conftest.py) and the
benchmarks (bench/world.py) stand on: the process's real kube-apiserver and etcd
(devstack.kubernetes.shared(), the rendered knative/ tree applied; the functions use their
ServiceAccounts' TokenRequest tokens through a fault-injecting proxy, `kube`), the real
SeaweedFS of the process (devstack.seaweedfs.shared(): one per test session, each test in its own namespace's
directories) behind a FaultProxy (`filer`: what the functions call, so a test can make it
fail), an event sink as the broker URL, the workload stand-in with engine replicas (they read
adapter files from the real filer, as through a SeaweedFS mount at MOUNT_ROOT), and each
function served by functions-framework. The functions read their configuration from the
environment, which `testbed()` sets for its lifetime and restores afterwards.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import secrets
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
from cloudevents.conversion import to_binary, to_structured
from cloudevents.http import CloudEvent
from kubernetes import client, config

from devstack.eventing.sink import EventSink
from devstack.eventing.triggers import render
from devstack.functions_host import FUNCTIONS, FunctionHost
from devstack.kubernetes import Kube
from devstack.kubernetes import shared as shared_control_plane
from devstack.seaweedfs import MOUNT_ROOT, FaultProxy, Shared, settle_marker, shared
from devstack.workload import Workload
from events.domain import AdapterRef
from functions.adapters.storage import quote_path
from functions.edge.bootstrap import reset_deps
from functions.resources.kinds import VLLM_ADAPTER, Kind
from tests.support.filer import FilerClient

ROOT = Path(__file__).resolve().parents[2]
ACCOUNTS = {name: f"system:serviceaccount:loraflow:loraflow-{name}" for name in FUNCTIONS if name != "ingest"}
"""The user each function talks to the API as (its own ServiceAccount; ingest has none)."""
T = TypeVar("T", bound="Testbed")
NAMESPACE_PREFIX = "t-"
"""The testbed's namespaces: its workload runs their targets only (the control plane is shared)."""
READY = {
    "type": "Ready",
    "status": "True",
    "reason": "IntegrityVerified",
    "message": "ok",
    "lastTransitionTime": "2026-01-01T00:00:00Z",
}
"""The Ready condition verify writes once every declared file matched."""


@dataclass
class Testbed:
    __test__ = False  # a fixture's type, not a test class pytest should collect

    kube: Kube
    filer: FaultProxy
    sink: EventSink
    workload: Workload
    host: FunctionHost
    api: client.ApiClient
    mount_root: Path
    seaweed: Shared
    http: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=30))

    @functools.cached_property
    def files(self) -> FilerClient:
        """The real filer, not through the proxy: what a user or another tool does there."""
        return FilerClient(self.seaweed.server.url)

    def close(self) -> None:
        """Close the testbed's own clients (the servers stop with `testbed()`)."""
        self.http.close()
        if "files" in self.__dict__:
            self.files.close()

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    # -- Kubernetes ------------------------------------------------------------------------------
    def namespace(self) -> str:
        name = f"{NAMESPACE_PREFIX}{secrets.token_hex(4)}"
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

    def mark_ready(self, namespace: str, name: str, storage_dir: str) -> None:
        """Give a vllm adapter the status admit and verify leave once its files matched."""
        status = {"observedGeneration": 1, "conditions": [READY], "storageRef": {"path": storage_dir}}
        self.custom.patch_namespaced_custom_object_status(
            VLLM_ADAPTER.group,
            VLLM_ADAPTER.version,
            namespace,
            VLLM_ADAPTER.plural,
            name,
            {"status": status},
            _content_type="application/merge-patch+json",
        )

    # -- storage -------------------------------------------------------------------------------
    def upload(self, path: str, content: bytes) -> str:
        """PUT a file to the real filer (it notifies); returns the hex MD5."""
        response = self.http.put(self.seaweed.server.url + quote_path(path), content=content)
        response.raise_for_status()
        return hashlib.md5(content, usedforsecurity=False).hexdigest()

    @property
    def webhook_auth(self) -> dict[str, str]:
        """The Authorization header the filer's webhook sends (ingest requires its token)."""
        return {"Authorization": f"Bearer {self.seaweed.webhook_token}"}

    @contextlib.contextmanager
    def webhook(self) -> Iterator[None]:
        """The filer's webhook reaches this testbed's ingest while the block runs (the shared
        filer posts with the session's bearer token, which ingest requires)."""
        with self.seaweed.relay.subscribed(self.host.urls["ingest"]):
            yield

    def settle(self, timeout: float = 10.0) -> bool:
        """Wait until the filer's notifications so far went through (see Stack.settle)."""
        marker = settle_marker()
        self.http.put(self.seaweed.server.url + marker, content=b"").raise_for_status()
        delivered = self.seaweed.relay.await_key(marker, timeout)
        self.http.delete(self.seaweed.server.url + marker)
        return delivered

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
        return {"adapter": ref.model_dump(mode="json"), **extra}

    @contextlib.contextmanager
    def settings(self, **env: str) -> Iterator[None]:
        """Run with extra LORAFLOW_* settings; the functions rebuild their clients around it."""
        with environment(**env):
            yield


@contextlib.contextmanager
def environment(**values: str) -> Iterator[None]:
    """Set environment variables for a block; the functions rebuild their clients around it."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
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


@contextlib.contextmanager
def testbed(
    cls: type[T],
    functions: bool = True,
    engine_timeout: float = 2.0,
    filer_proxy: bool = True,
    kube_proxy: bool = True,
    **engine_defaults: Any,
) -> Iterator[T]:
    """Start the stand-ins (and every function unless `functions=False`); stop them on exit.

    `filer_proxy=False` / `kube_proxy=False`: the functions call the real filer / kube-apiserver
    directly (what the benchmarks measure); the filer proxy is then one nobody uses, and the
    Kubernetes faults cannot be injected."""
    with tempfile.TemporaryDirectory(prefix="loraflow-testbed-") as tmp:
        base = Path(tmp)
        seaweed = shared()
        kube = Kube(shared_control_plane(render()), proxy=kube_proxy)
        filer = FaultProxy(seaweed.server.url).start()
        sink = EventSink().start()
        admin_config = kube.write_kubeconfig(base / "admin.kubeconfig")
        settings = {
            **{
                f"KUBECONFIG_{name.upper()}": str(
                    kube.service_account_kubeconfig(
                        base / f"{name}.kubeconfig", "loraflow", f"loraflow-{name}"
                    )
                )
                for name in ACCOUNTS
            },
            "LORAFLOW_FILER_URL": filer.url if filer_proxy else seaweed.server.url,
            "LORAFLOW_LOOPBACK_ENGINES": "allow",  # the engine stand-ins listen on 127.0.0.x
            "LORAFLOW_MOUNT_ROOT": str(MOUNT_ROOT),
            "LORAFLOW_ENGINE_TIMEOUT": str(engine_timeout),
            "LORAFLOW_WEBHOOK_TOKEN": seaweed.webhook_token,  # the shared filer sends it
            "LORAFLOW_BROKER_URL": sink.url,
        }
        api = config.new_client_from_config(str(admin_config))
        # The engines read the real filer directly: their mount is not the functions' HTTP path.
        workload = Workload(
            api,
            mount_root=MOUNT_ROOT,
            filer_url=seaweed.server.url,
            namespace_prefix=NAMESPACE_PREFIX,
            **engine_defaults,
        )
        host = FunctionHost(FUNCTIONS if functions else ())
        bed: T | None = None
        try:
            with environment(**settings):
                host.start()
                bed = cls(kube, filer, sink, workload, host, api, MOUNT_ROOT, seaweed)
                yield bed
        finally:
            if bed is not None:
                bed.close()
            host.stop()
            workload.stop()
            sink.stop()
            filer.stop()
            kube.stop()
            api.close()

"""The source stand-ins: ApiServerSource (resume, 410 relist without events), PingSource, SQS."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cloudevents.http import CloudEvent
from kubernetes import client, config

from devstack.eventing.apiserversource import ApiServerSource, guess_plural, label_selector
from devstack.eventing.broker import BrokerClient
from devstack.eventing.pingsource import PingSource, next_fire, ping_event
from devstack.standins.kube import KubeServer

ROOT = Path(__file__).resolve().parents[2]
GROUP, VERSION = "rackai.rackspace.com", "v1alpha1"


class Collector(BrokerClient):
    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:9/")
        self.events: list[CloudEvent] = []
        self._cv = threading.Condition()

    def send(self, event: CloudEvent) -> bool:
        with self._cv:
            self.events.append(event)
            self._cv.notify_all()
        return True

    def wait(self, count: int, timeout: float = 10.0) -> list[CloudEvent]:
        with self._cv:
            self._cv.wait_for(lambda: len(self.events) >= count, timeout)
            return list(self.events)


@pytest.fixture
def kube(tmp_path: Path) -> Iterator[tuple[KubeServer, client.ApiClient]]:
    server = KubeServer(crd_dir=ROOT / "knative" / "crds", watch_history=3).start()
    path = tmp_path / "kubeconfig"
    server.write_kubeconfig(path, server.admin_token)
    api = config.new_client_from_config(str(path))
    yield server, api
    api.close()
    server.stop()


def deployment(api: client.ApiClient, name: str, namespace: str = "default") -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {"model": "m"},
    }
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "modeldeployments", body
    )


MANIFEST: dict[str, Any] = {
    "kind": "ApiServerSource",
    "metadata": {"name": "src", "namespace": "loraflow"},
    "spec": {
        "mode": "Resource",
        "namespaceSelector": {},
        "resources": [{"apiVersion": f"{GROUP}/{VERSION}", "kind": "ModelDeployment"}],
    },
}


def test_apiserversource_events_and_quiet_relist_after_410(kube: tuple[KubeServer, client.ApiClient]) -> None:
    server, api = kube
    for n in range(5):  # exist before the source starts; history (3) no longer covers the first
        deployment(api, f"pre-{n}")
    sink = Collector()
    source = ApiServerSource(MANIFEST, api, sink, source_url=server.url)
    (watch,) = source._watches
    watch.relist()
    watch._rv = "1"  # resume from a compacted resourceVersion -> 410 Expired -> relist, no events
    watch._thread.start()
    try:
        time.sleep(0.5)
        assert sink.events == []
        deployment(api, "new")
        client.CustomObjectsApi(api).patch_namespaced_custom_object(
            GROUP, VERSION, "default", "modeldeployments", "new", {"spec": {"replicas": 2}}
        )
        client.CustomObjectsApi(api).delete_namespaced_custom_object(
            GROUP, VERSION, "default", "modeldeployments", "new"
        )
        events = sink.wait(3)
    finally:
        source.stop()
    assert [e["type"].rsplit(".", 1)[-1] for e in events] == ["add", "update", "delete"]
    first = events[0]
    assert first["subject"] == f"/apis/{GROUP}/{VERSION}/namespaces/default/modeldeployments/new"
    assert (first["kind"], first["apiversion"], first["name"], first["namespace"]) == (
        "ModelDeployment",
        f"{GROUP}/{VERSION}",
        "new",
        "default",
    )
    assert first["source"] == server.url
    assert first.data["metadata"]["name"] == "new"
    assert events[1].data["spec"]["replicas"] == 2


def test_namespace_selector_absent_means_own_namespace(kube: tuple[KubeServer, client.ApiClient]) -> None:
    server, api = kube
    client.CoreV1Api(api).create_namespace({"metadata": {"name": "loraflow"}})
    manifest = {**MANIFEST, "spec": {k: v for k, v in MANIFEST["spec"].items() if k != "namespaceSelector"}}
    sink = Collector()
    source = ApiServerSource(manifest, api, sink, source_url=server.url).start()
    try:
        deployment(api, "elsewhere")
        deployment(api, "mine", namespace="loraflow")
        events = sink.wait(1)
        time.sleep(0.3)
    finally:
        source.stop()
    assert [e["name"] for e in sink.events] == ["mine"]
    assert events


def test_helpers() -> None:
    assert [guess_plural(k) for k in ("Pod", "InferenceService", "Policy", "Gateway")] == [
        "pods",
        "inferenceservices",
        "policies",
        "gateways",
    ]
    selector = {
        "matchLabels": {"a": "1"},
        "matchExpressions": [{"key": "b", "operator": "In", "values": ["x", "y"]}],
    }
    assert label_selector(selector) == "a=1,b in (x,y)"


def test_pingsource_schedule_and_event() -> None:
    now = datetime(2026, 3, 1, 10, 0, 30, tzinfo=UTC)
    assert next_fire("*/1 * * * *", now) == datetime(2026, 3, 1, 10, 1, tzinfo=UTC)
    assert next_fire("0 12 * * *", now) == datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    manifest = {
        "metadata": {"name": "loraflow-resync", "namespace": "loraflow"},
        "spec": {"schedule": "*/1 * * * *", "contentType": "application/json", "data": '{"resync": true}'},
    }
    event = ping_event(manifest)
    assert event["type"] == "dev.knative.sources.ping"
    assert event["source"] == "/apis/v1/namespaces/loraflow/pingsources/loraflow-resync"
    assert event["datacontenttype"] == "application/json"
    sink = Collector()
    ping = PingSource(manifest, sink, period_s=0.05).start()
    try:
        assert len(sink.wait(2)) >= 2
    finally:
        ping.stop()

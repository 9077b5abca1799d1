"""The sources on the real kube-apiserver: ApiServerSource (its events, a quiet relist after
410 Expired, on a resume point too old and after a restart of kube-apiserver), PingSource."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cloudevents.http import CloudEvent
from kubernetes import client, config

from devstack.eventing.apiserversource import ApiServerSource, guess_plural, label_selector
from devstack.eventing.broker import BrokerClient
from devstack.eventing.pingsource import PingSource, next_fire, ping_event
from devstack.eventing.triggers import read_files
from devstack.kubernetes import ControlPlane, close_client
from tests.support.wait import eventually

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

    def wait(self, count: int, timeout: float = 20.0) -> list[CloudEvent]:
        with self._cv:
            self._cv.wait_for(lambda: len(self.events) >= count, timeout)
            return list(self.events)

    def names(self) -> list[tuple[str, str]]:
        with self._cv:
            return [(e["type"].rsplit(".", 1)[-1], e["name"]) for e in self.events]


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of this module's own: the 410 tests restart its kube-apiserver."""
    with ControlPlane() as running:
        running.install(read_files(sorted((ROOT / "knative" / "crds").glob("*.yaml"))))
        running.install([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "loraflow"}}])
        yield running


@pytest.fixture(scope="module")
def api(plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[client.ApiClient]:
    path = plane.write_kubeconfig(tmp_path_factory.mktemp("sources") / "kubeconfig")
    made = config.new_client_from_config(str(path))
    yield made
    close_client(made)


@pytest.fixture
def namespace(api: client.ApiClient) -> str:
    name = f"src-{secrets.token_hex(3)}"
    client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})
    return name


def deployment(api: client.ApiClient, name: str, namespace: str) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {"model": "m"},
    }
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "modeldeployments", body
    )


def answered(write: Callable[[], None]) -> bool:
    """True once `write` went through; a restarted kube-apiserver answers 429 (its custom
    resources' storage is initializing) or not at all for a moment after /readyz turns 200."""
    try:
        write()
    except client.ApiException as err:
        if err.status == 429 or err.status >= 500:
            return False
        raise
    except Exception:
        return False
    return True


def patch_replicas(api: client.ApiClient, name: str, namespace: str, replicas: int) -> None:
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "modeldeployments", name, {"spec": {"replicas": replicas}}
    )


def manifest(namespace: str | None) -> dict[str, Any]:
    """Watches ModelDeployments in `namespace` (None: the source's own, loraflow)."""
    selector = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}
    return {
        "kind": "ApiServerSource",
        "metadata": {"name": "src", "namespace": "loraflow"},
        "spec": {
            "mode": "Resource",
            **(selector if namespace else {}),
            "resources": [{"apiVersion": f"{GROUP}/{VERSION}", "kind": "ModelDeployment"}],
        },
    }


def test_events_of_a_real_watch(plane: ControlPlane, api: client.ApiClient, namespace: str) -> None:
    deployment(api, "before", namespace)  # exists before the source starts: no event, as Knative
    sink = Collector()
    source = ApiServerSource(manifest(namespace), api, sink, source_url=plane.url).start()
    try:
        deployment(api, "new", namespace)
        patch_replicas(api, "new", namespace, 2)
        client.CustomObjectsApi(api).delete_namespaced_custom_object(
            GROUP, VERSION, namespace, "modeldeployments", "new"
        )
        events = sink.wait(3)
    finally:
        source.stop()
    assert [e["type"].rsplit(".", 1)[-1] for e in events] == ["add", "update", "delete"]
    first = events[0]
    assert first["subject"] == f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/modeldeployments/new"
    assert (first["kind"], first["apiversion"], first["name"], first["namespace"]) == (
        "ModelDeployment",
        f"{GROUP}/{VERSION}",
        "new",
        namespace,
    )
    assert first["source"] == plane.url
    assert first.data["metadata"]["name"] == "new" and first.data["metadata"]["uid"]
    assert events[1].data["spec"]["replicas"] == 2
    assert int(events[2].data["metadata"]["resourceVersion"]) > int(
        events[1].data["metadata"]["resourceVersion"]
    )


def test_a_too_old_resource_version_is_relisted_quietly(
    plane: ControlPlane, api: client.ApiClient, namespace: str
) -> None:
    for n in range(3):
        deployment(api, f"pre-{n}", namespace)
    sink = Collector()
    source = ApiServerSource(manifest(namespace), api, sink, source_url=plane.url)
    (watch,) = source._watches
    # resourceVersion 1 is older than the watch cache holds: the real server answers HTTP 200
    # and one ERROR event (410 Expired), the source relists without sending anything
    watch.informer.resource_version = "1"
    watch.informer.start(initial_list=False)
    try:
        eventually(lambda: watch.expired == 1 and watch.informer.relists == 1, what="a 410 and a relist")
        assert sink.events == []
        deployment(api, "after", namespace)
        assert [e["name"] for e in sink.wait(1)] == ["after"]
    finally:
        source.stop()
    assert sink.names() == [("add", "after")]


def test_a_restarted_apiserver_expires_the_watch_and_the_source_resumes(
    plane: ControlPlane, api: client.ApiClient, namespace: str
) -> None:
    sink = Collector()
    source = ApiServerSource(manifest(namespace), api, sink, source_url=plane.url).start()
    try:
        deployment(api, "one", namespace)
        sink.wait(1)
        # a new kube-apiserver's watch cache starts at the current revision: every resume point
        # from before the restart is answered 410 Expired, and the source relists quietly
        plane.stop_apiserver()
        plane.start_apiserver()
        eventually(lambda: answered(lambda: deployment(api, "two", namespace)), what="a write")
        patch_replicas(api, "one", namespace, 3)
        (watch,) = source._watches
        eventually(lambda: source.expired >= 1 and watch.informer.relists >= 2, what="a 410, a relist")
        deployment(api, "three", namespace)
        eventually(lambda: ("add", "three") in sink.names(), what="events after the relist")
    finally:
        source.stop()
    names = sink.names()
    assert names[0] == ("add", "one")
    # what was written between the restart and the relist is the resync's to find, as in Knative
    assert set(names[1:]) <= {("add", "two"), ("update", "one"), ("add", "three")}
    assert names[-1] == ("add", "three")


def test_namespace_selector_absent_means_own_namespace(
    plane: ControlPlane, api: client.ApiClient, namespace: str
) -> None:
    sink = Collector()
    source = ApiServerSource(manifest(None), api, sink, source_url=plane.url).start()
    try:
        deployment(api, "elsewhere", namespace)
        deployment(api, "mine", "loraflow")
        deployment(api, "mine-too", "loraflow")
        sink.wait(2)
    finally:
        source.stop()
    assert sink.names() == [("add", "mine"), ("add", "mine-too")]


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
    ping_manifest = {
        "metadata": {"name": "loraflow-resync", "namespace": "loraflow"},
        "spec": {"schedule": "*/1 * * * *", "contentType": "application/json", "data": '{"resync": true}'},
    }
    event = ping_event(ping_manifest)
    assert event["type"] == "dev.knative.sources.ping"
    assert event["source"] == "/apis/v1/namespaces/loraflow/pingsources/loraflow-resync"
    assert event["datacontenttype"] == "application/json"
    sink = Collector()
    ping = PingSource(ping_manifest, sink, period_s=0.05).start()
    try:
        assert len(sink.wait(2)) >= 2
    finally:
        ping.stop()

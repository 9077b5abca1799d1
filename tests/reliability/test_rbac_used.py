"""RBAC least privilege per function, proven against the real kube-apiserver enforcing knative/rbac
(and the filer source's Role, knative/components/filer-source/rbac.yaml, at the end).

Each function talks to the API with its own ServiceAccount's token (`loraflow-<function>`, see
the harness), so every request it makes is checked against its own ClusterRole. Here:
(a) no request of any function was ever denied (the API server's audit log records each decision);
(b) one full lifecycle (admit, stat, verify, load, reload, resync, unload with deletion, Warning
    Events, a target's events, a Model appearing) uses every (verb, group, resource) each role
    grants, so nothing granted to any function is unused, and no function stepped outside its own;
(c) ingest has no account bound to anything: it reads nothing from Kubernetes.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from pathlib import Path

import pytest
import yaml
from cloudevents.http import CloudEvent, from_http

from devstack.eventing.sink import EventSink
from devstack.seaweedfs import shared
from events.domain import ADAPTER_ADMITTED, ADAPTER_READY, ADAPTER_STAT_COMPLETED, FILE_CHANGED, RESYNC_SHARD
from events.external import PING
from functions.resources.kinds import (
    INFERENCE_SERVICE,
    INFERENCE_SERVICE_LABEL,
    MODEL,
    MODEL_DEPLOYMENT,
    MODEL_DEPLOYMENT_LABEL,
    SGLANG_ADAPTER,
    VLLM_ADAPTER,
)
from tests.support.builders import deletion_of
from tests.support.denials import denials
from tests.support.filer import FilerClient
from tests.support.filer_source import (
    COMPONENT,
    LEASE_NAME,
    SERVICE_ACCOUNT,
    SourceRig,
    read_cursor,
    source_kube,
)
from tests.support.testbed import ACCOUNTS, ROOT, Testbed
from tests.support.wait import eventually

Grant = tuple[str, str, str]  # (verb, apiGroup, resource[/subresource])


def granted(function: str) -> set[Grant]:
    """Every (verb, group, resource) the function's own ClusterRole grants (no wildcards)."""
    out: set[Grant] = set()
    for path in sorted((ROOT / "knative" / "rbac").glob("*.yaml")):
        for doc in yaml.safe_load_all(Path(path).read_text()):
            if not doc or doc.get("kind") not in ("ClusterRole", "Role"):
                continue
            if doc["metadata"]["name"] != f"loraflow-{function}":
                continue
            for rule in doc.get("rules") or []:
                for verb in rule["verbs"]:
                    for group in rule["apiGroups"]:
                        for resource in rule["resources"]:
                            assert "*" not in (verb, group, resource), f"wildcard grant in {path}"
                            out.add((verb, group, resource))
    return out


def used(world: Testbed, function: str) -> set[Grant]:
    return {
        (r.verb, r.group, f"{r.resource}/{r.subresource}" if r.subresource else r.resource)
        for r in world.kube.authorized_requests
        if r.user == ACCOUNTS[function]
    }


def md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def send(
    world: Testbed, function: str, event: CloudEvent, ok: tuple[int, ...] = (200, 204)
) -> CloudEvent | None:
    response = world.post(function, event)
    assert response.status_code in ok, f"{function}: {response.status_code} {response.text}"
    return from_http(dict(response.headers), response.content) if response.status_code == 200 else None


def lifecycle(world: Testbed) -> None:
    """Both seeds, end to end, by posting what the Broker would deliver."""
    ns = world.namespace()
    config = json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 16}).encode()
    weights = b"weights-" * 64
    directory = f"/loraadapters/{ns}/m1/a/"
    world.upload(directory + "adapter_config.json", config)
    world.upload(directory + "adapter_model.safetensors", weights)
    world.create(MODEL, ns, {"metadata": {"name": "m1"}, "spec": {}})
    world.create(
        MODEL_DEPLOYMENT,
        ns,
        {"metadata": {"name": "md"}, "spec": {"model": "m1", "replicas": 1, "loraAdapters": ["a"]}},
    )
    world.workload.sync()
    integrity = {
        directory + "adapter_config.json": md5(config),
        directory + "adapter_model.safetensors": md5(weights),
    }
    created = world.create(
        VLLM_ADAPTER,
        ns,
        {"metadata": {"name": "a"}, "spec": {"model": "m1", "integrity": {"md5": integrity}}},
    )
    admitted = send(world, "admit", world.apiserver_event("add", created))
    assert admitted is not None and admitted["type"] == ADAPTER_ADMITTED
    observed = send(world, "stat", admitted)
    assert observed is not None and observed["type"] == ADAPTER_STAT_COMPLETED
    ready = send(world, "verify", observed)
    assert ready is not None and ready["type"] == ADAPTER_READY
    assert send(world, "load", ready) is not None
    # a Warning Event (record_event): an adapter for a Model that does not exist
    missing = world.create(VLLM_ADAPTER, ns, {"metadata": {"name": "b"}, "spec": {"model": "nope"}})
    send(world, "admit", world.apiserver_event("add", missing))
    # reload: the serving pod comes back (its engine lost the adapter)
    (pod,) = world.workload.pods(ns, f"{MODEL_DEPLOYMENT_LABEL}=md")
    world.workload.restart(ns, pod["metadata"]["name"])
    fresh = world.core.read_namespaced_pod(pod["metadata"]["name"], ns)
    pod_obj = world.api.sanitize_for_serialization(fresh)
    pod_obj.update(apiVersion="v1", kind="Pod")
    send(world, "reload", world.apiserver_event("update", pod_obj))
    # the sglang kind: an InferenceService running sglang and an adapter targeting it
    world.create(
        INFERENCE_SERVICE, ns, {"metadata": {"name": "isvc"}, "spec": {"runtime": "sglang", "replicas": 1}}
    )
    world.workload.sync()
    assert world.workload.pods(ns, f"{INFERENCE_SERVICE_LABEL}=isvc")
    world.upload(f"/sglang/{ns}/s/adapter_config.json", config)
    world.upload(f"/sglang/{ns}/s/adapter_model.safetensors", weights)
    v2 = world.create(
        SGLANG_ADAPTER,
        ns,
        {
            "metadata": {"name": "s"},
            "spec": {"inferenceServiceRef": {"name": "isvc"}, "name": "s", "path": f"/sglang/{ns}/s"},
        },
    )
    admitted2 = send(world, "admit", world.apiserver_event("add", v2))
    assert admitted2 is not None
    send(world, "load", admitted2, ok=(200, 204, 503))
    # resync: the periodic tick lists everything; dealt into parts, it lists the namespaces
    send(world, "resync", world.event(PING, {"resync": True}))
    world.sink.clear()
    with world.settings(LORAFLOW_RESYNC_SHARDS="2"):
        send(world, "resync", world.event(PING, {"resync": True}))
        parts = [event for event in world.sink.events if event["type"] == RESYNC_SHARD]
        assert ns in {name for part in parts for name in part.get_data()["namespaces"]}  # type: ignore[index]
        for part in parts:
            send(world, "resync", part)
    # a full tick (the filer source's, after its log lost events) also reads each adapter a frozen set names
    send(world, "resync", world.event(PING, {"resync": True, "full": True, "reason": "a test"}))
    rest_of_the_paths(world, ns, pod["metadata"]["name"], pod_obj, integrity)
    # unload: the adapter is deleted; our finalizer holds it until every pod is clean
    world.custom.delete_namespaced_custom_object(
        VLLM_ADAPTER.group, VLLM_ADAPTER.version, ns, VLLM_ADAPTER.plural, "a"
    )
    deleting = world.get(VLLM_ADAPTER, ns, "a")
    assert deleting is not None and deleting["metadata"].get("deletionTimestamp")
    send(world, "unload", deletion_of(world, deleting))
    assert world.get(VLLM_ADAPTER, ns, "a") is None, "finalizer not removed"
    # ... and the sglang one, whose unload fails once (a Warning Event), then finishes
    (sg_pod,) = world.workload.pods(ns, f"{INFERENCE_SERVICE_LABEL}=isvc")
    sg_replica = world.workload.replica(ns, sg_pod["metadata"]["name"])
    world.custom.delete_namespaced_custom_object(
        SGLANG_ADAPTER.group, SGLANG_ADAPTER.version, ns, SGLANG_ADAPTER.plural, "s"
    )
    deleting = world.get(SGLANG_ADAPTER, ns, "s")
    assert deleting is not None
    sg_replica.inject(status=500, times=1, routes=["unload"])
    deletion = deletion_of(world, deleting)
    send(world, "unload", deletion, ok=(200, 204, 503))
    send(world, "unload", deletion)
    assert world.get(SGLANG_ADAPTER, ns, "s") is None, "sglang finalizer not removed"


def rest_of_the_paths(
    world: Testbed, ns: str, pod: str, pod_obj: dict[str, object], integrity: dict[str, str]
) -> None:
    """The paths a happy lifecycle does not take, each a reason for a grant: a Model appearing
    (admit lists the adapters that wait for it), target events (load and unload read the
    ModelDeployment and its namespace's adapters), failures that record Events (stat truncates,
    verify finds a mismatch, reload fails a load), a restarted sglang pod (reload of the sglang kind,
    its status write conflicting once)."""
    waiting = world.create(VLLM_ADAPTER, ns, {"metadata": {"name": "w"}, "spec": {"model": "m2"}})
    send(world, "admit", world.apiserver_event("add", waiting))
    model = world.create(MODEL, ns, {"metadata": {"name": "m2"}, "spec": {}})
    send(world, "admit", world.apiserver_event("add", model))
    md = world.get(MODEL_DEPLOYMENT, ns, "md")
    assert md is not None
    send(world, "load", world.apiserver_event("update", md))
    send(world, "unload", world.apiserver_event("update", md))
    # stat records at most LORAFLOW_STATUS_MAX_FILES files (declared ones first) and says so
    world.upload(next(iter(integrity)).rsplit("/", 1)[0] + "/README.md", b"an undeclared file")
    with world.settings(LORAFLOW_STATUS_MAX_FILES="2"):
        changed = world.event(
            FILE_CHANGED,
            {"path": next(iter(integrity)), "eventType": "update"},
            subject=next(iter(integrity)),
        )
        send(world, "stat", changed)
    # verify: a declared MD5 that does not match (IntegrityCheckFailed, a Warning Event)
    wrong = world.create(
        VLLM_ADAPTER,
        ns,
        {
            "metadata": {"name": "x"},
            "spec": {
                "model": "m1",
                "integrity": {"md5": {k.replace("/a/", "/x/"): "0" * 32 for k in integrity}},
            },
        },
    )
    for path in integrity:
        world.upload(path.replace("/a/", "/x/"), b"other bytes")
    admitted = send(world, "admit", world.apiserver_event("add", wrong))
    assert admitted is not None
    observed = send(world, "stat", admitted)
    assert observed is not None
    assert send(world, "verify", observed) is not None  # adapter.failed
    # the restarted pod's engine fails loads (LoadFailed Events from load and from reload)
    replica = world.workload.replica(ns, pod)
    world.workload.restart(ns, pod)
    replica.inject(status=500, times=None, routes=["load"])
    send(world, "load", world.apiserver_event("update", md), ok=(503,))
    replica.clear_faults()  # another failure for reload: a status that moves, and its own Event
    replica.inject(refuse=True, times=None, routes=["load"])
    send(world, "reload", world.apiserver_event("update", pod_obj), ok=(200, 204, 503))
    replica.clear_faults()
    send(world, "reload", world.apiserver_event("update", pod_obj))
    # reload of a restarted sglang pod (a second later: lastLoadedAt has whole seconds)
    time.sleep(1.1)
    (sg_pod,) = world.workload.pods(ns, f"{INFERENCE_SERVICE_LABEL}=isvc")
    world.workload.restart(ns, sg_pod["metadata"]["name"])
    sg_obj = world.api.sanitize_for_serialization(
        world.core.read_namespaced_pod(sg_pod["metadata"]["name"], ns)
    )
    sg_obj.update(apiVersion="v1", kind="Pod")
    # ... whose status write meets another writer's (409): reload reads the adapter again (get);
    # a write that goes through proves the adapter alive, so a happy reload reads nothing after
    world.kube.inject(409, times=1, verb="patch", resource="loraadapters/status")
    send(world, "reload", world.apiserver_event("update", sg_obj), ok=(200, 204, 503))
    # a ModelDeployment that stops naming an adapter: unload takes it out and rewrites its status
    world.patch(MODEL_DEPLOYMENT, ns, "md", {"spec": {"loraAdapters": []}})
    changed_md = world.get(MODEL_DEPLOYMENT, ns, "md")
    assert changed_md is not None
    send(world, "unload", world.apiserver_event("update", changed_md))


@pytest.fixture(scope="module")
def lived(world: Testbed) -> Testbed:
    lifecycle(world)
    return world


@pytest.mark.parametrize("function", sorted(ACCOUNTS))
def test_each_function_runs_as_its_own_account(lived: Testbed, function: str) -> None:
    assert used(lived, function), f"no request was authorized for {function}'s ServiceAccount"


def test_no_request_of_any_function_was_denied(lived: Testbed) -> None:
    mine = [d for d in denials(lived.kube.audit) if d.user in ACCOUNTS.values()]
    assert mine == [], f"RBAC denied the functions: {mine}"


@pytest.mark.parametrize("function", sorted(ACCOUNTS))
def test_every_request_was_within_its_own_grants(lived: Testbed, function: str) -> None:
    assert used(lived, function) <= granted(function)


@pytest.mark.parametrize("function", sorted(ACCOUNTS))
def test_every_granted_verb_is_used(lived: Testbed, function: str) -> None:
    """Least privilege: a function's role grants nothing that function does not use."""
    unused = granted(function) - used(lived, function)
    assert not unused, f"{function}: granted but never used: {sorted(unused)}"


def test_ingest_talks_to_no_api(lived: Testbed) -> None:
    assert "ingest" not in ACCOUNTS
    assert not granted("ingest")


# -- the filer source's Role (knative/components/filer-source/rbac.yaml) ---------------------------
def source_granted() -> set[Grant]:
    out: set[Grant] = set()
    for doc in yaml.safe_load_all((COMPONENT / "rbac.yaml").read_text()):
        if doc and doc.get("kind") in ("Role", "ClusterRole"):
            assert doc["kind"] == "Role", "the source needs nothing cluster-wide"
            for rule in doc.get("rules") or []:
                assert rule.get("resourceNames") == [LEASE_NAME], "only its own Lease, by name"
                for verb in rule["verbs"]:
                    for group in rule["apiGroups"]:
                        for resource in rule["resources"]:
                            assert "*" not in (verb, group, resource), "wildcard grant"
                            out.add((verb, group, resource))
    return out


def test_the_filer_sources_role_is_exactly_what_it_uses(tmp_path: Path) -> None:
    """A first start (read the Lease: no cursor), a change published, a cursor written, a SIGTERM:
    everything it did was granted, nothing granted went unused, nothing was denied."""
    kube = source_kube()
    sink = EventSink().start()
    rig = SourceRig(shared().server, kube, sink.url, tmp_path)
    try:
        rig.start().wait_logged("following the filer's metadata log")
        directory = f"/loraadapters/rbac-{secrets.token_hex(3)}/m/a"
        with FilerClient(rig.seaweed.url) as filer:
            filer.put_file(f"{directory}/x.bin", b"x")
        eventually(lambda: [e for e in sink.of_type(FILE_CHANGED) if e["subject"] == f"{directory}/x.bin"])
        assert rig.terminate() == 0
        assert read_cursor(kube) is not None
        mine = {
            (r.verb, r.group, f"{r.resource}/{r.subresource}" if r.subresource else r.resource)
            for r in kube.authorized_requests
            if r.user == SERVICE_ACCOUNT
        }
        assert (
            mine
            == source_granted()
            == {("get", "coordination.k8s.io", "leases"), ("patch", "coordination.k8s.io", "leases")}
        )
        assert [d for d in denials(kube.audit) if d.user == SERVICE_ACCOUNT] == []
    finally:
        rig.stop()
        sink.stop()
        kube.stop()

"""The hostile tier: a second tenant, a hostile pod, hostile files and oversized requests.

Every case gets a clear verdict on the object it belongs to, bounded time and memory, and
nothing lost or half-written for anyone else; the convergence invariant holds afterwards and
names the violation when one is planted (a pod serving a name from another adapter's path).
Runs on the testbed: the Kubernetes and engine stand-ins, the real filer, every function over
real HTTP (in this process, so the memory figures are the functions' own).
"""

from __future__ import annotations

import json
import resource
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from events.domain import ADAPTER_DRIFTED, ADAPTER_READY, STEP_EXTENSION
from events.external import PING
from functions.logic import reasons
from functions.resources.kinds import (
    INFERENCE_SERVICE,
    MODEL_DEPLOYMENT_LABEL,
    SGLANG_ADAPTER,
    VLLM_ADAPTER,
)
from tests.support import invariant
from tests.support.builders import (
    admit,
    condition,
    deletion_of,
    deployment,
    isvc_pods,
    pod_object,
    ready_adapter,
    sglang_adapter,
    sglang_files,
    sglang_isvc,
)
from tests.support.hostile import HostilePod
from tests.support.testbed import Testbed


def rss_mib() -> float:
    """Peak resident memory of this process (the functions run in it), MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def stored(world: Testbed, kind: Any, ns: str, name: str) -> dict[str, Any]:
    obj = world.get(kind, ns, name)
    assert obj is not None
    return obj


def loaded_in(world: Testbed, ns: str, pod: str) -> dict[str, str]:
    return world.workload.replica(ns, pod).loaded


def sglang_ready(world: Testbed, ns: str, name: str) -> httpx.Response:
    return world.post("load", world.event(ADAPTER_READY, world.adapter_data(SGLANG_ADAPTER, ns, name)))


# -- a second tenant -------------------------------------------------------------------------------
@pytest.fixture
def two_tenants(world: Testbed) -> Iterator[tuple[str, str]]:
    """Tenant B serves `support` from its own path on InferenceService `chat` (2 pods), and
    accepts adapters from tenant A's namespace."""
    team_a, team_b = world.namespace(), world.namespace()
    sglang_isvc(world, team_b, replicas=2, name="chat")
    chat = stored(world, INFERENCE_SERVICE, team_b, "chat")
    world.patch(
        INFERENCE_SERVICE,
        team_b,
        "chat",
        {"metadata": {"annotations": {"loraflow.io/accept-adapters-from": team_a}}},
    )
    assert chat is not None
    path_b = sglang_files(world, team_b, "support")
    admit(world, sglang_adapter(world, team_b, "support", "support", path_b, target="chat"))
    assert sglang_ready(world, team_b, "support").status_code == 200
    yield team_a, team_b


def thief(world: Testbed, team_a: str, team_b: str) -> dict[str, Any]:
    path_a = sglang_files(world, team_a, "grab")
    return world.create(
        SGLANG_ADAPTER,
        team_a,
        {
            "metadata": {"name": "grab"},
            "spec": {
                "inferenceServiceRef": {"namespace": team_b, "name": "chat"},
                "name": "support",
                "path": path_a,
            },
        },
    )


def test_a_second_tenant_cannot_take_over_a_name(world: Testbed, two_tenants: tuple[str, str]) -> None:
    team_a, team_b = two_tenants
    path_b = f"/sglang/{team_b}/support"
    admit(world, thief(world, team_a, team_b))
    assert sglang_ready(world, team_a, "grab").status_code == 204  # nothing loaded for A
    pods = isvc_pods(world, team_b, "chat")
    for pod in pods:
        assert loaded_in(world, team_b, pod) == {"support": path_b}
    grab = stored(world, SGLANG_ADAPTER, team_a, "grab")
    loaded = condition(grab, "Loaded")
    assert (loaded["status"], loaded["reason"]) == ("False", reasons.NAME_CONFLICT)
    assert f"{team_b}/support" in loaded["message"]  # names the owner...
    assert path_b not in json.dumps(grab["status"]) and not any(p in json.dumps(grab["status"]) for p in pods)

    # B's pods restart: they get B's adapter back, from B's path
    for pod in pods:
        world.workload.restart(team_b, pod)
        assert world.post(
            "reload", world.apiserver_event("update", pod_object(world, team_b, pod))
        ).is_success
    # deleting A's adapter never takes B's name out of B's pods
    world.custom.delete_namespaced_custom_object(
        SGLANG_ADAPTER.group, SGLANG_ADAPTER.version, team_a, SGLANG_ADAPTER.plural, "grab"
    )
    deletion = deletion_of(world, stored(world, SGLANG_ADAPTER, team_a, "grab"))
    assert world.post("unload", deletion).is_success
    assert world.get(SGLANG_ADAPTER, team_a, "grab") is None
    for pod in pods:
        assert set(loaded_in(world, team_b, pod)) == {"support"}
        assert loaded_in(world, team_b, pod)["support"].endswith(path_b)
    assert invariant.check(world, [team_a, team_b]) == []


def test_without_consent_another_namespace_gets_a_verdict_and_nothing_is_loaded(
    world: Testbed, two_tenants: tuple[str, str]
) -> None:
    _, team_b = two_tenants
    stranger = world.namespace()
    path = sglang_files(world, stranger, "mine")
    created = world.create(
        SGLANG_ADAPTER,
        stranger,
        {
            "metadata": {"name": "mine"},
            "spec": {
                "inferenceServiceRef": {"namespace": team_b, "name": "chat"},
                "name": "mine",
                "path": path,
            },
        },
    )
    admit(world, created)
    available = condition(stored(world, SGLANG_ADAPTER, stranger, "mine"), "Available")
    assert (available["status"], available["reason"]) == ("False", reasons.REFERENCE_NOT_PERMITTED)
    assert (
        world.post(
            "load", world.event(ADAPTER_READY, world.adapter_data(SGLANG_ADAPTER, stranger, "mine"))
        ).status_code
        == 204
    )
    assert all("mine" not in loaded_in(world, team_b, pod) for pod in isvc_pods(world, team_b, "chat"))
    assert invariant.check(world, [team_b, stranger]) == []


def test_an_sglang_path_outside_the_roots_is_refused(world: Testbed) -> None:
    ns = world.namespace()
    sglang_isvc(world, ns, replicas=1)
    sneaky = f"/sglang/../loraadapters/{ns}/m1/secret"
    admit(world, sglang_adapter(world, ns, "s1", "x", sneaky))
    available = condition(stored(world, SGLANG_ADAPTER, ns, "s1"), "Available")
    assert (available["status"], available["reason"]) == ("False", reasons.PATH_NOT_ALLOWED)
    assert sglang_ready(world, ns, "s1").status_code == 204
    assert all(loaded_in(world, ns, pod) == {} for pod in isvc_pods(world, ns))


def test_the_invariant_names_a_takeover(world: Testbed, two_tenants: tuple[str, str]) -> None:
    """Planted behind the functions' backs: B's name served from A's path in one of B's pods."""
    team_a, team_b = two_tenants
    admit(world, thief(world, team_a, team_b))
    assert sglang_ready(world, team_a, "grab").status_code == 204  # its verdict: NameConflict
    pod = isvc_pods(world, team_b, "chat")[0]
    replica = world.workload.replica(team_b, pod)
    httpx.post(replica.url + "/unload_lora_adapter", json={"lora_name": "support"}).raise_for_status()
    body = {"lora_name": "support", "lora_path": f"/sglang/{team_a}/grab"}
    httpx.post(replica.url + "/load_lora_adapter", json=body).raise_for_status()
    found = invariant.check(world, [team_a, team_b])
    assert any(v.rule == "takeover" and pod in v.subject for v in found), found
    # the owner's load takes its name back
    assert sglang_ready(world, team_b, "support").status_code == 200
    assert loaded_in(world, team_b, pod)["support"].endswith(f"/sglang/{team_b}/support")
    assert invariant.check(world, [team_a, team_b]) == []


# -- a hostile pod ----------------------------------------------------------------------------------
def hostile_pod(
    world: Testbed, ns: str, deployment_name: str, pod: HostilePod, name: str = "zz-hostile"
) -> str:
    """A Pod labelled as one of the deployment's serving pods whose kubelet-reported address
    is the hostile server (created after the workload's last sync, which would scale it away)."""
    world.core.create_namespaced_pod(
        ns,
        {
            "metadata": {
                "name": name,
                "labels": {MODEL_DEPLOYMENT_LABEL: deployment_name, "loraflow.io/serving": "true"},
            },
            "spec": {
                "containers": [
                    {"name": "engine", "image": "x", "ports": [{"name": "http", "containerPort": pod.port}]}
                ]
            },
        },
    )
    status = {
        "phase": "Running",
        "podIP": pod.host,
        "podIPs": [{"ip": pod.host}],
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    world.core.patch_namespaced_pod_status(name, ns, {"status": status})
    return name


MODES = {
    "garbage": reasons.ENGINE_ANSWER_INVALID,
    "no-id": reasons.ENGINE_ANSWER_INVALID,
    "deep": reasons.ENGINE_ANSWER_INVALID,
    "huge": reasons.ENGINE_ANSWER_TOO_LARGE,
    "endless": reasons.ENGINE_ANSWER_TOO_LARGE,
    "gzip-bomb": reasons.ENGINE_ANSWER_INVALID,
    "trickle": reasons.ENGINE_TIMEOUT,
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_hostile_listing_is_that_pods_failure_only(world: Testbed, mode: str) -> None:
    ns = world.namespace()
    ready_adapter(world, ns, "a1")
    deployment(world, ns, "d1", 2, ["a1"])
    honest = sorted(p["metadata"]["name"] for p in world.workload.pods(ns, f"{MODEL_DEPLOYMENT_LABEL}=d1"))
    with HostilePod("127.0.0.250", mode, interval=0.5) as bad:
        name = hostile_pod(world, ns, "d1", bad)
        before, started = rss_mib(), time.monotonic()
        drifted = world.event(
            ADAPTER_DRIFTED,
            world.adapter_data(VLLM_ADAPTER, ns, "a1", step="load", reason="test"),
            **{STEP_EXTENSION: "load"},
        )
        response = world.post("load", drifted)
        elapsed, grown = time.monotonic() - started, rss_mib() - before
    assert response.status_code in (200, 503), response.text  # 503 only for the retryable timeout
    assert elapsed < 2 * 2.0 + 2, elapsed  # the testbed's engine timeout is 2 s: at most two of it
    assert grown < 64, f"the function grew by {grown:.0f} MiB"
    for pod in honest:
        assert "a1" in loaded_in(world, ns, pod)
    loaded = condition(stored(world, VLLM_ADAPTER, ns, "a1"), "Loaded")
    assert loaded["reason"] == reasons.LOAD_FAILED and f"{name} ({MODES[mode]}" in loaded["message"]
    assert all(method == "GET" for method, _ in bad.requests)  # it was listed, never sent a load


def test_a_hostile_pod_does_not_switch_off_resync_for_anyone(world: Testbed) -> None:
    hostile_ns, victim_ns = world.namespace(), world.namespace()
    ready_adapter(world, hostile_ns, "h1")
    deployment(world, hostile_ns, "d1", 1, ["h1"])
    ready_adapter(world, victim_ns, "a1")
    deployment(world, victim_ns, "d1", 1, ["a1"])
    assert (
        world.post(
            "load", world.event(ADAPTER_READY, world.adapter_data(VLLM_ADAPTER, victim_ns, "a1"))
        ).status_code
        == 200
    )
    (victim_pod,) = [
        p["metadata"]["name"] for p in world.workload.pods(victim_ns, f"{MODEL_DEPLOYMENT_LABEL}=d1")
    ]
    replica = world.workload.replica(victim_ns, victim_pod)
    httpx.post(replica.url + "/v1/unload_lora_adapter", json={"lora_name": "a1"}).raise_for_status()  # lost
    with (
        HostilePod("127.0.0.251", "trickle", interval=1.0) as bad,
        HostilePod("127.0.0.252", "garbage") as junk,
    ):
        hostile_pod(world, hostile_ns, "d1", bad, "zz-trickle")
        hostile_pod(world, hostile_ns, "d1", junk, "zz-garbage")
        world.sink.clear()
        started = time.monotonic()
        assert world.post("resync", world.event(PING, {})).status_code == 204
        assert time.monotonic() - started < 2 * 2.0 + 3
    nudges = {
        (e.get_data()["adapter"]["namespace"], e.get_data()["adapter"]["name"], e[STEP_EXTENSION])
        for e in world.sink.of_type(ADAPTER_DRIFTED)
    }  # type: ignore[index]
    assert (victim_ns, "a1", "load") in nudges


def test_a_pod_at_the_api_servers_address_is_never_called(world: Testbed) -> None:
    ns = world.namespace()
    ready_adapter(world, ns, "a1")
    deployment(world, ns, "d1", 1, ["a1"])
    # the address the functions know as their API server (the fault proxy in front of it here)
    api = httpx.URL(world.kube.functions_url)
    host, port = api.host, api.port
    assert port is not None
    world.core.create_namespaced_pod(
        ns,
        {
            "metadata": {
                "name": "zz-apiserver",
                "labels": {MODEL_DEPLOYMENT_LABEL: "d1", "loraflow.io/serving": "true"},
            },
            "spec": {
                "containers": [
                    {"name": "engine", "image": "x", "ports": [{"name": "http", "containerPort": port}]}
                ]
            },
        },
    )
    status = {"phase": "Running", "podIP": host, "conditions": [{"type": "Ready", "status": "True"}]}
    world.core.patch_namespaced_pod_status("zz-apiserver", ns, {"status": status})
    assert (
        world.post("load", world.event(ADAPTER_READY, world.adapter_data(VLLM_ADAPTER, ns, "a1"))).status_code
        == 200
    )
    loaded = condition(stored(world, VLLM_ADAPTER, ns, "a1"), "Loaded")
    assert (loaded["status"], loaded["reason"]) == ("True", "Loaded")
    assert "zz-apiserver" not in loaded["message"] and "1 Ready pod(s)" in loaded["message"]


# -- hostile files ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("content", "reason"),
    [
        pytest.param(
            b'{"peft_type": "LORA", "r": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
            reasons.CONFIG_INVALID,
            id="deep",
        ),
        pytest.param(
            b'{"peft_type": "LORA", "r": 8, "pad": "' + b"x" * (1 << 20) + b'"}',
            reasons.CONFIG_TOO_LARGE,
            id="too-large",
        ),
        pytest.param(b"\xff\xfe not json", reasons.CONFIG_INVALID, id="not-text"),
    ],
)
def test_a_hostile_config_is_a_verdict_on_its_adapter_only(
    world: Testbed, content: bytes, reason: str
) -> None:
    ns = world.namespace()
    ready_adapter(world, ns, "good")
    ready_adapter(world, ns, "bad")
    world.upload(f"/loraadapters/{ns}/m1/bad/adapter_config.json", content)
    deployment(world, ns, "d1", 2, ["good", "bad"])
    (pod, *_) = sorted(p["metadata"]["name"] for p in world.workload.pods(ns, f"{MODEL_DEPLOYMENT_LABEL}=d1"))
    restarted = pod_object(world, ns, pod)
    assert world.post("reload", world.apiserver_event("update", restarted)).status_code == 200
    assert set(loaded_in(world, ns, pod)) == {"good"}
    bad = condition(stored(world, VLLM_ADAPTER, ns, "bad"), "Loaded")
    assert (bad["status"], bad["reason"]) == ("False", reason)


# -- oversized requests ------------------------------------------------------------------------------
def raw_post(url: str, head: bytes, body: bytes = b"") -> tuple[int, float]:
    """Send a request by hand (a declared length we never send, a body the client would not)."""
    address = httpx.URL(url)
    started = time.monotonic()
    with socket.create_connection((address.host, address.port or 80), timeout=10) as sock:
        sock.sendall(head + body)
        answer = sock.recv(4096)
    return int(answer.split(b" ", 2)[1]), time.monotonic() - started


def test_an_oversized_body_is_refused_before_it_is_read(world: Testbed) -> None:
    url = world.host.urls["stat"]
    head = (
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/cloudevents+json\r\n"
        b"Content-Length: 419430400\r\n\r\n"
    )
    before = rss_mib()
    status, elapsed = raw_post(url, head, b"{")  # 400 MiB declared, one byte sent
    assert status == 413 and elapsed < 5
    chunked = (
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
    )
    piece = b"x" * 65536
    status, _ = raw_post(
        world.host.urls["ingest"],
        chunked + b"Authorization: " + world.webhook_auth["Authorization"].encode() + b"\r\n\r\n",
        (f"{len(piece):x}\r\n".encode() + piece + b"\r\n") * 80 + b"0\r\n\r\n",  # 5 MiB, chunked
    )
    assert status == 413
    assert rss_mib() - before < 32

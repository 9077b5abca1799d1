"""A reusable bench fixture: the stand-ins and the real functions over HTTP, in this process.

The same setup as the `world` fixture (tests/conftest.py): Kubernetes stand-in with RBAC, the
real SeaweedFS of the process (the functions call its filer directly, no fault proxy), event
sink, workload with engine replicas, every function served by functions-framework; as a
context manager, plus the few helpers the benchmarks share (ready adapters, deployments,
CloudEvents, a synchronous router that follows the Triggers without the broker).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from cloudevents.conversion import to_binary
from cloudevents.http import CloudEvent, from_http

from devstack.eventing.triggers import Trigger, load_triggers, subscriber_service
from devstack.functions_host import launch
from devstack.ports import free_port
from devstack.processes import descendants
from functions.resources.kinds import MODEL as MODEL_KIND
from functions.resources.kinds import MODEL_DEPLOYMENT, MODEL_DEPLOYMENT_LABEL, VLLM_ADAPTER, Kind
from tests.support.testbed import Testbed, environment, testbed
from tests.support.wait import eventually

ROOT = Path(__file__).resolve().parents[1]
MERGE = "application/merge-patch+json"
MODEL = "m1"


def ready_condition(reason: str = "IntegrityVerified") -> dict[str, str]:
    return {
        "type": "Ready",
        "status": "True",
        "reason": reason,
        "message": "ok",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }


class World(Testbed):
    """The testbed plus what the benchmarks share: a Model per namespace, Ready adapters."""

    def namespace(self) -> str:
        name = super().namespace()
        self.create(MODEL_KIND, name, {"metadata": {"name": MODEL}, "spec": {"displayName": "bench model"}})
        return name

    def read(self, kind: Kind, namespace: str, name: str) -> dict[str, Any]:
        found = self.get(kind, namespace, name)
        assert found is not None, f"{kind.plural}/{name} is gone"
        return found

    def patch_status(self, kind: Kind, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object_status(
            kind.group, kind.version, namespace, kind.plural, name, {"status": status}, _content_type=MERGE
        )

    def deployment(self, namespace: str, name: str, replicas: int, adapters: list[str]) -> None:
        self.create(
            MODEL_DEPLOYMENT,
            namespace,
            {
                "metadata": {"name": name},
                "spec": {"model": MODEL, "replicas": replicas, "loraAdapters": adapters},
            },
        )

    def pods(self, namespace: str, deployment: str) -> list[str]:
        return [
            p["metadata"]["name"]
            for p in self.workload.pods(namespace, f"{MODEL_DEPLOYMENT_LABEL}={deployment}")
        ]

    # -- storage ---------------------------------------------------------------------------------
    def adapter_dir(self, namespace: str, name: str) -> str:
        return f"/loraadapters/{namespace}/{MODEL}/{name}/"

    def adapter_files(self, namespace: str, name: str, rank: int = 16) -> dict[str, bytes]:
        """The two files of an adapter, by path."""
        base = self.adapter_dir(namespace, name)
        return {
            base + "adapter_config.json": json.dumps({"peft_type": "LORA", "r": rank}).encode(),
            base + "adapter_model.safetensors": b"weights",
        }

    def put_files(self, namespace: str, name: str, rank: int = 16) -> dict[str, str]:
        """The two files of an adapter, stored in the real filer (its webhook reaches no ingest
        here: nothing is subscribed); returns their MD5s by path (`spec.integrity.md5`)."""
        files = self.adapter_files(namespace, name, rank)
        for path, content in files.items():
            self.upload(path, content)
        return {path: _md5(content) for path, content in files.items()}

    def spec(self, md5s: dict[str, str]) -> dict[str, Any]:
        return {"model": MODEL, "integrity": {"md5": md5s}}

    def ready_adapter(self, namespace: str, name: str) -> None:
        """A vllm adapter whose files are in storage and verified (Ready=True), not yet loaded:
        its status as stat and verify leave it (the files' sizes and MD5s included)."""
        files = self.adapter_files(namespace, name)
        for path, content in files.items():
            self.upload(path, content)
        self.create(VLLM_ADAPTER, namespace, {"metadata": {"name": name}, "spec": {"model": MODEL}})
        self.patch_status(
            VLLM_ADAPTER,
            namespace,
            name,
            {
                "observedGeneration": 1,
                "conditions": [ready_condition()],
                "storageRef": {"path": self.adapter_dir(namespace, name)},
                "integrity": {
                    "files": {
                        path: {"md5": _md5(content), "size": len(content)} for path, content in files.items()
                    }
                },
            },
        )

    # -- events ----------------------------------------------------------------------------------


def _md5(content: bytes) -> str:
    return hashlib.md5(content, usedforsecurity=False).hexdigest()


# The testbed's event builders, as module functions for the benchmarks' brevity.
event = Testbed.event
adapter_data = Testbed.adapter_data
apiserver_event = Testbed.apiserver_event


def reply_of(response: httpx.Response) -> CloudEvent | None:
    if response.status_code != 200 or "ce-type" not in response.headers:
        return None
    return from_http(dict(response.headers), response.content)


@contextlib.contextmanager
def world(functions: bool = True, **engine_defaults: Any) -> Iterator[World]:
    """Start the stand-ins (and the functions unless `functions=False`); stop them on exit."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    with (
        testbed(
            World, functions, engine_timeout=10, filer_proxy=False, kube_proxy=False, **engine_defaults
        ) as started,
        environment(K_SINK=started.sink.url),
    ):
        yield started


def engine_path(world: World, namespace: str, name: str) -> str:
    from functions.logic.paths import engine_path as to_engine

    return to_engine(str(world.mount_root), world.adapter_dir(namespace, name))


def direct_load(http: httpx.Client, url: str, name: str, path: str) -> None:
    """The one engine call a load needs, made directly (vLLM route)."""
    response = http.post(url + "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path})
    response.raise_for_status()


class Router:
    """The Broker's routing without the Broker: deliver an event to `function` (else by the
    Triggers), then every reply by the Triggers, synchronously and breadth first.
    The Triggers are those the API server holds, read once (as Knative's broker reads them):
    rendering the manifests again (`kubectl kustomize`) takes seconds on this machine."""

    def __init__(self, world: World) -> None:
        self.world = world
        docs = [
            item
            for plural in ("brokers", "triggers")
            for item in world.custom.list_namespaced_custom_object(
                "eventing.knative.dev", "v1", "loraflow", plural
            )["items"]
        ]
        self.triggers: list[Trigger] = load_triggers(docs)
        self.failed: list[tuple[str, str, int]] = []
        """(function, event type, status) of every delivery not answered 200/204."""

    def destinations(self, event: CloudEvent) -> list[str]:
        found: list[str] = []
        for trigger in self.triggers:
            name = (subscriber_service(trigger.subscriber) or "").removeprefix("loraflow-")
            if name in self.world.host.urls and trigger.matches(event.get_attributes()) and name not in found:
                found.append(name)
        return found

    def deliver(self, first: CloudEvent, function: str | None = None) -> list[tuple[str, str, int]]:
        """Deliver until nothing is left; (function, event type, HTTP status) per delivery."""
        queue: list[tuple[str | None, CloudEvent]] = [(function, first)]
        delivered: list[tuple[str, str, int]] = []
        while queue:
            target, current = queue.pop(0)
            for name in [target] if target is not None else self.destinations(current):
                response = self.world.post(name, current)
                delivered.append((name, current["type"], response.status_code))
                if response.status_code not in (200, 204):
                    self.failed.append(delivered[-1])
                reply = reply_of(response)
                if reply is not None:
                    queue.append((None, reply))
        return delivered


def route(world: World, first: CloudEvent, function: str | None = None) -> list[tuple[str, str, int]]:
    """One event routed until nothing is left: (function, event type, HTTP status) per delivery."""
    return Router(world).deliver(first, function)


def spawn(
    target: str,
    source: Path,
    port: int,
    extra_env: dict[str, str] | None = None,
    python: str | None = None,
) -> Any:
    """`functions-framework --target <target>` in its own process (as in the container), run by
    `python` (default: this interpreter)."""
    return launch(target, source, port, python=python, env={**os.environ, **(extra_env or {})})


@contextlib.contextmanager
def function_process(name: str) -> Iterator[str]:
    """`name` served by functions-framework in its own process, as one Knative Service's pod
    is in a cluster (its Python does not share a GIL with the stand-ins); configured by the
    environment `world()` set. Yields its URL; the process is stopped on exit."""
    port = free_port()
    process = spawn(name, ROOT / "main.py", port)
    url = f"http://127.0.0.1:{port}/"

    def answers(http: httpx.Client) -> bool:
        try:
            return http.get(url + "healthz").status_code == 200
        except httpx.TransportError:
            return False

    try:
        with httpx.Client(timeout=5) as http:
            eventually(lambda: answers(http), 60, what=f"{name} answers /healthz", interval=0.01)
        yield url
    finally:
        process.send_signal(signal.SIGINT)  # the server stops as on SIGTERM
        process.wait(10)


def post_to(http: httpx.Client, url: str, event: CloudEvent) -> httpx.Response:
    headers, body = to_binary(event)
    return http.post(url, headers=headers, content=body)


def first_answer(http: httpx.Client, url: str, event: CloudEvent, timeout: float = 30.0) -> httpx.Response:
    """Post `event` until the server accepts the connection; the first answer."""
    headers, body = to_binary(event)
    deadline = time.monotonic() + timeout
    while True:
        try:
            return http.post(url, headers=headers, content=body)
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.002)


def _hwm_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def peak_rss_mib(pid: int) -> float:
    """Largest VmHWM (peak resident set), MiB, of a live process and its descendants.

    The function's server (functions/edge/server.py) handles requests in a forked worker, whose
    peak is the one that matters (the parent's alone stays at its start-up size)."""
    peaks = [_hwm_mib(p) for p in [pid, *descendants(pid)]]
    finite = [p for p in peaks if p == p]
    return max(finite) if finite else float("nan")

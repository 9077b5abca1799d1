"""Workload stand-in: what other operators do in a cluster, turning targets into Pods.

For every ModelDeployment and InferenceService it keeps `spec.replicas` Pod objects in the
real API server and as many engine replicas of the right runtime, each on its own
127.0.0.x address (the Pod's `status.podIP`) with a container port named `http`:
- scaling adds or removes both (ReplicaSet semantics: new pods get new names and addresses);
- an engine restart flips the Pod to not Ready, bumps `restartCount`, and back to Ready once
  the engine answers /health (kubelet readiness probe semantics);
- a deleted Pod is replaced by a new one (new name, new address).
`sync()` reconciles once (tests call it for determinism); `run()` reconciles on every watch
event in a background thread and, each second, stops the engines whose Pod is gone (the embedded stack).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from kubernetes import client, watch

from devstack.standins.engines import EngineFleet, EngineReplica
from devstack.standins.engines.args import EngineArgsError, replica_settings
from devstack.standins.engines.base import MountCache
from functions.resources.kinds import (
    INFERENCE_SERVICE,
    INFERENCE_SERVICE_LABEL,
    MODEL_DEPLOYMENT,
    MODEL_DEPLOYMENT_LABEL,
    RUNTIME_LABEL,
    SERVING_LABEL,
    Kind,
)

IMAGES = {"vllm": "vllm/vllm-openai:v0.11.0", "sglang": "lmsysorg/sglang:v0.5.3"}
OWNER_LABELS = {
    MODEL_DEPLOYMENT.kind: MODEL_DEPLOYMENT_LABEL,
    INFERENCE_SERVICE.kind: INFERENCE_SERVICE_LABEL,
}


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_body(kind: Kind, target: dict[str, Any], name: str, replica: EngineReplica) -> dict[str, Any]:
    """The Pod a target's controller creates for one engine replica (labels, owner, port)."""
    meta, spec = target["metadata"], target.get("spec") or {}
    runtime = "sglang" if kind is INFERENCE_SERVICE and spec.get("runtime") == "sglang" else "vllm"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "labels": {OWNER_LABELS[kind.kind]: meta["name"], RUNTIME_LABEL: runtime, SERVING_LABEL: "true"},
            "ownerReferences": [
                {
                    "apiVersion": kind.api_version,
                    "kind": kind.kind,
                    "name": meta["name"],
                    "uid": meta.get("uid", ""),
                    "controller": True,
                }
            ],
        },
        "spec": {
            "containers": [
                {
                    "name": "engine",
                    "image": IMAGES[runtime],
                    "ports": [{"name": "http", "containerPort": replica.port}],
                    **({"args": [str(a) for a in spec["engineArgs"]]} if spec.get("engineArgs") else {}),
                }
            ]
        },
    }


def pod_status(replica: EngineReplica, ready: bool, restarts: int) -> dict[str, Any]:
    """What the kubelet reports for the replica's Pod (its address, readiness, restarts)."""
    flag = "True" if ready else "False"
    return {
        "phase": "Running",
        "podIP": replica.host,
        "podIPs": [{"ip": replica.host}],
        "startTime": _now(),
        "conditions": [
            {"type": "Ready", "status": flag, "lastTransitionTime": _now()},
            {"type": "ContainersReady", "status": flag, "lastTransitionTime": _now()},
        ],
        "containerStatuses": [
            {
                "name": "engine",
                "ready": ready,
                "restartCount": restarts,
                "image": "engine",
                "imageID": "",
                "started": ready,
                "state": {"running": {"startedAt": _now()}},
            }
        ],
    }


def engine_settings(runtime: str, args: object) -> dict[str, Any]:
    """The replica settings a target's `spec.engineArgs` set (its capacity); arguments the
    engine would refuse are left out (loraflow reads the same arguments and says so)."""
    if not isinstance(args, list):
        return {}
    try:
        return replica_settings(runtime, [str(a) for a in args])
    except EngineArgsError:
        return {}


class Workload:
    def __init__(
        self,
        api: client.ApiClient,
        mount_root: Path,
        fleet: EngineFleet | None = None,
        namespace_prefix: str = "",
        **engine_defaults: Any,
    ) -> None:
        """`namespace_prefix`: run only the targets of namespaces so named; a test tier that
        shares its control plane with another keeps to its own namespaces, as tenants do."""
        self._custom = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)
        # Port 0: every replica has its own address already; an ephemeral port keeps parallel
        # test processes from colliding on 127.0.0.x:8000.
        self.fleet = fleet if fleet is not None else EngineFleet(port=0)
        self.mount_root = mount_root
        self.engine_defaults = engine_defaults
        self.namespace_prefix = namespace_prefix
        self.mount = MountCache()
        """The SeaweedFS mount of this node, which every engine here reads through."""
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- reconcile -----------------------------------------------------------------------------
    def sync(self) -> None:
        """Make Pods and engines match every target's spec.replicas, once."""
        with self._lock:
            for kind in (MODEL_DEPLOYMENT, INFERENCE_SERVICE):
                targets = self._custom.list_cluster_custom_object(kind.group, kind.version, kind.plural)
                for target in targets.get("items") or []:
                    if target["metadata"]["namespace"].startswith(self.namespace_prefix):
                        self._sync_target(kind, target)
            self._drop_orphans()

    def _sync_target(self, kind: Kind, target: dict[str, Any]) -> None:
        meta, spec = target["metadata"], target.get("spec") or {}
        label = OWNER_LABELS[kind.kind]
        pods = self._pods(meta["namespace"], f"{label}={meta['name']}")
        alive = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        wanted = int(spec.get("replicas", 1))
        for _ in range(wanted - len(alive)):
            self._create_pod(kind, target)
        for pod in sorted(alive, key=lambda p: p["metadata"]["name"])[wanted:]:
            self.delete_pod(pod["metadata"]["namespace"], pod["metadata"]["name"])

    def _drop_orphans(self) -> None:
        """Stop engines whose Pod is gone (deleted by someone else), so the next sync replaces them.
        One list of the Pods, not a read per engine: sync runs on every watch window, and the
        API server's CPU is shared with every other stand-in here."""
        keys = [key for key, _ in self.fleet.items()]
        if not keys:
            return
        response = self._core.list_pod_for_all_namespaces(_preload_content=False)
        pods = json.loads(response.data).get("items") or []
        present = {f"{p['metadata'].get('namespace', '')}/{p['metadata']['name']}" for p in pods}
        for key in keys:
            if key not in present:
                self.fleet.remove(key)

    def _create_pod(self, kind: Kind, target: dict[str, Any]) -> None:
        meta, spec = target["metadata"], target.get("spec") or {}
        runtime: Literal["vllm", "sglang"] = (
            "sglang" if kind is INFERENCE_SERVICE and spec.get("runtime") == "sglang" else "vllm"
        )
        name = f"{meta['name']}-{secrets.token_hex(3)}"
        namespace = meta["namespace"]
        replica = self.fleet.create(
            f"{namespace}/{name}",
            runtime,
            served_model=spec.get("model") or meta["name"],
            mount_root=self.mount_root,
            filer_cache=self.mount,
            **{**self.engine_defaults, **engine_settings(runtime, spec.get("engineArgs"))},
        )
        self._core.create_namespaced_pod(namespace, pod_body(kind, target, name, replica))
        self._set_pod_status(namespace, name, replica, ready=True, restarts=0)

    def _set_pod_status(
        self, namespace: str, name: str, replica: EngineReplica, ready: bool, restarts: int
    ) -> None:
        self._core.patch_namespaced_pod_status(
            name, namespace, {"status": pod_status(replica, ready, restarts)}
        )

    # -- operations tests and demos drive -----------------------------------------------------------
    def replica(self, namespace: str, pod: str) -> EngineReplica:
        return self.fleet[f"{namespace}/{pod}"]

    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return self._pods(namespace, selector)

    def restart(self, namespace: str, pod: str, unhealthy_for_s: float = 0.2, wait: bool = True) -> None:
        """Engine restart: Pod not Ready, restartCount + 1, Ready again once /health answers.
        KeyError when the Pod is gone (scaled away); gone while restarting, it is let go."""
        replica = self.replica(namespace, pod)
        try:
            current = self._core.read_namespaced_pod(pod, namespace)
            restarts = sum(c.restart_count for c in current.status.container_statuses or []) + 1
            self._set_pod_status(namespace, pod, replica, ready=False, restarts=restarts)
        except client.ApiException as err:
            if err.status == 404:  # scaled away, its engine not stopped yet: as if already gone
                raise KeyError(f"{namespace}/{pod}") from err
            raise
        replica.restart(unhealthy_for_s=unhealthy_for_s)
        if wait:
            self._await_ready(namespace, pod, replica, restarts)
        else:
            threading.Thread(
                target=self._await_ready,
                args=(namespace, pod, replica, restarts),
                name=f"ready-{namespace}/{pod}",
                daemon=True,
            ).start()

    def _await_ready(self, namespace: str, pod: str, replica: EngineReplica, restarts: int) -> None:
        deadline = time.monotonic() + 10
        key = f"{namespace}/{pod}"
        while not replica.healthy and key in self.fleet and time.monotonic() < deadline:
            time.sleep(0.01)
        if key not in self.fleet:
            return  # its Pod went meanwhile and its engine stopped
        try:
            self._set_pod_status(namespace, pod, replica, ready=True, restarts=restarts)
        except client.ApiException as err:
            if err.status != 404:  # 404: deleted meanwhile (scaled down), no status to report
                raise

    def delete_pod(self, namespace: str, pod: str) -> None:
        with contextlib.suppress(client.ApiException):
            self._core.delete_namespaced_pod(pod, namespace)
        self.fleet.remove(f"{namespace}/{pod}")

    def _pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        response = self._core.list_namespaced_pod(namespace, label_selector=selector, _preload_content=False)
        items: list[dict[str, Any]] = json.loads(response.data).get("items") or []
        return items

    # -- background mode -------------------------------------------------------------------------
    def run(self) -> None:
        """Reconcile on every change of a target or a Pod, until stop()."""
        for kind in (MODEL_DEPLOYMENT, INFERENCE_SERVICE):
            thread = threading.Thread(
                target=self._watch, args=(kind,), daemon=True, name=f"workload-{kind.plural}"
            )
            thread.start()
            self._threads.append(thread)
        reaper = threading.Thread(target=self._reap, daemon=True, name="workload-pods")
        reaper.start()
        self._threads.append(reaper)

    def _reap(self) -> None:
        """Stop the engines whose Pod went without its target changing (the namespace controller
        or the garbage collector deleting it), as a kubelet stops the containers of a Pod that is gone."""
        while not self._stop.wait(1.0):
            with contextlib.suppress(Exception), self._lock:
                self._drop_orphans()

    def _watch(self, kind: Kind) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                for _ in self._events(kind):
                    if self._stop.is_set():
                        return
                    self.sync()
            self._stop.wait(0.2)

    def _events(self, kind: Kind) -> Iterator[Any]:
        stream = watch.Watch().stream(
            self._custom.list_cluster_custom_object, kind.group, kind.version, kind.plural, timeout_seconds=1
        )
        yield from stream

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=3)
        self.fleet.stop_all()

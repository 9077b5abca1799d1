"""The convergence suite's scenarios on the embedded stack: a namespace per scenario (`Env`), a
lifecycle of both kinds, the broker's figures (`Meter`), and the wait for the invariant to hold
once the faults are off (`quiesce_and_check`). Used by tests/reliability (and its conftest)."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from devstack.stack import Stack
from functions.resources.kinds import (
    INFERENCE_SERVICE,
    INFERENCE_SERVICE_LABEL,
    MODEL,
    MODEL_DEPLOYMENT,
    MODEL_DEPLOYMENT_LABEL,
    SGLANG_ADAPTER,
    VLLM_ADAPTER,
)
from tests.support import invariant
from tests.support.cluster import Cluster
from tests.support.wait import eventually

PING_PERIOD_S = 1.0
RESULTS = Path(__file__).resolve().parents[1] / "reliability" / "results.json"
SCRATCH_RESULTS = Path(__file__).resolve().parents[2] / ".devstack" / "reliability-results.json"


def md5_hex(content: bytes) -> str:
    return hashlib.md5(content, usedforsecurity=False).hexdigest()


def adapter_config(rank: int = 8) -> bytes:
    return json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank}).encode()


@dataclass
class Env:
    """One namespace of the stack and what a user does in it (both kinds)."""

    stack: Stack
    namespace: str
    cluster: Cluster
    model: str = "llama"
    files: dict[str, dict[str, bytes]] = field(default_factory=dict)

    @classmethod
    def new(cls, stack: Stack, prefix: str = "rel") -> Env:
        namespace = f"{prefix}-{secrets.token_hex(3)}"
        stack.core.create_namespace({"metadata": {"name": namespace}})
        env = cls(stack, namespace, Cluster(stack, namespace))
        env.cluster.create(MODEL, env.model, {"displayName": "Llama"})
        return env

    # -- targets ---------------------------------------------------------------------------------
    def deployment(
        self, name: str, replicas: int, adapters: list[str], engine_args: list[str] | None = None
    ) -> None:
        spec: dict[str, Any] = {"model": self.model, "replicas": replicas, "loraAdapters": adapters}
        if engine_args:
            spec["engineArgs"] = engine_args
        self.cluster.create(MODEL_DEPLOYMENT, name, spec)

    def service(self, name: str, replicas: int, engine_args: list[str] | None = None) -> None:
        spec: dict[str, Any] = {"runtime": "sglang", "model": "qwen", "replicas": replicas}
        if engine_args:
            spec["engineArgs"] = engine_args
        self.cluster.create(INFERENCE_SERVICE, name, spec)

    def md_pods(self, name: str) -> list[dict[str, Any]]:
        return self.cluster.pods(f"{MODEL_DEPLOYMENT_LABEL}={name}")

    def isvc_pods(self, name: str) -> list[dict[str, Any]]:
        return self.cluster.pods(f"{INFERENCE_SERVICE_LABEL}={name}")

    def wait_pods(self, md: dict[str, int] | None = None, isvc: dict[str, int] | None = None) -> None:
        for name, count in (md or {}).items():
            eventually(partial(self._counted, self.md_pods, name, count), 30, what=f"{name}: {count} pods")
        for name, count in (isvc or {}).items():
            eventually(partial(self._counted, self.isvc_pods, name, count), 30, what=f"{name}: {count} pods")

    @staticmethod
    def _counted(pods: Callable[[str], list[dict[str, Any]]], name: str, count: int) -> bool:
        return len(pods(name)) == count

    # -- adapters --------------------------------------------------------------------------------
    def directory(self, name: str) -> str:
        return f"/loraadapters/{self.namespace}/{self.model}/{name}/"

    def vllm(self, name: str, upload: bool = True, corrupt: bool = False) -> None:
        files = {"adapter_config.json": adapter_config(), "adapter_model.safetensors": os.urandom(512)}
        self.files[name] = files
        declared = {self.directory(name) + f: md5_hex(c) for f, c in files.items()}
        if corrupt:
            declared[self.directory(name) + "adapter_model.safetensors"] = "0" * 32
        self.cluster.create(VLLM_ADAPTER, name, {"model": self.model, "integrity": {"md5": declared}})
        if upload:
            self.upload(name)

    def upload(self, name: str) -> None:
        for file, content in self.files[name].items():
            self.cluster.upload(self.directory(name) + file, content)

    def sglang(self, name: str, isvc: str) -> None:
        # spec.path is inside the SGLang pods, which see the storage through a SeaweedFS mount
        storage = f"/sglang/{self.namespace}/{name}"
        self.cluster.upload(f"{storage}/adapter_config.json", adapter_config())
        self.cluster.upload(f"{storage}/adapter_model.safetensors", os.urandom(256))
        directory = f"{self.stack.mount_root}{storage}"
        self.cluster.create(
            SGLANG_ADAPTER,
            name,
            {"name": f"{name}-v1", "path": str(directory), "inferenceServiceRef": {"name": isvc}},
        )

    def check(self) -> list[invariant.Violation]:
        return invariant.check(self.stack, [self.namespace])


def stop_faults(stack: Stack) -> None:
    """Every injected fault off: broker deliveries, Kubernetes API, filer, engines."""
    stack.broker.set_faults(None)
    stack.kube.clear_faults()
    stack.filer.clear_faults()
    for _, replica in stack.workload.fleet.items():
        replica.clear_faults()


def ping_seq(stack: Stack) -> int:
    """Sequence number of the latest ping the broker delivered to resync (0: none yet)."""
    seqs = [
        e["seq"]
        for e in stack.broker.log.since(0)
        if e["type"] == "dev.knative.sources.ping" and e["outcome"] == "delivered"
    ]
    return max(seqs, default=0)


def await_resync(stack: Stack, timeout: float = 15.0) -> None:
    """Wait for a resync tick delivered after now, then for the broker to be idle again."""
    before = ping_seq(stack)
    deadline = time.monotonic() + timeout
    while ping_seq(stack) <= before and time.monotonic() < deadline:
        time.sleep(0.05)
    stack.settle(timeout=max(1.0, deadline - time.monotonic()), quiet=0.3)


def quiesce_and_check(
    stack: Stack, namespaces: list[str] | None = None, rounds: int = 4
) -> tuple[list[invariant.Violation], int]:
    """Faults off, broker idle, then up to `rounds` resync ticks until the invariant holds.

    Returns (violations after the last round, resync ticks it took). A drop or a failure the
    functions answered 5xx to is repaired by redelivery or by the next tick; several ticks are
    allowed because one repair can reveal the next step (admit -> stat -> verify -> load)."""
    stop_faults(stack)
    stack.settle(timeout=30, quiet=0.5)
    violations = invariant.check(stack, namespaces)
    ticks = 0
    while violations and ticks < rounds:
        await_resync(stack)
        ticks += 1
        violations = invariant.check(stack, namespaces)
    return violations, ticks


def broker_figures(stack: Stack) -> dict[str, int]:
    stats = stack.broker.stats()
    log = stack.broker.log.since(0)
    deliveries = [e for e in log if e["outcome"] == "delivered"]
    seen: dict[tuple[str, str], int] = {}
    for e in deliveries:
        key = (e["id"], str(e.get("trigger")))
        seen[key] = seen.get(key, 0) + 1
    return {
        "events": int(stats["received"]),
        "deliveries": int(stats["delivered"]),
        "duplicates": sum(n - 1 for n in seen.values()),
        "drops": int(stats["dropped"]),
        "retries": int(stats["retried"]),
        "dead_lettered": int(stats["dead_lettered"]),
    }


def record_result(name: str, figures: dict[str, Any]) -> None:
    """Merge one scenario's figures into the results file.

    The committed tests/reliability/results.json (the README's source) is rewritten only when
    LORAFLOW_RECORD_RESULTS=1 (`make reliability`); a plain `make test` writes the git-ignored
    copy under .devstack/, so running the suite never dirties the tree.
    """
    path = RESULTS if os.environ.get("LORAFLOW_RECORD_RESULTS") == "1" else SCRATCH_RESULTS
    path.parent.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {}
    if path.exists():
        try:
            data = json.loads(path.read_text())
        except ValueError:
            data = {}
    data[name] = figures
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


@dataclass
class Meter:
    """Broker figures of one scenario: deltas from when it was created."""

    stack: Stack
    start: dict[str, int] = field(default_factory=dict)
    seq: int = 0

    def __post_init__(self) -> None:
        self.start = dict(self.stack.broker.stats())
        entries = self.stack.broker.log.since(0)
        self.seq = entries[-1]["seq"] if entries else 0

    def figures(self) -> dict[str, int]:
        stats = self.stack.broker.stats()
        delta = {
            k: int(stats[k]) - int(self.start.get(k, 0))
            for k in ("received", "delivered", "dropped", "retried", "dead_lettered")
        }
        seen: dict[tuple[str, str], int] = {}
        for entry in self.stack.broker.log.since(self.seq):
            if entry["outcome"] == "delivered":
                key = (str(entry["id"]), str(entry.get("trigger")))
                seen[key] = seen.get(key, 0) + 1
        return {
            "events": delta["received"],
            "deliveries": delta["delivered"],
            "duplicates": sum(n - 1 for n in seen.values()),
            "drops": delta["dropped"],
            "retries": delta["retried"],
            "dead_lettered": delta["dead_lettered"],
        }


def lifecycle(env: Env, pace: float = 0.4, on_pods: Callable[[], None] | None = None) -> int:
    """Both kinds through a whole lifecycle without waiting for convergence in between (the
    steps overlap whatever the faults do). Returns the number of user operations."""
    ops = 0

    def step(action: Callable[[], None]) -> None:
        nonlocal ops
        action()
        ops += 1
        time.sleep(pace)

    step(lambda: env.deployment("d1", 2, ["a1", "a2", "bad"]))
    step(lambda: env.service("svc", 2))
    env.wait_pods(md={"d1": 2}, isvc={"svc": 2})
    if on_pods is not None:
        on_pods()
    step(lambda: env.vllm("a1"))
    step(lambda: env.vllm("a2"))
    step(lambda: env.vllm("bad", corrupt=True))
    step(lambda: env.sglang("s1", "svc"))
    step(lambda: env.sglang("s2", "svc"))
    pod = env.md_pods("d1")[0]["metadata"]["name"]
    step(lambda: env.stack.workload.restart(env.namespace, pod, wait=False))
    step(lambda: env.cluster.patch(MODEL_DEPLOYMENT, "d1", {"spec": {"replicas": 3}}))
    step(lambda: env.cluster.patch(MODEL_DEPLOYMENT, "d1", {"spec": {"loraAdapters": ["a1", "bad", "a3"]}}))
    step(lambda: env.vllm("a3"))
    step(lambda: env.cluster.delete(VLLM_ADAPTER, "a2"))
    step(lambda: env.cluster.delete(SGLANG_ADAPTER, "s2"))
    spod = env.isvc_pods("svc")[0]["metadata"]["name"]
    step(lambda: env.stack.workload.restart(env.namespace, spod, wait=False))
    step(lambda: env.cluster.patch(INFERENCE_SERVICE, "svc", {"spec": {"replicas": 3}}))
    return ops

"""Reliability suite: re-uses the functions harness (`world`) and records RBAC denials.

The Kubernetes stand-in answers 403 to a request its RBAC rules refuse but keeps no record of
it, so the authorizer is wrapped here (at collection time, before any server starts) to note
every denial; `test_rbac_used` asserts the functions' ServiceAccount was never refused.
"""

from __future__ import annotations

import threading
from typing import NamedTuple

from devstack.kube.errors import ApiError
from devstack.kube.rbac import Attributes, Authorizer, User
from tests.functions.conftest import world  # noqa: F401


class Denial(NamedTuple):
    user: str
    verb: str
    group: str
    resource: str
    subresource: str
    namespace: str


DENIALS: list[Denial] = []
_LOCK = threading.Lock()
_ORIGINAL = Authorizer.authorize


def _recording_authorize(self: Authorizer, user: User, attrs: Attributes) -> None:
    try:
        _ORIGINAL(self, user, attrs)
    except ApiError:
        with _LOCK:
            DENIALS.append(
                Denial(user.name, attrs.verb, attrs.group, attrs.resource, attrs.subresource, attrs.namespace)
            )
        raise


if getattr(Authorizer.authorize, "__name__", "") != _recording_authorize.__name__:
    Authorizer.authorize = _recording_authorize  # type: ignore[method-assign]


# -- the embedded stack, for the convergence suite ------------------------------------------------
# (invariant.py, test_invariant.py, test_delivery_faults.py, test_infra_faults.py,
# test_chaos_soak.py, test_resync_scale.py)
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import secrets  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402

from devstack.broker import Faults as DeliveryFaults  # noqa: E402
from devstack.demo import Cluster  # noqa: E402
from devstack.stack import Stack  # noqa: E402
from functions.resources.kinds import (  # noqa: E402
    INFERENCE_SERVICE,
    INFERENCE_SERVICE_LABEL,
    MODEL,
    MODEL_DEPLOYMENT,
    MODEL_DEPLOYMENT_LABEL,
    SGLANG_ADAPTER,
    VLLM_ADAPTER,
)
from tests.reliability import invariant  # noqa: E402

PING_PERIOD_S = 1.0
RESULTS = Path(__file__).with_name("results.json")
SCRATCH_RESULTS = Path(__file__).resolve().parents[2] / ".devstack" / "reliability-results.json"


def md5_hex(content: bytes) -> str:
    return hashlib.md5(content, usedforsecurity=False).hexdigest()


def adapter_config(rank: int = 8) -> bytes:
    return json.dumps({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank}).encode()


@pytest.fixture(scope="module")
def rstack() -> Iterator[Stack]:
    """One embedded stack per module: a fast resync tick, fast broker backoffs."""
    with Stack(ping_period=PING_PERIOD_S, time_scale=0.05) as running:
        yield running


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
    def deployment(self, name: str, replicas: int, adapters: list[str]) -> None:
        self.cluster.create(
            MODEL_DEPLOYMENT, name, {"model": self.model, "replicas": replicas, "loraAdapters": adapters}
        )

    def service(self, name: str, replicas: int) -> None:
        self.cluster.create(
            INFERENCE_SERVICE, name, {"runtime": "sglang", "model": "qwen", "replicas": replicas}
        )

    def md_pods(self, name: str) -> list[dict[str, Any]]:
        return self.cluster.pods(f"{MODEL_DEPLOYMENT_LABEL}={name}")

    def isvc_pods(self, name: str) -> list[dict[str, Any]]:
        return self.cluster.pods(f"{INFERENCE_SERVICE_LABEL}={name}")

    def wait_pods(self, md: dict[str, int] | None = None, isvc: dict[str, int] | None = None) -> None:
        for name, count in (md or {}).items():
            eventually(lambda n=name, c=count: len(self.md_pods(n)) == c, what=f"{name}: {count} pods")
        for name, count in (isvc or {}).items():
            eventually(lambda n=name, c=count: len(self.isvc_pods(n)) == c, what=f"{name}: {count} pods")

    # -- adapters --------------------------------------------------------------------------------
    def directory(self, name: str) -> str:
        return f"/loraadapters/{self.namespace}/{self.model}/{name}/"

    def seed1(self, name: str, upload: bool = True, corrupt: bool = False) -> None:
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

    def seed2(self, name: str, isvc: str) -> None:
        directory = self.stack.mount_root / "sglang" / self.namespace / name
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "adapter_config.json").write_bytes(adapter_config())
        (directory / "adapter_model.safetensors").write_bytes(os.urandom(256))
        self.cluster.create(
            SGLANG_ADAPTER,
            name,
            {"name": f"{name}-v1", "path": str(directory), "inferenceServiceRef": {"name": isvc}},
        )

    def check(self) -> list[invariant.Violation]:
        return invariant.check(self.stack, [self.namespace])


def eventually(check: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not reached within {timeout:.0f}s")
        time.sleep(0.1)


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


__all__ = ["DeliveryFaults", "Env", "eventually", "quiesce_and_check", "record_result", "stop_faults"]


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
    step(lambda: env.seed1("a1"))
    step(lambda: env.seed1("a2"))
    step(lambda: env.seed1("bad", corrupt=True))
    step(lambda: env.seed2("s1", "svc"))
    step(lambda: env.seed2("s2", "svc"))
    pod = env.md_pods("d1")[0]["metadata"]["name"]
    step(lambda: env.stack.workload.restart(env.namespace, pod, wait=False))
    step(lambda: env.cluster.patch(MODEL_DEPLOYMENT, "d1", {"spec": {"replicas": 3}}))
    step(lambda: env.cluster.patch(MODEL_DEPLOYMENT, "d1", {"spec": {"loraAdapters": ["a1", "bad", "a3"]}}))
    step(lambda: env.seed1("a3"))
    step(lambda: env.cluster.delete(VLLM_ADAPTER, "a2"))
    step(lambda: env.cluster.delete(SGLANG_ADAPTER, "s2"))
    spod = env.isvc_pods("svc")[0]["metadata"]["name"]
    step(lambda: env.stack.workload.restart(env.namespace, spod, wait=False))
    step(lambda: env.cluster.patch(INFERENCE_SERVICE, "svc", {"spec": {"replicas": 3}}))
    return ops

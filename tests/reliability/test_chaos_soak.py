"""A bounded chaos soak: random user operations and random faults, with a fixed seed.

Runs for LORAFLOW_SOAK_SECONDS (default 60; `make soak` runs 600). The engines' capacities are
smaller than what their targets are asked to serve (SGLang `--max-loaded-loras`, vLLM
`--max-cpu-loras`), so the invariant's capacity rules (over-capacity, evicted, load-evict-loop)
are checked while capacity binds. Faults come in episodes
(broker duplicates/reordering/drops, Kubernetes API 409/500, engine 500/slow/refused/restart
mid-load, filer 503/slow); every CHECKPOINT_S seconds the faults stop, the system is allowed to
quiesce (broker idle + resync ticks) and the convergence invariant is checked. Prints one
summary line; every violation found at any checkpoint fails the test.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from typing import Any

from devstack.eventing.broker import Faults
from devstack.stack import Stack
from functions.logic import reasons
from functions.resources.kinds import (
    INFERENCE_SERVICE,
    MODEL_DEPLOYMENT,
    SGLANG_ADAPTER,
    VLLM_ADAPTER,
    Kind,
)
from tests.support import invariant
from tests.support.convergence import Env, Meter, quiesce_and_check, record_result

SEED = 20261130
CHECKPOINT_S = 15.0
MAX_ADAPTERS = 8
SGLANG_SLOTS = 2
"""`--max-loaded-loras` of the soak's InferenceService: up to MAX_ADAPTERS SGLang adapters target it."""
SGLANG_ARGS = ["--max-loaded-loras", str(SGLANG_SLOTS), "--max-loras-per-batch", str(SGLANG_SLOTS)]
"""SGLang refuses to start with fewer loaded adapters than batch slots (default 8)."""
VLLM_ARGS = ["--max-loras", "1", "--max-cpu-loras", "2"]
"""The deployments' vLLM: each may name up to MAX_ADAPTERS adapters, two stay resident."""


def soak_seconds() -> float:
    return float(os.environ.get("LORAFLOW_SOAK_SECONDS") or 60)


class Chaos:
    def __init__(self, stack: Stack, env: Env, rng: random.Random) -> None:
        self.stack, self.env, self.rng = stack, env, rng
        self.v1: set[str] = set()
        self.v2: set[str] = set()
        self.counter = 0
        self.operations = 0
        self.faults = 0
        self.by_op: dict[str, int] = {}

    def _name(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    # -- operations ----------------------------------------------------------------------------
    def create_vllm(self) -> None:
        if len(self.v1) >= MAX_ADAPTERS:
            return self.delete_vllm()
        name = self._name("a")
        self.env.vllm(name, corrupt=self.rng.random() < 0.15)
        self.v1.add(name)

    def delete_vllm(self) -> None:
        if self.v1:
            name = self.rng.choice(sorted(self.v1))
            self.env.cluster.delete(VLLM_ADAPTER, name)
            self.v1.discard(name)

    def create_sglang(self) -> None:
        if len(self.v2) >= MAX_ADAPTERS:
            return self.delete_sglang()
        name = self._name("s")
        self.env.sglang(name, "svc")
        self.v2.add(name)

    def delete_sglang(self) -> None:
        if self.v2:
            name = self.rng.choice(sorted(self.v2))
            self.env.cluster.delete(SGLANG_ADAPTER, name)
            self.v2.discard(name)

    def respec(self) -> None:
        md = self.rng.choice(["d1", "d2"])
        pool = [*sorted(self.v1), "never-created"]
        named = sorted(self.rng.sample(pool, self.rng.randint(0, len(pool))))
        self.env.cluster.patch(MODEL_DEPLOYMENT, md, {"spec": {"loraAdapters": named}})

    def scale(self) -> None:
        if self.rng.random() < 0.5:
            md = self.rng.choice(["d1", "d2"])
            self.env.cluster.patch(MODEL_DEPLOYMENT, md, {"spec": {"replicas": self.rng.randint(0, 3)}})
        else:
            self.env.cluster.patch(INFERENCE_SERVICE, "svc", {"spec": {"replicas": self.rng.randint(1, 3)}})

    def restart(self) -> None:
        pods = self.env.md_pods("d1") + self.env.md_pods("d2") + self.env.isvc_pods("svc")
        if pods:
            pod = self.rng.choice(pods)["metadata"]["name"]
            with contextlib.suppress(KeyError):  # scaled away meanwhile
                self.stack.workload.restart(self.env.namespace, pod, wait=False)

    # -- faults ------------------------------------------------------------------------------------
    def fault(self) -> None:
        rng, stack = self.rng, self.stack
        choice = rng.randrange(5)
        if choice == 0:
            stack.broker.set_faults(
                Faults(
                    duplicate=rng.random() < 0.5,
                    shuffle=rng.choice([0.0, 0.2, 0.5]),
                    drop=rng.choice([0.0, 0.05, 0.1]),
                    seed=rng.randrange(1 << 30),
                )
            )
        elif choice == 1:
            verb, resource, status = rng.choice(
                [
                    ("patch", "loraadapters/status", 409),
                    ("patch", "loraadapters/status", 500),
                    ("get", "loraadapters", 500),
                    ("list", "modeldeployments", 500),
                    ("patch", "loraadapters", 409),
                    ("get", "models", 504),
                ]
            )
            stack.kube.inject(status=status, times=rng.randint(1, 10), verb=verb, resource=resource)
        elif choice == 2:
            replicas = [r for k, r in stack.workload.fleet.items() if k.startswith(self.env.namespace + "/")]
            if replicas:
                replica = rng.choice(replicas)
                choices: list[dict[str, Any]] = [
                    {"status": 500, "times": 2, "routes": ["load", "unload"]},
                    {"delay_s": 1.5, "times": 1, "routes": ["load", "models"]},
                    {"refuse": True, "times": 2},
                    {"restart_mid_load": True, "times": 1},
                ]
                replica.inject(**rng.choice(choices))
        elif choice == 3:
            stack.filer.inject(status=503, times=rng.randint(1, 8), methods=("GET",))
        else:
            stack.filer.inject(delay_s=0.3, times=rng.randint(1, 5), methods=("GET",))
        self.faults += 1

    def step(self) -> None:
        ops = [
            (self.create_vllm, 4),
            (self.delete_vllm, 2),
            (self.create_sglang, 2),
            (self.delete_sglang, 1),
            (self.respec, 2),
            (self.scale, 2),
            (self.restart, 2),
            (self.fault, 3),
        ]
        action = self.rng.choices([o for o, _ in ops], weights=[w for _, w in ops])[0]
        action()
        if action != self.fault:
            self.operations += 1
            self.by_op[action.__name__] = self.by_op.get(action.__name__, 0) + 1


def capacity_bound(env: Env) -> int:
    """Adapters capacity binds on now: SGLang ones left out (EngineCapacityExceeded) plus vLLM
    pods that hold one reloadable rather than resident."""

    def items(kind: Kind) -> list[dict[str, Any]]:
        found = env.stack.custom.list_namespaced_custom_object(
            kind.group, kind.version, env.namespace, kind.plural
        )
        return list(found["items"])

    bound = 0
    for obj in items(SGLANG_ADAPTER):
        for cond in (obj.get("status") or {}).get("conditions") or []:
            if cond.get("type") == reasons.LOADED and cond.get("reason") == reasons.ENGINE_CAPACITY_EXCEEDED:
                bound += 1
    for obj in items(VLLM_ADAPTER):
        served = (obj.get("status") or {}).get("served") or []
        bound += sum(1 for s in served if s.get("residency") == "reloadable")
    return bound


def test_chaos_soak(rstack: Stack) -> None:
    rng = random.Random(SEED)
    rstack.settle()
    env = Env.new(rstack, "soak")
    env.deployment("d1", 2, [], VLLM_ARGS)
    env.deployment("d2", 1, [], VLLM_ARGS)
    env.service("svc", 2, SGLANG_ARGS)
    env.wait_pods(md={"d1": 2, "d2": 1}, isvc={"svc": 2})
    chaos = Chaos(rstack, env, rng)
    # more adapters than the engines hold from the start, so the first checkpoint already binds
    for _ in range(SGLANG_SLOTS + 1):
        chaos.create_sglang()
    for _ in range(3):
        chaos.create_vllm()
    env.cluster.patch(MODEL_DEPLOYMENT, "d1", {"spec": {"loraAdapters": sorted(chaos.v1)}})
    bound_max = 0
    meter = Meter(rstack)
    duration = soak_seconds()
    started = time.monotonic()
    checkpoints = 0
    found: list[invariant.Violation] = []
    next_check = started + CHECKPOINT_S
    while True:
        now = time.monotonic()
        done = now - started >= duration
        if now >= next_check or done:
            violations, _ = quiesce_and_check(rstack, [env.namespace])
            checkpoints += 1
            bound_max = max(bound_max, capacity_bound(env))
            found += violations
            if violations:
                print(f"\ncheckpoint {checkpoints}: {len(violations)} violation(s)")
                print(invariant.report(violations))
            next_check = time.monotonic() + CHECKPOINT_S
            if done:
                break
            continue
        chaos.step()
        time.sleep(rng.uniform(0.05, 0.4))
    figures = meter.figures()
    result = {
        "seconds": round(time.monotonic() - started, 1),
        "seed": SEED,
        "operations": chaos.operations,
        "faults_injected": chaos.faults,
        "events": figures["events"],
        "deliveries": figures["deliveries"],
        "duplicates": figures["duplicates"],
        "drops": figures["drops"],
        "retries": figures["retries"],
        "dead_lettered": figures["dead_lettered"],
        "checkpoints": checkpoints,
        "violations": len(found),
        "capacity_bound_max": bound_max,
    }
    record_result("soak" if duration <= 120 else f"soak.{int(duration)}s", result)
    print("\nchaos soak: " + ", ".join(f"{k}={v}" for k, v in result.items()) + f"; ops {chaos.by_op}")
    assert found == [], invariant.report(found)
    assert bound_max > 0, "capacity never bound at a checkpoint: the capacity rules were not exercised"

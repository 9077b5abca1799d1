"""kube-apiserver, then etcd, stopped in the middle of the flow and started again on the same
ports and data: nothing is lost.

Adapters created just before the outage have their events in flight when it starts (the
functions' reads and status writes fail, the broker redelivers); one is asked for while the
server is down (the user's create is retried, as kubectl's user would, and lands when the server
is back). A restarted kube-apiserver answers every watch resume point from before the restart
with 410 Expired, so the ApiServerSource relists without events and what it missed is the
resync's to find. When the server is back: every adapter Ready and Loaded in every pod that
should serve it, and the convergence invariant holds.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from functools import partial

import pytest
from kubernetes import client

from devstack.stack import Stack
from functions.resources.kinds import MODEL_DEPLOYMENT_LABEL, VLLM_ADAPTER
from tests.support import invariant
from tests.support.cluster import condition
from tests.support.convergence import Env, Meter, adapter_config, md5_hex, quiesce_and_check, record_result
from tests.support.wait import eventually

OUTAGE_S = 4.0
BEFORE = ("a1", "a2")
DURING = "a3"
SELECTOR = f"{MODEL_DEPLOYMENT_LABEL}=d1"


def persistently(action: Callable[[], None], deadline_s: float = 120.0) -> None:
    """Retry `action` until it goes through: a user whose kubectl fails tries again."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            action()
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def create_during_outage(env: Env, name: str) -> None:
    """Create the adapter (retried until the server takes it; an AlreadyExists means an earlier
    try went through unanswered), then upload its files."""
    env.files[name] = {"adapter_config.json": adapter_config(), "adapter_model.safetensors": os.urandom(512)}
    declared = {env.directory(name) + f: md5_hex(c) for f, c in env.files[name].items()}

    def create() -> None:
        try:
            env.cluster.create(VLLM_ADAPTER, name, {"model": env.model, "integrity": {"md5": declared}})
        except client.ApiException as err:
            if err.status != 409:
                raise

    persistently(create)
    env.upload(name)


def stop_apiserver(stack: Stack) -> Callable[[], None]:
    stack.control_plane.stop_apiserver()
    return stack.control_plane.start_apiserver


def stop_etcd(stack: Stack) -> Callable[[], None]:
    stack.control_plane.stop_etcd()
    return stack.control_plane.start_etcd


OUTAGES: dict[str, Callable[[Stack], Callable[[], None]]] = {
    "kube-apiserver": stop_apiserver,
    "etcd": stop_etcd,
}


@pytest.mark.parametrize("name", list(OUTAGES))
def test_nothing_is_lost_when_the_control_plane_returns(rstack: Stack, name: str) -> None:
    rstack.settle()
    env = Env.new(rstack, f"cp-{name[:4]}")
    env.deployment("d1", 2, [*BEFORE, DURING])
    env.wait_pods(md={"d1": 2})
    meter = Meter(rstack)
    expired = sum(s.expired for s in rstack.sources)
    started = time.monotonic()

    for adapter in BEFORE:  # their chains are under way when the server goes
        env.vllm(adapter)
    restart = OUTAGES[name](rstack)
    # the user asks for a3 while the server is down; the create lands once it is back
    during = threading.Thread(target=create_during_outage, args=(env, DURING), name="user")
    during.start()
    time.sleep(OUTAGE_S)
    restart()
    during.join(timeout=150)
    assert not during.is_alive(), f"{DURING} could not be created after the {name} outage"

    violations, ticks = quiesce_and_check(rstack, [env.namespace], rounds=8)
    for adapter in (*BEFORE, DURING):
        eventually(partial(env.cluster.loaded_in, SELECTOR, adapter, 2), 30, what=f"{adapter} in both pods")
        obj = env.cluster.get(VLLM_ADAPTER, adapter)
        assert condition(obj, "Ready").get("status") == "True", (adapter, obj and obj.get("status"))
        assert condition(obj, "Loaded").get("status") == "True", (adapter, obj and obj.get("status"))
    result = {
        **meter.figures(),
        "outage_s": OUTAGE_S,
        "source_watches_expired": sum(s.expired for s in rstack.sources) - expired,
        "resync_ticks_to_converge": ticks,
        "violations": len(violations),
        "seconds": round(time.monotonic() - started, 1),
    }
    record_result(f"control-plane.{name}", result)
    print(f"\ncontrol plane outage [{name}]: " + ", ".join(f"{k}={v}" for k, v in result.items()))
    assert violations == [], invariant.report(violations)

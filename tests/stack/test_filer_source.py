"""The embedded stack with the filer source instead of the webhook (`notifications="source"`), on
the real SeaweedFS, both backends: a file stored -> the filer's metadata log -> the source's own
process -> broker -> stat -> verify -> Ready -> loaded. The source is killed from outside by the
pid the stack reports, as a test or a person would: the stack starts it again (a kubelet's
restart) and the change written meanwhile still arrives, from the cursor in its Lease.
"""

from __future__ import annotations

import hashlib
import os
import signal
from collections.abc import Iterator

import pytest

from devstack.seaweedfs import shared
from devstack.stack import SOURCE_PROCESS, Stack
from events.domain import FILE_CHANGED
from events.external import PING
from functions.resources.kinds import MODEL_DEPLOYMENT_LABEL, VLLM_ADAPTER
from tests.support.cluster import Cluster, serving_a1
from tests.support.wait import eventually

CONFIG = b'{"peft_type": "LORA", "r": 8}'
SELECTOR = f"{MODEL_DEPLOYMENT_LABEL}=d1"


def md5(content: bytes) -> str:
    return hashlib.md5(content, usedforsecurity=False).hexdigest()


@pytest.fixture(scope="module", params=["filer", "s3"])
def stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    with Stack(
        ping_period=None, time_scale=0.1, storage=request.param, seaweed=shared(), notifications="source"
    ) as running:
        yield running


@pytest.fixture
def cluster(stack: Stack) -> Cluster:
    return serving_a1(stack, "fs")


def phase(cluster: Cluster) -> str:
    return str(((cluster.get(VLLM_ADAPTER, "a1") or {}).get("status") or {}).get("phase", ""))


def source_pid(stack: Stack) -> int | None:
    (found,) = [p for p in stack.processes() if p["name"] == SOURCE_PROCESS]
    pid: int | None = found["pid"]
    return pid


def received(stack: Stack, type_: str, under: str = "") -> list[dict[str, object]]:
    return [
        e
        for e in stack.broker.log.since(0)
        if e["type"] == type_ and e["outcome"] == "received" and str(e["subject"] or "").startswith(under)
    ]


def test_the_source_runs_as_its_component_deploys_it(stack: Stack) -> None:
    """Its own supervised process, its ServiceAccount (its Lease is all RBAC lets it touch), a
    full-resync tick at its first start, routed to resync by the component's Trigger."""
    processes = {p["name"]: p for p in stack.processes()}
    assert processes[SOURCE_PROCESS]["supervised"] and processes[SOURCE_PROCESS]["pid"]
    assert processes["devstack"]["pid"] == os.getpid()
    # the PingSource's minute tick may come first on a slow start; the source's goes to its own Trigger
    # alone (that Trigger's filter names the source, the PingSource's Trigger does not match it)
    ticks = eventually(
        lambda: [e for e in received(stack, PING) if "loraflow-resync-filer-source" in e["triggers"]],
        what="the first start's resync tick",
    )
    assert ticks[0]["triggers"] == ["loraflow-resync-filer-source"]
    assert stack.endpoints()["notifications"] == "source"


def test_files_become_ready_and_loaded_and_survive_a_killed_source(stack: Stack, cluster: Cluster) -> None:
    directory = f"/loraadapters/{cluster.namespace}/llama/a1/"
    files = {"adapter_config.json": CONFIG, "adapter_model.safetensors": os.urandom(4096)}
    cluster.create(
        VLLM_ADAPTER,
        "a1",
        {"model": "llama", "integrity": {"md5": {directory + n: md5(c) for n, c in files.items()}}},
    )
    cluster.upload(directory + "adapter_config.json", files["adapter_config.json"])
    eventually(lambda: received(stack, FILE_CHANGED, directory), what="the first file's event")
    before = source_pid(stack)
    assert before is not None
    restarts = stack.supervisor.child(SOURCE_PROCESS).restarts
    os.kill(before, signal.SIGKILL)
    cluster.upload(directory + "adapter_model.safetensors", files["adapter_model.safetensors"])
    stack.supervisor.wait_restarted(SOURCE_PROCESS, restarts + 1)
    assert source_pid(stack) not in (None, before)
    eventually(lambda: phase(cluster) == "Ready", 30, what=f"Ready (now {phase(cluster)!r})")
    eventually(lambda: cluster.loaded_in(SELECTOR, "a1", 2), 30, what="loaded in 2 pods")
    # the second file's event comes from the restarted source (stat may have seen the file first)
    wanted = {directory + name for name in files}
    eventually(lambda: {e["subject"] for e in received(stack, FILE_CHANGED, directory)} == wanted)
    assert stack.settle(timeout=30)  # the restarted source replays from its cursor first

"""stat and verify over real HTTP against the Kubernetes API and filer stand-ins."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from cloudevents.http import CloudEvent

from events.domain import (
    ADAPTER_ADMITTED,
    ADAPTER_FAILED,
    ADAPTER_READY,
    ADAPTER_STAT_COMPLETED,
    FILE_CHANGED,
)
from functions.logic.quantity import format_bytes
from functions.observability import KUBE_CONFLICTS
from functions.resources.kinds import MODEL, SGLANG_ADAPTER, VLLM_ADAPTER
from tests.support.builders import CONFIG, WEIGHTS, Flow, expected_status, md5, setup_adapter, status_of
from tests.support.testbed import Testbed

CONFIG_NAME, WEIGHTS_NAME = "adapter_config.json", "adapter_model.safetensors"


def changed(world: Testbed, path: str, event_type: str = "create") -> Any:
    return world.event(FILE_CHANGED, {"path": path, "eventType": event_type}, subject=path)


def admitted(world: Testbed, ns: str, generation: int = 1) -> Any:
    return world.event(ADAPTER_ADMITTED, world.adapter_data(VLLM_ADAPTER, ns, "a", generation=generation))


def stat_done(world: Testbed, ns: str) -> Any:
    return world.event(ADAPTER_STAT_COMPLETED, world.adapter_data(VLLM_ADAPTER, ns, "a", files=2, size="1"))


def upload_both(world: Testbed, directory: str, weights: bytes = WEIGHTS) -> None:
    world.upload(directory + CONFIG_NAME, CONFIG)
    world.upload(directory + WEIGHTS_NAME, weights)


def ready_condition(world: Testbed, ns: str) -> dict[str, Any]:
    status = status_of(world, ns)
    (condition,) = [c for c in status["conditions"] if c["type"] == "Ready"]
    return condition


def test_wrong_md5_fails_then_fixing_the_file_makes_it_ready(world: Testbed) -> None:
    flow = Flow(world)
    ns, directory = setup_adapter(world, flow)
    wrong = b"not the weights"
    upload_both(world, directory, weights=wrong)
    replies = flow.send("stat", changed(world, directory + WEIGHTS_NAME))
    assert [r["type"] for r in replies] == [ADAPTER_STAT_COMPLETED, ADAPTER_FAILED]
    failed = replies[-1].get_data()
    assert failed["reason"] == "IntegrityCheckFailed"
    status = status_of(world, ns)
    weights = directory + WEIGHTS_NAME
    assert status["conditions"] == [
        {
            "type": "Ready",
            "status": "False",
            "reason": "IntegrityCheckFailed",
            "message": (
                f"MD5 mismatch for 1 file(s): {weights} (expected {md5(WEIGHTS)}, observed {md5(wrong)})"
            ),
            "observedGeneration": 1,
        }
    ]
    assert status["phase"] == "Failed" and status["ready"] is False and status["uploadComplete"] is False
    assert status["integrity"]["files"][weights] == {"md5": md5(wrong), "size": len(wrong)}
    events = [e for e in world.core.list_namespaced_event(ns).items if e.reason == "IntegrityCheckFailed"]
    assert len(events) == 1 and events[0].type == "Warning"
    # a duplicate verdict neither replies nor records a second Event
    assert flow.send("verify", replies[0]) == []
    assert (
        len([e for e in world.core.list_namespaced_event(ns).items if e.reason == "IntegrityCheckFailed"])
        == 1
    )

    world.upload(weights, WEIGHTS)
    replies = flow.send("stat", changed(world, weights, "update"))
    assert [r["type"] for r in replies] == [ADAPTER_STAT_COMPLETED, ADAPTER_READY]
    assert status_of(world, ns) == expected_status(directory)


def test_integrity_declared_after_upload(world: Testbed) -> None:
    flow = Flow(world)
    ns, directory = setup_adapter(world, flow, integrity=False)
    upload_both(world, directory)
    flow.send("stat", changed(world, directory + WEIGHTS_NAME))
    status = status_of(world, ns)
    assert ready_condition(world, ns)["reason"] == "AwaitingIntegrity"
    assert (status["phase"], status["ready"], status["uploadComplete"]) == ("Processing", False, False)
    assert len(status["integrity"]["files"]) == 2

    stored = world.patch(
        VLLM_ADAPTER,
        ns,
        "a",
        {
            "spec": {
                "integrity": {
                    "md5": {directory + CONFIG_NAME: md5(CONFIG), directory + WEIGHTS_NAME: md5(WEIGHTS)}
                }
            }
        },
    )
    assert stored["metadata"]["generation"] == 2
    replies = flow.send("admit", world.apiserver_event("update", stored))
    assert ADAPTER_READY in [r["type"] for r in replies]
    expected = expected_status(directory)
    expected["observedGeneration"] = 2
    expected["conditions"][0]["observedGeneration"] = 2
    assert status_of(world, ns) == expected


ORDERS = {
    "in-order": ["admitted", "changed", "statdone"],
    "verify-first": ["statdone", "admitted", "changed"],
    "duplicated": ["changed", "changed", "statdone", "admitted", "statdone", "changed"],
}


@pytest.mark.parametrize("order", list(ORDERS))
def test_duplicated_reordered_and_stale_events_converge(world: Testbed, order: str) -> None:
    flow = Flow(world)
    ns, directory = setup_adapter(world, flow)
    upload_both(world, directory)
    events = {
        "admitted": ("stat", admitted(world, ns)),
        "changed": ("stat", changed(world, directory + CONFIG_NAME)),
        "statdone": ("verify", stat_done(world, ns)),
    }
    for name in ORDERS[order]:
        target, event = events[name]
        flow.send(target, event)
    assert status_of(world, ns) == expected_status(directory)
    # stale and replayed events afterwards (even one naming an old generation) change nothing
    stale = [
        ("verify", admitted(world, ns, generation=0)),
        ("stat", changed(world, directory + "deleted-long-ago", "delete")),
        *events.values(),
    ]
    random.Random(7).shuffle(stale)
    for target, event in stale:
        assert flow.send(target, event) == []
    assert status_of(world, ns) == expected_status(directory)


def test_deleted_file_goes_back_to_waiting(world: Testbed) -> None:
    flow = Flow(world)
    ns, directory = setup_adapter(world, flow)
    upload_both(world, directory)
    flow.send("stat", changed(world, directory + CONFIG_NAME))
    assert world.files.delete(directory + WEIGHTS_NAME) == 204
    replies = flow.send("stat", changed(world, directory + WEIGHTS_NAME, "delete"))
    assert [r["type"] for r in replies] == [ADAPTER_STAT_COMPLETED]
    status = status_of(world, ns)
    assert ready_condition(world, ns)["reason"] == "AwaitingFiles"
    assert directory + WEIGHTS_NAME in ready_condition(world, ns)["message"]
    assert (status["phase"], status["ready"], status["uploadComplete"]) == ("Processing", False, False)
    assert list(status["integrity"]["files"]) == [directory + CONFIG_NAME]


def test_missing_backend_md5_is_hashed_or_reported(world: Testbed) -> None:
    flow = Flow(world)
    ns, directory = setup_adapter(world, flow)
    upload_both(world, directory)
    world.files.write_without_md5(directory + WEIGHTS_NAME, WEIGHTS)
    with world.settings(LORAFLOW_HASH_MAX_BYTES="1"):
        flow.send("stat", changed(world, directory + WEIGHTS_NAME))
        condition = ready_condition(world, ns)
        assert (condition["status"], condition["reason"]) == ("False", "Md5Unavailable")
        status = status_of(world, ns)
        recorded = status["integrity"]["files"][directory + WEIGHTS_NAME]
        assert recorded["size"] == len(WEIGHTS) and "md5" not in recorded
        assert recorded["version"].startswith("fv1:")  # what changes with its bytes
        assert status["phase"] == "Failed"
    replies = flow.send("verify", stat_done(world, ns))  # default limit (1 GiB): streamed and hashed
    assert [r["type"] for r in replies] == [ADAPTER_READY]
    expected = expected_status(directory)
    unhashed = expected["integrity"]["files"][directory + WEIGHTS_NAME]
    unhashed.pop("md5")  # the backend still reports none
    unhashed["version"] = recorded["version"]
    assert status_of(world, ns) == expected


def test_storage_unavailable_is_retryable_and_writes_nothing(world: Testbed) -> None:
    flow = Flow(world)
    ns, directory = setup_adapter(world, flow)
    upload_both(world, directory)
    before = status_of(world, ns)
    world.filer.inject(503, times=None, path_prefix=directory.rstrip("/"))
    try:
        response = world.post("stat", changed(world, directory + CONFIG_NAME))
    finally:
        world.filer.clear_faults()
    assert response.status_code == 503
    assert status_of(world, ns) == before
    flow.send("stat", changed(world, directory + CONFIG_NAME))  # the Broker's redelivery
    assert status_of(world, ns) == expected_status(directory)


def stat_held_up(world: Testbed, flow: Flow, path: str, meanwhile: Callable[[], None]) -> list[CloudEvent]:
    """stat of `path`, its status write held up 0.5 s by the API stand-in while `meanwhile`
    runs (so that the write then conflicts: 409); returns stat's replies, followed."""
    fault = world.kube.inject(None, times=1, verb="patch", resource="loraadapters/status", delay_s=0.5)
    result: dict[str, Any] = {}

    def run() -> None:
        result["replies"] = flow.send("stat", changed(world, path))

    worker = threading.Thread(target=run)
    worker.start()
    try:
        deadline = time.monotonic() + 5
        while fault.hits < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        meanwhile()
    finally:
        worker.join(10)
        world.kube.clear_faults()
    replies: list[CloudEvent] = result["replies"]
    return replies


def test_conflicting_writer_loses_no_field(world: Testbed) -> None:
    flow = Flow(world)
    ns, directory = setup_adapter(world, flow)
    upload_both(world, directory)
    conflicts = KUBE_CONFLICTS.labels("loraadapters").value

    def load_writes_used_by() -> None:  # another function writes while stat's write is in flight
        world.custom.patch_namespaced_custom_object_status(
            VLLM_ADAPTER.group,
            VLLM_ADAPTER.version,
            ns,
            VLLM_ADAPTER.plural,
            "a",
            {"status": {"usedBy": ["deployment-1"]}},
            _content_type="application/merge-patch+json",
        )

    replies = stat_held_up(world, flow, directory + CONFIG_NAME, load_writes_used_by)
    assert KUBE_CONFLICTS.labels("loraadapters").value > conflicts
    assert ADAPTER_READY in [r["type"] for r in replies]
    assert status_of(world, ns) == {**expected_status(directory), "usedBy": ["deployment-1"]}


def test_a_stat_whose_write_lost_a_race_lists_storage_again(world: Testbed) -> None:
    """Two stats of one adapter: the first lists the directory (the config alone), and its status
    write is held up; the weights arrive, and a second stat records both files (verify: Ready).
    The first write then conflicts (409): it must list again, never write its older listing
    over the newer one (that took Ready back, and verify then waited for files that are there:
    the stack test of a chunked file caught it, one run in ~12)."""
    flow = Flow(world)
    ns, directory = setup_adapter(world, flow)
    world.upload(directory + CONFIG_NAME, CONFIG)
    conflicts = KUBE_CONFLICTS.labels("loraadapters").value
    second: list[CloudEvent] = []

    def the_weights_arrive_and_are_stated() -> None:
        world.upload(directory + WEIGHTS_NAME, WEIGHTS)
        second.extend(flow.send("stat", changed(world, directory + WEIGHTS_NAME)))

    stat_held_up(world, flow, directory + CONFIG_NAME, the_weights_arrive_and_are_stated)
    assert ADAPTER_READY in [r["type"] for r in second]
    assert KUBE_CONFLICTS.labels("loraadapters").value > conflicts
    assert status_of(world, ns) == expected_status(directory)
    assert ready_condition(world, ns)["status"] == "True"


def test_injected_conflicts_are_retried(world: Testbed) -> None:
    flow = Flow(world)
    ns, directory = setup_adapter(world, flow)
    upload_both(world, directory)
    world.kube.inject(409, times=2, verb="patch", resource="loraadapters/status")
    try:
        flow.send("stat", changed(world, directory + CONFIG_NAME))
    finally:
        world.kube.clear_faults()
    assert status_of(world, ns) == expected_status(directory)


def test_stat_ignores_what_is_not_its_business(world: Testbed) -> None:
    ns = world.namespace()
    world.create(MODEL, ns, {"metadata": {"name": "llama"}, "spec": {}})
    world.create(VLLM_ADAPTER, ns, {"metadata": {"name": "a"}, "spec": {"model": "llama"}})
    # no such adapter / the adapter's model differs / a file directly in the model dir
    for path in (
        f"/loraadapters/{ns}/llama/zz/w",
        f"/loraadapters/{ns}/other/a/w",
        f"/loraadapters/{ns}/llama/w",
    ):
        assert world.post("stat", changed(world, path)).status_code == 204, path
    sglang = world.event(ADAPTER_ADMITTED, world.adapter_data(SGLANG_ADAPTER, ns, "s", generation=1))
    assert world.post("stat", sglang).status_code == 204
    assert world.post("verify", sglang).status_code == 204
    gone = world.event(
        ADAPTER_STAT_COMPLETED, world.adapter_data(VLLM_ADAPTER, ns, "nope", files=0, size="0")
    )
    assert world.post("verify", gone).status_code == 204


@pytest.mark.parametrize(
    "path",
    ["/etc/passwd", "/loraadapters/ns/m/a/../../../etc/x", "/loraadapters/ns/m/a/%2e%2e/x"],
)
def test_stat_rejects_paths_outside_the_adapters(world: Testbed, path: str) -> None:
    response = world.post("stat", changed(world, path), structured=True)
    assert response.status_code == 400
    assert repr(path) in response.text


def test_a_directory_too_large_for_one_status_records_the_declared_files_first(world: Testbed) -> None:
    """The status is bounded (LORAFLOW_STATUS_MAX_FILES): declared files always, then the others
    in path order; size counts every file, statcompleted tells the real count, a Warning says so,
    and verify still reaches its verdict from the declared files."""
    flow = Flow(world)
    ns, directory = setup_adapter(world, flow)
    extras = [f"{directory}aa-extra-{i:02d}.bin" for i in range(6)]  # sort before the declared
    for path in extras:
        world.upload(path, b"x")
    with world.settings(LORAFLOW_STATUS_MAX_FILES="4"):
        upload_both(world, directory)
        replies = flow.send("stat", changed(world, directory + WEIGHTS_NAME))
    assert [r["type"] for r in replies] == [ADAPTER_STAT_COMPLETED, ADAPTER_READY]
    assert replies[0].get_data()["files"] == 8
    status = status_of(world, ns)
    declared = [directory + CONFIG_NAME, directory + WEIGHTS_NAME]
    assert [f["path"] for f in status["files"]] == sorted(extras[:2] + declared)
    assert sorted(status["integrity"]["files"]) == sorted(extras[:2] + declared)
    assert status["size"] == format_bytes(len(CONFIG) + len(WEIGHTS) + len(extras))
    assert ready_condition(world, ns)["reason"] == "IntegrityVerified"
    warnings = [
        e.message for e in world.core.list_namespaced_event(ns).items if e.reason == "StatusFilesTruncated"
    ]
    assert warnings == [f"status lists 4 of the 8 files in {directory} (declared ones first)"]

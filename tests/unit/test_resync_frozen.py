"""resync and frozen file sets: a retired set no pod serves is a reason to run verify (through
stat's reply), which deletes it once the grace period has passed; a set still served, or none
retired, is no reason, and such an adapter is not taken for steady."""

from __future__ import annotations

from typing import Any

from functions.logic.drift import Snapshot, drift, steady
from functions.logic.facts import file_set

MOUNT = "/mnt/sw"
DECLARED = {"/loraadapters/ns/m1/a1/w": "0" * 32}
CURRENT = file_set(DECLARED)
OLD = "md5set:" + "f" * 16


def record(file_set: str, retired: bool) -> dict[str, Any]:
    found = {
        "fileSet": file_set,
        "path": f"/loraflow-frozen/ns/m1/a1/{file_set[-16:]}/",
        "size": 1,
        "frozenAt": "2026-01-01T00:00:00Z",
    }
    return found | ({"retiredAt": "2026-01-01T00:10:00Z"} if retired else {})


def adapter(served: list[str], records: list[dict[str, Any]]) -> dict[str, Any]:
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "IntegrityVerified",
        "message": "",
        "observedGeneration": 1,
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    return {
        "apiVersion": "rackai.rackspace.com/v1alpha1",
        "metadata": {"name": "a1", "namespace": "ns", "generation": 1},
        "spec": {"model": "m1", "integrity": {"md5": DECLARED}},
        "status": {
            "observedGeneration": 1,
            "conditions": [ready],
            "fileSet": CURRENT,
            "frozen": records,
            "served": [{"pod": f"p{i}", "fileSet": fs} for i, fs in enumerate(served)],
        },
    }


def test_a_retired_set_no_pod_serves_nudges_stat() -> None:
    snapshot = Snapshot(v1=[adapter([CURRENT], [record(CURRENT, False), record(OLD, True)])])
    nudges = [(n.name, n.step, n.reason) for n in drift(snapshot, MOUNT) if n.step == "stat"]
    assert nudges == [("a1", "stat", "a retired frozen file set no pod serves waits to be deleted")]
    assert steady(snapshot, MOUNT) == frozenset()


def test_a_retired_set_a_pod_still_serves_is_no_reason() -> None:
    snapshot = Snapshot(v1=[adapter([OLD], [record(CURRENT, False), record(OLD, True)])])
    assert not [n for n in drift(snapshot, MOUNT) if "frozen" in n.reason]
    only_current = Snapshot(v1=[adapter([CURRENT], [record(CURRENT, False)])])
    assert not [n for n in drift(only_current, MOUNT) if "frozen" in n.reason]


def test_a_ready_adapter_without_a_frozen_copy_of_its_verified_set_nudges_stat() -> None:
    """Verified by a release before sets were frozen (or its record lost): its pods read the
    tenant's upload directory until verify freezes the set."""
    for records in ([], [record(CURRENT, True)], [record(OLD, False)]):
        snapshot = Snapshot(v1=[adapter([CURRENT], records)])
        reasons = [n.reason for n in drift(snapshot, MOUNT) if n.step == "stat"]
        assert "the verified file set has no frozen copy yet" in reasons
        assert steady(snapshot, MOUNT) == frozenset()
    not_ready = adapter([CURRENT], [])
    not_ready["status"]["conditions"][0]["status"] = "Unknown"
    assert not [n for n in drift(Snapshot(v1=[not_ready]), MOUNT) if "frozen" in n.reason]

from __future__ import annotations

from typing import Any

import pytest

from functions.logic import serving
from functions.logic.capacity import Capacity
from functions.logic.drift import LEFT_OUT as QUOTED
from functions.logic.drift import Snapshot, drift
from functions.logic.facts import file_set
from functions.logic.serving import TargetKey

MOUNT = "/mnt/sw"
V1 = "rackai.rackspace.com/v1alpha1"
V2 = "inference.rackai.rackspace.com/v1alpha1"
ROOT = f"{MOUNT}/loraadapters/ns/m1/a1"


def cond(type_: str, status: str = "True", reason: str = "R", gen: int = 1) -> dict[str, Any]:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": "",
        "observedGeneration": gen,
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }


FILE_SET = file_set({})
"""The file set of an adapter that declares no MD5s (these fixtures declare none)."""
SERVED_IN_2 = {"message": "loaded in 2 Ready pod(s): d1 2/2"}


def a1(
    ready: bool = True, used: list[str] | None = None, loaded: str | None = "True", **extra: Any
) -> dict[str, Any]:
    """As load leaves it after loading into FULL's two pods (served records, message)."""
    conditions = [cond("Ready", "True" if ready else "False", extra.pop("ready_reason", "IntegrityVerified"))]
    if loaded:
        loaded_condition = cond("Loaded", loaded, extra.pop("loaded_reason", "Loaded"))
        conditions.append({**loaded_condition, **(SERVED_IN_2 if loaded == "True" else {})})
    status: dict[str, Any] = {
        "observedGeneration": 1,
        "conditions": conditions,
        "usedBy": ["d1"] if used is None else used,
    }
    if loaded == "True":
        status["served"] = [{"pod": "p0", "fileSet": FILE_SET}, {"pod": "p1", "fileSet": FILE_SET}]
    status.update(extra.pop("status", {}))
    return {
        "apiVersion": V1,
        "metadata": {"name": "a1", "namespace": "ns", "generation": 1, **extra},
        "spec": {"model": "m1"},
        "status": status,
    }


def d1(loras: list[str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "d1", "namespace": "ns"},
        "spec": {"model": "m1", "loraAdapters": loras or ["a1"]},
    }


def s1(available: bool = True, loaded: str = "True", **meta: Any) -> dict[str, Any]:
    """As load leaves it after loading into one pod of ns/svc."""
    loaded_condition = cond("Loaded", loaded, "Loaded" if loaded == "True" else "R")
    if loaded == "True":
        loaded_condition["message"] = "loaded in 1 Ready pod(s) of ns/svc"
    return {
        "apiVersion": V2,
        "metadata": {"name": "s1", "namespace": "ns", "generation": 1, **meta},
        "spec": {"inferenceServiceRef": {"name": "svc"}, "name": "x", "path": "/p/x"},
        "status": {
            "conditions": [cond("Available", "True" if available else "False"), loaded_condition],
            "loadedPath": "/p/x",
            **({"lastLoadedAt": "2026-01-01T00:00:00Z"} if loaded == "True" else {}),
        },
    }


SVC = {"metadata": {"name": "svc", "namespace": "ns"}, "spec": {"runtime": "sglang"}}
VLLM_SVC = {"metadata": {"name": "svc", "namespace": "ns"}, "spec": {"runtime": "vllm"}}
MODEL_MISSING = a1(
    ready=False, loaded=None, ready_reason="ModelNotFound", used=[], status={"phase": "Failed"}
)


def v2_unavailable(reason: str) -> dict[str, Any]:
    """Not Available; Loaded says why, as load writes it for an adapter it no longer serves."""
    adapter = s1(available=False, loaded="False")
    for condition in adapter["status"]["conditions"]:
        condition["reason"] = reason
    return adapter


FULL = {("ns", "d1"): {"p0": {"a1": ROOT}, "p1": {"a1": ROOT}}}
LOADED_IN_3 = {**cond("Loaded"), "reason": "Loaded", "message": "loaded in 3 Ready pod(s) of ns/svc"}


@pytest.mark.parametrize(
    ("snapshot", "expected"),
    [
        pytest.param(Snapshot(v1=[a1()], deployments=[d1()], md_pods=FULL), [], id="in-sync"),
        pytest.param(
            Snapshot(v1=[a1(status={"observedGeneration": None})]), [("a1", "admit")], id="never-admitted"
        ),
        pytest.param(
            Snapshot(v1=[a1(generation=2)], deployments=[d1()], md_pods=FULL),
            [("a1", "admit")],
            id="new-generation",
        ),
        pytest.param(
            Snapshot(v1=[a1(ready=False, loaded=None)], deployments=[d1()]), [("a1", "stat")], id="not-ready"
        ),
        pytest.param(
            Snapshot(
                v1=[a1(ready=False, loaded=None, ready_reason="IntegrityCheckFailed")], deployments=[d1()]
            ),
            [],
            id="failed-not-statted",
        ),
        pytest.param(
            Snapshot(v1=[a1()], deployments=[d1()], md_pods={("ns", "d1"): {"p0": {"a1": ROOT}, "p1": {}}}),
            [("a1", "load")],
            id="missing-in-pod",
        ),
        pytest.param(
            Snapshot(v1=[a1()], deployments=[d1()], md_pods={("ns", "d1"): {"p0": {"a1": ROOT}, "p1": None}}),
            [],
            id="unreachable-pod-not-judged",
        ),
        pytest.param(
            Snapshot(v1=[a1(used=[])], deployments=[d1()], md_pods=FULL), [("a1", "load")], id="usedby-stale"
        ),
        pytest.param(
            Snapshot(v1=[a1(loaded="False")], deployments=[d1()], md_pods=FULL),
            [("a1", "load")],
            id="loaded-stale",
        ),
        pytest.param(
            Snapshot(
                v1=[a1(loaded="False", loaded_reason="RankTooHigh")],
                deployments=[d1()],
                md_pods={("ns", "d1"): {"p0": {}}},
            ),
            [],
            id="rank-verdict-not-renudged",
        ),
        pytest.param(
            Snapshot(v1=[a1(deletionTimestamp="t", finalizers=["loraflow.io/unload"])], deployments=[d1()]),
            [("a1", "unload")],
            id="deleting",
        ),
        pytest.param(
            Snapshot(
                v1=[a1(used=[], loaded="False", loaded_reason="NotReferenced")],
                deployments=[d1(["other"])],
                md_pods={("ns", "d1"): {"p0": {"a1": ROOT, "static": "/models/static"}}},
            ),
            [("a1", "unload")],
            id="loaded-where-not-wanted-static-ignored",
        ),
        pytest.param(
            Snapshot(
                v1=[a1(used=[], loaded="False", loaded_reason="NotReferenced")],
                deployments=[d1(["other"])],
                md_pods={("ns", "d1"): {"p0": {"a1": "/models/a1"}}},
            ),
            [],
            id="same-name-static-path-ignored",
        ),
        pytest.param(
            Snapshot(v2=[s1()], services=[SVC], isvc_pods={("ns", "svc"): {"p": {"x": "/p/x"}}}),
            [],
            id="v2-in-sync",
        ),
        pytest.param(
            Snapshot(
                v2=[{**s1(), "status": {k: v for k, v in s1()["status"].items() if k != "lastLoadedAt"}}],
                services=[SVC],
                isvc_pods={("ns", "svc"): {"p": {"x": "/p/x"}}},
            ),
            [("s1", "load")],
            id="v2-load-time-lost-with-its-status-write",
        ),
        pytest.param(
            Snapshot(v2=[s1()], services=[SVC], isvc_pods={("ns", "svc"): {"p": {}}}),
            [("s1", "load")],
            id="v2-missing",
        ),
        pytest.param(
            Snapshot(
                v2=[s1(available=False, loaded="False")],
                services=[SVC],
                isvc_pods={("ns", "svc"): {"p": {"x": "/p/x"}}},
            ),
            [("s1", "unload")],
            id="v2-not-available-but-loaded",
        ),
        pytest.param(
            Snapshot(v2=[{**s1(), "status": {}}], services=[SVC]), [("s1", "admit")], id="v2-never-admitted"
        ),
        pytest.param(
            Snapshot(v2=[s1(deletionTimestamp="t", finalizers=["loraflow.io/unload"])], services=[SVC]),
            [("s1", "unload")],
            id="v2-deleting",
        ),
        pytest.param(
            Snapshot(v1=[MODEL_MISSING], models=frozenset({("ns", "m1")})),
            [("a1", "admit")],
            id="model-created-after-the-adapter",
        ),
        pytest.param(Snapshot(v1=[MODEL_MISSING]), [], id="model-still-missing"),
        pytest.param(
            Snapshot(v2=[v2_unavailable("InferenceServiceNotFound")], services=[SVC]),
            [("s1", "admit")],
            id="v2-target-created-after-the-adapter",
        ),
        pytest.param(
            Snapshot(v2=[v2_unavailable("InferenceServiceNotFound")]), [], id="v2-target-still-missing"
        ),
        pytest.param(
            Snapshot(v2=[v2_unavailable("RuntimeMismatch")], services=[SVC]),
            [("s1", "admit")],
            id="v2-target-now-sglang",
        ),
        pytest.param(
            Snapshot(v2=[v2_unavailable("RuntimeMismatch")], services=[VLLM_SVC]),
            [],
            id="v2-target-still-vllm",
        ),
        pytest.param(Snapshot(v2=[s1()]), [("s1", "admit")], id="v2-target-gone"),
        pytest.param(
            Snapshot(v1=[a1(used=[], loaded="True")]), [("a1", "load")], id="unreferenced-loaded-stale"
        ),
        pytest.param(
            Snapshot(v1=[a1(used=[], loaded=None)]), [("a1", "load")], id="unreferenced-loaded-missing"
        ),
        pytest.param(
            Snapshot(
                v2=[{**s1(), "status": {"conditions": [cond("Available"), LOADED_IN_3]}}],
                services=[SVC],
                isvc_pods={("ns", "svc"): {"p0": {"x": "/p/x"}, "p1": {"x": "/p/x"}}},
            ),
            [("s1", "load")],
            id="v2-loaded-counts-pods-scaled-away",
        ),
        pytest.param(
            Snapshot(
                v1=[a1(status={"conditions": [cond("Ready", reason="IntegrityVerified"), LOADED_IN_3]})],
                deployments=[d1()],
                md_pods=FULL,
            ),
            [("a1", "load")],
            id="loaded-counts-pods-scaled-away",
        ),
        pytest.param(
            Snapshot(deployments=[d1()], md_pods={("ns", "d1"): {"p0": {"a1": ROOT}}}),
            [("a1", "unload")],
            id="orphan-left-after-deletion",
        ),
    ],
)
def test_drift(snapshot: Snapshot, expected: list[tuple[str, str]]) -> None:
    assert [(n.name, n.step) for n in drift(snapshot, MOUNT)] == expected


def test_one_nudge_per_adapter_and_step() -> None:
    snapshot = Snapshot(
        v1=[a1(used=[], loaded="False")], deployments=[d1()], md_pods={("ns", "d1"): {"p0": {}}}
    )
    nudges = drift(snapshot, MOUNT)
    assert len(nudges) == 1 and "usedBy" in nudges[0].reason and "missing" in nudges[0].reason


def test_scales_linearly() -> None:
    adapters = [
        {**a1(), "metadata": {"name": f"a{i}", "namespace": "ns", "generation": 1}} for i in range(3000)
    ]
    mds = [d1([f"a{i}" for i in range(3000)])]
    for a in adapters:
        a["status"]["usedBy"] = ["d1"]
        a["status"]["served"] = [{"pod": f"p{i}", "fileSet": FILE_SET} for i in range(20)]
        for c in a["status"]["conditions"]:
            if c["type"] == "Loaded":
                c["message"] = "loaded in 20 Ready pod(s): d1 20/20"
    listing = {f"a{i}": f"{MOUNT}/loraadapters/ns/m1/a{i}" for i in range(3000)}
    pods = {("ns", "d1"): {f"p{i}": dict(listing) for i in range(20)}}
    assert drift(Snapshot(v1=adapters, deployments=mds, md_pods=pods), MOUNT) == []


def test_a_full_resync_restats_every_admitted_seed1_adapter() -> None:
    """The filer source's nudge after its log lost events (ResyncTick full): a Ready, loaded
    adapter that an ordinary tick leaves alone is restatted; one being deleted, one never
    admitted (admit first) and the seed-2 kind (no storage step) are not."""
    ready = a1()
    deleting = {
        **a1(),
        "metadata": {"name": "gone", "namespace": "ns", "generation": 1, "deletionTimestamp": "x"},
    }
    unadmitted = {**a1(), "metadata": {"name": "new", "namespace": "ns", "generation": 2}}
    snapshot = Snapshot(
        v1=[ready, deleting, unadmitted],
        v2=[s1()],
        deployments=[d1()],
        services=[SVC],
        md_pods=FULL,
    )
    ordinary = [(n.name, n.step) for n in drift(snapshot, MOUNT)]
    full = drift(snapshot, MOUNT, restat="the filer's log starts after the cursor")
    assert ("a1", "stat") not in ordinary
    assert sorted((n.name, n.step) for n in full) == sorted({*ordinary, ("a1", "stat")})
    (restat,) = [n for n in full if n.step == "stat"]
    assert restat.reason == "the filer's log starts after the cursor"


# -- capacity: an sglang adapter left out is nudged only when room may have appeared ---------------
LEFT_OUT = {
    **cond("Loaded", "False", "EngineCapacityExceeded"),
    "message": "left out in 2 of 2 Ready pod(s) (p0, p1): the engine holds at most 2 adapter(s) "
    "(spec.engineArgs) and ns/svc wants 3; this one ranks outside them (serving-priority, then age): svc 0/2",
}


def sg(name: str, second: int, left_out: bool = False, **annotations: str) -> dict[str, Any]:
    """An sglang adapter of ns/svc created at `second`, as load left it: served, or left out."""
    adapter = s1()
    adapter["metadata"] = {
        "name": name,
        "namespace": "ns",
        "generation": 1,
        "uid": name,
        "creationTimestamp": f"2026-01-01T00:00:{second:02d}Z",
        **({"annotations": annotations} if annotations else {}),
    }
    adapter["spec"] = {**adapter["spec"], "name": name, "path": f"/p/{name}"}
    loaded_condition = adapter["status"]["conditions"][-1]
    loaded_condition["message"] = "loaded in 2 Ready pod(s) of ns/svc"
    if left_out:
        conditions = adapter["status"]["conditions"]
        adapter["status"] = {
            "conditions": [c for c in conditions if c["type"] != "Loaded"] + [dict(LEFT_OUT)]
        }
    return adapter


def full_pods(*names: str, pods: int = 2) -> dict[tuple[str, str], dict[str, dict[str, str] | None]]:
    return {("ns", "svc"): {f"p{i}": {n: f"/p/{n}" for n in names} for i in range(pods)}}


def s3_nudges(snapshot: Snapshot) -> list[str]:
    return [n.step for n in drift(snapshot, MOUNT) if n.name == "s3"]


def test_left_out_for_capacity_with_nothing_changed_is_not_nudged() -> None:
    adapters = [sg("s1", 1), sg("s2", 2), sg("s3", 3, left_out=True)]
    snapshot = Snapshot(v2=adapters, services=[SVC], isvc_pods=full_pods("s1", "s2"))
    assert drift(snapshot, MOUNT) == []
    # what suppresses it is the capacity the condition quotes: without it, every tick nudges
    garbled = sg("s3", 3, left_out=True)
    garbled["status"]["conditions"][-1]["message"] = "left out"
    snapshot = Snapshot(v2=[*adapters[:2], garbled], services=[SVC], isvc_pods=full_pods("s1", "s2"))
    assert s3_nudges(snapshot) == ["load"]


@pytest.mark.parametrize(
    ("adapters", "pods"),
    [
        pytest.param([sg("s2", 2), sg("s3", 3, left_out=True)], full_pods("s2"), id="claimant-deleted"),
        pytest.param(
            [sg("s1", 1), sg("s2", 2), sg("s3", 3, left_out=True)],
            {("ns", "svc"): {**full_pods("s1", "s2")[("ns", "svc")], "p2": {}}},
            id="replica-added",
        ),
        pytest.param(
            [sg("s1", 1), sg("s2", 2), sg("s3", 3, left_out=True)],
            full_pods("s1", "s2", "other"),
            id="capacity-raised",
        ),
        pytest.param(
            [sg("s1", 1), sg("s2", 2), sg("s3", 3, left_out=True, **{"loraflow.io/serving-priority": "5"})],
            full_pods("s1", "s2"),
            id="reprioritised",
        ),
    ],
)
def test_left_out_for_capacity_is_nudged_when_room_may_have_appeared(
    adapters: list[dict[str, Any]], pods: dict[tuple[str, str], dict[str, dict[str, str] | None]]
) -> None:
    assert s3_nudges(Snapshot(v2=adapters, services=[SVC], isvc_pods=pods)) == ["load"]


def test_left_out_message_counting_fewer_claims_than_there_are_is_rewritten() -> None:
    """A claimant added that ranks out too: the count both left-out messages quote (3) is stale,
    so load writes them again, once; the loaded ones are not nudged."""
    adapters = [sg("s1", 1), sg("s2", 2), sg("s3", 3, left_out=True), sg("s4", 4, left_out=True)]
    nudges = drift(Snapshot(v2=adapters, services=[SVC], isvc_pods=full_pods("s1", "s2")), MOUNT)
    assert [(n.name, n.step) for n in nudges] == [("s3", "load"), ("s4", "load")]
    assert all("wants 4" in n.reason for n in nudges), nudges


def test_the_quoted_capacity_is_the_one_load_writes() -> None:
    room = serving.Room(frozenset(), Capacity(7, True, "engine"), 9)
    found = QUOTED.search(serving.left_out_message(room, TargetKey("InferenceService", "ns", "svc")))
    assert found is not None and found.groups() == ("7", "engine")

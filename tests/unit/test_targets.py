from __future__ import annotations

from typing import Any

import pytest

from functions.errors import Reject
from functions.logic import targets

MOUNT = "/mnt/seaweedfs"


def adapter(name: str = "a1", model: str = "m1", ready: bool = True, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "rackai.rackspace.com/v1alpha1",
        "metadata": {"name": name, "namespace": "ns", **meta},
        "spec": {"model": model},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def md(name: str = "d1", model: str = "m1", loras: list[str] | None = None, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", **meta},
        "spec": {"model": model, "loraAdapters": ["a1"] if loras is None else loras},
    }


def sg(
    name: str = "s1",
    lora: str = "x",
    isvc: str = "svc",
    ns: str | None = None,
    available: bool = True,
    **meta: Any,
) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": isvc}
    if ns:
        ref["namespace"] = ns
    return {
        "apiVersion": "inference.rackai.rackspace.com/v1alpha1",
        "metadata": {"name": name, "namespace": "ns", **meta},
        "spec": {"inferenceServiceRef": ref, "name": lora, "path": f"/adapters/{lora}"},
        "status": {"conditions": [{"type": "Available", "status": "True" if available else "False"}]},
    }


def isvc(name: str = "svc", ns: str = "ns", runtime: str = "sglang") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns}, "spec": {"runtime": runtime}}


@pytest.mark.parametrize(
    ("deployments", "expected"),
    [
        pytest.param([], [], id="none"),
        pytest.param([md("b"), md("a")], ["a", "b"], id="sorted"),
        pytest.param([md("a", loras=["other"])], [], id="not-named"),
        pytest.param([md("a", model="m2")], ["a"], id="mismatch-still-used"),
        pytest.param([md("a"), md("a")], ["a"], id="dedup"),
    ],
)
def test_used_by(deployments: list[dict[str, Any]], expected: list[str]) -> None:
    assert targets.used_by("a1", deployments) == expected


@pytest.mark.parametrize(
    ("deployment", "adapters", "expected"),
    [
        pytest.param(md(), {"a1": adapter()}, ["a1"], id="ready-matching"),
        pytest.param(md(), {"a1": adapter(ready=False)}, [], id="not-ready"),
        pytest.param(md(model="m2"), {"a1": adapter()}, [], id="model-mismatch"),
        pytest.param(md(loras=["a1", "zz"]), {"a1": adapter()}, ["a1"], id="unknown-name"),
        pytest.param(md(), {"a1": adapter(deletionTimestamp="now")}, [], id="deleting"),
        pytest.param(md(loras=[]), {"a1": adapter()}, [], id="empty-spec"),
    ],
)
def test_desired_v1(deployment: dict[str, Any], adapters: dict[str, Any], expected: list[str]) -> None:
    desired = targets.desired_v1(deployment, adapters, MOUNT)
    assert sorted(desired) == expected
    for wanted in desired.values():
        assert wanted.lora_path == f"{MOUNT}/loraadapters/ns/m1/a1"


def test_storage_ref_wins_and_traversal_rejected() -> None:
    a = adapter()
    a["status"]["storageRef"] = {"path": "/loraadapters/ns/m1/a1/"}
    assert targets.wanted_v1(a, "/mnt/x/").lora_path == "/mnt/x/loraadapters/ns/m1/a1"
    assert targets.config_path(a) == "/loraadapters/ns/m1/a1/adapter_config.json"
    a["status"]["storageRef"] = {"path": "/../../etc"}
    with pytest.raises(Reject):
        targets.wanted_v1(a, MOUNT)


@pytest.mark.parametrize(
    ("target", "adapters", "expected"),
    [
        pytest.param(isvc(), [sg()], ["x"], id="available"),
        pytest.param(isvc(), [sg(available=False)], [], id="not-available"),
        pytest.param(isvc(runtime="vllm"), [sg()], [], id="runtime-mismatch"),
        pytest.param(isvc(), [sg(isvc="other")], [], id="other-target"),
        pytest.param(isvc(ns="prod"), [sg(ns="prod")], ["x"], id="cross-namespace"),
        pytest.param(isvc(ns="prod"), [sg()], [], id="default-namespace-is-own"),
        pytest.param(isvc(), [sg("b", "x"), sg("a", "x")], ["x"], id="duplicate-name"),
    ],
)
def test_desired_v2(target: dict[str, Any], adapters: list[dict[str, Any]], expected: list[str]) -> None:
    assert sorted(targets.desired_v2(target, adapters)) == expected


def test_duplicate_name_first_wins() -> None:
    assert targets.desired_v2(isvc(), [sg("b", "x"), sg("a", "x")])["x"].name == "a"


@pytest.mark.parametrize(
    ("lora", "root", "expected"),
    [
        pytest.param("a1", f"{MOUNT}/loraadapters/ns/m1/a1", True, id="ours"),
        pytest.param("a1", "/models/static/a1", False, id="static-path"),
        pytest.param("gone", f"{MOUNT}/loraadapters/ns/m1/gone", True, id="orphan-in-our-layout"),
        pytest.param("a1", f"{MOUNT}/loraadapters/other/m1/a1", False, id="another-namespace"),
        pytest.param("a1", f"{MOUNT}/loraadapters/ns/m1/b1", False, id="name-differs-from-path"),
        pytest.param("a1", f"{MOUNT}/loraadapters/ns/a1", False, id="no-model-level"),
        pytest.param("a1", f"{MOUNT}/loraadapters/../etc", False, id="traversal"),
        pytest.param("a1", f"{MOUNT}/loraadapters", False, id="root-itself"),
        pytest.param("a1", "", False, id="empty-root"),
    ],
)
def test_managed_v1(lora: str, root: str, expected: bool) -> None:
    assert targets.managed_v1(lora, root, "ns", MOUNT) is expected


@pytest.mark.parametrize(
    ("listing", "desired", "expected"),
    [
        pytest.param({"a1": f"{MOUNT}/loraadapters/ns/m1/a1"}, {"a1"}, [], id="desired-kept"),
        pytest.param({"a1": f"{MOUNT}/loraadapters/ns/m1/a1"}, set(), ["a1"], id="left-spec"),
        pytest.param({"static": "/models/static"}, set(), [], id="static-survives"),
        pytest.param({"a1": "/models/a1"}, set(), [], id="same-name-static-path"),
    ],
)
def test_surplus_v1(listing: dict[str, str], desired: set[str], expected: list[str]) -> None:
    wanted = {n: targets.Wanted("ns", n, n, "") for n in desired}
    assert targets.surplus_v1(listing, wanted, "ns", MOUNT) == expected


@pytest.mark.parametrize(
    ("listing", "adapters", "expected"),
    [
        pytest.param({"x": "/p"}, [sg(available=False)], ["x"], id="not-available-unloaded"),
        pytest.param({"x": "/p"}, [sg()], [], id="desired-kept"),
        pytest.param({"boot": "/p"}, [sg()], [], id="static-survives"),
        pytest.param({"x": "/p"}, [sg(isvc="other", available=False)], [], id="other-target-not-managed"),
    ],
)
def test_surplus_v2(listing: dict[str, str], adapters: list[dict[str, Any]], expected: list[str]) -> None:
    desired = targets.desired_v2(isvc(), adapters)
    assert targets.surplus_v2(listing, desired, isvc(), adapters) == expected


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        pytest.param(None, 64, id="default"),
        pytest.param({"loraflow.io/max-lora-rank": "128"}, 128, id="raised"),
        pytest.param({"loraflow.io/max-lora-rank": "8"}, 8, id="lowered"),
        pytest.param({"loraflow.io/max-lora-rank": "x"}, 64, id="garbage"),
        pytest.param({"loraflow.io/max-lora-rank": "0"}, 64, id="zero"),
    ],
)
def test_max_rank(annotations: dict[str, str] | None, expected: int) -> None:
    assert targets.max_rank(md(annotations=annotations), 64) == expected


@pytest.mark.parametrize(
    ("listing", "expected"),
    [
        pytest.param({}, ["a1", "b"], id="empty"),
        pytest.param({"a1": "/p"}, ["b"], id="one-present"),
        pytest.param({"a1": "/p", "b": "/q", "c": "/r"}, [], id="all-present"),
    ],
)
def test_missing(listing: dict[str, str], expected: list[str]) -> None:
    desired = {n: targets.Wanted("ns", n, n, "") for n in ("b", "a1")}
    assert targets.missing(listing, desired) == expected

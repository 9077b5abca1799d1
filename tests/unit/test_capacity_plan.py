"""Engine capacity, pure: what a replica reports or was started with, and what the serving
planner asks of a pod that cannot hold every adapter its target wants."""

from __future__ import annotations

import pytest

from functions.logic import capacity, reasons, serving
from functions.logic.capacity import Capacity
from functions.logic.serving import Adapter, AdapterKey, Pod, Scope, Target, TargetKey, World

ISVC = TargetKey("InferenceService", "ns", "chat")


@pytest.mark.parametrize(
    ("body", "slots", "problem"),
    [
        (b'{"max_loaded_loras": 4}', 4, False),
        (b'{"max_loaded_loras": null}', None, False),
        (b'{"max_loaded_loras": 0}', None, True),
        (b'{"max_loaded_loras": -3}', None, True),
        (b'{"max_loaded_loras": 1000000000}', None, True),
        (b'{"max_loaded_loras": "4"}', None, True),
        (b'{"max_loaded_loras": true}', None, True),
        (b'{"max_loaded_loras": 4.5}', None, True),
        (b"[1, 2]", None, True),
        (b"not json", None, True),
    ],
)
def test_server_info_capacity(body: bytes, slots: int | None, problem: bool) -> None:
    found = capacity.from_server_info(body)
    assert found is not None
    assert found.slots == slots
    assert (found.problem is not None) == problem
    if found.problem is not None:
        assert found.problem[0] == reasons.ENGINE_CAPACITY_INVALID


def test_server_info_without_the_setting_reports_nothing() -> None:
    assert capacity.from_server_info(b'{"model_path": "m"}') is None


@pytest.mark.parametrize(
    ("runtime", "args", "slots", "problem"),
    [
        ("sglang", ["--max-loaded-loras", "4"], 4, False),
        ("sglang", ["--max-loaded-loras=8", "--max-loras-per-batch", "8"], 8, False),
        ("sglang", ["--max-loaded-loras", "many"], None, True),
        ("sglang", ["--max-loaded-loras", "-1"], None, True),
        ("vllm", ["--max-loras", "2"], 2, False),
        ("vllm", ["--max-loras", "2", "--max-cpu-loras", "6"], 6, False),
        ("vllm", ["--enable-lora"], None, False),
    ],
)
def test_engine_args_capacity(
    runtime: capacity.Runtime, args: list[str], slots: int | None, problem: bool
) -> None:
    found = capacity.of_pod(runtime, None, args, None)
    assert (found.slots, found.problem is not None) == (slots, problem)


def test_the_engine_wins_over_the_pod_which_wins_over_the_spec() -> None:
    reported = Capacity(3, True, "engine")
    assert (
        capacity.of_pod("sglang", reported, ["--max-loaded-loras", "5"], ["--max-loaded-loras", "7"])
        == reported
    )
    assert (
        capacity.of_pod("sglang", None, ["--max-loaded-loras", "5"], ["--max-loaded-loras", "7"]).source
        == "pod args"
    )
    assert capacity.of_pod("sglang", None, [], ["--max-loaded-loras", "7"]).slots == 7
    assert capacity.of_pod("sglang", None, None, None).slots is None


def sglang(name: str, created: str, priority: int = 0) -> Adapter:
    return Adapter(
        key=AdapterKey("sglang", "ns", name),
        uid=f"u-{name}",
        created=created,
        lora_name=name,
        lora_path=f"/m/{name}",
        file_set=f"/m/{name}",
        serve="serve",
        target=ISVC,
        priority=priority,
    )


def world(listing: dict[str, str] | None, slots: int | None, *adapters: Adapter) -> World:
    cap = Capacity(slots, True, "engine")
    return World(
        adapters={a.key: a for a in adapters},
        targets={ISVC: Target(ISVC)},
        pods={ISVC: (Pod(ISVC, "p0", listing, cap),)},
    )


ADAPTERS = (
    sglang("old", "2026-01-01T00:00:00Z"),
    sglang("mid", "2026-01-02T00:00:00Z"),
    sglang("new", "2026-01-03T00:00:00Z"),
)


@pytest.mark.parametrize(
    ("listing", "slots", "loads", "unloads"),
    [
        ({}, 2, ["mid", "old"], []),  # oldest first
        ({}, 3, ["mid", "new", "old"], []),
        ({}, None, ["mid", "new", "old"], []),
        ({"static": "/s"}, 2, ["old"], []),  # a name not the target's takes a slot
        ({"new": "/m/new"}, 2, ["mid", "old"], ["new"]),  # ranks out: room first
        ({"old": "/m/old", "mid": "/m/mid"}, 2, [], []),  # steady: nothing to do
        (None, 2, [], []),  # what it holds is unknown: no blind load into a bound pod
    ],
)
def test_a_pod_is_planned_within_its_capacity(
    listing: dict[str, str] | None, slots: int | None, loads: list[str], unloads: list[str]
) -> None:
    w = world(listing, slots, *ADAPTERS)
    actions = serving.plan(w, serving.desired(w), Scope())
    assert sorted(a.lora_name for a in actions if a.op == "load") == loads
    assert [a.lora_name for a in actions if a.op == "unload"] == unloads
    if unloads:
        assert actions[0].op == "unload"  # before any load


def test_priority_ranks_before_age_and_the_left_out_report_says_why() -> None:
    vip = sglang("vip", "2026-02-01T00:00:00Z", priority=5)
    w = world({"old": "/m/old", "vip": "/m/vip"}, 2, vip, *ADAPTERS)
    desire = serving.desired(w)
    assert serving.plan(w, desire, Scope()) == []
    report = serving.serving_report(w, desire, AdapterKey("sglang", "ns", "mid"))
    (pod,) = report.targets[0].pods
    assert (pod.state, pod.reason) == ("capacity", reasons.ENGINE_CAPACITY_EXCEEDED)
    assert "at most 2 adapter(s) (engine)" in pod.message and "wants 4" in pod.message


def test_a_garbage_capacity_loads_nothing_there_and_keeps_what_it_serves() -> None:
    bad = Capacity(None, True, "engine", (reasons.ENGINE_CAPACITY_INVALID, "max_loaded_loras is 'x'"))
    w = World(
        adapters={a.key: a for a in ADAPTERS},
        targets={ISVC: Target(ISVC)},
        pods={ISVC: (Pod(ISVC, "p0", {"old": "/m/old"}, bad),)},
    )
    desire = serving.desired(w)
    assert serving.plan(w, desire, Scope(unload=True)) == []
    served = serving.serving_report(w, desire, AdapterKey("sglang", "ns", "old")).targets[0].pods[0]
    absent = serving.serving_report(w, desire, AdapterKey("sglang", "ns", "new")).targets[0].pods[0]
    assert served.state == "serving"
    assert (absent.state, absent.reason) == ("failed", reasons.ENGINE_CAPACITY_INVALID)

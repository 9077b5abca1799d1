"""The serving planner as tables: for this world, these calls, and this status (no servers).

Worlds are built from the objects the API server would hand the observe step, through the
same `facts` functions production uses, so the tables also hold the object -> fact mapping.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from functions.logic import facts, loaded, reasons, serving
from functions.logic.adapter_config import ConfigVerdict
from functions.logic.serving import (
    Action,
    AdapterKey,
    ListingFailure,
    Outcome,
    Pod,
    Policy,
    Scope,
    TargetKey,
    World,
)

MOUNT = "/mnt/seaweedfs"
OK_CONFIG = ConfigVerdict(True, "AdapterConfigValid", "ok", rank=8)
D1 = TargetKey("ModelDeployment", "ns", "d1")
SVC = TargetKey("InferenceService", "ns", "svc")
LOADED = reasons.POD_LOADED


def condition(type_: str, status: str = "True", reason: str = "R") -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": "", "lastTransitionTime": "t"}


def vllm(
    name: str = "a1",
    model: str = "m1",
    ready: str = "True",
    md5s: dict[str, str] | None = None,
    file_set: str | None = None,
    served: dict[str, str] | None = None,
    ns: str = "ns",
    **meta: Any,
) -> dict[str, Any]:
    md5s = md5s or {f"/loraadapters/{ns}/{model}/{name}/w.bin": "0" * 32}
    status: dict[str, Any] = {"conditions": [condition("Ready", ready)]}
    if file_set is not None:
        status["fileSet"] = file_set
    if served:
        status["served"] = [{"pod": p, "fileSet": f} for p, f in served.items()]
    return {
        "apiVersion": "rackai.rackspace.com/v1alpha1",
        "kind": "LoRAAdapter",
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"uid-{name}",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            **meta,
        },
        "spec": {"model": model, "integrity": {"md5": md5s}},
        "status": status,
    }


def sglang(
    name: str = "s1",
    lora: str = "x",
    path: str | None = None,
    ns: str = "ns",
    target: tuple[str, str] = ("ns", "svc"),
    available: bool = True,
    created: str = "2026-01-01T00:00:00Z",
    loaded_path: str | None = None,
    **meta: Any,
) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": [condition("Available", "True" if available else "False")]}
    if loaded_path:
        status["loadedPath"] = loaded_path
    return {
        "apiVersion": "inference.rackai.rackspace.com/v1alpha1",
        "kind": "LoRAAdapter",
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"uid-{name}",
            "creationTimestamp": created,
            **meta,
        },
        "spec": {
            "inferenceServiceRef": {"name": target[1], "namespace": target[0]},
            "name": lora,
            "path": path or f"/adapters/{name}",
        },
        "status": status,
    }


def md(
    name: str = "d1", model: str = "m1", loras: tuple[str, ...] = ("a1",), rank: str | None = None
) -> dict[str, Any]:
    annotations = {"loraflow.io/max-lora-rank": rank} if rank else {}
    return {
        "kind": "ModelDeployment",
        "metadata": {"name": name, "namespace": "ns", "annotations": annotations},
        "spec": {"model": model, "loraAdapters": list(loras)},
    }


def isvc(
    name: str = "svc", ns: str = "ns", runtime: str = "sglang", accepts: str | None = None
) -> dict[str, Any]:
    annotations = {"loraflow.io/accept-adapters-from": accepts} if accepts else {}
    return {
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": ns, "annotations": annotations},
        "spec": {"runtime": runtime},
    }


def root(name: str = "a1", model: str = "m1", ns: str = "ns") -> str:
    return f"{MOUNT}/loraadapters/{ns}/{model}/{name}"


def world(
    adapters: list[dict[str, Any]] = (),  # type: ignore[assignment]
    targets: list[dict[str, Any]] = (),  # type: ignore[assignment]
    pods: dict[TargetKey, dict[str, Any]] | None = None,
    config: ConfigVerdict | None = OK_CONFIG,
    roots: tuple[str, ...] = ("/",),
) -> World:
    found: dict[AdapterKey, serving.Adapter] = {}
    for obj in adapters:
        a = (
            facts.vllm_adapter(obj, MOUNT, config)
            if obj["apiVersion"].startswith("rackai")
            else facts.sglang_adapter(obj)
        )
        found[a.key] = a
    tgts: dict[TargetKey, serving.Target | None] = {}
    for obj in targets:
        t = facts.deployment(obj, 64) if obj["kind"] == "ModelDeployment" else facts.inference_service(obj)
        tgts[t.key] = t
    for a in found.values():
        if a.target is not None:
            tgts.setdefault(a.target, None)
    grouped = {
        target: tuple(Pod(target, name, listing) for name, listing in sorted(listings.items()))
        for target, listings in (pods or {}).items()
    }
    return World(found, tgts, grouped, Policy(mount_root=MOUNT, sglang_roots=roots))


LOAD = Scope()


def plan(w: World, scope: Scope = LOAD) -> list[tuple[str, str, str]]:
    return [(a.op, a.pod, a.lora_name) for a in serving.plan(w, serving.desired(w), scope)]


VLLM_SET = facts.file_set({"/loraadapters/ns/m1/a1/w.bin": "0" * 32})


# -- who serves what -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("adapter", "deployment", "config", "expected"),
    [
        pytest.param(vllm(), md(), OK_CONFIG, None, id="served"),
        pytest.param(vllm(), md(model="m2"), OK_CONFIG, reasons.MODEL_MISMATCH, id="model-mismatch"),
        pytest.param(vllm(), md(rank="4"), OK_CONFIG, reasons.RANK_TOO_HIGH, id="rank-above-the-targets"),
        pytest.param(vllm(), md(), None, reasons.CONFIG_MISSING, id="no-config"),
        pytest.param(
            vllm(),
            md(),
            ConfigVerdict(False, reasons.UNSUPPORTED_PEFT_TYPE, "IA3"),
            reasons.UNSUPPORTED_PEFT_TYPE,
            id="not-lora",
        ),
    ],
)
def test_vllm_verdicts(
    adapter: dict[str, Any], deployment: dict[str, Any], config: ConfigVerdict | None, expected: str | None
) -> None:
    w = world([adapter], [deployment], config=config)
    desire = serving.desired(w)
    key = AdapterKey("vllm", "ns", "a1")
    if expected is None:
        assert desire.wanted[D1]["a1"].adapter == key
        assert key not in desire.verdicts
    else:
        assert desire.verdicts[key][D1][0] == expected
        assert "a1" not in desire.wanted.get(D1, {})


@pytest.mark.parametrize(
    ("adapter", "serve"),
    [
        pytest.param(vllm(), "serve", id="ready-no-recorded-set"),
        pytest.param(vllm(file_set=VLLM_SET), "serve", id="ready-this-set"),
        pytest.param(vllm(file_set="md5set:older"), "hold", id="ready-but-the-spec-changed"),
        pytest.param(vllm(ready="Unknown", file_set="md5set:older"), "hold", id="verifying-a-change"),
        pytest.param(vllm(ready="Unknown"), "drop", id="never-verified"),
        pytest.param(vllm(ready="False", file_set="md5set:older"), "drop", id="failed"),
        pytest.param(vllm(deletionTimestamp="t"), "drop", id="deleting"),
    ],
)
def test_vllm_serve_state(adapter: dict[str, Any], serve: str) -> None:
    assert facts.vllm_adapter(adapter, MOUNT).serve == serve


def test_a_storage_ref_outside_the_layout_is_not_a_path_engines_read() -> None:
    adapter = vllm()
    adapter["status"]["storageRef"] = {"path": "/../../etc/"}
    assert facts.vllm_adapter(adapter, MOUNT).lora_path == root()  # the layout, not the status
    adapter["status"]["storageRef"] = {"path": "/loraadapters/ns/m1/a1/"}
    assert facts.vllm_adapter(adapter, "/mnt/x/").lora_path == "/mnt/x/loraadapters/ns/m1/a1"


def test_used_by_names_every_deployment_naming_it_served_or_not() -> None:
    w = world([vllm()], [md("b"), md("a", model="m2"), md("c", loras=("other",))])
    assert [t.name for t in serving.desired(w).targets_of[AdapterKey("vllm", "ns", "a1")]] == ["a", "b"]


@pytest.mark.parametrize(
    ("adapters", "target", "owner", "conflicted"),
    [
        pytest.param([sglang()], isvc(), "s1", [], id="alone"),
        pytest.param(
            [sglang("b", created="2026-01-02T00:00:00Z"), sglang("a", created="2026-01-03T00:00:00Z")],
            isvc(),
            "b",
            ["a"],
            id="oldest-wins-not-the-first-by-name",
        ),
        pytest.param(
            [sglang("b", created="2026-01-01T00:00:00Z"), sglang("a", created="2026-01-01T00:00:00Z")],
            isvc(),
            "a",
            ["b"],
            id="same-second-uid-decides",
        ),
        pytest.param(
            [
                sglang("alpha", ns="team-a", target=("ns", "svc")),  # its uid alone would win
                sglang("zeta", ns="ns"),
            ],
            isvc(accepts="team-a"),
            "zeta",
            ["alpha"],
            id="same-second-the-services-own-namespace-first",
        ),
        pytest.param(
            [
                sglang("thief", ns="team-a", target=("ns", "svc"), created="2025-01-01T00:00:00Z"),
                sglang("mine", created="2026-01-01T00:00:00Z"),
            ],
            isvc(),
            "mine",
            [],
            id="an-older-claim-without-consent-takes-nothing",
        ),
        pytest.param(
            [sglang("s1", available=False, created="2025-01-01T00:00:00Z"), sglang("s2")],
            isvc(),
            "s2",
            [],
            id="only-available-adapters-claim",
        ),
    ],
)
def test_sglang_name_ownership(
    adapters: list[dict[str, Any]], target: dict[str, Any], owner: str, conflicted: list[str]
) -> None:
    w = world(adapters, [target])
    desire = serving.desired(w)
    assert desire.wanted[SVC]["x"].adapter.name == owner
    losers = sorted(
        k.name for k, v in desire.verdicts.items() if v.get(SVC, ("",))[0] == reasons.NAME_CONFLICT
    )
    assert losers == conflicted
    for key in desire.verdicts:
        if key.name in conflicted:
            message = desire.verdicts[key][SVC][1]
            assert owner in message and "/adapters/" not in message  # names the owner, never its path


@pytest.mark.parametrize(
    ("adapter", "target", "reason"),
    [
        pytest.param(sglang(ns="team-a"), isvc(), reasons.REFERENCE_NOT_PERMITTED, id="no-consent"),
        pytest.param(
            sglang(ns="team-a"),
            isvc(accepts="team-b"),
            reasons.REFERENCE_NOT_PERMITTED,
            id="another-namespace-accepted",
        ),
        pytest.param(sglang(ns="team-a"), isvc(accepts="team-b, team-a"), None, id="accepted"),
        pytest.param(sglang(ns="team-a"), isvc(accepts="*"), None, id="accepts-any"),
        pytest.param(sglang(path="/sg/../loraadapters/b/m/x"), isvc(), reasons.PATH_NOT_ALLOWED, id="dotdot"),
        pytest.param(sglang(path="relative/x"), isvc(), reasons.PATH_NOT_ALLOWED, id="relative"),
        pytest.param(sglang(path="/a//b"), isvc(), reasons.PATH_NOT_ALLOWED, id="double-slash"),
        pytest.param(sglang(), isvc(runtime="vllm"), reasons.RUNTIME_MISMATCH, id="runtime"),
    ],
)
def test_sglang_verdicts(adapter: dict[str, Any], target: dict[str, Any], reason: str | None) -> None:
    w = world([adapter], [target])
    verdict = serving.sglang_verdict(
        w, w.adapters[AdapterKey("sglang", adapter["metadata"]["namespace"], "s1")]
    )
    assert (verdict[0] if verdict else None) == reason


def test_sglang_paths_confined_to_the_configured_roots() -> None:
    inside, outside = sglang("s1", path="/models/x"), sglang("s2", lora="y", path="/tmp/y")
    w = world([inside, outside], [isvc()], roots=("/models",))
    desire = serving.desired(w)
    assert list(desire.wanted[SVC]) == ["x"]
    assert desire.verdicts[AdapterKey("sglang", "ns", "s2")][SVC][0] == reasons.PATH_NOT_ALLOWED


# -- what each pod needs ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("adapter", "listing", "expected"),
    [
        pytest.param(vllm(), {}, [("load", "p0", "a1")], id="absent"),
        pytest.param(vllm(), None, [("load", "p0", "a1")], id="not-listed-load-blindly"),
        pytest.param(vllm(served={"p0": VLLM_SET}), {"a1": root()}, [], id="serving"),
        pytest.param(vllm(), {"a1": root()}, [("replace", "p0", "a1")], id="ours-without-a-record"),
        pytest.param(
            vllm(served={"p0": "md5set:old"}), {"a1": root()}, [("replace", "p0", "a1")], id="older-set"
        ),
        pytest.param(
            vllm(), {"a1": root(model="m0")}, [("replace", "p0", "a1")], id="ours-from-an-old-model-dir"
        ),
        pytest.param(vllm(), {"a1": "/models/static/a1"}, [], id="a-static-adapter-of-that-name"),
        pytest.param(vllm(), ListingFailure("EngineUnreachable", "x"), [], id="unreachable"),
        pytest.param(vllm(file_set="md5set:older"), {}, [], id="held-while-verify-rules"),
    ],
)
def test_vllm_pod_plan(adapter: dict[str, Any], listing: Any, expected: list[tuple[str, str, str]]) -> None:
    assert plan(world([adapter], [md()], {D1: {"p0": listing}})) == expected


@pytest.mark.parametrize(
    ("adapters", "listing", "expected"),
    [
        pytest.param([sglang(path="/p/new")], {"x": "/p/new"}, [], id="serving"),
        pytest.param(
            [sglang(path="/p/new", loaded_path="/p/old")],
            {"x": "/p/old"},
            [("replace", "p0", "x")],
            id="path-changed",
        ),
        pytest.param([sglang(path="/p/new")], {"x": "/p/someone"}, [], id="foreign-copy-never-touched"),
        pytest.param(
            [
                sglang("owner", path="/p/owner", created="2026-01-01T00:00:00Z"),
                sglang("late", path="/p/late", created="2026-02-01T00:00:00Z"),
            ],
            {"x": "/p/late"},
            [("replace", "p0", "x")],
            id="the-owner-takes-its-name-back",
        ),
    ],
)
def test_sglang_pod_plan(
    adapters: list[dict[str, Any]], listing: dict[str, str], expected: list[tuple[str, str, str]]
) -> None:
    assert plan(world(adapters, [isvc()], {SVC: {"p0": listing}})) == expected


def test_reload_loads_only_into_its_own_pod() -> None:
    w = world([vllm()], [md()], {D1: {"p0": {}, "p1": {}}})
    assert plan(w, Scope(pods=frozenset({(D1, "p1")}))) == [("load", "p1", "a1")]


UNLOAD = Scope(load=False, unload=True)


@pytest.mark.parametrize(
    ("adapters", "listing", "scope", "expected"),
    [
        pytest.param([vllm()], {"a1": root()}, UNLOAD, [], id="wanted-kept"),
        pytest.param([vllm(ready="False")], {"a1": root()}, UNLOAD, [("unload", "p0", "a1")], id="not-ready"),
        pytest.param([], {"a1": root()}, UNLOAD, [("unload", "p0", "a1")], id="orphan-in-our-layout"),
        pytest.param([], {"static": "/models/static"}, UNLOAD, [], id="static-survives"),
        pytest.param([], {"a1": root(ns="other")}, UNLOAD, [], id="another-namespaces-layout"),
        pytest.param([], {"a1": root(name="b1")}, UNLOAD, [], id="name-differs-from-path"),
        pytest.param(
            [vllm(ready="False")],
            {"a1": root()},
            Scope(adapters=frozenset({AdapterKey("vllm", "ns", "zz")}), load=False, unload=True),
            [],
            id="out-of-scope",
        ),
    ],
)
def test_vllm_unload_plan(
    adapters: list[dict[str, Any]],
    listing: dict[str, str],
    scope: Scope,
    expected: list[tuple[str, str, str]],
) -> None:
    assert plan(world(adapters, [md()], {D1: {"p0": listing}}), scope) == expected


def test_sglang_unload_takes_only_a_copy_from_the_adapters_own_path() -> None:
    gone = sglang("s1", path="/p/s1", available=False)
    w = world([gone], [isvc()], {SVC: {"p0": {"x": "/p/s1"}, "p1": {"x": "/p/someone-else"}}})
    assert plan(w, UNLOAD) == [("unload", "p0", "x")]


def test_deleting_another_claimant_never_unloads_the_owners_copy() -> None:
    owner = sglang("owner", path="/p/owner", created="2026-01-01T00:00:00Z")
    doomed = sglang("doomed", path="/p/doomed", created="2026-02-01T00:00:00Z", deletionTimestamp="t")
    w = world([owner, doomed], [isvc()], {SVC: {"p0": {"x": "/p/owner"}}})
    assert (
        plan(w, Scope(adapters=frozenset({AdapterKey("sglang", "ns", "doomed")}), load=False, unload=True))
        == []
    )


# -- after the calls: the status --------------------------------------------------------------------
def outcome(
    op: str, pod: str, ok: bool = True, reason: str = LOADED, message: str = "", retryable: bool = False
) -> Outcome:
    action = Action(op, D1, pod, "a1", AdapterKey("vllm", "ns", "a1"), root(), VLLM_SET)  # type: ignore[arg-type]
    return Outcome(action, ok, reason, message, retryable)


def report_after(
    pods: dict[str, Any], outcomes: list[Outcome], adapter: dict[str, Any] | None = None
) -> serving.ServingReport:
    w = world([adapter or vllm()], [md()], {D1: pods})
    after = serving.apply(w, outcomes)
    return serving.serving_report(after, serving.desired(after), AdapterKey("vllm", "ns", "a1"), outcomes)


def test_loads_that_succeeded_are_served_and_recorded() -> None:
    report = report_after({"p0": {}, "p1": {}}, [outcome("load", "p0"), outcome("load", "p1")])
    assert report.served == {"p0": VLLM_SET, "p1": VLLM_SET}
    assert report.loaded_now == ("p0", "p1")
    assert loaded.summarize(report)[:2] == ("True", reasons.LOADED_REASON)
    assert loaded.summarize(report).message == "loaded in 2 Ready pod(s): d1 2/2"


def test_a_name_the_engine_put_out_to_make_room_leaves_the_pods_listing() -> None:
    """A load's answer (SGLang's loaded_adapters) no longer lists a name the pod listed before and
    that no call of this run unloaded: the engine evicted it, because another writer loaded into
    the pod meanwhile. What the run itself unloaded, or an answer that says nothing, is no sign."""
    s2 = AdapterKey("sglang", "ns", "s2")
    w = world(
        [sglang("s1", "s1", "/p/s1"), sglang("s2", "s2", "/p/s2", created="2026-02-01T00:00:00Z")],
        [isvc()],
        {SVC: {"p0": {"s1": "/p/s1", "x": "/p/x"}, "p1": {"s1": "/p/s1"}}},
    )
    unload_x = Outcome(
        Action("unload", SVC, "p0", "x", AdapterKey("sglang", "ns", "x")), True, reasons.POD_UNLOADED
    )
    load = Action("load", SVC, "p0", "s2", s2, "/p/s2", "/p/s2")
    evicting = Outcome(load, True, LOADED, holds={"s2": "/p/s2", "theirs": "/p/theirs"})
    silent = Outcome(load._replace(pod="p1"), True, LOADED)
    outcomes = [unload_x, evicting, silent]
    assert serving.put_out(w, outcomes) == {(SVC, "p0"): frozenset({"s1"})}
    after = serving.apply(w, outcomes)
    assert {p.name: dict(p.listing or {}) for p in after.pods[SVC]} == {
        "p0": {"s2": "/p/s2"},
        "p1": {"s1": "/p/s1", "s2": "/p/s2"},
    }
    assert serving.put_out(w, [unload_x, evicting._replace(holds={"s1": "/p/s1", "s2": "/p/s2"})]) == {}


OLD_SET = "md5set:older"


def test_records_written_meanwhile_by_another_invocation_are_kept() -> None:
    """A reload into restarted p1 observed p0 serving the older set; before its status write, a
    load replaced p0 and recorded it. The write, re-read after its 409, keeps load's record of
    p0 and adds its own of p1: not the older p0 it once observed (a pod then called stale while
    its engine serves the current set)."""
    key = AdapterKey("vllm", "ns", "a1")
    w = world([vllm(served={"p0": OLD_SET})], [md()], {D1: {"p0": {"a1": root()}, "p1": {}}})
    outcomes = [outcome("load", "p1")]
    after = serving.apply(w, outcomes)
    desire = serving.desired(after)
    observed = serving.serving_report(after, desire, key, outcomes)
    assert observed.served == {"p0": OLD_SET, "p1": VLLM_SET}  # what the write would have put back
    newer = serving.with_records(after, key, {"p0": VLLM_SET}, outcomes)
    report = serving.serving_report(newer, desire, key, outcomes)
    assert report.served == {"p0": VLLM_SET, "p1": VLLM_SET}
    assert loaded.summarize(report)[:2] == ("True", reasons.LOADED_REASON)


def test_a_pods_record_this_invocation_changed_is_its_own() -> None:
    """What this invocation's calls did to a pod wins over an older read of it: its load of p0,
    its unload from p1 (the record goes), and not an "already loaded" (someone else's load)."""
    key = AdapterKey("vllm", "ns", "a1")
    w = world([vllm(served={"p1": VLLM_SET})], [md()], {D1: {"p0": {}, "p1": {"a1": root()}, "p2": {}}})
    outcomes = [
        outcome("load", "p0"),
        outcome("unload", "p1", reason=reasons.POD_UNLOADED),
        outcome("load", "p2", reason=reasons.POD_ALREADY_LOADED),
    ]
    after = serving.apply(w, outcomes)
    newer = serving.with_records(after, key, {"p0": OLD_SET, "p1": OLD_SET, "p2": VLLM_SET}, outcomes)
    assert newer.adapters[key].served == {"p0": VLLM_SET, "p2": VLLM_SET}


@pytest.mark.parametrize(
    ("pods", "outcomes", "expected"),
    [
        pytest.param(
            {"p0": {}, "p1": {}},
            [outcome("load", "p0"), outcome("load", "p1", False, "EngineError", "boom", True)],
            reasons.LOAD_FAILED,
            id="one-failed",
        ),
        pytest.param(
            {"p0": {}, "p1": {}},
            [outcome("load", "p0")],
            reasons.LOADING,
            id="another-pods-own-reload-pending",
        ),
        pytest.param({"p0": {"a1": root()}}, [], reasons.UPDATING, id="an-older-set-still-served"),
        pytest.param(
            {"p0": {"a1": "/models/a1"}}, [], reasons.NAME_CONFLICT, id="name-taken-by-a-static-adapter"
        ),
        pytest.param({}, [], reasons.NO_READY_REPLICAS, id="no-pods"),
        pytest.param(
            {"p0": ListingFailure("EngineAnswerInvalid", "garbage", False)},
            [],
            reasons.LOAD_FAILED,
            id="garbage-listing",
        ),
    ],
)
def test_loaded_reasons(pods: dict[str, Any], outcomes: list[Outcome], expected: str) -> None:
    assert loaded.summarize(report_after(pods, outcomes)).reason == expected


def test_a_status_for_another_tenant_names_no_pods_and_no_engine_answers() -> None:
    adapter = sglang(ns="team-a", target=("ns", "svc"))
    w = world(
        [adapter],
        [isvc(accepts="team-a")],
        {SVC: {"secret-pod": ListingFailure("EngineAnswerInvalid", "internal detail", False)}},
    )
    report = serving.serving_report(w, serving.desired(w), AdapterKey("sglang", "team-a", "s1"))
    state = loaded.summarize(report, redact=True)
    assert state.reason == reasons.LOAD_FAILED
    assert "secret-pod" not in state.message and "internal detail" not in state.message


# -- properties ----------------------------------------------------------------------------------------
NAMES = st.sampled_from(["a1", "a2", "a3"])
LISTINGS = st.dictionaries(
    NAMES,
    st.sampled_from([root("a1"), root("a2"), root("a3"), "/models/static", root("a1", model="m0")]),
    max_size=3,
)


@settings(max_examples=200, deadline=None)
@given(
    ready=st.dictionaries(NAMES, st.sampled_from(["True", "False", "Unknown"]), min_size=1),
    named=st.lists(NAMES, unique=True),
    pods=st.dictionaries(st.sampled_from(["p0", "p1", "p2"]), LISTINGS, max_size=3),
)
def test_plans_converge_and_never_touch_what_is_not_ours(
    ready: dict[str, str], named: list[str], pods: dict[str, dict[str, str]]
) -> None:
    adapters = [vllm(name, ready=state) for name, state in ready.items()]
    w = world(adapters, [md(loras=tuple(named))], {D1: pods})
    scope = Scope(load=True, unload=True)
    actions = serving.plan(w, serving.desired(w), scope)
    for action in actions:
        if action.op == "unload":
            listed = pods[action.pod][action.lora_name]
            assert serving.vllm_layout_owner(listed, "ns", MOUNT) is not None  # only our layout
        else:
            assert action.lora_name in named and ready.get(action.lora_name) == "True"
    # every call succeeds: nothing is left to do, and every wanted pod serves the current set
    after = serving.apply(
        w, [Outcome(a, True, LOADED if a.op != "unload" else reasons.POD_UNLOADED) for a in actions]
    )
    assert serving.plan(after, serving.desired(after), scope) == []
    for name in named:
        if ready.get(name) == "True":
            report = serving.serving_report(after, serving.desired(after), AdapterKey("vllm", "ns", name))
            assert all(p.state in ("serving", "occupied") for t in report.targets for p in t.pods)

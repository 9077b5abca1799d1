"""resync page by page says exactly what the whole world says (functions/logic/drift.py: shards).

Random clusters on fakes: namespaces with ModelDeployments and InferenceServices, vllm adapters
in every state (in sync, missing from a pod, stale status, deleting, not Ready, orphan copies,
static adapters of the same name), sglang adapters claiming names across namespaces (consent
or not, name conflicts, older paths). The resync handler, reading with pages of 1, 2, 3 or 500
objects, must publish the same nudges, reasons included, as `drift.drift` over one snapshot of
everything (the planner's answer before resync read page by page).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from events.domain import RESYNC_SHARD, STEP_EXTENSION
from events.external import PING
from functions import resync
from functions.edge import inputs
from functions.edge.bootstrap import Deps
from functions.logic import capacity, drift
from functions.logic.facts import file_set
from functions.resources.kinds import (
    INFERENCE_SERVICE,
    MODEL,
    MODEL_DEPLOYMENT,
    POD,
    SGLANG_ADAPTER,
    VLLM_ADAPTER,
)
from functions.settings import Settings
from tests.support.fakes import FakeBroker, FakeEngines, FakeKube
from tests.support.objects import (
    MOUNT,
    condition,
    inference_service,
    model_deployment,
    pod,
    sglang_adapter,
    url_of,
    vllm_adapter,
)

Obj = dict[str, Any]
NAMESPACES = ("ns", "ns-a", "ns-b")  # etcd lists "ns-a/..." before "ns/..."
LORAS = ("x", "y")
PATHS = ("/p/1", "/p/2")
STAMPS = ("2026-01-01T00:00:00Z", "2026-01-01T00:00:05Z")
CAPACITY_ARGS = ([], [], ["--max-cpu-loras=1"], ["--max-cpu-loras", "3"], ["--max-loras=0"])
"""A vllm pod's arguments: no capacity, one that binds, one that may, and garbage."""
RESIDENCIES = (None, "resident", "reloadable")


def _vllm(draw: st.DrawFn, namespace: str, name: str, pods: list[str], mds: list[str]) -> Obj:
    state = draw(st.sampled_from(["ready", "ready", "not-ready", "failed", "deleting", "model-missing"]))
    used = sorted(draw(st.sets(st.sampled_from(mds)))) if mds else []
    obj = vllm_adapter(namespace, name, ready=state in ("ready", "deleting"), usedBy=used)
    status = obj["status"]
    if state == "failed":
        status["conditions"][0].update(reason="IntegrityCheckFailed")
        status["phase"] = "Failed"
    if state == "model-missing":
        status["conditions"][0].update(reason="ModelNotFound")
        obj["spec"]["model"] = draw(st.sampled_from(["m1", "m2"]))
    if state == "deleting":
        obj["metadata"]["deletionTimestamp"] = STAMPS[0]
    if draw(st.booleans()):
        obj["metadata"]["generation"] = draw(st.sampled_from([1, 2]))
    loaded = draw(st.sampled_from(["none", "true", "false-notreferenced", "false-rank"]))
    if loaded == "true":
        message = draw(
            st.sampled_from(["loaded in 1 Ready pod(s): d0 1/1", "loaded in 2 Ready pod(s): d0 2/2"])
        )
        status["conditions"].append(condition("Loaded", "True", "Loaded", message))
    elif loaded == "false-notreferenced":
        status["conditions"].append(condition("Loaded", "False", "NotReferenced"))
    elif loaded == "false-rank":
        status["conditions"].append(condition("Loaded", "False", "RankTooHigh"))
    served = draw(st.sets(st.sampled_from(pods))) if pods else set()
    if served:
        stale = draw(st.booleans())
        status["served"] = [
            {
                "pod": p,
                "fileSet": file_set({}) if stale else status.get("fileSet", ""),
                **({"residency": r} if (r := draw(st.sampled_from(RESIDENCIES))) else {}),
            }
            for p in sorted(served)
        ]
    return obj


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[Obj], dict[str, dict[str, str]]]:
    """(objects, listing by engine url)."""
    objects: list[Obj] = [
        {"apiVersion": MODEL.api_version, "kind": MODEL.kind, "metadata": {"name": "m1", "namespace": ns}}
        for ns in NAMESPACES
    ]
    objects += [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}} for ns in NAMESPACES]
    engines: dict[str, dict[str, str]] = {}
    ip = iter(range(1, 250))
    isvcs = [(ns, f"svc{i}") for ns in NAMESPACES for i in range(draw(st.integers(0, 2)))]
    for namespace, name in isvcs:
        accepts = draw(st.sampled_from([None, "*", "ns-a", "ns ns-b"]))
        runtime = draw(st.sampled_from(["sglang", "sglang", "vllm"]))
        isvc = inference_service(namespace, name, accepts, runtime)
        objects.append(isvc)
        for p in range(draw(st.integers(0, 2))):
            served = pod(namespace, f"{name}-{p}", isvc, f"10.1.0.{next(ip)}")
            objects.append(served)
            engines[url_of(served)] = {
                lora: path for lora in LORAS if (path := draw(st.sampled_from([None, *PATHS]))) is not None
            }
    for namespace in NAMESPACES:
        names = [f"a{i}" for i in range(draw(st.integers(0, 5)))]
        mds = [f"d{i}" for i in range(draw(st.integers(0, 2)))]
        pod_names: list[str] = []
        for md_name in mds:
            wanted = sorted(draw(st.sets(st.sampled_from([*names, "gone"])))) if names else []
            md = model_deployment(namespace, md_name, wanted)
            if draw(st.booleans()):
                md["spec"]["engineArgs"] = draw(st.sampled_from(CAPACITY_ARGS))
            objects.append(md)
            for p in range(draw(st.integers(0, 2))):
                served = pod(namespace, f"{md_name}-{p}", md, f"10.0.0.{next(ip)}")
                served["spec"]["containers"][0]["args"] = draw(st.sampled_from(CAPACITY_ARGS))
                objects.append(served)
                pod_names.append(f"{md_name}-{p}")
                listing: dict[str, str] = {}
                for lora in [*names, "gone", "orphan"]:
                    if draw(st.booleans()):
                        listing[lora] = f"{MOUNT}/loraadapters/{namespace}/m1/{lora}"
                if draw(st.booleans()):
                    listing["static"] = "/models/static"
                engines[url_of(served)] = listing
        for name in names:
            objects.append(_vllm(draw, namespace, name, pod_names, mds))
        for i in range(draw(st.integers(0, 4))):
            target = draw(st.sampled_from([*isvcs, (namespace, "missing")]))
            lora, path = draw(st.sampled_from(LORAS)), draw(st.sampled_from(PATHS))
            adapter = sglang_adapter(
                namespace, f"s{i}", lora, path, target, draw(st.sampled_from(STAMPS)), draw(st.booleans())
            )
            if draw(st.booleans()):
                adapter["status"]["loadedPath"] = draw(st.sampled_from(PATHS))
            if draw(st.booleans()):
                message = f"loaded in 1 Ready pod(s) of {target[0]}/{target[1]}"
                adapter["status"]["conditions"].append(condition("Loaded", "True", "Loaded", message))
            if draw(st.integers(0, 5)) == 0:
                adapter["metadata"]["deletionTimestamp"] = STAMPS[0]
            observed = draw(st.sampled_from([1, 1, 1, 0]))  # 0: a generation admit has not seen
            for c in adapter["status"]["conditions"]:
                c["observedGeneration"] = observed
            objects.append(adapter)
    return objects, engines


def _whole_world(kube: FakeKube, engines: FakeEngines, deps: Deps) -> drift.Snapshot:
    """Everything at once, as resync observed it before it read page by page."""
    grouped: dict[str, dict[drift.Namespaced, dict[str, Any]]] = {
        "md": defaultdict(dict),
        "isvc": defaultdict(dict),
    }
    args: dict[tuple[drift.Namespaced, str], list[object]] = {}
    for obj in kube.iter(POD):
        target = inputs.serving_target(obj)
        ep = resync.fleet.endpoint_of(deps, obj, target) if target is not None else None
        if target is None or ep is None:
            continue
        which = "md" if target.kind == "ModelDeployment" else "isvc"
        args[((target.namespace, target.name), ep.pod)] = capacity.container_args(obj)
        listing = engines.listing(ep)
        grouped[which][(target.namespace, target.name)][ep.pod] = (
            listing if isinstance(listing, dict) else None
        )
    v1 = list(kube.iter(VLLM_ADAPTER))
    models = frozenset(k for k in drift.missing_models(v1) if kube.get(MODEL, k[0], k[1]) is not None)
    deployments = list(kube.iter(MODEL_DEPLOYMENT))
    return drift.Snapshot(
        v1=v1,
        v2=list(kube.iter(SGLANG_ADAPTER)),
        deployments=deployments,
        services=list(kube.iter(INFERENCE_SERVICE)),
        md_pods=grouped["md"],
        md_capacity=drift.vllm_capacities(deployments, grouped["md"], args),
        isvc_pods=grouped["isvc"],
        models=models,
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters(), st.sampled_from([1, 2, 3, 500]), st.booleans(), st.sampled_from([1, 1, 2, 3, 4]))
def test_page_by_page_nudges_equal_the_whole_worlds(
    cluster: tuple[list[Obj], dict[str, dict[str, str]]], page: int, full: bool, parts: int
) -> None:
    """With LORAFLOW_RESYNC_SHARDS > 1 the tick publishes its parts, and each part's nudges are
    its namespaces' share: all parts together say exactly what the whole world says."""
    objects, listings = cluster
    kube, engines, broker = FakeKube(*objects), FakeEngines(), FakeBroker()
    for url, listing in listings.items():
        engines.engine(url).loaded.update(listing)
    deps = Deps(
        Settings(mount_root=MOUNT, list_page_size=page, resync_shards=parts),
        kube=kube,
        engines=engines,
        broker=broker,
        clock=lambda: datetime(2026, 6, 1, tzinfo=UTC),
    )
    restat = "the filer's log lost its cursor" if full else None  # a full resync: stat everything
    expected = sorted(drift.drift(_whole_world(kube, engines, deps), MOUNT, restat=restat))
    resync.handle(resync_ping(restat), deps)
    if parts > 1:
        ticked = list(broker.events)
        assert [e["type"] for e in ticked] == [RESYNC_SHARD] * len(ticked)
        dealt = [ns for e in ticked for ns in e.get_data()["namespaces"]]  # type: ignore[index]
        assert sorted(dealt) == sorted(NAMESPACES) and len(ticked) == min(parts, len(NAMESPACES))
        broker.events.clear()
        for shard in ticked:
            resync.handle(shard, deps)
    published = sorted(
        drift.Nudge(
            e.get_data()["adapter"]["apiVersion"],  # type: ignore[index]
            e.get_data()["adapter"]["namespace"],  # type: ignore[index]
            e.get_data()["adapter"]["name"],  # type: ignore[index]
            e[STEP_EXTENSION],
            e.get_data()["reason"],  # type: ignore[index]
        )
        for e in broker.events
    )
    assert published == expected


def resync_ping(full: str | None = None) -> Any:
    from cloudevents.http import CloudEvent

    data = {"full": True, "reason": full} if full else None
    return CloudEvent({"type": PING, "source": "/tests", "id": "tick"}, data)


def test_read_ahead_keeps_order_raises_the_sources_error_and_stops_with_its_reader() -> None:
    items = [{"n": i} for i in range(25)]
    assert list(resync.read_ahead(iter(items), 4)) == items

    def failing() -> Any:
        yield {"n": 0}
        raise RuntimeError("page 2")

    with pytest.raises(RuntimeError, match="page 2"):
        list(resync.read_ahead(failing(), 1))

    pulled: list[int] = []

    def endless() -> Any:
        for i in range(10_000):
            pulled.append(i)
            yield {"n": i}

    reader = resync.read_ahead(endless(), 10)
    assert next(reader) == {"n": 0}
    reader.close()  # the consumer gives up: the pump reads at most the pages already queued
    assert len(pulled) <= 10 * 4

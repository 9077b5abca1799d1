"""reload: a new or restarted serving Pod gets back the adapters it should serve.

Trigger: apiserver add/update of a Pod (serving pods, label `loraflow.io/serving=true`).
Reads: the Pod (re-read: the event is a nudge), its engine's `/health` and `GET /v1/models`,
its ModelDeployment / InferenceService and their adapters, `adapter_config.json` (seed 1).
Loads only into this pod: the targets' other Ready pods are observed (their own Pod events
reload them) and count as NotLoaded in the status while they lack an adapter, so neither their
loads nor their failures are attributed to this pod's event.
Writes: each affected adapter's status as load does (Loaded recomputed over every Ready pod of
the targets; seed 2 `lastLoadedAt` moves when a load call succeeded).
Outcomes: 200 + `pod.reloaded` when something was loaded into this pod; 204 when the pod is
gone, not Ready, or already complete; 503 when the pod is Ready but its engine's /health is
not 200 (no further Pod event is guaranteed while it stays Ready, so the Broker must retry), or
when a load into this pod failed retryably.
"""

from __future__ import annotations

from cloudevents.http import CloudEvent

from events.domain import POD_RELOADED, PodFailure, PodReloaded
from events.external import API_ADD, API_UPDATE
from functions import _edge, _inputs, _serving
from functions._edge import Deps
from functions._serving import Fleet, Plan
from functions.errors import EngineUnavailable
from functions.logic import targets
from functions.logic.loading import TargetResult, describe_failures
from functions.logic.pods import endpoint
from functions.resources.kinds import (
    INFERENCE_SERVICE_LABEL,
    MODEL_DEPLOYMENT,
    MODEL_DEPLOYMENT_LABEL,
    POD,
    SGLANG_ADAPTER,
    VLLM_ADAPTER,
)

NAME = "reload"
ACCEPTS = (API_ADD, API_UPDATE)


def handle(event: CloudEvent, deps: Deps) -> _edge.Reply:
    obj = _inputs.kube_object(event)
    if obj.get("kind") != "Pod" or obj.get("apiVersion") != "v1":
        return None
    namespace, name = targets.namespace_of(obj), targets.name_of(obj)
    pod = deps.kube.get(POD, namespace, name)
    labels = ((pod or {}).get("metadata") or {}).get("labels") or {}
    md, isvc = labels.get(MODEL_DEPLOYMENT_LABEL), labels.get(INFERENCE_SERVICE_LABEL)
    ep = endpoint(pod, "vllm" if md else "sglang") if pod is not None else None
    if ep is None or not (md or isvc):
        return None
    if not deps.engines.healthy(ep):
        raise EngineUnavailable(f"pod {namespace}/{name} is Ready but its engine /health is not 200")
    fleet = Fleet(deps)
    deployments: list[dict[str, object]] = []
    if md:
        plans = plans_v1(fleet, namespace, md, name, deployments)
    else:
        plans = plans_v2(fleet, namespace, str(isvc), name)
    _serving.execute(fleet, [p for _, group in plans for p in group])
    outcomes = [(adapter, [p.result() for p in group]) for adapter, group in plans]
    # one status write per adapter, concurrently (bounded); each starts from the object as
    # listed above, so an adapter whose status would not change costs no request at all
    deps.engines.fan_out(outcomes, lambda item: write(deps, item[0], item[1], name, deployments))
    all_results = [r for _, results in outcomes for r in results]
    _serving.raise_if_retryable(all_results, f"reload pod {namespace}/{name}")
    return answer(namespace, name, plans)


def plans_v1(
    fleet: Fleet, namespace: str, md_name: str, pod: str, deployments: list[dict[str, object]]
) -> list[tuple[dict[str, object], list[Plan]]]:
    """Plans for the adapters `md_name` should serve; fills `deployments` (the namespace's)."""
    deps = fleet.deps
    md = deps.kube.get(MODEL_DEPLOYMENT, namespace, md_name)
    if md is None:
        return []
    deployments += deps.kube.list_all(MODEL_DEPLOYMENT, namespace)
    adapters = {targets.name_of(a): a for a in deps.kube.list_all(VLLM_ADAPTER, namespace)}
    wanted = targets.desired_v1(md, adapters, deps.settings.mount_root)
    fleet.prefetch_configs([adapters[name] for name in wanted])
    return [
        (adapters[name], _serving.plan_v1(fleet, adapters[name], deployments, {pod}))
        for name in sorted(wanted)
    ]


def plans_v2(fleet: Fleet, namespace: str, isvc: str, pod: str) -> list[tuple[dict[str, object], list[Plan]]]:
    chosen = [
        a
        for a in fleet.deps.kube.iter(SGLANG_ADAPTER)
        if targets.targets_isvc(a, namespace, isvc) and targets.available_v2(a)
    ]
    return [(a, [_serving.plan_v2(fleet, a, {pod})]) for a in chosen]


def write(
    deps: Deps,
    adapter: dict[str, object],
    results: list[TargetResult],
    pod: str,
    deployments: list[dict[str, object]],
) -> None:
    """`adapter` as listed by this invocation; `deployments`: its namespace's (seed 1)."""
    if _serving.kind_of(adapter) == SGLANG_ADAPTER:
        _serving.write_v2(deps, adapter, results[0], fresh=True)
    else:
        used = targets.used_by(targets.name_of(adapter), deployments)
        _serving.write_v1(deps, adapter, used, results, fresh=True)
    mine = [TargetResult(r.target, pods=tuple(p for p in r.failed if p.pod == pod)) for r in results]
    if any(r.failed for r in mine):
        _serving.warn(deps, adapter, "LoadFailed", describe_failures(mine), NAME)


def answer(namespace: str, pod: str, plans: list[tuple[dict[str, object], list[Plan]]]) -> _edge.Reply:
    loaded: list[str] = []
    failed: list[PodFailure] = []
    for _, group in plans:
        for plan in group:
            mine = plan.results.get(pod)
            if mine is None or plan.wanted is None:
                continue
            if mine.loaded_now:
                loaded.append(plan.wanted.lora_name)
            elif not mine.ok:
                failed.append(PodFailure(pod=pod, reason=mine.reason, message=mine.message))
    if not loaded:
        return None
    data = PodReloaded(namespace=namespace, pod=pod, adapters=sorted(set(loaded)), failed=failed)
    return _edge.reply(POD_RELOADED, NAME, POD.path(namespace, pod), data)


reload = _edge.function(NAME, ACCEPTS, handle)

"""resync: the periodic safety net. Finds drift and publishes one nudge per (adapter, step).

Trigger: `dev.knative.sources.ping`.
Reads: ModelDeployments, InferenceServices and serving Pods (`loraflow.io/serving=true`), held
for the tick (targets and pods are few); the adapters of both kinds page by page
(`LORAFLOW_LIST_PAGE_SIZE`), never all at once; one `GET /v1/models` per Ready pod (fanned out),
one namespace's pods at a time.
Writes: nothing. Publishes `io.loraflow.adapter.drifted.v1` (extension `loraflowstep` =
admit|stat|load|unload, data.reason) to the Broker for what drifted only, shard by shard.
Outcomes: 204 (nudges are published, not replied); 503 when the API or the Broker fails.
Cost: the paginated lists (about adapters / page size requests, the sglang kind twice) + one
listing per Ready pod, no per-adapter API call; memory: one page of adapters, one namespace's
sglang adapters and pod listings, the targets and pods (functions/logic/drift.py: shards).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import groupby
from typing import Any, NamedTuple

from cloudevents.http import CloudEvent

from events.domain import ADAPTER_DRIFTED, STEP_EXTENSION, AdapterDrifted, AdapterRef
from events.external import PING, PingData
from functions import _edge, _inputs
from functions._edge import Deps
from functions.adapters import fleet
from functions.adapters.concurrency import bounded_map
from functions.logic import drift, facts
from functions.logic.pods import Endpoint
from functions.logic.serving import AdapterKey, TargetKey
from functions.resources.kinds import (
    ADAPTER_KINDS,
    INFERENCE_SERVICE,
    MODEL,
    MODEL_DEPLOYMENT,
    POD,
    SERVING_LABEL,
    SGLANG_ADAPTER,
    VLLM_ADAPTER,
)

NAME = "resync"
ACCEPTS = (PING,)
Obj = dict[str, Any]


def handle(event: CloudEvent, deps: Deps) -> _edge.Reply:
    if event.get_data() not in (None, b"", ""):
        _edge.data_as(event, PingData)  # a tick carries an object or nothing; garbage is a 400
    for snapshot in shards(deps):
        for nudge in drift.drift(snapshot, deps.settings.mount_root):
            deps.broker.publish(to_event(nudge))
    return None


class Held(NamedTuple):
    """What a tick holds from start to end: the targets and the Ready pods' engines."""

    deployments: Mapping[str, Sequence[Obj]]
    """namespace -> its ModelDeployments."""
    services: Mapping[drift.Namespaced, Obj]
    pods: Mapping[TargetKey, Sequence[Endpoint]]


def hold(deps: Deps) -> Held:
    kube, page = deps.kube, deps.settings.list_page_size
    deployments: dict[str, list[Obj]] = defaultdict(list)
    for md in kube.iter(MODEL_DEPLOYMENT, page_size=page):
        deployments[facts.namespace_of(md)].append(md)
    services = {
        (facts.namespace_of(s), facts.name_of(s)): s for s in kube.iter(INFERENCE_SERVICE, page_size=page)
    }
    pods: dict[TargetKey, list[Endpoint]] = defaultdict(list)
    for pod in kube.iter(POD, None, f"{SERVING_LABEL}=true", page_size=page):
        target = _inputs.serving_target(pod)
        ep = fleet.endpoint_of(deps, pod, target) if target is not None else None
        if ep is not None and target is not None:
            pods[target].append(ep)
    return Held(dict(deployments), services, dict(pods))


def listings(deps: Deps, held: Held, targets: Iterable[TargetKey]) -> dict[drift.Namespaced, dict[str, Any]]:
    """(namespace, target) -> Ready pod -> its engine's listing (None: unreachable)."""
    located = [(t, ep) for t in targets for ep in held.pods.get(t, ())]
    grouped: dict[drift.Namespaced, dict[str, Any]] = defaultdict(dict)
    if not located:  # no serving pod, no engine client: an idle namespace pays for none
        return grouped
    listed = bounded_map([ep for _, ep in located], deps.engines.listing, deps.settings.load_concurrency)
    for (target, ep), (_, found) in zip(located, listed, strict=True):
        grouped[(target.namespace, target.name)][ep.pod] = found if isinstance(found, dict) else None
    return grouped


class Models:
    """Models are read by name only (RBAC: get), and only those some adapter said were missing;
    each once per tick."""

    def __init__(self, deps: Deps) -> None:
        self._deps = deps
        self._exists: dict[drift.Namespaced, bool] = {}

    def existing(self, adapters: Sequence[Obj]) -> frozenset[drift.Namespaced]:
        for key in sorted(drift.missing_models(adapters)):
            if key not in self._exists:
                self._exists[key] = self._deps.kube.get(MODEL, key[0], key[1]) is not None
        return frozenset(key for key, found in self._exists.items() if found)


def shards(deps: Deps) -> Iterator[drift.Snapshot]:
    """The world as shards (functions/logic/drift.py), read as they are judged."""
    held = hold(deps)
    models = Models(deps)
    yield from _vllm_shards(deps, held, models)
    yield from _sglang_shards(deps, held)


def _chunks(objects: Iterable[Obj], size: int) -> Iterator[tuple[str, list[Obj]]]:
    """(namespace, at most `size` adapters of it), in the list's (namespace, name) order."""
    for namespace, group in groupby(objects, key=facts.namespace_of):
        chunk: list[Obj] = []
        for obj in group:
            chunk.append(obj)
            if len(chunk) >= size:
                yield namespace, chunk
                chunk = []
        if chunk:
            yield namespace, chunk


def _vllm_shards(deps: Deps, held: Held, models: Models) -> Iterator[drift.Snapshot]:
    """One namespace at a time: its ModelDeployments and their pods' listings, then its
    adapters a chunk at a time, then the copies no chunk named (orphans)."""
    page = deps.settings.list_page_size
    pending = sorted(held.deployments)  # namespaces with deployments not reached yet
    current: str | None = None
    pods: dict[drift.Namespaced, dict[str, Any]] = {}
    unnamed: set[str] = set()

    def enter(namespace: str) -> None:
        nonlocal current, pods, unnamed
        current = namespace
        targets = [TargetKey("ModelDeployment", namespace, facts.name_of(md)) for md in _mds(held, namespace)]
        pods = listings(deps, held, targets)
        unnamed = drift.listed(pods)

    def leave() -> Iterator[drift.Snapshot]:
        if current is not None and unnamed:
            yield drift.Snapshot(deployments=_mds(held, current), md_pods=drift.restrict(pods, unnamed))

    adapters = deps.kube.iter(VLLM_ADAPTER, page_size=page)
    for namespace, chunk in _chunks(adapters, page):
        if namespace != current:
            yield from leave()
            while pending and pending[0] < namespace:
                enter(pending.pop(0))
                yield from leave()
            if pending and pending[0] == namespace:
                pending.pop(0)
            enter(namespace)
        names = {facts.name_of(obj) for obj in chunk}
        unnamed -= names
        yield drift.Snapshot(
            v1=chunk,
            deployments=_mds(held, namespace),
            md_pods=drift.restrict(pods, names),
            models=models.existing(chunk),
        )
    yield from leave()
    for namespace in pending:
        enter(namespace)
        yield from leave()


def _mds(held: Held, namespace: str) -> Sequence[Obj]:
    return held.deployments.get(namespace, ())


def _sglang_shards(deps: Deps, held: Held) -> Iterator[drift.Snapshot]:
    """One namespace at a time: its adapters (their lifecycle), with every claimant of its
    InferenceServices (their serving), the claimants from other namespaces read first."""
    page = deps.settings.list_page_size
    foreign: dict[str, list[Obj]] = defaultdict(list)
    for obj in deps.kube.iter(SGLANG_ADAPTER, page_size=page):
        ref = facts.isvc_ref(obj)
        if ref.namespace != facts.namespace_of(obj):
            foreign[ref.namespace].append(obj)
    isvc_namespaces = {namespace for namespace, _ in held.services}
    pending = sorted(isvc_namespaces | set(foreign))
    adapters = deps.kube.iter(SGLANG_ADAPTER, page_size=page)
    for namespace, group in groupby(adapters, key=facts.namespace_of):
        while pending and pending[0] < namespace:
            yield _sglang_shard(deps, held, pending.pop(0), [], foreign)
        if pending and pending[0] == namespace:
            pending.pop(0)
        yield _sglang_shard(deps, held, namespace, list(group), foreign)
    for namespace in pending:
        yield _sglang_shard(deps, held, namespace, [], foreign)


def _sglang_shard(
    deps: Deps,
    held: Held,
    namespace: str,
    own: list[Obj],
    foreign: Mapping[str, Sequence[Obj]],
) -> drift.Snapshot:
    claimants = list(foreign.get(namespace, ()))
    referenced = {(ref.namespace, ref.name) for ref in map(facts.isvc_ref, own)}
    services = [s for key, s in sorted(held.services.items()) if key[0] == namespace or key in referenced]
    targets = [TargetKey("InferenceService", ns, n) for ns, n in sorted(held.services) if ns == namespace]
    return drift.Snapshot(
        v2=own + claimants,
        services=services,
        isvc_pods=listings(deps, held, targets),
        lifecycle=frozenset(_key("sglang", obj) for obj in own),
        serving=frozenset(
            _key("sglang", obj) for obj in own + claimants if facts.isvc_ref(obj).namespace == namespace
        ),
    )


def _key(kind: str, obj: Obj) -> AdapterKey:
    return AdapterKey(kind, facts.namespace_of(obj), facts.name_of(obj))  # type: ignore[arg-type]


def to_event(nudge: drift.Nudge) -> CloudEvent:
    ref = AdapterRef.model_validate(
        {"apiVersion": nudge.api_version, "namespace": nudge.namespace, "name": nudge.name}
    )
    data = AdapterDrifted.model_validate({"adapter": ref, "step": nudge.step, "reason": nudge.reason})
    subject = ADAPTER_KINDS[nudge.api_version].path(nudge.namespace, nudge.name)
    return _edge.reply(ADAPTER_DRIFTED, NAME, subject, data, {STEP_EXTENSION: nudge.step})


resync = _edge.function(NAME, ACCEPTS, handle)

"""The serving steps' I/O: observe a world, run the planned engine calls, write the statuses.

    observed = observe(ports, request)                  # objects, Ready pods, listings, configs
    desire = serving.desired(observed.world)
    with the turns of the bounded pods it loads into:   # functions/adapters/turns.py
        result = execute(ports, observed, desire)       # listings and calls, pipelined per pod
        reports = write_statuses(ports, observed, result)  # one guarded write per adapter

`ports` is what it reads and calls (`functions.ports.ServingPorts`): the steps pass their Deps,
whose ports are built on first use.

What is read for a request (the trigger mappers in load, reload and unload build requests):
- an adapter by key: it, the ModelDeployments of its namespace (vllm: usedBy) or its
  InferenceService and every adapter that claims a name there (sglang: ownership);
- a target by key: it, and every adapter it serves or may hold copies of (vllm: the adapters of
  its namespace; sglang: every adapter that references it), so that an unload sweep over its
  pods never mistakes a live adapter's copy for an orphan;
- the Ready pods (label-selected, in the target's namespace) of every target whose pods an
  adapter in scope is or could be served by, and each one's engine listing.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any, NamedTuple

from functions.adapters.concurrency import Task, bounded_map, pipeline, run_tasks, side_by_side
from functions.adapters.turns import TURNS
from functions.logic import adapter_config, capacity, facts, reasons, serving
from functions.logic.capacity import Capacity
from functions.logic.loaded import FAILING, describe_failures, sglang_status, vllm_status
from functions.logic.pods import (
    LOOPBACK,
    Address,
    Endpoint,
    denied_by,
    endpoint,
    parse_networks,
)
from functions.logic.serving import (
    Action,
    Adapter,
    AdapterKey,
    Desire,
    ListingFailure,
    Outcome,
    Pod,
    PodReport,
    Policy,
    Scope,
    ServingReport,
    Target,
    TargetKey,
    World,
)
from functions.observability import ENGINE_EVICTIONS
from functions.ports import ServingPorts, Written
from functions.resources.kinds import (
    INFERENCE_SERVICE,
    MODEL_DEPLOYMENT,
    POD,
    SERVING_BY_RUNTIME,
    SERVING_BY_TARGET,
    SGLANG_ADAPTER,
    VLLM_ADAPTER,
    Kind,
)

log = logging.getLogger("loraflow.fleet")
Obj = dict[str, Any]
Denied = Callable[[Address, int], bool]
RANK_UNBOUNDED = 1 << 30
"""adapter_config.json is checked once for what it is; each target's own maximum rank is the
planner's to compare."""


class Request(NamedTuple):
    """What a trigger asks the serving reconciler to look at, and what it may do."""

    adapters: frozenset[AdapterKey] = frozenset()
    targets: frozenset[TargetKey] = frozenset()
    pods: frozenset[tuple[TargetKey, str]] | None = None
    """Load only into these pods (reload: the one that restarted); None: every Ready pod."""
    load: bool = True
    unload: bool = False
    listings: bool = True
    """False for an adapter just verified or admitted: no pod should have it yet, so each load
    call is made without a listing first ("already loaded" answers the same question one
    round-trip sooner; such pods are then listed and planned again)."""
    every_deployment: bool = False
    """vllm: observe every ModelDeployment of the adapter's namespace, not only those naming it
    (taking an adapter back takes it back from wherever a copy may be)."""


class Observed(NamedTuple):
    world: World
    objects: Mapping[AdapterKey, Obj]
    """Each adapter in the world, as read by this invocation."""
    endpoints: Mapping[tuple[TargetKey, str], Endpoint]
    relevant: frozenset[AdapterKey]
    """The adapters whose status this request may change (written by `write_statuses`)."""
    scope: Scope
    targets: Mapping[TargetKey, Obj]


class Executed(NamedTuple):
    before: World
    after: World
    desire: Desire
    outcomes: tuple[Outcome, ...]


# -- observe ----------------------------------------------------------------------------------------
def observe(ports: ServingPorts, request: Request) -> Observed:
    """Reads that do not depend on each other go out side by side (`LORAFLOW_LOAD_CONCURRENCY`
    wide): the objects a request names, then the pods and the adapter configs. Each is on the
    path of every load event before its first engine call."""
    settings = ports.settings
    read = _objects(ports, request)
    objects, targets, target_objects = read.adapters, read.targets, read.target_objects
    # the pods, and the adapters' configs beside them (those depend on the objects alone)
    adapters = _adapters(ports, objects)
    config_keys = _needing_config(adapters, targets)
    asked = [t for t in sorted(request.targets) if targets.get(t) is not None]
    endpoints: dict[tuple[TargetKey, str], Endpoint] = {}
    verdicts: dict[AdapterKey, adapter_config.ConfigVerdict] = {}
    pod_args: PodArgs = {}
    if asked:  # which other targets are watched depends on what the asked ones' pods serve
        endpoints, verdicts = _pods_and_configs(ports, asked, objects, config_keys, pod_args)
        config_keys = []
    relevant = _relevant(request, objects, targets, {(t, pod) for t, pod in endpoints})
    watched = _watched_targets(request, relevant, objects, targets)
    more, more_verdicts = _pods_and_configs(
        ports, [t for t in sorted(watched) if t not in request.targets], objects, config_keys, pod_args
    )
    endpoints |= more
    for key, verdict in (verdicts | more_verdicts).items():
        adapters[key] = adapters[key]._replace(config=verdict)
    pods = {
        target: tuple(Pod(target, ep.pod) for (t, _), ep in sorted(endpoints.items()) if t == target)
        for target in sorted(watched)
        if targets.get(target) is not None
    }
    policy = Policy(mount_root=settings.mount_root, sglang_roots=settings.sglang_root_paths())
    world = World(adapters=adapters, targets=targets, pods=pods, policy=policy)
    world = _with_listings(
        ports, world, endpoints, _to_list(request, world, endpoints), pod_args, target_objects
    )
    scope = serving.Scope(
        adapters=None if request.targets else frozenset(request.adapters),
        pods=request.pods,
        load=request.load,
        unload=request.unload,
    )
    return Observed(world, objects, endpoints, relevant, scope, target_objects)


class _Objects(NamedTuple):
    """The custom objects a request involves, as read."""

    adapters: dict[AdapterKey, Obj]
    targets: dict[TargetKey, Target | None]
    """None: asked for and not found (known to be absent)."""
    target_objects: dict[TargetKey, Obj]


def _objects(ports: ServingPorts, request: Request) -> _Objects:
    """The adapters and targets a request involves, in two rounds of reads side by side: what
    the request names (vllm: with every ModelDeployment of its namespaces, for usedBy and who
    names whom), then the InferenceServices involved and every adapter that claims a name on
    them (sglang: ownership)."""
    kube = ports.kube
    rank = ports.settings.max_lora_rank
    read = _Objects({}, {}, {})
    vllm_namespaces = {k.namespace for k in request.adapters if k.kind == "vllm"} | {
        t.namespace for t in request.targets if t.kind == "ModelDeployment"
    }
    adapter_keys = sorted(request.adapters)
    target_keys = sorted(t for t in request.targets if t.name)
    adapter_namespaces = sorted({t.namespace for t in request.targets if t.kind == "ModelDeployment"})
    first = (
        [partial(kube.get, SERVING_BY_RUNTIME[k.kind].adapter, k.namespace, k.name) for k in adapter_keys]
        + [partial(kube.get, SERVING_BY_TARGET[t.kind].target, t.namespace, t.name) for t in target_keys]
        + [partial(_listed, kube, MODEL_DEPLOYMENT, ns) for ns in sorted(vllm_namespaces)]
        + [partial(_listed, kube, VLLM_ADAPTER, ns) for ns in adapter_namespaces]
    )
    answers = iter(side_by_side(first, ports.settings.load_concurrency))
    for key in adapter_keys:
        if (obj := next(answers)) is not None:
            read.adapters[key] = obj
    for target_key in sorted(request.targets):
        read.targets.setdefault(target_key, None)
    for target_key in target_keys:
        _keep_target(read, rank, target_key, next(answers))
    for namespace in sorted(vllm_namespaces):
        for md in next(answers):
            _keep_target(read, rank, TargetKey("ModelDeployment", namespace, facts.name_of(md)), md)
    for namespace in adapter_namespaces:
        for obj in next(answers):
            read.adapters.setdefault(AdapterKey("vllm", namespace, facts.name_of(obj)), obj)
    _read_claimants(ports, request, read)
    return read


def _read_claimants(ports: ServingPorts, request: Request, read: _Objects) -> None:
    """sglang: the InferenceServices involved (those not read yet) and every adapter that claims
    a name on one of them, added to `read`."""
    services = {t for t in request.targets if t.kind == "InferenceService"} | {
        facts.isvc_ref(obj) for key, obj in read.adapters.items() if key.kind == "sglang"
    }
    if not services:
        return
    unread = sorted(s for s in services if s not in read.targets)
    second = [
        partial(ports.kube.get, INFERENCE_SERVICE, s.namespace, s.name) if s.name else _nothing
        for s in unread
    ] + [partial(_listed, ports.kube, SGLANG_ADAPTER, None)]
    *services_read, claimants = side_by_side(second, ports.settings.load_concurrency)
    for service, obj in zip(unread, services_read, strict=True):
        _keep_target(read, ports.settings.max_lora_rank, service, obj)
    for obj in claimants:
        if facts.isvc_ref(obj) in services:
            read.adapters.setdefault(AdapterKey("sglang", facts.namespace_of(obj), facts.name_of(obj)), obj)


def _keep_target(read: _Objects, default_rank: int, key: TargetKey, obj: Obj | None) -> None:
    read.targets[key] = _target(obj, default_rank) if obj is not None else None
    if obj is not None:
        read.target_objects[key] = obj


def _listed(kube: Any, kind: Kind, namespace: str | None, selector: str | None = None) -> list[Obj]:
    return list(kube.iter(kind, namespace, selector))


def _nothing() -> None:
    return None


def _target(obj: Obj, default_rank: int) -> Target:
    if obj.get("kind") == "InferenceService":
        return facts.inference_service(obj)
    return facts.deployment(obj, default_rank)


def _relevant(
    request: Request,
    objects: Mapping[AdapterKey, Obj],
    targets: Mapping[TargetKey, Target | None],
    pods: set[tuple[TargetKey, str]],
) -> frozenset[AdapterKey]:
    """Adapters whose status a request may change: the ones asked for, and for a target those it
    names, those it held (usedBy, a served record on one of its pods) and, for an
    InferenceService, every claimant."""
    keys = set(request.adapters)
    for target_key in request.targets:
        target = targets.get(target_key)
        if target_key.kind == "ModelDeployment":
            named = set(target.adapters) if target is not None else set()
            mine = {pod for t, pod in pods if t == target_key}
            for key, obj in objects.items():
                if key.kind != "vllm" or key.namespace != target_key.namespace:
                    continue
                used = facts.status(obj).get("usedBy") or []
                served = {
                    str(s.get("pod")) for s in facts.status(obj).get("served") or [] if isinstance(s, dict)
                }
                if key.name in named or target_key.name in used or served & mine:
                    keys.add(key)
        else:
            keys |= {
                k for k, obj in objects.items() if k.kind == "sglang" and facts.isvc_ref(obj) == target_key
            }
    return frozenset(k for k in keys if k in objects)


def _watched_targets(
    request: Request,
    relevant: frozenset[AdapterKey],
    objects: Mapping[AdapterKey, Obj],
    targets: Mapping[TargetKey, Target | None],
) -> set[TargetKey]:
    """Targets whose Ready pods are observed: the requested ones, and every target of a relevant
    adapter (its status counts them all)."""
    watched = set(request.targets)
    namespaces_everywhere = (
        {k.namespace for k in request.adapters if k.kind == "vllm"} if request.every_deployment else set()
    )
    for key, target in targets.items():
        if target is None or key.kind != "ModelDeployment":
            continue
        if key.namespace in namespaces_everywhere or any(
            AdapterKey("vllm", key.namespace, name) in relevant for name in target.adapters
        ):
            watched.add(key)
    watched |= {facts.isvc_ref(objects[k]) for k in relevant if k.kind == "sglang"}
    watched |= {facts.isvc_ref(objects[k]) for k in request.adapters if k.kind == "sglang" and k in objects}
    return {t for t in watched if targets.get(t) is not None}


def endpoint_of(ports: ServingPorts, pod: Obj, target: TargetKey) -> Endpoint | None:
    """The engine of one of `target`'s pods, unless its address is one we never call."""
    return _endpoint(pod, target, never_called(ports))


def never_called(ports: ServingPorts) -> Denied:
    """The check of the addresses we never call, as the settings and the API server say."""
    settings = ports.settings
    return _never_called(settings.engine_deny, settings.loopback_engines, ports.kube.server)


@functools.lru_cache(maxsize=16)
def _never_called(engine_deny: str, loopback: str, server: tuple[str, int] | None) -> Denied:
    # built once per setting, not per pod: a fan-out lists 50 pods per event, a resync tick thousands
    networks = parse_networks(engine_deny) + (LOOPBACK if loopback == "deny" else ())
    return denied_by(networks, [server] if server else [])


def _endpoint(pod: Obj, target: TargetKey, denied: Denied) -> Endpoint | None:
    ep = endpoint(pod, SERVING_BY_TARGET[target.kind].runtime, denied)
    return ep if ep is not None and ep.namespace == target.namespace else None


PodArgs = dict[tuple[TargetKey, str], list[object]]
"""Each Ready pod's engine container arguments (its capacity settings)."""


def _pods_and_configs(
    ports: ServingPorts,
    watched: Sequence[TargetKey],
    objects: Mapping[AdapterKey, Obj],
    config_keys: Sequence[AdapterKey],
    args: PodArgs | None = None,
) -> tuple[dict[tuple[TargetKey, str], Endpoint], dict[AdapterKey, adapter_config.ConfigVerdict]]:
    """The engines of `watched`'s pods (label-selected in each target's namespace) and the
    configs of `config_keys`, read side by side."""
    reads = [
        partial(
            _listed, ports.kube, POD, key.namespace, f"{SERVING_BY_TARGET[key.kind].pod_label}={key.name}"
        )
        for key in watched
    ] + [partial(_config, ports, objects[key]) for key in config_keys]
    answers = side_by_side(reads, ports.settings.load_concurrency)
    found: dict[tuple[TargetKey, str], Endpoint] = {}
    denied = never_called(ports)
    for key, listed in zip(watched, answers[: len(watched)], strict=True):
        for pod in listed:
            ep = _endpoint(pod, key, denied)
            if ep is not None:
                found[(key, ep.pod)] = ep
                if args is not None:
                    args[(key, ep.pod)] = capacity.container_args(pod)
    return found, dict(zip(config_keys, answers[len(watched) :], strict=True))


def _needing_config(
    adapters: Mapping[AdapterKey, Adapter], targets: Mapping[TargetKey, Target | None]
) -> list[AdapterKey]:
    """The vllm adapters a ModelDeployment names and that may be served: their
    adapter_config.json is checked before any load."""
    named = {
        (key.namespace, name)
        for key, target in targets.items()
        if target is not None and key.kind == "ModelDeployment"
        for name in target.adapters
    }
    return [
        key
        for key, adapter in adapters.items()
        if key.kind == "vllm" and (key.namespace, key.name) in named and adapter.serve != "drop"
    ]


def _config(ports: ServingPorts, obj: Obj) -> adapter_config.ConfigVerdict:
    from functions.adapters.storage import ContentTooLarge

    path = facts.config_path(obj)
    try:
        raw = ports.configs.get(path, facts.config_md5(obj)) if path else None
    except ContentTooLarge as err:
        message = (
            f"{adapter_config.CONFIG_FILE} is larger than {adapter_config.CONFIG_MAX_BYTES} bytes: {err}"
        )
        return adapter_config.ConfigVerdict(False, adapter_config.TOO_LARGE, message)
    return adapter_config.check(raw, RANK_UNBOUNDED)


def _adapters(ports: ServingPorts, objects: Mapping[AdapterKey, Obj]) -> dict[AdapterKey, Adapter]:
    """Each adapter as the planner sees it (a vllm one's config verdict is added once read)."""
    mount = ports.settings.mount_root
    return {
        key: facts.sglang_adapter(obj) if key.kind == "sglang" else facts.vllm_adapter(obj, mount)
        for key, obj in objects.items()
    }


def _to_list(
    request: Request, world: World, endpoints: Mapping[tuple[TargetKey, str], Endpoint]
) -> set[tuple[TargetKey, str]]:
    """The pods whose engine is listed before planning.

    A reload lists only its own pod: the others keep what their status records say (each
    pod's own Pod event reloads it; resync lists them all), so that a rolling restart of N
    pods lists N engines, not N². Not for an sglang adapter served across namespaces (its
    status names no pods). An sglang pod is always listed: what it holds decides what more it
    can take. Otherwise every pod, unless the request loads without listing first."""
    pods = {where for where in endpoints if where[0] in world.pods}
    if request.pods is not None:
        redacted_targets = {
            a.target for a in world.adapters.values() if a.key.kind == "sglang" and serving.redacted(a)
        }
        return {w for w in pods if w in request.pods or w[0] in redacted_targets}
    if request.listings:
        return pods
    return {w for w in pods if w[0].kind == "InferenceService"}


def _with_listings(
    ports: ServingPorts,
    world: World,
    endpoints: Mapping[tuple[TargetKey, str], Endpoint],
    to_list: set[tuple[TargetKey, str]],
    pod_args: PodArgs,
    target_objects: Mapping[TargetKey, Obj],
) -> World:
    """Each pod's listing (those of `to_list`) and capacity, read side by side."""
    wanted = sorted(where for where in endpoints if where[0] in world.pods)

    def read(where: tuple[TargetKey, str]) -> tuple[serving.Listing, Capacity]:
        ep = endpoints[where]
        listing = ports.engines.listing(ep) if where in to_list else None
        if isinstance(listing, ListingFailure):
            return listing, capacity.unbounded(ep.runtime)
        reported = ports.engines.capacity(ep)
        spec = facts.spec(target_objects.get(where[0]) or {}).get("engineArgs")
        spec_args = spec if isinstance(spec, list) else None
        return listing, capacity.of_pod(ep.runtime, reported, pod_args.get(where), spec_args)

    read_all = dict(bounded_map(wanted, read, ports.settings.load_concurrency))
    pods = {
        t: tuple(
            p._replace(listing=read_all[(t, p.name)][0], capacity=read_all[(t, p.name)][1])
            if (t, p.name) in read_all
            else p
            for p in group
        )
        for t, group in world.pods.items()
    }
    return world._replace(pods=pods)


# -- execute ----------------------------------------------------------------------------------------
def execute(ports: ServingPorts, observed: Observed, desire: Desire | None = None) -> Executed:
    """List (when not yet listed) and call, pipelined per pod; a failing pod never blocks another.

    Pods that answered "already loaded" to a load made without a listing are listed and planned
    again. What an adapter deleted meanwhile got is taken back after the status writes
    (`take_back_if_deleted`).
    """
    world = observed.world
    desire = desire or serving.desired(world)
    outcomes: list[Outcome] = []
    listed: dict[tuple[TargetKey, str], Any] = {}
    lock = threading.Lock()
    width = ports.settings.load_concurrency

    def run(action: Action) -> None:
        outcome = call(ports, observed.endpoints[(action.target, action.pod)], action)
        with lock:
            outcomes.append(outcome)

    def per_pod(pod: Pod, fetch: bool) -> list[Task]:
        if fetch:
            listing = ports.engines.listing(observed.endpoints[(pod.target, pod.name)])
            with lock:
                listed[(pod.target, pod.name)] = listing
            pod = pod._replace(listing=listing)
        actions = serving.plan_pod(world, desire, pod, observed.scope)
        if any(a.op == "unload" for a in actions) and any(a.op != "unload" for a in actions):
            # room first: a pod's unloads finish before its loads start (the engine never evicts)
            return [partial(_in_order, run, actions)]
        return [partial(run, a) for a in actions]

    pods = [pod for target in sorted(world.pods) for pod in world.pods[target]]
    # planned from what is known (no I/O), pod after pod while the first calls run: only the
    # calls need threads (none when all is served)
    run_tasks((task for pod in pods for task in per_pod(pod, fetch=False)), width)
    # "already loaded" to a load made without a listing: the pod holds the name. Our status says
    # whether we put that file set there; if it does not, the pod is listed and planned again.
    confirmed: dict[tuple[TargetKey, str], dict[str, str]] = {}
    blind: set[tuple[TargetKey, str]] = set()
    for o in outcomes:
        if o.reason != reasons.POD_ALREADY_LOADED:
            continue
        where = (o.action.target, o.action.pod)
        adapter = world.adapters.get(o.action.adapter)
        if adapter is not None and adapter.served.get(o.action.pod) == o.action.file_set:
            confirmed.setdefault(where, {})[o.action.lora_name] = o.action.lora_path
        else:
            blind.add(where)
    if blind:
        # listed before: the name arrived since (another writer), so that listing is stale too
        again = [pod for pod in pods if (pod.target, pod.name) in blind]
        pipeline(again, lambda pod: per_pod(pod, fetch=True), width)
    world = _set_listings(world, {**confirmed, **listed})
    after = serving.apply(world, outcomes)
    return Executed(world, after, desire, tuple(outcomes))


def _in_order(run: Callable[[Action], None], actions: Sequence[Action]) -> None:
    for action in actions:
        run(action)


def _set_listings(world: World, listed: Mapping[tuple[TargetKey, str], Any]) -> World:
    pods = {
        t: tuple(p._replace(listing=listed[(t, p.name)]) if (t, p.name) in listed else p for p in group)
        for t, group in world.pods.items()
    }
    return world._replace(pods=pods)


def call(ports: ServingPorts, ep: Endpoint, action: Action) -> Outcome:
    if action.op == "load":
        result = ports.engines.load(ep, action.lora_name, action.lora_path)
    elif action.op == "replace":
        result = ports.engines.replace(ep, action.lora_name, action.lora_path)
    else:
        result = ports.engines.unload(ep, action.lora_name)
    return Outcome(action, result.ok, result.reason, result.message, result.retryable, result.holds)


def undo_if_deleted(
    ports: ServingPorts, observed: Observed, outcomes: Sequence[Outcome], proven: Iterable[AdapterKey] = ()
) -> list[Outcome]:
    """Take back what this invocation loaded for an adapter being deleted (or gone) meanwhile.

    unload sweeps every pod once the deletionTimestamp is set, then drops the finalizer; a load
    already in flight can land after that sweep and outlive the adapter. Reading the adapter
    again after our own loads closes the window ("not found" on unload counts as done).
    `proven`: adapters known alive after the loads already (not read again).
    """
    loaded = [
        o for o in outcomes if o.ok and o.action.op != "unload" and o.reason != reasons.POD_ALREADY_LOADED
    ]
    keys = {o.action.adapter for o in loaded} - set(proven)
    if not keys:
        return []
    gone = keys - still_alive(ports, keys)
    undo = [
        o.action._replace(op="unload", lora_path="", file_set="") for o in loaded if o.action.adapter in gone
    ]
    done = bounded_map(
        undo, lambda a: call(ports, observed.endpoints[(a.target, a.pod)], a), ports.settings.load_concurrency
    )
    return [outcome for _, outcome in done]


def take_back_if_deleted(
    ports: ServingPorts, observed: Observed, executed: Executed, reported: Mapping[AdapterKey, Reported]
) -> tuple[Executed, dict[AdapterKey, Reported]]:
    """`undo_if_deleted` after the status writes, and the reports of what it took back.

    A status write that went through proves its adapter was alive after our loads: it was sent
    after the last of them with the resourceVersion of an object that was not being deleted (a
    deletionTimestamp set meanwhile changes the resourceVersion: 409, re-read, and the write is
    skipped for it), so unload's sweep can only come after our loads landed and takes them back
    itself. Only the adapters without such a write are read again (a deleting one's status is
    never written: `write_statuses` skips it).
    """
    proven = {key for key, item in reported.items() if item.written is not None and item.written.changed}
    undone = undo_if_deleted(ports, observed, executed.outcomes, proven)
    if not undone:
        return executed, dict(reported)
    outcomes = executed.outcomes + tuple(undone)
    executed = executed._replace(after=serving.apply(executed.before, outcomes), outcomes=outcomes)
    again = reports(observed, executed, {o.action.adapter for o in undone})
    return executed, {
        **reported,
        **{key: Reported(report, reported[key].written) for key, report in again.items() if key in reported},
    }


def still_alive(ports: ServingPorts, keys: Iterable[AdapterKey]) -> set[AdapterKey]:
    """Which adapters exist and are not being deleted, read now: one GET for a single adapter,
    one list per kind and namespace for several (a restart reloads 50 at once)."""
    groups: dict[tuple[str, str], set[str]] = {}
    for key in keys:
        groups.setdefault((key.kind, key.namespace), set()).add(key.name)
    alive: set[AdapterKey] = set()
    for (kind, namespace), names in groups.items():
        if len(names) == 1:
            (name,) = names
            found = ports.kube.get(SERVING_BY_RUNTIME[kind].adapter, namespace, name)
            objs = [found] if found is not None else []
        else:
            objs = [
                o
                for o in ports.kube.iter(SERVING_BY_RUNTIME[kind].adapter, namespace)
                if facts.name_of(o) in names
            ]
        alive |= {AdapterKey(kind, namespace, facts.name_of(o)) for o in objs if not facts.deleting(o)}  # type: ignore[arg-type]
    return alive


# -- write ------------------------------------------------------------------------------------------
def reports(
    observed: Observed, executed: Executed, keys: Iterable[AdapterKey] | None = None
) -> dict[AdapterKey, ServingReport]:
    # an adapter unloaded to make room for one that ranks higher is told so too
    displaced = {o.action.adapter for o in executed.outcomes if o.action.op == "unload" and o.ok}
    chosen = observed.relevant | (displaced & set(observed.objects)) if keys is None else keys
    return {
        key: serving.serving_report(executed.after, executed.desire, key, executed.outcomes)
        for key in sorted(chosen)
        if key in executed.after.adapters
    }


class Reported(NamedTuple):
    report: ServingReport
    written: Written | None
    """None: the adapter is gone, being deleted, or changed under us."""


def write_statuses(ports: ServingPorts, observed: Observed, executed: Executed) -> dict[AdapterKey, Reported]:
    """One guarded status write per relevant live adapter (none when nothing changes), computed
    from the world after the calls. A write whose adapter changed under us in a way the plan did
    not see (another file set, path or verdict) is skipped: the event of that change runs again."""
    chosen = reports(observed, executed)
    now = ports.clock()
    used_by = {
        key: [t.name for t in executed.desire.targets_of.get(key, ())] for key in chosen if key.kind == "vllm"
    }

    def write(key: AdapterKey) -> Written | None:
        planned = executed.before.adapters[key]
        if planned.deleting:
            return None
        report = chosen[key]

        def desired(current: Obj) -> Obj | None:
            this = report
            if current is not observed.objects[key]:  # re-read after a conflict: is it the same?
                fresh = (
                    facts.vllm_adapter(current, ports.settings.mount_root)
                    if key.kind == "vllm"
                    else facts.sglang_adapter(current)
                )
                if _identity(fresh) != _identity(planned):
                    return None
                if fresh.served != planned.served:  # pods recorded meanwhile by another invocation
                    world = serving.with_records(executed.after, key, fresh.served, executed.outcomes)
                    this = serving.serving_report(world, executed.desire, key, executed.outcomes)
            generation = facts.meta(current).get("generation")
            status = dict(facts.status(current))
            if key.kind == "vllm":
                serving_report = this if planned.serve == "serve" else None
                return vllm_status(status, serving_report, used_by[key], planned.serve, generation, now)
            served = planned.serve == "serve"
            return sglang_status(
                status, this, planned.lora_path, generation, now, serving.redacted(planned), served
            )

        return ports.kube.write_status(
            SERVING_BY_RUNTIME[key.kind].adapter,
            key.namespace,
            key.name,
            desired,
            current=observed.objects[key],
        )

    written = dict(bounded_map(sorted(chosen), write, ports.settings.load_concurrency))
    return {key: Reported(chosen[key], written.get(key)) for key in chosen}


class Result(NamedTuple):
    observed: Observed
    executed: Executed
    reports: Mapping[AdapterKey, Reported]

    def failing(
        self, pods: frozenset[tuple[TargetKey, str]] | None = None
    ) -> list[tuple[AdapterKey, TargetKey, PodReport]]:
        """Failing pods of every reported adapter (only `pods`, when given)."""
        return [
            (key, target.target, pod)
            for key, reported in sorted(self.reports.items())
            for target in reported.report.targets
            for pod in target.pods
            if pod.state in FAILING and (pods is None or (target.target, pod.pod) in pods)
        ]


def describe(failing: Sequence[tuple[AdapterKey, TargetKey, PodReport]]) -> str:
    """`N pod(s) failed: pod (Reason: message); ...` for a retry's answer (operators read it)."""
    shown = [f"{key}: {pod.pod} ({pod.reason}: {pod.message})" for key, _, pod in failing[:10]]
    more = f" and {len(failing) - 10} more" if len(failing) > 10 else ""
    return f"{len(failing)} pod(s) failed: " + "; ".join(shown) + more


def run(ports: ServingPorts, request: Request, component: str) -> Result:
    """observe -> plan -> execute -> write, and a Warning Event for each adapter whose status
    moved into a failure (not on every retry of the same one)."""
    stamp = TURNS.stamp()
    observed = observe(ports, request)
    desire = serving.desired(observed.world)
    engines = {observed.endpoints[where].url: where for where in loading_into_bounded(observed, desire)}
    with TURNS.taking(engines, ports.settings.engine_timeout):
        changed = [where for url, where in engines.items() if TURNS.changed_since(url, stamp)]
        observed = listed_again(ports, observed, changed)
        executed = execute(ports, observed, desire)
        reported = write_statuses(ports, observed, executed)
    executed, reported = take_back_if_deleted(ports, observed, executed, reported)
    result = Result(observed, executed, reported)
    now = ports.clock()
    for key, item in reported.items():
        written = item.written
        if written is None or not written.changed:
            continue
        loaded = facts.condition(written.obj, reasons.LOADED)
        if capacity_event(ports, observed.objects.get(key), written.obj, component):
            continue
        if loaded is None or loaded.get("status") == "True" or loaded.get("reason") not in WARNED:
            continue
        message = describe_failures(item.report.targets, serving.redacted(executed.before.adapters[key]))
        ports.kube.record_event(written.obj, "Warning", reasons.EVENT_LOAD_FAILED, message, component, now)
    warn_targets(ports, observed, executed, component)
    crossed = residency_crossed(executed)
    if crossed and not request.targets:
        # the other adapters these pods list moved between resident and reloadable: a pass over
        # their deployments writes those statuses (no engine call; an unchanged status is not written)
        run(ports, Request(targets=crossed, load=False), component)
    evicted = evicted_by_others(observed, executed)
    if evicted and not request.targets:
        # turns order this process only: one pass over those targets, from new listings, puts
        # back what ranks in, takes out what ranks out, and writes every status they change
        run(ports, Request(targets=evicted), component)
    return result


def evicted_by_others(observed: Observed, executed: Executed) -> frozenset[TargetKey]:
    """The targets where a load's answer shows the engine evicted a name this run did not
    unload: another writer loaded into the pod after it was listed (`serving.put_out`)."""
    put_out = serving.put_out(executed.before, executed.outcomes)
    for (target, pod), names in sorted(put_out.items()):
        ENGINE_EVICTIONS.labels(observed.endpoints[(target, pod)].runtime).inc(len(names))
        log.warning(
            "the engine of %s (%s) evicted %s while this run loaded into it: another writer loaded there",
            pod,
            target,
            ", ".join(sorted(names)),
            extra={"pod": pod, "target": str(target), "evicted": sorted(names)},
        )
    return frozenset(target for target, _ in put_out)


def loading_into_bounded(observed: Observed, desire: Desire) -> list[tuple[TargetKey, str]]:
    """The pods of known capacity that evict what does not fit, where this run plans a load:
    it takes their turns (functions/adapters/turns.py)."""
    world = observed.world
    return [
        (pod.target, pod.name)
        for pods in world.pods.values()
        for pod in pods
        if pod.capacity is not None
        and pod.capacity.evicts_when_full
        and (pod.target, pod.name) in observed.endpoints
        and any(a.op != "unload" for a in serving.plan_pod(world, desire, pod, observed.scope))
    ]


def listed_again(ports: ServingPorts, observed: Observed, pods: Sequence[tuple[TargetKey, str]]) -> Observed:
    """`observed` with the listings of `pods` read again (another turn changed them)."""
    if not pods:
        return observed
    listings = bounded_map(
        pods, lambda where: ports.engines.listing(observed.endpoints[where]), ports.settings.load_concurrency
    )
    return observed._replace(world=_set_listings(observed.world, dict(listings)))


def residency_crossed(executed: Executed) -> frozenset[TargetKey]:
    """The ModelDeployments where this run's loads or unloads moved a vLLM pod of known capacity
    across it (the count it lists to or from above its slots), or may have (it loaded without
    a listing, so the count before is unknown)."""
    changes: dict[tuple[TargetKey, str], int] = defaultdict(int)
    for o in executed.outcomes:
        if o.ok and o.action.op in ("load", "unload") and o.action.target.kind == "ModelDeployment":
            changes[(o.action.target, o.action.pod)] += 1 if o.action.op == "load" else -1
    crossed: set[TargetKey] = set()
    for (target, name), change in changes.items():
        before = next((p for p in executed.before.pods.get(target, ()) if p.name == name), None)
        after = next((p for p in executed.after.pods.get(target, ()) if p.name == name), None)
        cap = after.capacity if after is not None else None
        if cap is None or cap.slots is None or cap.evicts_listed or after is None:
            continue
        was = before.listing if before is not None else None
        now = after.listing
        if not isinstance(was, Mapping) or not isinstance(now, Mapping):
            crossed.add(target)  # the count before is unknown: it may have crossed
            continue
        if change and (len(was) <= cap.slots) != (len(now) <= cap.slots):
            crossed.add(target)
    return frozenset(crossed)


WARNED = frozenset({reasons.LOAD_FAILED, reasons.NAME_CONFLICT})
CAPACITY_TROUBLE = frozenset({reasons.ENGINE_CAPACITY_EXCEEDED, reasons.ENGINE_CAPACITY_INVALID})


def capacity_event(ports: ServingPorts, before: Obj | None, after: Obj, component: str) -> bool:
    """An Event when Loaded moves into capacity trouble (Warning, its reason) or out of it
    (Normal EngineCapacityAvailable); True when one was recorded. A move within the trouble
    (another count) records nothing: the condition's message says it."""
    was = (facts.condition(before, reasons.LOADED) or {}).get("reason") if before is not None else None
    now_loaded = facts.condition(after, reasons.LOADED) or {}
    now = now_loaded.get("reason")
    message = str(now_loaded.get("message") or "")
    if now in CAPACITY_TROUBLE and was != now:
        ports.kube.record_event(after, "Warning", str(now), message, component, ports.clock())
        return True
    if was in CAPACITY_TROUBLE and now not in CAPACITY_TROUBLE:
        text = f"no longer left out by engine capacity: {message}"
        ports.kube.record_event(
            after, "Normal", reasons.EVENT_CAPACITY_AVAILABLE, text, component, ports.clock()
        )
        return now == reasons.LOADED_REASON
    return False


def warn_targets(ports: ServingPorts, observed: Observed, executed: Executed, component: str) -> None:
    """A pod whose engine answered garbage is its target owner's to look at: an Event there,
    in the target's namespace, with what the engine said."""
    now = ports.clock()
    for target, group in sorted(executed.after.pods.items()):
        bad = [p for p in group if isinstance(p.listing, ListingFailure) and not p.listing.retryable]
        obj = observed.targets.get(target)
        if not bad or obj is None:
            continue
        detail = "; ".join(
            f"{p.name}: {p.listing.message}" for p in bad[:10] if isinstance(p.listing, ListingFailure)
        )
        message = (
            f"{len(bad)} Ready pod(s) answer GET /v1/models with something that is not a listing: {detail}"
        )
        ports.kube.record_event(obj, "Warning", reasons.ENGINE_ANSWER_INVALID, message, component, now)


def _identity(adapter: Adapter) -> tuple[Any, ...]:
    return (
        adapter.serve,
        adapter.file_set,
        adapter.lora_name,
        adapter.lora_path,
        adapter.target,
        adapter.deleting,
    )

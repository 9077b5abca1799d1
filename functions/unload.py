"""unload: take adapters out of engines when they are deleted or no longer wanted.

Trigger: `adapter.deleting` (admit saw a deletion held by our finalizer: the adapter's status
writes wake admit only, not unload too); apiserver update of a ModelDeployment / InferenceService;
`adapter.drifted` (loraflowstep=unload); `adapter.failed` (a Ready adapter whose files went bad
must stop serving the old weights).
Reads: as load does (functions/adapters/fleet.py); for an adapter, the pods of every
ModelDeployment of its namespace (a copy may be anywhere it was ever named).
Does: unloads only copies that are ours and not wanted: vllm loaded from our storage layout
`{mount_root}/loraadapters/{namespace}/{model}/{name}` (even when the LoRAAdapter is gone: a load
that raced a deletion is cleaned up on resync's nudge); sglang a claimant's `spec.name` served
from that adapter's own path. Static adapters and names served from other paths are never touched.
Writes: removes finalizer `loraflow.io/unload` once no Ready pod holds a copy; the status of
every live adapter whose serving changed (as load writes it); Loaded=False UnloadFailed and a
Warning Event UnloadFailed while a deletion cannot finish.
Outcomes: 200 + `adapter.unloaded` (adapter-scoped, something unloaded or finalized); 204 when
nothing to do; 503 when a Ready pod failed retryably (finalizer kept).
"""

from __future__ import annotations

from collections.abc import Mapping

from cloudevents.http import CloudEvent

from events.domain import (
    ADAPTER_DELETING,
    ADAPTER_DRIFTED,
    ADAPTER_FAILED,
    ADAPTER_UNLOADED,
    STEP_EXTENSION,
    AdapterUnloaded,
)
from events.external import API_UPDATE
from functions.adapters import fleet
from functions.adapters.fleet import Request
from functions.edge import inputs, messages, shell
from functions.edge.bootstrap import Deps
from functions.edge.messages import Reply
from functions.errors import EngineUnavailable
from functions.logic import facts, loaded, reasons, serving
from functions.logic.serving import AdapterKey, ListingFailure, World
from functions.resources.kinds import FINALIZER

NAME = "unload"
ACCEPTS = (ADAPTER_DELETING, API_UPDATE, ADAPTER_DRIFTED, ADAPTER_FAILED)


def request_for(event: CloudEvent, deps: Deps) -> Request | None:
    if event["type"] == ADAPTER_DELETING:
        key = inputs.adapter_key(inputs.adapter_ref(event))
        current = deps.kube.get(inputs.adapter_kind_of(key), key.namespace, key.name)
        if current is None or not facts.deletion_held(current):
            return None  # not deleted (a forged or misrouted event), or its deletion is done
        return take_back(key)
    if event["type"] in (ADAPTER_DRIFTED, ADAPTER_FAILED):
        if event["type"] == ADAPTER_DRIFTED and event.get(STEP_EXTENSION) != "unload":
            return None
        return take_back(inputs.adapter_key(inputs.adapter_ref(event)))
    target = inputs.target_key(inputs.kube_object(event))
    return Request(targets=frozenset({target}), load=False, unload=True) if target is not None else None


def take_back(key: AdapterKey) -> Request:
    """Every copy of this adapter that is not wanted (all of them when it is deleted or failed)."""
    return Request(adapters=frozenset({key}), load=False, unload=True, every_deployment=True)


def handle(event: CloudEvent, deps: Deps) -> Reply:
    request = request_for(event, deps)
    if request is None:
        return None
    result = fleet.run(deps, request, NAME)
    if request.targets:
        failed = unload_failures(result)
        if any(o.retryable for o in failed):
            raise EngineUnavailable(f"unload: {len(failed)} call(s) failed, a retry may finish")
        return None
    (key,) = request.adapters
    obj = result.observed.objects.get(key)
    unloaded = sorted(
        {
            o.action.pod
            for o in result.executed.outcomes
            if o.action.adapter == key
            and o.ok
            and o.action.op == "unload"
            and o.reason == reasons.POD_UNLOADED
        }
    )
    finalized = False
    if obj is not None and facts.deleting(obj):
        blockers = remaining(result.executed.after, key) + [
            f"{o.action.pod} ({o.reason}: {o.message})" for o in unload_failures(result)
        ]
        if blockers:
            return blocked(
                deps,
                key,
                blockers,
                any(o.retryable for o in unload_failures(result)) or retryable_listing(result.executed.after),
            )
        written = deps.kube.write_finalizers(
            inputs.adapter_kind_of(key),
            key.namespace,
            key.name,
            lambda current: [f for f in facts.meta(current).get("finalizers") or [] if f != FINALIZER],
        )
        finalized = written is not None and written.changed
    else:
        failed = unload_failures(result)
        if any(o.retryable for o in failed):
            raise EngineUnavailable(f"unload {key}: {len(failed)} call(s) failed, a retry may finish")
    if obj is None or (not unloaded and not finalized):  # an orphan's copy: no adapter to speak of
        return None
    data = AdapterUnloaded(adapter=inputs.ref_of(key), pods=unloaded, finalized=finalized)
    return messages.reply(
        ADAPTER_UNLOADED, NAME, inputs.subject_of(key), data, schema_base_url=deps.settings.schema_base_url
    )


def unload_failures(result: fleet.Result) -> list[serving.Outcome]:
    return [o for o in result.executed.outcomes if o.action.op == "unload" and not o.ok]


def remaining(world: World, key: AdapterKey) -> list[str]:
    """Pods that still hold a copy of the adapter, or whose engine could not say."""
    left: list[str] = []
    for target, pods in sorted(world.pods.items()):
        for pod in pods:
            listing = pod.listing
            if isinstance(listing, ListingFailure):
                left.append(f"{pod.name} ({listing.reason}: {listing.message})")
            elif isinstance(listing, Mapping) and any(
                serving.owner_of_copy(world, target, lora, root) == key for lora, root in listing.items()
            ):
                left.append(f"{pod.name} (still serves it)")
    return left


def retryable_listing(world: World) -> bool:
    return any(
        isinstance(p.listing, ListingFailure) and p.listing.retryable
        for group in world.pods.values()
        for p in group
    )


def blocked(deps: Deps, key: AdapterKey, blockers: list[str], retry: bool) -> Reply:
    """A deletion that cannot finish yet: the finalizer stays, the status and an Event say why."""
    message = f"{len(blockers)} pod(s) block the deletion: " + "; ".join(blockers[: loaded.MAX_NAMED])
    kind = inputs.adapter_kind_of(key)
    now = deps.clock()
    written = deps.kube.write_status(
        kind,
        key.namespace,
        key.name,
        lambda current: loaded.unload_failed_status(
            dict(facts.status(current)), message, facts.meta(current).get("generation"), now
        ),
    )
    if written is not None and written.changed:
        deps.kube.record_event(written.obj, "Warning", reasons.EVENT_UNLOAD_FAILED, message, NAME, now)
    if retry:
        raise EngineUnavailable(f"unload {key}: {message}")
    return None


unload = shell.function(NAME, ACCEPTS, handle)

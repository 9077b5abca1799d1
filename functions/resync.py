"""resync: the periodic safety net. Finds drift and publishes one nudge per (adapter, step).

Triggers:
- `dev.knative.sources.ping`, from the PingSource or from the filer source; data
  `{"full": true, "reason": ...}` (the filer source, when the filer's metadata log no longer
  covers its cursor) adds a stat nudge for every admitted seed-1 adapter, Ready ones included:
  their files may have changed unnoticed. With LORAFLOW_RESYNC_SHARDS = 1 the tick is judged
  here; above, the namespaces are listed and dealt out into that many parts, each published as
  `io.loraflow.resync.shard.v1` (the Broker brings each back to a request of its own).
- `io.loraflow.resync.shard.v1`: judges the namespaces it names, as the tick would.
Reads: InferenceServices and serving Pods (`loraflow.io/serving=true`), held for the tick
(they are few); the ModelDeployments and the adapters of both kinds page by page
(`LORAFLOW_LIST_PAGE_SIZE`), never all at once (ModelDeployments name every vllm adapter, so
they are paged by the names they carry, and only a page and two namespaces' of them are held:
the lists come in the API's key order); one
`GET /v1/models` per Ready pod (fanned out), one namespace's pods at a time. A part lists its
namespaces' adapters namespace by namespace, and the other kinds cluster-wide, keeping its own.
Writes: nothing in the API. Publishes `io.loraflow.adapter.drifted.v1` (extension
`loraflowstep` = admit|stat|load|unload, data.reason) to the Broker for what drifted only,
shard by shard. On a full tick it also deletes the frozen sets no adapter accounts for (its
adapter gone or for another model, or left unrecorded by a crash: `frozen.orphaned`), listing
`/loraflow-frozen/` once and reading each adapter named there.
Outcomes: 204 (nudges are published, not replied); 503 when the API or the Broker fails.
Cost: the paginated lists (about adapters / page size requests, the sglang kind twice; a
part: its namespaces' adapters, at least one list per namespace and kind, and the whole sglang
kind once) + one listing per Ready pod, no per-adapter API call; memory: a page of adapters and
one of ModelDeployments, one namespace's sglang adapters and pod listings, the InferenceServices
and pods (functions/logic/drift.py: shards).
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import chain, groupby
from queue import Full, Queue
from typing import Any, NamedTuple

from cloudevents.http import CloudEvent

from events.domain import (
    ADAPTER_DRIFTED,
    MAX_SHARD_NAMESPACES,
    RESYNC_SHARD,
    STEP_EXTENSION,
    AdapterDrifted,
    AdapterRef,
    ResyncShard,
)
from events.external import PING, ResyncTick
from functions.adapters import fleet
from functions.adapters.concurrency import bounded_map
from functions.edge import inputs, messages, shell
from functions.edge.bootstrap import Deps
from functions.edge.messages import Reply
from functions.errors import StorageUnavailable
from functions.logic import capacity, drift, facts, frozen
from functions.logic.paths import FROZEN_ROOT
from functions.logic.pods import Endpoint
from functions.logic.serving import AdapterKey, TargetKey
from functions.observability import FROZEN_BYTES
from functions.resources.kinds import (
    ADAPTER_KINDS,
    INFERENCE_SERVICE,
    MODEL,
    MODEL_DEPLOYMENT,
    NAMESPACE,
    POD,
    SERVING_LABEL,
    SGLANG_ADAPTER,
    VLLM_ADAPTER,
    Kind,
)

NAME = "resync"
ACCEPTS = (PING, RESYNC_SHARD)
log = logging.getLogger("loraflow.resync")
Obj = dict[str, Any]


def handle(event: CloudEvent, deps: Deps) -> Reply:
    if event["type"] == RESYNC_SHARD:
        part = messages.data_as(event, ResyncShard)
        judge(deps, Scope(frozenset(part.namespaces)), restat_reason(part.full, part.reason))
        return None
    tick = ResyncTick()
    if event.get_data() not in (None, b"", ""):
        tick = messages.data_as(event, ResyncTick)  # an object or nothing; garbage is a 400
    if deps.settings.resync_shards == 1:
        judge(deps, Scope(None), restat_reason(tick.full, tick.reason))
        return None
    names = [facts.name_of(ns) for ns in deps.kube.iter(NAMESPACE, page_size=deps.settings.list_page_size)]
    parts = deal(names, deps.settings.resync_shards)
    events = [
        part_event(
            ResyncShard(namespaces=part, shard=index, shards=len(parts), full=tick.full, reason=tick.reason),
            deps.settings.schema_base_url,
        )
        for index, part in enumerate(parts)
    ]
    bounded_map(events, deps.broker.publish, deps.settings.load_concurrency)
    return None


def restat_reason(full: bool, reason: str | None) -> str | None:
    return (reason or "storage notifications may have been lost") if full else None


def deal(namespaces: Iterable[str], shards: int) -> list[list[str]]:
    """The namespaces dealt out into `shards` parts like cards (a tenant with many adapters next
    to another in the list then lands in another part), more parts when one would name more than
    MAX_SHARD_NAMESPACES; each part in list order, no part empty."""
    ordered = sorted(set(namespaces), key=list_order)
    count = max(shards, -(-len(ordered) // MAX_SHARD_NAMESPACES))
    return [part for index in range(count) if (part := ordered[index::count])]


def part_event(part: ResyncShard, schema_base_url: str) -> CloudEvent:
    return messages.reply(
        RESYNC_SHARD, NAME, f"{part.shard + 1}/{part.shards}", part, schema_base_url=schema_base_url
    )


def judge(deps: Deps, scope: Scope, restat: str | None) -> None:
    """Publish the nudges for what drifted in `scope`."""
    width = deps.settings.load_concurrency
    for snapshot in shards(deps, scope):
        # built here, where the tick's trace context is; posted side by side: each is one POST
        # to the Broker, which answers slower than the planner judges the next shard
        base = deps.settings.schema_base_url
        events = [to_event(n, base) for n in drift.drift(snapshot, deps.settings.mount_root, restat=restat)]
        bounded_map(events, deps.broker.publish, width)
    if restat is not None:
        try:
            collect_orphans(deps, scope)
        except (StorageUnavailable, OSError) as err:  # the nudges are out; the next full tick tries again
            log.warning("frozen sets not collected: %s", err)


def collect_orphans(deps: Deps, scope: Scope) -> list[str]:
    """Delete the frozen sets no adapter accounts for (`frozen.orphaned`) in the scope's
    namespaces; the directories deleted. A full tick only: it lists the frozen area and reads
    each adapter named there, which a minute's tick need not pay for."""
    files = [
        (f.path, f.size)
        for f in deps.storage.stat_dir(FROZEN_ROOT + "/")
        if scope.has(f.path.split("/")[2] if f.path.count("/") > 2 else "")
    ]
    named = {(p.split("/")[2], p.split("/")[4]) for p, _ in files if p.count("/") >= 6}
    adapters = {key: deps.kube.get(VLLM_ADAPTER, *key) for key in sorted(named)}
    deleted: list[str] = []
    for orphan in frozen.orphaned(files, adapters):
        deps.storage.delete_tree(orphan.directory)
        FROZEN_BYTES.labels("deleted").inc(orphan.size)
        log.info("deleted the frozen set %s (%d bytes): %s", orphan.directory, orphan.size, orphan.why)
        deleted.append(orphan.directory)
    return deleted


class Scope(NamedTuple):
    """The namespaces a request judges (None: all of them)."""

    namespaces: frozenset[str] | None

    def has(self, namespace: str) -> bool:
        return self.namespaces is None or namespace in self.namespaces

    def keep(self, objects: Iterable[Obj]) -> Iterator[Obj]:
        """`objects` of the scope's namespaces, in their order."""
        if self.namespaces is None:
            return iter(objects)
        return (obj for obj in objects if facts.namespace_of(obj) in self.namespaces)

    def listed(self, deps: Deps, kind: Kind) -> Iterator[Obj]:
        """`kind`'s objects in the scope, in the API's list order, page by page: one cluster-wide
        list for all namespaces, else one list per namespace (no other's pages are read)."""
        page = deps.settings.list_page_size
        if self.namespaces is None:
            return deps.kube.iter(kind, page_size=page)
        ordered = sorted(self.namespaces, key=list_order)
        return chain.from_iterable(deps.kube.iter(kind, ns, page_size=page) for ns in ordered)


class Held(NamedTuple):
    """What a tick holds from start to end: the InferenceServices and the Ready pods' engines."""

    services: Mapping[drift.Namespaced, Obj]
    pods: Mapping[TargetKey, Sequence[Endpoint]]
    vllm_args: Mapping[tuple[drift.Namespaced, str], Sequence[object]]
    """((namespace, deployment), pod) -> its engine container's arguments (its capacity)."""


def hold(deps: Deps, scope: Scope) -> Held:
    """Every InferenceService (an adapter of the scope may reference any namespace's), and the
    Ready pods of the scope's targets."""
    kube, page = deps.kube, deps.settings.list_page_size
    services = {
        (facts.namespace_of(s), facts.name_of(s)): s for s in kube.iter(INFERENCE_SERVICE, page_size=page)
    }
    pods: dict[TargetKey, list[Endpoint]] = defaultdict(list)
    vllm_args: dict[tuple[drift.Namespaced, str], Sequence[object]] = {}
    for pod in scope.keep(kube.iter(POD, None, f"{SERVING_LABEL}=true", page_size=page)):
        target = inputs.serving_target(pod)
        ep = fleet.endpoint_of(deps, pod, target) if target is not None else None
        if ep is not None and target is not None:
            pods[target].append(ep)
            if target.kind == "ModelDeployment":
                vllm_args[((target.namespace, target.name), ep.pod)] = capacity.container_args(pod)
    return Held(services, dict(pods), vllm_args)


class Deployments:
    """The ModelDeployments one namespace at a time, in the list's order, read as they are
    judged: what is held is the page being read and two namespaces' of them (the one judged
    and the next, whose pods are listed meanwhile)."""

    def __init__(self, objects: Iterable[Obj]) -> None:
        self._groups = ((ns, list(group)) for ns, group in groupby(objects, key=facts.namespace_of))
        self._next = next(self._groups, None)

    def upcoming(self) -> tuple[str, Sequence[TargetKey]] | None:
        """The next namespace with ModelDeployments, and their keys (None: no more)."""
        if self._next is None:
            return None
        return self._next[0], _md_keys(self._next[0], self._next[1])

    def take(self) -> tuple[str, list[Obj]]:
        """The next namespace's ModelDeployments (there must be one: `upcoming`)."""
        assert self._next is not None
        taken, self._next = self._next, next(self._groups, None)
        return taken


NAMES_PER_SLOT = 10
"""A page of ModelDeployments may name about ten adapters per object an adapter page holds: a
name weighs a small fraction of an adapter object, so such a page stays lighter than one of adapters."""


def deployment_page_size(page: int) -> Callable[[Sequence[Obj]], int]:
    """ModelDeployments paged by what they name, not by count (each names its adapters: ten or
    ten thousand): the next page holds about `page` x NAMES_PER_SLOT names at the last page's
    largest, the first a tenth of `page` objects, never more than `page` objects."""
    budget = page * NAMES_PER_SLOT

    def size(last: Sequence[Obj]) -> int:
        if not last:
            return max(1, page // NAMES_PER_SLOT)
        largest = max(_named_count(md) for md in last)
        return max(1, min(page, budget // max(1, largest)))

    return size


def _named_count(md: Obj) -> int:
    named = facts.spec(md).get("loraAdapters")
    return len(named) if isinstance(named, list) else 0


def _md_keys(namespace: str, mds: Sequence[Obj]) -> list[TargetKey]:
    return [TargetKey("ModelDeployment", namespace, facts.name_of(md)) for md in mds]


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


class Ahead:
    """Each namespace's pod listings, fetched one namespace ahead of the one being judged (the
    engines answer while the planner works); at most two namespaces' listings are held."""

    def __init__(self, deps: Deps, held: Held) -> None:
        self._deps, self._held = deps, held
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="resync-ahead")
        self._pending: dict[str, Future[dict[drift.Namespaced, dict[str, Any]]]] = {}

    def _submit(self, targets: Sequence[TargetKey]) -> Future[dict[drift.Namespaced, dict[str, Any]]]:
        return self._pool.submit(listings, self._deps, self._held, targets)

    def listings(
        self,
        namespace: str,
        targets: Sequence[TargetKey],
        following: tuple[str, Sequence[TargetKey]] | None,
    ) -> dict[drift.Namespaced, dict[str, Any]]:
        """`namespace`'s listings (its `targets`' pods); `following`'s are fetched meanwhile."""
        future = self._pending.pop(namespace, None) or self._submit(targets)
        if following is not None and following[0] not in self._pending:
            self._pending[following[0]] = self._submit(following[1])
        return future.result()

    def close(self) -> None:
        for future in self._pending.values():
            future.cancel()
        self._pool.shutdown(wait=True)


def read_ahead(objects: Iterable[Obj], batch: int) -> Iterator[Obj]:
    """`objects` as they come, the next pages read by a thread meanwhile (at most two pages
    waiting), so the API server serves a page while the planner judges the last one."""
    queue: Queue[list[Obj] | BaseException | None] = Queue(maxsize=2)
    stop = threading.Event()

    def pump() -> None:
        try:
            chunk: list[Obj] = []
            for obj in objects:
                chunk.append(obj)
                if len(chunk) >= batch:
                    if not _put(queue, chunk, stop):
                        return  # the reader is gone: read no further page
                    chunk = []
            if _put(queue, chunk, stop):
                _put(queue, None, stop)
        except BaseException as err:  # handed to the reader, which raises it
            _put(queue, err, stop)

    reader = threading.Thread(target=pump, name="resync-pages", daemon=True)
    reader.start()
    try:
        while True:
            item = queue.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield from item
    finally:
        stop.set()
        reader.join()


def _put(queue: Queue[Any], item: Any, stop: threading.Event) -> bool:
    """Queue `item` unless the reader stopped first (False)."""
    while not stop.is_set():
        try:
            queue.put(item, timeout=0.1)
            return True
        except Full:
            continue
    return False


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


def shards(deps: Deps, scope: Scope) -> Iterator[drift.Snapshot]:
    """The scope's world as shards (functions/logic/drift.py), read as they are judged."""
    held = hold(deps, scope)
    models = Models(deps)
    yield from _vllm_shards(deps, scope, held, models)
    yield from _sglang_shards(deps, scope, held)


def list_order(namespace: str) -> str:
    """Where a namespace's objects come in a cluster-wide list: etcd orders the keys
    .../<namespace>/<name> as bytes, so "team-b" comes before "team" ('-' is below '/')."""
    return namespace + "/"


def listed_before(namespace: str, other: str) -> bool:
    return list_order(namespace) < list_order(other)


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


def _vllm_shards(deps: Deps, scope: Scope, held: Held, models: Models) -> Iterator[drift.Snapshot]:
    """One namespace at a time, in the lists' order: its ModelDeployments and their pods'
    listings, then its adapters a chunk at a time, then the copies no chunk named (orphans)."""
    page = deps.settings.list_page_size
    # read as judged, a page when the last is used up: read ahead, two pages would be queued;
    # cluster-wide in a shard too (a few pages: one ModelDeployment serves many adapters)
    sized = deployment_page_size(page)
    deployments = Deployments(scope.keep(deps.kube.iter(MODEL_DEPLOYMENT, page_size=sized)))
    current: str | None = None
    mds: list[Obj] = []
    pods: dict[drift.Namespaced, dict[str, Any]] = {}
    capacities: dict[drift.Namespaced, dict[str, drift.PodCapacity]] = {}
    unnamed: set[str] = set()
    ahead = Ahead(deps, held)

    def enter(namespace: str, its_mds: list[Obj]) -> None:
        nonlocal current, mds, pods, capacities, unnamed
        current, mds = namespace, its_mds
        pods = ahead.listings(namespace, _md_keys(namespace, its_mds), deployments.upcoming())
        capacities = drift.vllm_capacities(its_mds, pods, held.vllm_args)
        unnamed = drift.listed(pods)

    def leave() -> Iterator[drift.Snapshot]:
        if current is not None and unnamed:
            restricted = drift.restrict(pods, unnamed)
            yield drift.Snapshot(deployments=mds, md_pods=restricted, md_capacity=capacities)

    def before(namespace: str | None) -> Iterator[drift.Snapshot]:
        """The namespaces with ModelDeployments but no adapter, up to `namespace` (None: all)."""
        while (upcoming := deployments.upcoming()) and (
            namespace is None or listed_before(upcoming[0], namespace)
        ):
            enter(*deployments.take())
            yield from leave()

    adapters = read_ahead(scope.listed(deps, VLLM_ADAPTER), page)
    try:
        for namespace, chunk in _chunks(adapters, page):
            if namespace != current:
                yield from leave()
                yield from before(namespace)
                upcoming = deployments.upcoming()
                enter(namespace, deployments.take()[1] if upcoming and upcoming[0] == namespace else [])
            names = {facts.name_of(obj) for obj in chunk}
            unnamed -= names
            yield drift.Snapshot(
                v1=chunk,
                deployments=mds,
                md_pods=drift.restrict(pods, names),
                md_capacity=capacities,
                models=models.existing(chunk),
            )
        yield from leave()
        yield from before(None)
    finally:
        ahead.close()


def _sglang_shards(deps: Deps, scope: Scope, held: Held) -> Iterator[drift.Snapshot]:
    """One namespace at a time: its adapters (their lifecycle), with every claimant of its
    InferenceServices (their serving), the claimants from other namespaces read first."""
    page = deps.settings.list_page_size
    targets = SglangTargets(held, scope)
    # An adapter may claim any namespace's InferenceService, permitted or not, and the service's
    # claimants are judged together (the oldest owns a name; a copy is known by its path), so
    # a part reads the whole kind first, keeping only the claims on its own namespaces.
    foreign: dict[str, list[Obj]] = defaultdict(list)
    for obj in read_ahead(deps.kube.iter(SGLANG_ADAPTER, page_size=page), page):
        ref = facts.isvc_ref(obj)
        if ref.namespace != facts.namespace_of(obj) and scope.has(ref.namespace):
            foreign[ref.namespace].append(obj)
    ahead = Ahead(deps, held)
    pending = sorted(set(targets.namespaces) | set(foreign), key=list_order)
    adapters = read_ahead(scope.listed(deps, SGLANG_ADAPTER), page)
    try:
        for namespace, group in groupby(adapters, key=facts.namespace_of):
            while pending and listed_before(pending[0], namespace):
                yield _sglang_shard(targets, pending.pop(0), [], foreign, ahead)
            if pending and pending[0] == namespace:
                pending.pop(0)
            yield _sglang_shard(targets, namespace, list(group), foreign, ahead)
        for namespace in pending:
            yield _sglang_shard(targets, namespace, [], foreign, ahead)
    finally:
        ahead.close()


class SglangTargets:
    """The scope's InferenceServices by namespace, in list order (and every one, by key: an
    adapter may reference another namespace's)."""

    def __init__(self, held: Held, scope: Scope) -> None:
        self.services = held.services
        self._of: dict[str, list[TargetKey]] = defaultdict(list)
        for namespace, name in sorted(held.services):
            if scope.has(namespace):
                self._of[namespace].append(TargetKey("InferenceService", namespace, name))
        self.namespaces = sorted(self._of, key=list_order)

    def of(self, namespace: str) -> list[TargetKey]:
        return self._of.get(namespace, [])

    def following(self, namespace: str) -> tuple[str, Sequence[TargetKey]] | None:
        """The next namespace after `namespace` with InferenceServices, and theirs."""
        index = bisect.bisect_right(self.namespaces, list_order(namespace), key=list_order)
        return (
            (self.namespaces[index], self.of(self.namespaces[index]))
            if index < len(self.namespaces)
            else None
        )


def _sglang_shard(
    targets: SglangTargets, namespace: str, own: list[Obj], foreign: Mapping[str, Sequence[Obj]], ahead: Ahead
) -> drift.Snapshot:
    claimants = list(foreign.get(namespace, ()))
    mine = targets.of(namespace)
    referenced = {(ref.namespace, ref.name) for ref in map(facts.isvc_ref, own)}
    keys = sorted({(t.namespace, t.name) for t in mine} | (referenced & targets.services.keys()))
    return drift.Snapshot(
        v2=own + claimants,
        services=[targets.services[key] for key in keys],
        isvc_pods=ahead.listings(namespace, mine, targets.following(namespace)),
        lifecycle=frozenset(_key("sglang", obj) for obj in own),
        serving=frozenset(
            _key("sglang", obj) for obj in own + claimants if facts.isvc_ref(obj).namespace == namespace
        ),
    )


def _key(kind: str, obj: Obj) -> AdapterKey:
    return AdapterKey(kind, facts.namespace_of(obj), facts.name_of(obj))  # type: ignore[arg-type]


def to_event(nudge: drift.Nudge, schema_base_url: str) -> CloudEvent:
    ref = AdapterRef.model_validate(
        {"apiVersion": nudge.api_version, "namespace": nudge.namespace, "name": nudge.name}
    )
    data = AdapterDrifted.model_validate({"adapter": ref, "step": nudge.step, "reason": nudge.reason})
    subject = ADAPTER_KINDS[nudge.api_version].path(nudge.namespace, nudge.name)
    return messages.reply(
        ADAPTER_DRIFTED, NAME, subject, data, {STEP_EXTENSION: nudge.step}, schema_base_url=schema_base_url
    )


resync = shell.function(NAME, ACCEPTS, handle)

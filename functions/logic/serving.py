"""The serving planner: which pods should serve which adapter, and what to ask each engine (pure).

load, reload and unload are one reconciler: each maps its trigger to a scope, observes the
world into a `World` (adapters, targets, their Ready pods and each engine's own listing), and
runs the same three pure steps:

    desire = desired(world)                        # who should serve what, verdicts otherwise
    actions = [a for pod in pods for a in plan_pod(world, desire, pod, scope)]
    ...execute actions, then apply their outcomes to the world...
    report = serving_report(world_after, desire, key, outcomes)   # what the status says

Rules (docs/operations.md, "Serving"):
- vllm: a ModelDeployment serves the adapters of its namespace named in `spec.loraAdapters`
  that are Ready, of its `spec.model`, with a valid `adapter_config.json` of a rank it takes.
  The engine name is the adapter's name; the path is our storage layout seen through the mount.
- sglang: an InferenceService (runtime sglang) serves the Available adapters that reference it,
  from its own namespace or from the namespaces it accepts (annotation
  `loraflow.io/accept-adapters-from`), whose `spec.path` is confined to the allowed roots.
  On one InferenceService a `spec.name` belongs to the oldest eligible adapter that claims it
  (creationTimestamp; within its one-second grain the InferenceService's own namespace first;
  then uid); the others get the verdict NameConflict and are never loaded.
- Capacity (functions/logic/capacity.py): an sglang pod holds at most its `max_loaded_loras`
  (what does not fit leaves its listing), so a target's claims are ranked, highest
  `loraflow.io/serving-priority` first, then oldest creationTimestamp, then namespace and name,
  and a pod holds the first ones that fit beside the names it serves that are not the target's;
  the others are left out (EngineCapacityExceeded) and never loaded there. A load never evicts:
  a claim that ranks out is unloaded before the one that ranks in is loaded. A vllm pod lists
  every name and reads an evicted one again on demand: all are loaded, and each pod says
  whether they are resident or reloadable. A pod whose capacity is garbage gets no loads.
- What a pod serves is known by content: a copy counts as ours only when the engine's `root`
  is the adapter's path (vllm: and `status.served` records the verified file set it was loaded
  from). A copy from an older file set is replaced; a name served from a path that is not ours
  is never touched (NameConflict on the adapter that wants it).
"""

from __future__ import annotations

import posixpath
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Literal, NamedTuple

from functions.logic import reasons
from functions.logic.adapter_config import ConfigVerdict
from functions.logic.capacity import Capacity
from functions.logic.paths import STORAGE_ROOT, frozen_owner, normal_path

AdapterKind = Literal["vllm", "sglang"]
TargetKind = Literal["ModelDeployment", "InferenceService"]
Serve = Literal["serve", "hold", "drop"]
"""serve: may be loaded. hold (vllm): a verified file set exists and verify is ruling on a change:
keep the copies there are, load none. drop: must not be served (not Ready, deleting)."""
Op = Literal["load", "replace", "unload"]
PodState = Literal["serving", "stale", "absent", "occupied", "failed", "unreachable", "capacity"]
ACCEPT_ALL = "*"


class AdapterKey(NamedTuple):
    kind: AdapterKind
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class TargetKey(NamedTuple):
    kind: TargetKind
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class Adapter(NamedTuple):
    """What the planner needs of one LoRAAdapter (built from the object by the observe step)."""

    key: AdapterKey
    uid: str
    created: str
    """metadata.creationTimestamp (RFC 3339, so string order is time order)."""
    lora_name: str
    lora_path: str
    """Where the engines read it: vllm the storage layout under the mount root, sglang spec.path."""
    file_set: str
    """Identity of the content: vllm the digest of the verified MD5s, sglang spec.path."""
    serve: Serve
    not_served: tuple[str, str] = (reasons.ADAPTER_NOT_READY, "adapter is not Ready")
    """(reason, message) of Loaded when `serve` is not "serve" (sglang: Available's)."""
    deleting: bool = False
    model: str = ""
    target: TargetKey | None = None
    """sglang: the InferenceService of spec.inferenceServiceRef."""
    loaded_path: str = ""
    """sglang: status.loadedPath, the path it was last served from in every pod (ours too)."""
    served: Mapping[str, str] = {}
    """vllm: status.served, pod -> the file set it was loaded from."""
    config: ConfigVerdict | None = None
    """vllm: the verdict on its adapter_config.json (rank checked against each target)."""
    priority: int = 0
    """`loraflow.io/serving-priority`: higher ranks first when a pod cannot hold every claim."""


class Target(NamedTuple):
    key: TargetKey
    serves: bool = True
    problem: tuple[str, str] | None = None
    """(reason, message) when it cannot serve adapters (RuntimeMismatch)."""
    model: str = ""
    adapters: tuple[str, ...] = ()
    """ModelDeployment spec.loraAdapters."""
    max_rank: int = 64
    accepts: frozenset[str] = frozenset()
    """InferenceService: other namespaces whose adapters it serves (`*`: any)."""


class ListingFailure(NamedTuple):
    reason: str
    message: str
    retryable: bool = True


Listing = Mapping[str, str] | ListingFailure | None
"""name -> root of what the engine serves; a failure; None when not observed (yet)."""


class Pod(NamedTuple):
    target: TargetKey
    name: str
    listing: Listing = None
    capacity: Capacity | None = None
    """None: no limit known (nothing is ranked out)."""
    listed: int | None = None
    """How many names the engine lists in all, when `listing` is only a part of it (a resync
    shard); None: the listing's own length."""


class Policy(NamedTuple):
    mount_root: str = "/mnt/seaweedfs"
    sglang_roots: tuple[str, ...] = ("/",)
    """Where sglang spec.path may point (normalised, absolute, no `..`)."""


class World(NamedTuple):
    adapters: Mapping[AdapterKey, Adapter]
    targets: Mapping[TargetKey, Target | None]
    """Every target an adapter names or that was asked about; None: it does not exist."""
    pods: Mapping[TargetKey, Sequence[Pod]]
    """Each target's Ready pods (with an address the kubelet set)."""
    policy: Policy = Policy()


class Claim(NamedTuple):
    """What one target serves under one engine name."""

    adapter: AdapterKey
    lora_name: str
    lora_path: str
    file_set: str
    load: bool = True
    """False while the adapter is held: keep its copies, add none."""


Verdict = tuple[str, str]
"""(reason, message) of a target that will not serve an adapter."""


class Desire(NamedTuple):
    wanted: Mapping[TargetKey, Mapping[str, Claim]]
    verdicts: Mapping[AdapterKey, Mapping[TargetKey, Verdict]]
    targets_of: Mapping[AdapterKey, tuple[TargetKey, ...]]
    """The targets that name each adapter (vllm: usedBy), served or not."""
    copies: Mapping[tuple[TargetKey, str], Sequence[AdapterKey]] = {}
    """sglang: (InferenceService, engine name) -> every adapter naming both, whatever its state,
    in key order: who a listed copy may belong to (`owner_of_copy`)."""


class Scope(NamedTuple):
    """What one invocation may do."""

    adapters: frozenset[AdapterKey] | None = None
    """Act only for these adapters (keys of gone adapters allowed: an orphan copy); None: all."""
    pods: frozenset[tuple[TargetKey, str]] | None = None
    """Load only into these pods (reload: the restarted one); None: every Ready pod."""
    load: bool = True
    unload: bool = False

    def covers(self, key: AdapterKey) -> bool:
        return self.adapters is None or key in self.adapters

    def may_load(self, pod: Pod) -> bool:
        return self.load and (self.pods is None or (pod.target, pod.name) in self.pods)


class Action(NamedTuple):
    op: Op
    target: TargetKey
    pod: str
    lora_name: str
    adapter: AdapterKey
    lora_path: str = ""
    file_set: str = ""


class Outcome(NamedTuple):
    action: Action
    ok: bool
    reason: str
    message: str = ""
    retryable: bool = False
    holds: Mapping[str, str] | None = None
    """What the engine's answer to a load says it holds after it (SGLang), name -> path."""


class PodReport(NamedTuple):
    pod: str
    state: PodState
    reason: str = ""
    message: str = ""
    retryable: bool = False
    residency: str = ""
    """vllm with a known capacity, when serving: `resident` or `reloadable`."""


class TargetReport(NamedTuple):
    target: TargetKey
    verdict: Verdict | None = None
    pods: tuple[PodReport, ...] = ()


class ServingReport(NamedTuple):
    """Everything the status of one adapter says about serving, decided from the world."""

    adapter: AdapterKey
    targets: tuple[TargetReport, ...]
    served: Mapping[str, str]
    """vllm: pod -> file set, for status.served."""
    loaded_now: tuple[str, ...]
    """Pods a load or replace call of this invocation succeeded in."""
    unloaded_now: tuple[str, ...]
    residency: Mapping[str, str] = {}
    """pod -> residency, for the served records (pods whose capacity is known)."""


# -- paths ---------------------------------------------------------------------------------------------
def same_path(a: str, b: str) -> bool:
    if a == b:
        return bool(a)
    return bool(a) and bool(b) and normal_path(a) == normal_path(b)


def confined(path: str, roots: Sequence[str]) -> bool:
    """Absolute, normalised (no `.`/`..`/`//` segments, no NUL) and under one of `roots`."""
    if not path.startswith("/") or "\x00" in path or "\\" in path:
        return False
    if any(part in (".", "..") for part in path.split("/")) or "//" in path:
        return False
    normal = posixpath.normpath(path)
    return any(
        root == "/" or normal == posixpath.normpath(root) or normal.startswith(posixpath.normpath(root) + "/")
        for root in roots
    )


def vllm_layout_owner(root: str, namespace: str, mount_root: str) -> tuple[str, str] | None:
    """(model, name) when `root` is `{mount}/loraadapters/{namespace}/{model}/{name}` or a frozen
    set of it (`paths.frozen_owner`): a copy only loraflow loads (even when its LoRAAdapter is
    gone); else None (a static adapter)."""
    home = _layout_home(mount_root, namespace)
    normal = normal_path(root) if root.startswith("/") else ""
    if not normal.startswith(home + "/"):
        return frozen_owner(normal, namespace, mount_root)
    parts = normal[len(home) + 1 :].split("/")
    return (parts[0], parts[1]) if len(parts) == 2 and all(parts) else None


@lru_cache(maxsize=1 << 12)
def _layout_home(mount_root: str, namespace: str) -> str:
    return posixpath.join(posixpath.normpath(mount_root), STORAGE_ROOT.strip("/"), namespace)


# -- who should serve what -----------------------------------------------------------------------------
def desired(world: World) -> Desire:
    wanted: dict[TargetKey, dict[str, Claim]] = defaultdict(dict)
    verdicts: dict[AdapterKey, dict[TargetKey, Verdict]] = defaultdict(dict)
    targets_of: dict[AdapterKey, tuple[TargetKey, ...]] = {}
    _desire_vllm(world, wanted, verdicts, targets_of)
    _desire_sglang(world, wanted, verdicts, targets_of)
    return Desire(dict(wanted), dict(verdicts), targets_of, sglang_copies(world))


def sglang_copies(world: World) -> dict[tuple[TargetKey, str], list[AdapterKey]]:
    """(InferenceService, engine name) -> the sglang adapters naming both, in key order."""
    found: dict[tuple[TargetKey, str], list[AdapterKey]] = defaultdict(list)
    for key, adapter in world.adapters.items():
        if key.kind == "sglang" and adapter.target is not None:
            found[(adapter.target, adapter.lora_name)].append(key)
    return {pair: sorted(keys) for pair, keys in found.items()}


def _desire_vllm(
    world: World,
    wanted: dict[TargetKey, dict[str, Claim]],
    verdicts: dict[AdapterKey, dict[TargetKey, Verdict]],
    targets_of: dict[AdapterKey, tuple[TargetKey, ...]],
) -> None:
    naming: dict[tuple[str, str], list[Target]] = defaultdict(list)
    for target_key, target in world.targets.items():
        if target is not None and target_key.kind == "ModelDeployment":
            for lora in dict.fromkeys(target.adapters):
                naming[(target_key.namespace, lora)].append(target)
    for key, adapter in world.adapters.items():
        if key.kind != "vllm":
            continue
        mds = sorted(naming.get((key.namespace, key.name), []), key=lambda t: t.key.name)
        targets_of[key] = tuple(md.key for md in mds)
        if adapter.serve == "drop":
            continue
        for md in mds:
            verdict = _vllm_verdict(adapter, md)
            if verdict is not None:
                verdicts[key][md.key] = verdict
                continue
            wanted[md.key][adapter.lora_name] = Claim(
                key, adapter.lora_name, adapter.lora_path, adapter.file_set, load=adapter.serve == "serve"
            )


def _vllm_verdict(adapter: Adapter, md: Target) -> Verdict | None:
    if not md.serves:
        return md.problem or (reasons.NO_READY_REPLICAS, f"ModelDeployment {md.key} is being deleted")
    if not adapter.model or adapter.model != md.model:
        return (
            reasons.MODEL_MISMATCH,
            f"{md.key.name} serves model {md.model!r}, adapter is for {adapter.model!r}",
        )
    config = adapter.config
    if config is None:
        return reasons.CONFIG_MISSING, "adapter_config.json not found in storage"
    if not config.ok:
        return config.reason, config.message
    if config.rank is not None and config.rank > md.max_rank:
        return reasons.RANK_TOO_HIGH, f"rank r={config.rank} exceeds the maximum {md.max_rank}"
    return None


def _desire_sglang(
    world: World,
    wanted: dict[TargetKey, dict[str, Claim]],
    verdicts: dict[AdapterKey, dict[TargetKey, Verdict]],
    targets_of: dict[AdapterKey, tuple[TargetKey, ...]],
) -> None:
    claimants: dict[tuple[TargetKey, str], list[Adapter]] = defaultdict(list)
    for key, adapter in world.adapters.items():
        if key.kind != "sglang" or adapter.target is None:
            continue
        targets_of[key] = (adapter.target,)
        if adapter.serve != "serve":
            continue
        verdict = sglang_verdict(world, adapter)
        if verdict is not None:
            verdicts[key][adapter.target] = verdict
            continue
        claimants[(adapter.target, adapter.lora_name)].append(adapter)
    for (target, lora), claiming in claimants.items():
        # oldest first; creationTimestamp has whole seconds, so within one second the
        # InferenceService's own namespace wins over a foreign one, then the uid decides
        owner, *others = sorted(
            claiming, key=lambda a: (a.created, a.key.namespace != target.namespace, a.uid)
        )
        wanted[target][lora] = Claim(owner.key, lora, owner.lora_path, owner.file_set)
        for other in others:
            message = (
                f"spec.name {lora!r} on InferenceService {target} belongs to the older adapter {owner.key}"
            )
            verdicts[other.key][target] = (reasons.NAME_CONFLICT, message)


def sglang_verdict(world: World, adapter: Adapter) -> Verdict | None:
    """Why the adapter's InferenceService will not serve it, regardless of other adapters."""
    assert adapter.target is not None
    target = world.targets.get(adapter.target)
    where = str(adapter.target)
    if target is None:
        return reasons.INFERENCE_SERVICE_NOT_FOUND, f"InferenceService {where} not found"
    if not target.serves:
        return target.problem or (
            reasons.RUNTIME_MISMATCH,
            f"InferenceService {where} cannot serve sglang adapters",
        )
    if not accepts(target, adapter.key.namespace):
        return (
            reasons.REFERENCE_NOT_PERMITTED,
            f"InferenceService {where} does not accept adapters from namespace {adapter.key.namespace!r}",
        )
    if not confined(adapter.lora_path, world.policy.sglang_roots):
        return reasons.PATH_NOT_ALLOWED, f"spec.path {adapter.lora_path!r} is not under an allowed root"
    return None


def accepts(target: Target, namespace: str) -> bool:
    return namespace == target.key.namespace or ACCEPT_ALL in target.accepts or namespace in target.accepts


# -- what one pod needs ------------------------------------------------------------------------------------
def pod_state(world: World, claim: Claim, listing: Mapping[str, str], pod: str) -> PodState:
    """Whether the pod serves the claim, an older copy of it, nothing, or someone else's copy."""
    root = listing.get(claim.lora_name)
    if root is None:
        return "absent"
    adapter = world.adapters.get(claim.adapter)
    if same_path(root, claim.lora_path):
        if claim.adapter.kind == "vllm":
            served = adapter.served.get(pod) if adapter is not None else None
            return "serving" if served == claim.file_set else "stale"
        return "serving"
    if adapter is not None and copy_of(world, claim.adapter, root) is not None:
        return "stale"
    return "occupied"


def copy_of(world: World, key: AdapterKey, root: str) -> AdapterKey | None:
    """`key` when `root` is a path the adapter is (or was last) served from."""
    adapter = world.adapters.get(key)
    if adapter is None:
        return None
    if same_path(root, adapter.lora_path) or same_path(root, adapter.loaded_path):
        return key
    if key.kind == "vllm":
        owner = vllm_layout_owner(root, key.namespace, world.policy.mount_root)
        return key if owner is not None and owner[1] == key.name else None
    return None


def owner_of_copy(
    world: World,
    target: TargetKey,
    lora: str,
    root: str,
    copies: Mapping[tuple[TargetKey, str], Sequence[AdapterKey]] | None = None,
) -> AdapterKey | None:
    """Which adapter a loaded (name, root) belongs to, if it is ours at all.

    vllm: our layout under the mount root names it, even when the LoRAAdapter is gone.
    sglang: a claimant of that name on this InferenceService served from exactly that root
    (`copies`: `Desire.copies`, else found by looking at every adapter of `world`).
    """
    if target.kind == "ModelDeployment":
        owner = vllm_layout_owner(root, target.namespace, world.policy.mount_root)
        if owner is None or owner[1] != lora:
            return None
        return AdapterKey("vllm", target.namespace, lora)
    # the oldest key decides; a planner asks for every name every pod lists, so it passes the
    # index (scanning the adapters for each was a tenth of a resync's CPU)
    claimants = (
        copies.get((target, lora), ()) if copies is not None else sglang_copies(world).get((target, lora), ())
    )
    for key in claimants:
        if copy_of(world, key, root) is not None:
            return key
    return None


class Room(NamedTuple):
    """What one pod may hold of its target's claims."""

    fits: frozenset[str] | None
    """Engine names of the claims that fit; None: all of them."""
    capacity: Capacity | None = None
    ranked: int = 0
    """How many claims the target has (for the messages)."""
    residency: str = ""


def rank_key(adapter: Adapter | None, lora: str) -> tuple[int, str, str, str]:
    if adapter is None:
        return (0, "~", "", lora)
    return (-adapter.priority, adapter.created or "~", adapter.key.namespace, adapter.key.name)


def residency(slots: int, listed: int) -> str:
    """A vllm pod's residency: every adapter it lists fits its CPU cache, or some are read
    again from their path when a request names them."""
    return reasons.RESIDENT if listed <= slots else reasons.RELOADABLE


def room(world: World, desire: Desire, pod: Pod) -> Room:
    """Which of its target's claims `pod` holds, given its capacity and what else it lists."""
    cap = pod.capacity
    if cap is None or (cap.slots is None and cap.problem is None):
        return Room(None)
    claims = desire.wanted.get(pod.target, {})
    listing = pod.listing if isinstance(pod.listing, Mapping) else None
    if cap.problem is not None:  # unknown room: hold what is there, add nothing
        held = frozenset(n for n in claims if listing is not None and n in listing)
        return Room(held, cap, len(claims))
    assert cap.slots is not None
    if not cap.evicts_listed:  # vllm: every name stays served; residency says how
        total = pod.listed if pod.listed is not None else len(listing) if listing is not None else len(claims)
        return Room(None, cap, len(claims), residency(cap.slots, total))
    foreign = 0 if listing is None else sum(1 for n in listing if n not in claims)
    if len(claims) + foreign <= cap.slots:
        return Room(None, cap, len(claims))
    budget = max(0, cap.slots - foreign)
    order = sorted(claims, key=lambda n: rank_key(world.adapters.get(claims[n].adapter), n))
    return Room(frozenset(order[:budget]), cap, len(claims))


def left_out_message(rm: Room, target: TargetKey) -> str:
    cap = rm.capacity
    slots = cap.slots if cap is not None else None
    source = f" ({cap.source})" if cap is not None and cap.source else ""
    return (
        f"the engine holds at most {slots} adapter(s){source} and {target} wants {rm.ranked}; "
        "this one ranks outside them (serving-priority, then age)"
    )


def plan_pod(world: World, desire: Desire, pod: Pod, scope: Scope) -> list[Action]:
    """The engine calls one pod needs, given its listing (None: not observed, load blindly)."""
    listing = pod.listing
    if isinstance(listing, ListingFailure):
        return []
    claims = desire.wanted.get(pod.target, {})
    actions: list[Action] = []
    rm = room(world, desire, pod)
    bound = rm.capacity is not None and rm.capacity.evicts_listed and rm.fits is not None
    if bound and listing is None:
        return []  # what it holds is unknown: a load could evict a wanted adapter
    if rm.capacity is not None and rm.capacity.problem is not None:
        rm = rm._replace(fits=frozenset())  # no loads where the room is unknown
    if scope.may_load(pod):
        for lora, claim in sorted(claims.items()):
            if not scope.covers(claim.adapter) or not claim.load:
                continue
            if rm.fits is not None and lora not in rm.fits:
                continue
            state = "absent" if listing is None else pod_state(world, claim, listing, pod.name)
            if state == "occupied" and listing is not None:
                holder = owner_of_copy(world, pod.target, lora, listing[lora], desire.copies)
                if holder is not None and holder != claim.adapter:
                    state = "stale"  # a younger claimant's copy: the owner takes its name back
            if state in ("absent", "stale"):
                op: Op = "load" if state == "absent" else "replace"
                actions.append(
                    Action(op, pod.target, pod.name, lora, claim.adapter, claim.lora_path, claim.file_set)
                )
        if bound and isinstance(listing, Mapping) and any(a.op == "load" for a in actions):
            # room first: what ranks out goes before what ranks in arrives (fleet runs a pod's
            # unloads before its loads), so the engine never evicts on its own
            assert rm.fits is not None
            out = [
                Action("unload", pod.target, pod.name, lora, claims[lora].adapter)
                for lora in sorted(listing)
                if lora in claims
                and lora not in rm.fits
                and owner_of_copy(world, pod.target, lora, listing[lora], desire.copies)
                == claims[lora].adapter
            ]
            actions = out + actions
    if scope.unload and listing is not None:
        for lora, root in sorted(listing.items()):
            owner = owner_of_copy(world, pod.target, lora, root, desire.copies)
            if owner is None or not scope.covers(owner):
                continue
            wanted = claims.get(lora)
            if wanted is not None and wanted.adapter == owner:
                continue  # wanted here (an older copy is load's to replace)
            action = Action("unload", pod.target, pod.name, lora, owner)
            if action not in actions:
                actions.append(action)
    return actions


def plan(world: World, desire: Desire, scope: Scope) -> list[Action]:
    return [
        a
        for target in sorted(world.pods)
        for pod in world.pods[target]
        for a in plan_pod(world, desire, pod, scope)
    ]


# -- after the calls -------------------------------------------------------------------------------------
def apply(world: World, outcomes: Iterable[Outcome]) -> World:
    """The world as it is after the successful calls (listings and served records updated)."""
    outcomes = tuple(outcomes)
    listings: dict[tuple[TargetKey, str], dict[str, str] | None] = {}
    served: dict[AdapterKey, dict[str, str]] = {}
    for outcome in outcomes:
        action = outcome.action
        if not outcome.ok or outcome.reason == reasons.POD_ALREADY_LOADED:
            continue
        where = (action.target, action.pod)
        if where not in listings:
            current = _listing_of(world, action.target, action.pod)
            listings[where] = dict(current) if isinstance(current, Mapping) else None
        adapter = world.adapters.get(action.adapter)
        if adapter is not None and action.adapter not in served:
            served[action.adapter] = dict(adapter.served)
        if action.op == "unload":
            if listings[where] is not None:
                listings[where].pop(action.lora_name, None)  # type: ignore[union-attr]
            served.get(action.adapter, {}).pop(action.pod, None)
            continue
        if listings[where] is None:
            listings[where] = {}
        listings[where][action.lora_name] = action.lora_path  # type: ignore[index]
        if action.adapter in served:
            served[action.adapter][action.pod] = action.file_set
    for where, names in put_out(world, outcomes).items():
        current = listings[where] if where in listings else _listing_of(world, *where)
        if isinstance(current, Mapping):
            listings[where] = {n: root for n, root in current.items() if n not in names}
    pods = {
        target: tuple(
            pod._replace(listing=listings[(target, pod.name)]) if (target, pod.name) in listings else pod
            for pod in group
        )
        for target, group in world.pods.items()
    }
    adapters = {
        key: adapter._replace(served=served[key]) if key in served else adapter
        for key, adapter in world.adapters.items()
    }
    return world._replace(pods=pods, adapters=adapters)


def put_out(world: World, outcomes: Iterable[Outcome]) -> dict[tuple[TargetKey, str], frozenset[str]]:
    """Per pod, the names it listed before these calls that a load's answer says the engine no
    longer holds, though none of these calls unloaded them: the engine evicted them to make
    room, because another writer (another instance of load, reload, an operator) loaded into
    the pod after this run listed it. Only SGLang's answers say what the engine holds."""
    outcomes = list(outcomes)
    touched = {(o.action.target, o.action.pod, o.action.lora_name) for o in outcomes if o.action.op != "load"}
    gone: dict[tuple[TargetKey, str], set[str]] = defaultdict(set)
    for o in outcomes:
        if not o.ok or o.holds is None:
            continue
        before = _listing_of(world, o.action.target, o.action.pod)
        if not isinstance(before, Mapping):
            continue
        where = (o.action.target, o.action.pod)
        gone[where] |= {n for n in before if n not in o.holds and (*where, n) not in touched}
    return {where: frozenset(names) for where, names in gone.items() if names}


def with_records(
    world: World, key: AdapterKey, records: Mapping[str, str], outcomes: Iterable[Outcome]
) -> World:
    """`world` (after `outcomes`) with the vllm adapter's served records as a newer read says,
    but for the pods whose records these outcomes changed. Another invocation may have loaded
    other pods since this one observed them (a load beside a reload): its records are newer
    than this invocation's view of those pods, and a status written from that view would put
    their older records back."""
    adapter = world.adapters.get(key)
    if adapter is None:
        return world
    changed = {
        o.action.pod
        for o in outcomes
        if o.action.adapter == key and o.ok and o.reason != reasons.POD_ALREADY_LOADED
    }
    served = {pod: fs for pod, fs in records.items() if pod not in changed}
    served |= {pod: fs for pod, fs in adapter.served.items() if pod in changed}
    return world._replace(adapters={**world.adapters, key: adapter._replace(served=served)})


def _listing_of(world: World, target: TargetKey, pod: str) -> Listing:
    return next((p.listing for p in world.pods.get(target, ()) if p.name == pod), None)


def serving_report(
    world: World, desire: Desire, key: AdapterKey, outcomes: Sequence[Outcome] = ()
) -> ServingReport:
    """How the adapter is served over every target that names it, after `outcomes` (already
    applied to `world`); failures of this invocation's calls are named on their pods."""
    failed = {
        (o.action.target, o.action.pod): o
        for o in outcomes
        if o.action.adapter == key and not o.ok and o.action.op != "unload"
    }
    reports: list[TargetReport] = []
    served: dict[str, str] = {}
    residency: dict[str, str] = {}
    adapter = world.adapters.get(key)
    if adapter is not None and adapter.serve != "serve":
        verdicts = tuple(TargetReport(t, adapter.not_served) for t in desire.targets_of.get(key, ()))
        return ServingReport(key, verdicts, dict(adapter.served), (), ())
    for target in desire.targets_of.get(key, ()):
        verdict = desire.verdicts.get(key, {}).get(target)
        claim = desire.wanted.get(target, {}).get(adapter.lora_name if adapter else "")
        if verdict is not None or claim is None or claim.adapter != key:
            reports.append(TargetReport(target, verdict))
            continue
        pods: list[PodReport] = []
        for pod in world.pods.get(target, ()):
            rm = room(world, desire, pod)
            report = _pod_report(world, claim, pod, failed.get((target, pod.name)), rm, target)
            pods.append(report)
            if report.state == "serving":
                served[pod.name] = claim.file_set
                if report.residency:
                    residency[pod.name] = report.residency
            elif (
                report.state in ("unreachable", "failed")
                and adapter is not None
                and pod.name in adapter.served
            ):
                served[pod.name] = adapter.served[pod.name]  # unknown or unchanged: keep the record
            elif report.state == "stale" and adapter is not None and pod.name in adapter.served:
                served[pod.name] = adapter.served[pod.name]
        reports.append(TargetReport(target, None, tuple(pods)))
    mine = [o for o in outcomes if o.action.adapter == key and o.ok]
    loaded_now = tuple(
        sorted(
            {o.action.pod for o in mine if o.action.op != "unload" and o.reason != reasons.POD_ALREADY_LOADED}
        )
    )
    unloaded_now = tuple(
        sorted({o.action.pod for o in mine if o.action.op == "unload" and o.reason == reasons.POD_UNLOADED})
    )
    return ServingReport(key, tuple(reports), served, loaded_now, unloaded_now, residency)


def _pod_report(
    world: World, claim: Claim, pod: Pod, failure: Outcome | None, rm: Room, target: TargetKey
) -> PodReport:
    if failure is not None:
        return PodReport(pod.name, "failed", failure.reason, failure.message, failure.retryable)
    listing = pod.listing
    if isinstance(listing, ListingFailure):
        return PodReport(pod.name, "unreachable", listing.reason, listing.message, listing.retryable)
    adapter = world.adapters.get(claim.adapter)
    if listing is None and adapter is not None and adapter.served.get(pod.name) == claim.file_set:
        # not listed by this invocation (a reload reads only its own pod): its record stands
        return PodReport(pod.name, "serving", reasons.POD_PRESENT, residency=rm.residency)
    state = "absent" if listing is None else pod_state(world, claim, listing, pod.name)
    if state == "absent" and rm.capacity is not None and rm.capacity.problem is not None:
        reason, message = rm.capacity.problem
        return PodReport(pod.name, "failed", reason, message)
    if state == "absent" and rm.fits is not None and claim.lora_name not in rm.fits:
        return PodReport(pod.name, "capacity", reasons.ENGINE_CAPACITY_EXCEEDED, left_out_message(rm, target))
    if listing is None:
        return PodReport(pod.name, "absent", reasons.POD_NOT_LOADED, "not loaded (yet)")
    if state == "occupied":
        return PodReport(
            pod.name, "occupied", reasons.POD_OCCUPIED, "the name is served from a path that is not ours"
        )
    if state == "stale":
        return PodReport(pod.name, "stale", reasons.POD_STALE, "serves an older file set")
    if state == "absent":
        return PodReport(pod.name, "absent", reasons.POD_NOT_LOADED, "not loaded (yet)")
    return PodReport(pod.name, "serving", reasons.POD_PRESENT, residency=rm.residency)


def retryable(reports: Iterable[ServingReport]) -> bool:
    return any(
        p.retryable
        for r in reports
        for t in r.targets
        for p in t.pods
        if p.state in ("failed", "unreachable")
    )


def redacted(adapter: Adapter) -> bool:
    """An sglang adapter in another namespace than its InferenceService is told counts and
    reasons, never that namespace's pods, paths or engine answers."""
    return adapter.target is not None and adapter.target.namespace != adapter.key.namespace

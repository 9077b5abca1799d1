"""From per-pod outcomes to the adapter status load/reload/unload own (pure).

Seed 1 owns `usedBy` and a `Loaded` condition; seed 2 owns `Loaded`, `Error`, `loadedPath`
and `lastLoadedAt`. Loaded is True only when every Ready pod of every target that should
serve the adapter has it, and never with zero pods.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from functions.logic import conditions
from functions.logic.adapter_config import VERDICT_REASONS
from functions.resources.meta import Condition, ConditionStatus

Obj = dict[str, Any]

LOADED = "Loaded"
ERROR = "Error"
# Loaded reasons
R_LOADED = "Loaded"
R_LOAD_FAILED = "LoadFailed"
R_LOADING = "Loading"  # some Ready pods lack it only because their own load has not run yet
R_NO_READY = "NoReadyReplicas"
R_MODEL_MISMATCH = "ModelMismatch"
R_NOT_REFERENCED = "NotReferenced"
R_NOT_READY = "AdapterNotReady"
R_RUNTIME_MISMATCH = "RuntimeMismatch"
R_TARGET_NOT_FOUND = "InferenceServiceNotFound"
R_UNLOADED = "Unloaded"
_LOADED_IN = re.compile(r"loaded in (\d+) Ready pod\(s\)")
R_UNLOAD_FAILED = "UnloadFailed"
R_NO_ERROR = "NoError"
NOT_LOADED = "NotLoaded"  # pod result: observed without loading, the pod lacks it

PRESENT = "Present"  # pod result: the engine had it already (its listing or its "already loaded")
MAX_NAMED = 10


class PodResult(NamedTuple):
    pod: str
    ok: bool
    reason: str
    message: str = ""
    retryable: bool = False

    @property
    def loaded_now(self) -> bool:
        """A load call actually succeeded (not: already present, not: duplicate answered)."""
        return self.ok and self.reason == "Loaded"


class TargetResult(NamedTuple):
    """One target's outcome for one adapter: a verdict (nothing attempted) or Ready-pod results."""

    target: str
    verdict: str | None = None
    message: str = ""
    pods: tuple[PodResult, ...] = ()

    @property
    def failed(self) -> list[PodResult]:
        return [p for p in self.pods if not p.ok]


def failures(targets: Sequence[TargetResult]) -> list[tuple[str, PodResult]]:
    return [(t.target, p) for t in targets for p in t.failed]


def retryable(targets: Sequence[TargetResult]) -> bool:
    return any(p.retryable for _, p in failures(targets))


def describe_failures(targets: Sequence[TargetResult]) -> str:
    failed = failures(targets)
    named = [f"{pod.pod} ({pod.reason}: {pod.message})" if pod.message else pod.pod for _, pod in failed]
    more = f" and {len(named) - MAX_NAMED} more" if len(named) > MAX_NAMED else ""
    return f"{len(failed)} pod(s) failed: " + "; ".join(named[:MAX_NAMED]) + more


def _pending_only(targets: Sequence[TargetResult]) -> bool:
    """Every shortfall is a pod that simply has not been loaded yet (a new or restarted replica
    whose own reload is on its way): not a failure, so not LoadFailed and no Error."""
    return all(pod.reason == NOT_LOADED for _, pod in failures(targets))


def _describe_pending(targets: Sequence[TargetResult]) -> str:
    waiting = [pod.pod for _, pod in failures(targets)]
    more = f" and {len(waiting) - MAX_NAMED} more" if len(waiting) > MAX_NAMED else ""
    counts = ", ".join(_count(t) for t in targets)
    return f"loading: {counts}; waiting for {', '.join(waiting[:MAX_NAMED])}{more}"


def _count(target: TargetResult) -> str:
    good = sum(1 for p in target.pods if p.ok)
    return f"{target.target} {good}/{len(target.pods)}"


def loaded_in(pods: int) -> str:
    """How a True Loaded condition's message starts (both seeds); `counted` reads it back."""
    return f"loaded in {pods} Ready pod(s)"


def counted(message: str) -> int | None:
    """The number of Ready pods a True Loaded message states, if it states one."""
    found = _LOADED_IN.match(message)
    return int(found.group(1)) if found else None


def summarize_v1(targets: Sequence[TargetResult]) -> tuple[ConditionStatus, str, str]:
    """(status, reason, message) of seed 1's Loaded condition over its referencing deployments."""
    if not targets:
        return "False", R_NOT_REFERENCED, "no ModelDeployment lists this adapter in spec.loraAdapters"
    attempted = [t for t in targets if t.verdict is None]
    mismatched = [t for t in targets if t.verdict == R_MODEL_MISMATCH]
    refused = [t for t in targets if t.verdict in VERDICT_REASONS]
    notes = "".join(f"; {t.target}: {t.message}" for t in mismatched)
    if failures(attempted):
        if _pending_only(attempted):
            return "False", R_LOADING, _describe_pending(attempted) + notes
        return "False", R_LOAD_FAILED, describe_failures(attempted) + notes
    if refused:
        first = refused[0]
        return "False", str(first.verdict), f"not loaded into {first.target}: {first.message}"
    if not attempted:
        return "False", R_MODEL_MISMATCH, "; ".join(f"{t.target}: {t.message}" for t in mismatched)
    pods = sum(len(t.pods) for t in attempted)
    counts = ", ".join(_count(t) for t in attempted)
    if pods == 0:
        return "False", R_NO_READY, f"no Ready pod in {counts}" + notes
    return "True", R_LOADED, f"{loaded_in(pods)}: {counts}" + notes


def summarize_v2(target: TargetResult) -> tuple[ConditionStatus, str, str, str, str]:
    """(Loaded status, Loaded reason, message, Error reason, Error message) for seed 2."""
    if target.verdict is not None:
        return "False", target.verdict, target.message, target.verdict, target.message
    failed = target.failed
    if failed and _pending_only([target]):
        return "False", R_LOADING, _describe_pending([target]), R_NO_ERROR, "no error"
    if failed:
        message = describe_failures([target])
        return "False", R_LOAD_FAILED, message, failed[0].reason, message
    if not target.pods:
        return "False", R_NO_READY, f"no Ready pod in {target.target}", R_NO_ERROR, "no error"
    return (
        "True",
        R_LOADED,
        f"{loaded_in(len(target.pods))} of {target.target}",
        R_NO_ERROR,
        "no error",
    )


def _conditions(status: Mapping[str, Any]) -> list[Condition]:
    return [Condition.model_validate(c) for c in status.get("conditions") or []]


def _wire(items: Sequence[Condition]) -> list[Obj]:
    return [c.to_wire() for c in items]


def status_v1(
    current: Mapping[str, Any],
    used: Sequence[str],
    targets: Sequence[TargetResult] | None,
    generation: int | None,
    now: datetime,
    not_ready: bool = False,
) -> Obj:
    """The whole desired status: usedBy, plus Loaded (None targets: leave Loaded alone)."""
    status = dict(current)
    status["usedBy"] = sorted(used)
    if not status["usedBy"]:
        status.pop("usedBy")
    items = _conditions(current)
    if not_ready:
        if conditions.find(items, LOADED) is None:
            return status
        state: tuple[ConditionStatus, str, str] = ("False", R_NOT_READY, "adapter is not Ready")
    elif targets is None:
        return status
    else:
        state = summarize_v1(targets)
    items = conditions.set_condition(items, LOADED, state[0], state[1], state[2], generation, now)
    status["conditions"] = _wire(items)
    return status


def status_v2(
    current: Mapping[str, Any], target: TargetResult, path: str, generation: int | None, now: datetime
) -> Obj:
    """Loaded, Error, loadedPath (once any pod has it) and lastLoadedAt (a load call succeeded)."""
    loaded, reason, message, error_reason, error_message = summarize_v2(target)
    items = conditions.set_condition(_conditions(current), LOADED, loaded, reason, message, generation, now)
    error_state: ConditionStatus = "False" if error_reason == R_NO_ERROR else "True"
    items = conditions.set_condition(items, ERROR, error_state, error_reason, error_message, generation, now)
    status = dict(current)
    status["conditions"] = _wire(items)
    if any(p.ok for p in target.pods):
        status["loadedPath"] = path
    if any(p.loaded_now for p in target.pods):
        status["lastLoadedAt"] = conditions.timestamp(now)
    return status


def status_loaded(
    current: Mapping[str, Any],
    state: ConditionStatus,
    reason: str,
    message: str,
    generation: int | None,
    now: datetime,
    used: Sequence[str] | None = None,
) -> Obj:
    """Set only the Loaded condition (and usedBy when given): used by unload."""
    status = dict(current)
    items = conditions.set_condition(_conditions(current), LOADED, state, reason, message, generation, now)
    status["conditions"] = _wire(items)
    if used is not None:
        status["usedBy"] = sorted(used)
        if not used:
            status.pop("usedBy")
    return status

"""load: put adapters into every Ready replica of the targets that should serve them.

Trigger: `adapter.ready`, `adapter.admitted`, `adapter.drifted` (loraflowstep=load); apiserver
add/update of a ModelDeployment or InferenceService; apiserver delete of a serving Pod (its
target's adapters now count one Ready pod fewer).
Reads: the adapter(s) and their targets (see functions/adapters/fleet.py), target Pods,
`adapter_config.json` in storage (vllm), each Ready pod's own `GET /v1/models`.
Does: loads what a Ready pod lacks; replaces a copy loaded from an older verified file set
(vLLM `load_inplace`, else unload then load). Never unloads anything else, never touches a
name served from a path that is not the adapter's.
Writes: vllm `usedBy`, `served` and condition Loaded; sglang Loaded + Error, `loadedPath`,
`lastLoadedAt` (docs/operations.md lists the reasons); Warning Event LoadFailed when Loaded
moves into a failure.
Outcomes: 200 + `adapter.loaded.v2` (adapter-scoped, something loaded; the deprecated v1 is
published beside it); 204 otherwise; 503 after
writing status when a pod failed retryably; 400 for malformed events.
"""

from __future__ import annotations

import logging

from cloudevents.http import CloudEvent

from events.domain import (
    ADAPTER_ADMITTED,
    ADAPTER_DRIFTED,
    ADAPTER_LOADED,
    ADAPTER_LOADED_V2,
    ADAPTER_READY,
    STEP_EXTENSION,
    AdapterLoaded,
    AdapterLoadedV2,
    PodFailure,
)
from events.external import API_ADD, API_DELETE, API_TYPES, API_UPDATE
from functions.adapters import fleet
from functions.adapters.fleet import Request
from functions.edge import inputs, messages, shell
from functions.edge.bootstrap import Deps
from functions.edge.messages import Reply
from functions.errors import EngineUnavailable, Retryable
from functions.logic.serving import AdapterKey

log = logging.getLogger("loraflow.load")
NAME = "load"
ACCEPTS = (ADAPTER_READY, ADAPTER_ADMITTED, ADAPTER_DRIFTED, API_ADD, API_UPDATE, API_DELETE)


def request_for(event: CloudEvent) -> Request | None:
    """What this event asks load to reconcile (None: not load's business)."""
    if event["type"] in API_TYPES:
        obj = inputs.kube_object(event)
        deleted = inputs.is_deleted(event)
        if inputs.is_pod(obj):
            # a pod that starts or turns Ready is reload's; a deleted one lowers its target's count
            target = inputs.serving_target(obj)
            return Request(targets=frozenset({target})) if deleted and target is not None else None
        target = inputs.target_key(obj)
        return Request(targets=frozenset({target})) if target is not None and not deleted else None
    if event["type"] == ADAPTER_DRIFTED and event.get(STEP_EXTENSION) != "load":
        return None
    key = inputs.adapter_key(inputs.adapter_ref(event))
    # just verified or admitted: no pod should have it yet, so load without listing first
    return Request(adapters=frozenset({key}), listings=event["type"] == ADAPTER_DRIFTED)


def handle(event: CloudEvent, deps: Deps) -> Reply:
    request = request_for(event)
    if request is None:
        return None
    result = fleet.run(deps, request, NAME)
    failing = result.failing()
    if any(pod.retryable for _, _, pod in failing):
        raise EngineUnavailable(f"load: {fleet.describe(failing)}")
    if len(request.adapters) != 1:
        return None
    (key,) = request.adapters
    return loaded_event(deps, result, key)


def loaded_event(deps: Deps, result: fleet.Result, key: AdapterKey) -> CloudEvent | None:
    """`adapter.loaded.v2` (the reply) naming the file set now served; the deprecated v1 is
    published beside it for subscribers that have not moved yet (best effort)."""
    reported = result.reports.get(key)
    adapter = result.executed.after.adapters.get(key)
    if reported is None or adapter is None or not reported.report.loaded_now:
        return None
    failed = [
        PodFailure(pod=pod.pod, reason=pod.reason, message=pod.message)
        for failing_key, _, pod in result.failing()
        if failing_key == key
    ]
    ref, subject, pods = inputs.ref_of(key), inputs.subject_of(key), list(reported.report.loaded_now)
    try:
        deps.broker.publish(
            messages.reply(
                ADAPTER_LOADED,
                NAME,
                subject,
                AdapterLoaded(adapter=ref, pods=pods, failed=failed),
                schema_base_url=deps.settings.schema_base_url,
            )
        )
    except Retryable as err:
        log.warning("Could not publish the deprecated adapter.loaded.v1", extra={"error": str(err)})
    data = AdapterLoadedV2(adapter=ref, file_set=adapter.file_set, pods=pods, failed=failed)
    return messages.reply(
        ADAPTER_LOADED_V2, NAME, subject, data, schema_base_url=deps.settings.schema_base_url
    )


load = shell.function(NAME, ACCEPTS, handle)

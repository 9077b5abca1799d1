"""reload: a new or restarted serving Pod gets back the adapters it should serve.

Trigger: apiserver add/update of a Pod (serving pods, label `loraflow.io/serving=true`).
Reads: the Pod (re-read: the event is a nudge), its engine's `/health`, its ModelDeployment /
InferenceService and what it serves (functions/adapters/fleet.py), each Ready pod's listing.
Loads only into this pod: the targets' other Ready pods are observed (their own Pod events
reload them) and count as NotLoaded in the status while they lack an adapter, so neither their
loads nor their failures are attributed to this pod's event.
Writes: each affected adapter's status as load does (Loaded recomputed over every Ready pod of
the targets; sglang `lastLoadedAt` moves when a load call succeeded).
Outcomes: 200 + `pod.reloaded` when something was loaded into this pod; 204 when the pod is
gone, not Ready, or already complete; 503 when the pod is Ready but its engine's /health is
not 200 (no further Pod event is guaranteed while it stays Ready, so the Broker must retry), or
when a load into this pod failed retryably.
"""

from __future__ import annotations

from cloudevents.http import CloudEvent

from events.domain import POD_RELOADED, PodFailure, PodReloaded
from events.external import API_ADD, API_UPDATE
from functions.adapters import fleet
from functions.adapters.fleet import Request
from functions.edge import inputs, messages, shell
from functions.edge.bootstrap import Deps
from functions.edge.messages import Reply
from functions.errors import EngineUnavailable
from functions.logic import reasons
from functions.resources.kinds import POD

NAME = "reload"
ACCEPTS = (API_ADD, API_UPDATE)
LOADED = (reasons.POD_LOADED, reasons.POD_REPLACED)


def handle(event: CloudEvent, deps: Deps) -> Reply:
    obj = inputs.kube_object(event)
    if not inputs.is_pod(obj):
        return None
    namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    pod = deps.kube.get(POD, namespace, name)
    target = inputs.serving_target(pod) if pod is not None else None
    if pod is None or target is None:
        return None
    ep = fleet.endpoint_of(deps, pod, target)
    if ep is None:
        return None
    if not deps.engines.healthy(ep):
        raise EngineUnavailable(f"pod {namespace}/{name} is Ready but its engine /health is not 200")
    mine = frozenset({(target, name)})
    result = fleet.run(deps, Request(targets=frozenset({target}), pods=mine), NAME)
    failing = result.failing(mine)
    if any(p.retryable for _, _, p in failing):
        raise EngineUnavailable(
            f"reload pod {namespace}/{name}: {len(failing)} load(s) failed, a retry may succeed"
        )
    loaded = sorted(
        {
            o.action.lora_name
            for o in result.executed.outcomes
            if o.action.pod == name and o.action.target == target and o.reason in LOADED
        }
    )
    if not loaded:
        return None
    failed = [PodFailure(pod=name, reason=p.reason, message=p.message) for _, _, p in failing]
    data = PodReloaded(namespace=namespace, pod=name, adapters=loaded, failed=failed)
    return messages.reply(
        POD_RELOADED, NAME, POD.path(namespace, name), data, schema_base_url=deps.settings.schema_base_url
    )


reload = shell.function(NAME, ACCEPTS, handle)

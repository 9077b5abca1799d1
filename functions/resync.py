"""resync: the periodic safety net. Finds drift and publishes one nudge per (adapter, step).

Trigger: `dev.knative.sources.ping`, from the PingSource or from the filer source; data
`{"full": true, "reason": ...}` (the filer source, when the filer's metadata log no longer
covers its cursor) adds a stat nudge for every admitted seed-1 adapter, Ready ones included:
their files may have changed unnoticed.
Reads: every adapter of both kinds, ModelDeployments, InferenceServices and serving Pods
(`loraflow.io/serving=true`), all paginated; one `GET /v1/models` per Ready pod (fanned out).
Writes: nothing. Publishes `io.loraflow.adapter.drifted.v1` (extension `loraflowstep` =
admit|stat|load|unload, data.reason) to the Broker for what drifted only.
Outcomes: 204 (nudges are published, not replied); 503 when the API or the Broker fails.
Cost: a fixed number of paginated lists + one listing per Ready pod, no per-adapter API call.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from cloudevents.http import CloudEvent

from events.domain import ADAPTER_DRIFTED, STEP_EXTENSION, AdapterDrifted, AdapterRef
from events.external import PING, ResyncTick
from functions.adapters import fleet
from functions.adapters.concurrency import bounded_map
from functions.edge import inputs, messages, shell
from functions.edge.bootstrap import Deps
from functions.edge.messages import Reply
from functions.logic import drift
from functions.logic.pods import Endpoint
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


def handle(event: CloudEvent, deps: Deps) -> Reply:
    tick = ResyncTick()
    if event.get_data() not in (None, b"", ""):
        tick = messages.data_as(event, ResyncTick)  # an object or nothing; garbage is a 400
    restat = (tick.reason or "storage notifications may have been lost") if tick.full else None
    snapshot = observe(deps)
    for nudge in drift.drift(snapshot, deps.settings.mount_root, restat=restat):
        deps.broker.publish(to_event(nudge))
    return None


def observe(deps: Deps) -> drift.Snapshot:
    kube = deps.kube
    located: list[tuple[str, drift.Namespaced, Endpoint]] = []
    for pod in kube.iter(POD, None, f"{SERVING_LABEL}=true"):
        target = inputs.serving_target(pod)
        ep = fleet.endpoint_of(deps, pod, target) if target is not None else None
        if ep is not None and target is not None:
            which = "md" if target.kind == "ModelDeployment" else "isvc"
            located.append((which, (target.namespace, target.name), ep))
    listings: dict[Endpoint, dict[str, str] | None] = {}
    if located:  # no serving pod, no engine client: a tick in an idle cluster pays for none
        width = deps.settings.load_concurrency
        listed = bounded_map([ep for _, _, ep in located], deps.engines.listing, width)
        listings = {ep: found if isinstance(found, dict) else None for ep, found in listed}
    grouped: dict[str, dict[drift.Namespaced, dict[str, Any]]] = {
        "md": defaultdict(dict),
        "isvc": defaultdict(dict),
    }
    for which, key, ep in located:
        grouped[which][key][ep.pod] = listings[ep]
    v1 = list(kube.iter(VLLM_ADAPTER))
    # Models are read by name only (RBAC: get), and only those some adapter said were missing.
    models = frozenset(key for key in drift.missing_models(v1) if kube.get(MODEL, key[0], key[1]) is not None)
    return drift.Snapshot(
        v1=v1,
        v2=list(kube.iter(SGLANG_ADAPTER)),
        deployments=list(kube.iter(MODEL_DEPLOYMENT)),
        services=list(kube.iter(INFERENCE_SERVICE)),
        md_pods=grouped["md"],
        isvc_pods=grouped["isvc"],
        models=models,
    )


def to_event(nudge: drift.Nudge) -> CloudEvent:
    ref = AdapterRef.model_validate(
        {"apiVersion": nudge.api_version, "namespace": nudge.namespace, "name": nudge.name}
    )
    data = AdapterDrifted.model_validate({"adapter": ref, "step": nudge.step, "reason": nudge.reason})
    subject = ADAPTER_KINDS[nudge.api_version].path(nudge.namespace, nudge.name)
    return messages.reply(ADAPTER_DRIFTED, NAME, subject, data, {STEP_EXTENSION: nudge.step})


resync = shell.function(NAME, ACCEPTS, handle)

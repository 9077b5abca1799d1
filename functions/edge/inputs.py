"""Reading what an event points at, validated once, shared by the step modules.

Every name that will reach a path, a URL or an API call is checked here first (DNS
labels/subdomains), so a hostile event is rejected with 400 before any I/O happens.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from cloudevents.http import CloudEvent
from pydantic import ValidationError

from events.catalog import BY_TYPE
from events.domain import AdapterRef
from events.external import API_TYPES, KubeObject
from functions.edge.messages import data_as
from functions.errors import Reject, problems
from functions.logic.paths import check_label, check_subdomain, is_subdomain
from functions.logic.serving import AdapterKey, TargetKey
from functions.resources.kinds import (
    ADAPTER_KINDS,
    SERVING_BY_API_VERSION,
    SERVING_BY_RUNTIME,
    SERVING_KINDS,
    Kind,
    by_api_version_and_kind,
)
from functions.resources.wire import WireModel

M = TypeVar("M", bound=WireModel)


def adapter_ref(event: CloudEvent) -> AdapterRef:
    """The adapter a domain event of ours is about (its payload's `adapter`)."""
    entry = BY_TYPE.get(event["type"])
    if entry is None:
        raise Reject(f"unknown event type {event['type']!r}")
    payload = data_as(event, entry.payload)
    ref = getattr(payload, "adapter", None)
    if not isinstance(ref, AdapterRef):
        raise Reject(f"events of type {event['type']!r} do not name an adapter")
    return ref


def adapter_kind(ref: AdapterRef) -> Kind:
    return ADAPTER_KINDS[ref.api_version]


def kube_object(event: CloudEvent) -> dict[str, Any]:
    """The object of an ApiServerSource (mode Resource) event, with a checked name and namespace."""
    if event["type"] not in API_TYPES:
        raise Reject(f"{event['type']!r} is not an ApiServerSource resource event")
    obj = data_as(event, KubeObject)
    meta = obj.metadata
    name, namespace = meta.get("name"), meta.get("namespace")
    if not isinstance(name, str) or not isinstance(namespace, str):
        raise Reject("object metadata must carry a string name and namespace")
    check_label(namespace, "namespace")
    check_subdomain(name, "name")
    return obj.as_dict()


def stored(model: type[M], obj: Mapping[str, Any]) -> M:
    """An object read from the API server in its model, or Reject naming the first problems
    (the apiserver accepted it, so our model and the CRD disagree: retrying cannot help)."""
    try:
        return model.model_validate(obj)
    except ValidationError as err:
        raise Reject(
            f"stored {obj.get('kind', 'object')} does not match its schema: {problems(err)}"
        ) from err


def is_deleted(event: CloudEvent) -> bool:
    return bool(event["type"].endswith(".delete"))


def adapter_key(ref: AdapterRef) -> AdapterKey:
    return AdapterKey(SERVING_BY_API_VERSION[ref.api_version].runtime, ref.namespace, ref.name)


def adapter_kind_of(key: AdapterKey) -> Kind:
    return SERVING_BY_RUNTIME[key.kind].adapter


def ref_of(key: AdapterKey) -> AdapterRef:
    api_version = SERVING_BY_RUNTIME[key.kind].api_version
    return AdapterRef(api_version=api_version, namespace=key.namespace, name=key.name)


def subject_of(key: AdapterKey) -> str:
    return adapter_kind_of(key).path(key.namespace, key.name)


def kind_of_object(obj: dict[str, Any]) -> Kind | None:
    return by_api_version_and_kind(str(obj.get("apiVersion")), str(obj.get("kind")))


def is_pod(obj: dict[str, Any]) -> bool:
    return obj.get("apiVersion") == "v1" and obj.get("kind") == "Pod"


def object_adapter_key(obj: dict[str, Any]) -> AdapterKey | None:
    """The key of an apiserver event's object when it is a LoRAAdapter of either kind."""
    kind = kind_of_object(obj)
    serving = next((s for s in SERVING_KINDS if s.adapter == kind), None)
    if serving is None:
        return None
    meta = obj["metadata"]
    return AdapterKey(serving.runtime, meta["namespace"], meta["name"])


def target_key(obj: dict[str, Any]) -> TargetKey | None:
    """The key of an apiserver event's object when it is a ModelDeployment or InferenceService."""
    kind = kind_of_object(obj)
    meta = obj["metadata"]
    serving = next((s for s in SERVING_KINDS if s.target == kind), None)
    return None if serving is None else TargetKey(serving.target_kind, meta["namespace"], meta["name"])


def serving_target(pod: dict[str, Any]) -> TargetKey | None:
    """The target a serving Pod's labels name (in the pod's namespace); None for a label value
    that is no object name."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    namespace = pod["metadata"]["namespace"]
    for serving in SERVING_KINDS:  # in the table's order: a pod labelled for both names its ModelDeployment
        name = labels.get(serving.pod_label)
        if isinstance(name, str) and is_subdomain(name):
            return TargetKey(serving.target_kind, namespace, name)
    return None

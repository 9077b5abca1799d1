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
from functions._edge import data_as
from functions.errors import Reject, problems
from functions.logic.paths import check_label, check_subdomain
from functions.resources.kinds import ADAPTER_KINDS, Kind
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

"""Kubernetes object metadata and metav1.Condition, as the API server serialises them."""

from __future__ import annotations

from typing import ClassVar, Literal

from events.records import field
from functions.resources.wire import WireModel

ConditionStatus = Literal["True", "False", "Unknown"]


class ObjectMeta(WireModel):
    name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    finalizers: list[str] | None = None


class Condition(WireModel):
    """metav1.Condition: lastTransitionTime moves only when status changes."""

    # `message` is required in the CRD (json:"message", no omitempty): "" is sent as "".
    always_emit: ClassVar[frozenset[str]] = frozenset({"message"})

    type: str
    status: ConditionStatus
    reason: str = field(min_length=1, max_length=1024)
    message: str = field(default="", max_length=32768)
    last_transition_time: str
    observed_generation: int | None = None


class ObjectReference(WireModel):
    """The identity of a namespaced object, enough to re-read it."""

    api_version: str
    kind: str
    namespace: str
    name: str

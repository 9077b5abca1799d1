"""Kubernetes object metadata, metav1.Condition and resource.Quantity, as the API server
serialises them."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from functions.resources.wire import WireModel

ConditionStatus = Literal["True", "False", "Unknown"]

QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
"""resource.Quantity's string form, as the CRDs declare it (apimachinery's quantity regexp)."""

Quantity = int | Annotated[str, Field(pattern=QUANTITY_PATTERN)]
"""An int-or-string Quantity (`x-kubernetes-int-or-string`): 1073741824, "1Gi", "1.5G"."""


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
    reason: str = Field(min_length=1, max_length=1024)
    message: str = Field(default="", max_length=32768)
    last_transition_time: str
    observed_generation: int | None = None

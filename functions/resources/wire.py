"""Serialisation rules shared by every resource model.

One rule for every type ("omitempty everywhere", see docs/contracts.md): camelCase keys,
None, "", [] and {} are omitted; booleans and integers are optional and emitted when set.
Unknown fields are kept, because the API server adds fields we do not model and a
round-trip must never drop them.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_serializer
from pydantic.alias_generators import to_camel
from pydantic_core.core_schema import SerializerFunctionWrapHandler


def is_empty(value: Any) -> bool:
    """Go's omitempty for strings, slices, maps and pointers (not for bools and ints)."""
    return value is None or (isinstance(value, str | list | dict | tuple) and len(value) == 0)


def prune(value: Any) -> Any:
    """Drop empty members recursively from plain JSON data."""
    if isinstance(value, dict):
        pruned = {k: prune(v) for k, v in value.items()}
        return {k: v for k, v in pruned.items() if not is_empty(v)}
    if isinstance(value, list):
        return [prune(v) for v in value]
    return value


class WireModel(BaseModel):
    """Base of every resource model: camelCase on the wire, omitempty on the way out."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="allow",
        serialize_by_alias=True,
        # Validators are built on a model's first use, not at import: a function's process
        # builds only the models its events touch, and its cold start pays for no others.
        defer_build=True,
    )

    # Wire names that are required without omitempty in the Go type (e.g. metav1.Condition's
    # `message`): emitted even when empty, or the apiserver rejects the object.
    always_emit: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _omit_empty(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if k in self.always_emit or not is_empty(v)}
        return data

    def to_wire(self) -> dict[str, Any]:
        """The JSON object as the API server would store it.

        omitempty applies to modelled fields only (each model's serializer). Opaque values are
        kept verbatim: an `emptyDir: {}` volume, a label with an empty value and the `{}`
        markers of managedFields are meaningful, and recursive pruning would corrupt them.
        """
        result: dict[str, Any] = self.model_dump(mode="json", by_alias=True)
        return result

"""The base of every resource model: how the API server's JSON maps to pydantic and back.

One rule for every type ("omitempty everywhere", see docs/contracts.md): camelCase keys; on
the way out None, "", [] and {} are omitted; booleans and integers are optional (Go pointers)
and emitted when set, `false` and `0` included. Unknown fields are kept, because the API
server adds fields we do not model (managedFields, ownerReferences, another controller's
status) and a round trip must never drop them.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import ConfigDict
from pydantic.alias_generators import to_camel

from events.base import Model


def is_empty(value: Any) -> bool:
    """What Go's omitempty drops: nil, "", empty slices and maps (not false, not 0); and a
    nested struct all of whose fields it drops (its JSON would be `{}`)."""
    if value is None:
        return True
    kind = type(value)
    if kind is str or kind is list or kind is dict:
        return not value
    return isinstance(value, WireModel) and value.writes_nothing()


class WireModel(Model):
    """A Kubernetes object or part of one, as the API server stores it.

    Types are as strict as the API server's schema validation: "3" is not an integer, 1 is
    not a boolean. Models are immutable values: a changed object is `model_copy(update=...)`.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="allow",
        strict=True,
        frozen=True,
        # Validators are built on a model's first use, not at import: a step's cold start pays
        # only for the kinds its events touch.
        defer_build=True,
    )

    always_emit: ClassVar[frozenset[str]] = frozenset()
    """Fields written even when empty: a Go field without omitempty (Condition.message)."""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        """omitempty on every declared field, as pydantic's own `exclude_if` (checked in the
        serializer, in Rust, for each value: a model-wide wrap serializer calls Python for
        every nested object, which made serializing a large status several times slower).

        Only declared fields: unknown ones are written back verbatim, since an `emptyDir: {}`
        volume, a label with an empty value and the `{}` markers of managedFields mean
        something. Set before the schema is built (defer_build), so the serializer has it."""
        super().__pydantic_init_subclass__(**kwargs)
        for name, info in cls.__pydantic_fields__.items():
            if name not in cls.always_emit:
                info.exclude_if = is_empty

    def writes_nothing(self) -> bool:
        """True when to_wire() would be `{}` (omitempty then drops this object from its parent)."""
        if self.__pydantic_extra__ or self.always_emit:
            return False
        return all(is_empty(getattr(self, name)) for name in type(self).__pydantic_fields__)

    def to_wire(self) -> dict[str, Any]:
        """The JSON object as the API server would store it (camelCase, omitempty applied)."""
        wire: dict[str, Any] = self.model_dump(mode="json")
        return wire

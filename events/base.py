"""The root of loraflow's pydantic models: what every layer's base (events.domain.Payload,
functions.resources.wire.WireModel) adds to pydantic's BaseModel."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

from pydantic import BaseModel


class Model(BaseModel):
    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """pydantic's copy with changes, refusing a name that is not a field's: pydantic would
        keep a wire name (`storageRef`) as an unknown field beside the real one, or drop a typo
        silently, and `update` is a plain dict that no type checker reads."""
        unknown = sorted(set(update or ()) - set(type(self).__pydantic_fields__))
        if unknown:
            raise TypeError(
                f"{type(self).__name__} has no field {', '.join(map(repr, unknown))} (Python names)"
            )
        return super().model_copy(update=update, deep=deep)

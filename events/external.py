"""CloudEvent types loraflow consumes from sources it does not own (Knative, SeaweedFS).

Their data is someone else's format: fields we do not model are kept (`model_extra`), and the
names are the sender's (the SeaweedFS webhook writes snake_case).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

API_ADD = "dev.knative.apiserver.resource.add"
API_UPDATE = "dev.knative.apiserver.resource.update"
API_DELETE = "dev.knative.apiserver.resource.delete"
API_TYPES = (API_ADD, API_UPDATE, API_DELETE)
PING = "dev.knative.sources.ping"
AWS_SQS = "dev.knative.eventing.aws-sqs"


class Received(BaseModel):
    """Base of the data others send us: immutable, JSON's types taken strictly, unknown keys kept."""

    model_config = ConfigDict(frozen=True, extra="allow", strict=True, defer_build=True)


class KubeObject(Received):
    """ApiServerSource (mode Resource) data: the whole object, new state (last state on delete)."""

    model_config = ConfigDict(alias_generator=to_camel, validate_by_name=True, serialize_by_alias=True)

    api_version: str = Field(min_length=1)
    kind: str = Field(min_length=1)
    metadata: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """The object as it came, without a copy: a Kubernetes object can be 1.5 MiB, and a
        handler only reads it (model_dump would rebuild every nested value)."""
        modelled = {"apiVersion": self.api_version, "kind": self.kind, "metadata": self.metadata}
        return {**modelled, **(self.model_extra or {})}


class PingData(Received):
    """PingSource data: whatever `spec.data` holds; ours sends `{"resync": true}` or nothing."""


class ResyncTick(PingData):
    """A resync tick: the PingSource's (`{"resync": true}` or nothing), or the filer source's
    when the filer's metadata log no longer covers its cursor (`full: true` and a `reason`):
    changes may have gone unnoticed, so every admitted adapter's files are looked at again."""

    full: bool = False
    reason: str | None = Field(default=None, max_length=1024)


class SeaweedWebhook(Received):
    """SeaweedFS filer webhook body (not a CloudEvent): `{key, event_type, message}`."""

    key: str = Field(min_length=1, max_length=4096)
    event_type: str
    message: dict[str, Any] = Field(default_factory=dict)

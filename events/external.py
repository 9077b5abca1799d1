"""CloudEvent types loraflow consumes from sources it does not own (Knative, SeaweedFS).

Models defer_build: a step builds the validators of the events it takes, on first use."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

API_ADD = "dev.knative.apiserver.resource.add"
API_UPDATE = "dev.knative.apiserver.resource.update"
API_DELETE = "dev.knative.apiserver.resource.delete"
API_TYPES = (API_ADD, API_UPDATE, API_DELETE)
PING = "dev.knative.sources.ping"
AWS_SQS = "dev.knative.eventing.aws-sqs"


class KubeObject(BaseModel):
    """ApiServerSource (mode Resource) data: the whole object, new state (last state on delete)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, defer_build=True)

    api_version: str = Field(alias="apiVersion", min_length=1)
    kind: str = Field(min_length=1)
    metadata: dict[str, Any]


class PingData(BaseModel):
    """PingSource data: whatever `spec.data` holds; ours sends `{"resync": true}` or nothing."""

    model_config = ConfigDict(extra="allow", defer_build=True)


class SeaweedWebhook(BaseModel):
    """SeaweedFS filer webhook body (not a CloudEvent): `{key, event_type, message}`."""

    model_config = ConfigDict(extra="allow", defer_build=True)

    key: str = Field(min_length=1, max_length=4096)
    event_type: str
    message: dict[str, Any] = Field(default_factory=dict)

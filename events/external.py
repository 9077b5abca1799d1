"""CloudEvent types loraflow consumes from sources it does not own (Knative, SeaweedFS)."""

from __future__ import annotations

from typing import Any

from events.records import Record, field

API_ADD = "dev.knative.apiserver.resource.add"
API_UPDATE = "dev.knative.apiserver.resource.update"
API_DELETE = "dev.knative.apiserver.resource.delete"
API_TYPES = (API_ADD, API_UPDATE, API_DELETE)
PING = "dev.knative.sources.ping"
AWS_SQS = "dev.knative.eventing.aws-sqs"


class KubeObject(Record):
    """ApiServerSource (mode Resource) data: the whole object, new state (last state on delete)."""

    extra = "allow"

    api_version: str = field(alias="apiVersion", min_length=1)
    kind: str = field(min_length=1)
    metadata: dict[str, Any]


class PingData(Record):
    """PingSource data: whatever `spec.data` holds; ours sends `{"resync": true}` or nothing."""

    extra = "allow"


class SeaweedWebhook(Record):
    """SeaweedFS filer webhook body (not a CloudEvent): `{key, event_type, message}`."""

    extra = "allow"

    key: str = field(min_length=1, max_length=4096)
    event_type: str
    message: dict[str, Any] = field(default_factory=dict)

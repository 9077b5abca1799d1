"""Where each event type's JSON Schema is published: the `dataschema` of every event we emit
and the `schema` of its Knative EventType (knative/eventtypes/) are the same absolute URI.

Every function serves the schemas it was built with at `GET /schemas/<file>` (functions/edge/shell.py),
so the default base is one of our own cluster-local Services: resolvable wherever loraflow is
installed, no internet needed, and always the schemas of the code that emits the events. It is
ingest's because ingest is already the one Service called directly, not only by the Broker
(the SeaweedFS filer posts to it). Publish them elsewhere (a schema registry, the repository)
with LORAFLOW_SCHEMA_BASE_URL, and point the EventTypes there too.

Kept apart from `events.catalog` so that a function's cold start does not import the catalog.
"""

from __future__ import annotations

DEFAULT_SCHEMA_BASE_URL = "http://loraflow-ingest.loraflow.svc.cluster.local/schemas/"


def slug(event_type: str) -> str:
    """`io.loraflow.adapter.ready.v1` -> `io_loraflow_adapter_ready_v1` (schema and sample names)."""
    return event_type.replace(".", "_").replace("-", "_")


def schema_file(event_type: str) -> str:
    return f"{slug(event_type)}.json"


def schema_url(event_type: str, base: str = DEFAULT_SCHEMA_BASE_URL) -> str:
    return base.rstrip("/") + "/" + schema_file(event_type)

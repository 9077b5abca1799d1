"""The catalog: every CloudEvent type we emit or consume, its payload model and who emits it.

`python -m events.catalog` regenerates `events/schemas/*.json`; a test keeps them in step.
"""

from __future__ import annotations

import builtins
import json
from pathlib import Path
from typing import Literal, NamedTuple

from pydantic import BaseModel

from events import domain, external
from events.schema_urls import schema_url, slug

HERE = Path(__file__).parent
SCHEMAS = HERE / "schemas"
SAMPLES = HERE / "samples"

Direction = Literal["emitted", "consumed"]


class EventType(NamedTuple):
    """One catalog entry (a NamedTuple: defined at every function's start, and cheaper to define
    than a frozen dataclass)."""

    type: str
    payload: builtins.type[BaseModel]
    direction: Direction
    emitted_by: str
    summary: str
    subject: str

    @property
    def slug(self) -> str:
        return slug(self.type)

    def schema(self) -> dict[str, object]:
        """The payload's JSON Schema as pydantic generates it (validation mode: what it accepts),
        identified by the URI it is published at by default (the events' `dataschema`)."""
        return {"$id": schema_url(self.type), **self.payload.model_json_schema()}


CATALOG: tuple[EventType, ...] = (
    EventType(
        domain.FILE_CHANGED,
        domain.FileChanged,
        "emitted",
        "ingest, filer-source",
        "A file under /loraadapters/ changed in storage",
        "full storage path",
    ),
    EventType(
        domain.ADAPTER_ADMITTED,
        domain.AdapterAdmitted,
        "emitted",
        "admit",
        "An adapter's spec was accepted; storage path and finalizer are set",
        "adapter",
    ),
    EventType(
        domain.ADAPTER_STAT_COMPLETED,
        domain.AdapterStatCompleted,
        "emitted",
        "stat",
        "Storage was listed and the observation changed",
        "adapter",
    ),
    EventType(
        domain.ADAPTER_READY,
        domain.AdapterReady,
        "emitted",
        "verify",
        "Every declared file is in storage with its MD5",
        "adapter",
    ),
    EventType(
        domain.ADAPTER_FAILED,
        domain.AdapterFailed,
        "emitted",
        "verify",
        "Integrity check failed (reason and paths in data)",
        "adapter",
    ),
    EventType(
        domain.ADAPTER_DELETING,
        domain.AdapterDeleting,
        "emitted",
        "admit",
        "The adapter's deletion was requested; our finalizer holds it until unload has taken it out",
        "adapter",
    ),
    EventType(
        domain.ADAPTER_LOADED,
        domain.AdapterLoaded,
        "emitted",
        "load",
        "Deprecated (until 0.3): v2 without the file set",
        "adapter",
    ),
    EventType(
        domain.ADAPTER_LOADED_V2,
        domain.AdapterLoadedV2,
        "emitted",
        "load",
        "The adapter is loaded in the listed pods from the named file set (failures listed)",
        "adapter",
    ),
    EventType(
        domain.ADAPTER_UNLOADED,
        domain.AdapterUnloaded,
        "emitted",
        "unload",
        "The adapter was unloaded from the listed pods",
        "adapter",
    ),
    EventType(
        domain.POD_RELOADED,
        domain.PodReloaded,
        "emitted",
        "reload",
        "A restarted or new replica got back the adapters it should serve",
        "pod",
    ),
    EventType(
        domain.ADAPTER_DRIFTED,
        domain.AdapterDrifted,
        "emitted",
        "resync",
        "Resync found drift; extension `loraflowstep` names the step to run",
        "adapter",
    ),
    EventType(
        domain.RESYNC_SHARD,
        domain.ResyncShard,
        "emitted",
        "resync",
        "One part of a resync tick: the namespaces one request judges (LORAFLOW_RESYNC_SHARDS > 1)",
        "part/parts",
    ),
    EventType(
        external.API_ADD,
        external.KubeObject,
        "consumed",
        "ApiServerSource",
        "A watched object was added (data: the object)",
        "object path",
    ),
    EventType(
        external.API_UPDATE,
        external.KubeObject,
        "consumed",
        "ApiServerSource",
        "A watched object changed, status writes included (data: the object)",
        "object path",
    ),
    EventType(
        external.API_DELETE,
        external.KubeObject,
        "consumed",
        "ApiServerSource",
        "A watched object was deleted (data: its last state)",
        "object path",
    ),
    EventType(
        external.PING,
        external.ResyncTick,
        "consumed",
        "PingSource, filer-source",
        "Periodic resync tick",
        "-",
    ),
    EventType(
        external.AWS_SQS,
        external.PingData,
        "consumed",
        "IntegrationSource (aws.sqs)",
        "SeaweedFS aws_sqs notification: protobuf EventNotification bytes",
        "-",
    ),
)

BY_TYPE = {entry.type: entry for entry in CATALOG}


def sample(entry: EventType) -> dict[str, object]:
    """The committed sample CloudEvent (structured mode) of a catalog entry."""
    loaded: dict[str, object] = json.loads((SAMPLES / f"{entry.slug}.json").read_text())
    return loaded


def write_schemas() -> None:
    SCHEMAS.mkdir(exist_ok=True)
    for entry in CATALOG:
        text = json.dumps(entry.schema(), indent=2, sort_keys=True) + "\n"
        (SCHEMAS / f"{entry.slug}.json").write_text(text)


def markdown_table() -> str:
    """The catalog as the README shows it (a test keeps the README in step)."""
    lines = ["| type | direction | emitted by | subject | meaning |", "|---|---|---|---|---|"]
    for e in CATALOG:
        lines.append(f"| `{e.type}` | {e.direction} | {e.emitted_by} | {e.subject} | {e.summary} |")
    return "\n".join(lines)


if __name__ == "__main__":
    write_schemas()
    print(markdown_table())

"""ingest and the filer source send the same io.loraflow.file.changed.v1 for the same change:
the same mapping (functions.logic.file_events) and the same envelope (ingest's comes from
functions.edge.messages.reply, the source's from file_events.cloud_event, which does without the HTTP
shell); only `source`, `id` and `time` tell them apart."""

from __future__ import annotations

import pytest

from events.catalog import BY_TYPE, sample
from events.domain import FILE_CHANGED, FileChanged
from functions.edge.bootstrap import reset_deps
from functions.ingest import _event as ingest_event
from functions.logic.file_events import cloud_event, file_changed
from functions.logic.seaweed_event import FileChange

CHANGES = [
    FileChange("/loraadapters/ns/m/a/w.bin", "create", None, 7, "0cc175b9c0f1b6a831c399e269772661", False),
    FileChange("/loraadapters/ns/m/a/w.bin", "rename", "/loraadapters/ns/m/a/v.bin", 7, None, False),
    FileChange("/loraadapters/ns/m/a/w.bin", "delete", None, None, None, False),
]


@pytest.fixture(autouse=True)
def fresh_deps() -> None:
    reset_deps()  # reply reads the schema base from the environment's settings


@pytest.mark.parametrize("change", CHANGES, ids=lambda c: c.event_type)
def test_both_senders_send_the_same_event(change: FileChange) -> None:
    payload = file_changed(change)
    assert payload is not None
    webhook = ingest_event(payload)
    source = cloud_event(
        payload, "filer-source", event_id="5-1796122145707821593", time="2026-12-01T10:49:05Z"
    )
    differ = {"source", "id", "time"}
    same = lambda e: {k: v for k, v in e.get_attributes().items() if k not in differ}  # noqa: E731
    assert same(source) == same(webhook)
    assert source.get_data() == webhook.get_data()
    assert (webhook["source"], source["source"]) == ("/loraflow/ingest", "/loraflow/filer-source")
    assert source["id"] == "5-1796122145707821593" and source["dataschema"].endswith(
        "io_loraflow_file_changed_v1.json"
    )


def test_the_sample_is_what_a_sender_writes() -> None:
    shipped = sample(BY_TYPE[FILE_CHANGED])
    payload = FileChanged.model_validate(shipped["data"])
    event = cloud_event(payload, "ingest")
    assert event.get_data() == shipped["data"] and event["subject"] == shipped["subject"]

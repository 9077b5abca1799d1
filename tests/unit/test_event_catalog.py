"""The event catalog is the public contract: schemas and samples are committed and agree.

For every entry of events.catalog.CATALOG:
- events/schemas/<slug>.json equals the schema generated from the payload model;
- events/samples/<slug>.json is a structured-mode CloudEvent (what `curl -d @sample` to a
  Broker would send) whose data validates against the committed JSON Schema and the model;
- our types are reverse-DNS and versioned; Knative's keep Knative's names;
- an emitted sample's `dataschema`, and every schema's `$id`, is the URI the schema is published
  at (events.schema_urls), which the Knative EventTypes name too (tests/manifests).

Documented sample forms:
- ApiServerSource samples carry the extensions `kind`, `apiversion`, `name`, `namespace` and a
  subject `/apis/<apiVersion>/namespaces/<ns>/<plural>/<name>`, as the adapter sends them.
- PingSource and the aws-sqs IntegrationSource set no subject.
- aws-sqs: the SQS body is protobuf bytes (SeaweedFS sends `string(proto bytes)`), so the sample
  carries `data_base64`; it must decode as a filer EventNotification with our own decoder.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import jsonschema
import pytest

from events import catalog, external
from events.catalog import CATALOG, SAMPLES, SCHEMAS, EventType
from events.schema_urls import schema_url
from functions.logic import seaweed_event

REQUIRED = ("specversion", "id", "source", "type", "time", "datacontenttype")
NO_SUBJECT = {external.PING, external.AWS_SQS}
APISERVER_EXTENSIONS = ("kind", "apiversion", "name", "namespace")
OURS = re.compile(r"^io\.loraflow(\.[a-z][a-z0-9]*)+\.v[1-9][0-9]*$")
EXTENSION_NAME = re.compile(r"^[a-z0-9]{1,20}$")
CONTEXT = {*REQUIRED, "subject", "data", "data_base64", "dataschema"}

IDS = [entry.slug for entry in CATALOG]


def load_sample(entry: EventType) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((SAMPLES / f"{entry.slug}.json").read_text())
    return loaded


@pytest.mark.parametrize("entry", CATALOG, ids=IDS)
def test_committed_schema_is_generated_one(entry: EventType) -> None:
    committed = json.loads((SCHEMAS / f"{entry.slug}.json").read_text())
    assert committed == json.loads(json.dumps(entry.schema()))


def test_no_stray_files() -> None:
    """A schema or sample without a catalog entry is a contract nobody honours."""
    slugs = {f"{entry.slug}.json" for entry in CATALOG}
    assert {p.name for p in SCHEMAS.glob("*.json")} == slugs
    assert {p.name for p in SAMPLES.glob("*.json")} == slugs


@pytest.mark.parametrize("entry", CATALOG, ids=IDS)
def test_sample_is_structured_cloudevent(entry: EventType) -> None:
    sample = load_sample(entry)
    for attribute in REQUIRED:
        assert isinstance(sample.get(attribute), str) and sample[attribute], attribute
    assert sample["specversion"] == "1.0"
    assert sample["type"] == entry.type
    assert ("subject" in sample) is (entry.type not in NO_SUBJECT)
    assert ("data" in sample) != ("data_base64" in sample)
    for name in set(sample) - CONTEXT:
        assert EXTENSION_NAME.match(name), f"bad extension attribute name {name!r}"
    assert sample == catalog.sample(entry)


@pytest.mark.parametrize("entry", [e for e in CATALOG if e.type != external.AWS_SQS], ids=lambda e: e.slug)
def test_sample_data_validates(entry: EventType) -> None:
    sample = load_sample(entry)
    assert sample["datacontenttype"] == "application/json"
    schema = json.loads((SCHEMAS / f"{entry.slug}.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(sample["data"])
    entry.payload.model_validate(sample["data"])


@pytest.mark.parametrize("entry", [e for e in CATALOG if e.type in external.API_TYPES], ids=lambda e: e.slug)
def test_apiserver_sample_has_knative_extensions(entry: EventType) -> None:
    sample = load_sample(entry)
    data = sample["data"]
    assert [sample[k] for k in APISERVER_EXTENSIONS] == [
        data["kind"],
        data["apiVersion"],
        data["metadata"]["name"],
        data["metadata"]["namespace"],
    ]
    plural = sample["subject"].rsplit("/", 2)[-2]
    assert sample["subject"] == (
        f"/apis/{data['apiVersion']}/namespaces/{data['metadata']['namespace']}"
        f"/{plural}/{data['metadata']['name']}"
    )


def test_sqs_sample_decodes_as_filer_notification() -> None:
    sample = load_sample(catalog.BY_TYPE[external.AWS_SQS])
    raw = base64.b64decode(sample["data_base64"], validate=True)
    notification = seaweed_event.decode_sqs_body(raw)
    assert notification.new_entry is not None
    assert notification.new_parent_path.startswith("/loraadapters/")


@pytest.mark.parametrize("entry", CATALOG, ids=IDS)
def test_dataschema_is_where_the_schema_is_published(entry: EventType) -> None:
    committed = json.loads((SCHEMAS / f"{entry.slug}.json").read_text())
    assert committed["$id"] == schema_url(entry.type)
    if entry.direction == "emitted":  # the consumed ones are other producers' events
        assert load_sample(entry)["dataschema"] == schema_url(entry.type)


@pytest.mark.parametrize("entry", CATALOG, ids=IDS)
def test_type_names(entry: EventType) -> None:
    if entry.direction == "emitted":
        assert OURS.match(entry.type), entry.type
        # every sender named is one of ours, and the sample comes from one of them
        senders = {f"/loraflow/{sender}" for sender in entry.emitted_by.split(", ")}
        assert load_sample(entry)["source"] in senders
    else:
        assert entry.type.startswith("dev.knative."), entry.type


def test_sample_validation_can_fail() -> None:
    """The data check is real: a sample with a wrong field is rejected by schema and model."""
    entry = catalog.BY_TYPE["io.loraflow.adapter.ready.v1"]
    data = {**load_sample(entry)["data"], "unexpected": 1}
    schema = json.loads((SCHEMAS / f"{entry.slug}.json").read_text())
    assert list(jsonschema.Draft202012Validator(schema).iter_errors(data))
    with pytest.raises(ValueError, match="unexpected"):
        entry.payload.model_validate(data)

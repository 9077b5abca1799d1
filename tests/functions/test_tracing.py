"""Trace context and `dataschema` over real HTTP: a step's reply and every event it publishes
carry the incoming trace; the `dataschema` of an emitted event resolves, at the URL it names,
to a JSON Schema its data validates against."""

from __future__ import annotations

import secrets

import httpx
import jsonschema
from cloudevents.conversion import to_binary
from cloudevents.http import CloudEvent, from_http

from events.domain import ADAPTER_ADMITTED, ADAPTER_DRIFTED, FILE_CHANGED
from events.external import AWS_SQS, PING
from events.schema_urls import schema_file
from functions.resources.kinds import MODEL, VLLM_ADAPTER
from tests.support import filer_pb
from tests.support.testbed import Testbed

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TRACE = {"traceparent": TRACEPARENT, "tracestate": "rojo=00f067aa0ba902b7"}


def sqs_body(parent: str, name: str) -> bytes:
    """What the filer puts in an aws_sqs body (its protobuf EventNotification)."""
    return filer_pb.notification(new=filer_pb.entry(name, size=3, md5_hex="0" * 32), new_parent_path=parent)


def webhook_body(parent: str, name: str) -> dict[str, object]:
    """The filer's webhook JSON for a created file (Go encoding/json of the Entry, omitempty)."""
    entry = {"name": name, "attributes": {"file_size": 3, "mtime": 1796109979, "file_mode": 432}}
    message = {"new_entry": entry, "new_parent_path": parent, "delete_chunks": True}
    return {"event_type": "create", "key": f"{parent}/{name}", "message": message}


def post(world: Testbed, function: str, event: CloudEvent) -> httpx.Response:
    headers, body = to_binary(event)
    return world.http.post(world.host.urls[function], headers={**headers, **TRACE}, content=body)


def test_reply_carries_the_trace_and_a_dataschema_that_resolves(world: Testbed) -> None:
    base = world.host.urls["verify"].rstrip("/") + "/schemas/"
    directory = f"/loraadapters/ns-{secrets.token_hex(3)}/llama/a"
    event = CloudEvent(
        {"type": AWS_SQS, "source": "aws.sqs.test", "id": secrets.token_hex(8)},
        sqs_body(directory, "w.safetensors"),
    )
    with world.settings(LORAFLOW_SCHEMA_BASE_URL=base):
        response = post(world, "ingest", event)
    assert response.status_code == 200, response.text
    reply = from_http(dict(response.headers), response.content)
    assert reply["traceparent"] == TRACE["traceparent"] and reply["tracestate"] == TRACE["tracestate"]

    assert reply["dataschema"] == base + schema_file(FILE_CHANGED)
    fetched = world.http.get(reply["dataschema"])
    assert fetched.status_code == 200 and fetched.headers["content-type"] == "application/schema+json"
    jsonschema.Draft202012Validator(fetched.json()).validate(reply.get_data())


def test_only_catalog_schemas_are_served(world: Testbed) -> None:
    url = world.host.urls["stat"].rstrip("/")
    assert world.http.get(f"{url}/schemas/no_such_type_v1.json").status_code == 404
    for escape in ("..%2Fcatalog.py", "..%2F..%2Ffunctions%2Fsettings.py", "../catalog.py"):
        answer = world.http.get(f"{url}/schemas/{escape}")
        assert b"import" not in answer.content, escape  # the health answer at most, never a file


def test_a_published_webhook_event_carries_the_callers_trace(world: Testbed) -> None:
    path = f"/loraadapters/ns-{secrets.token_hex(3)}/llama/a/w.safetensors"
    directory, name = path.rsplit("/", 1)
    body = webhook_body(directory, name)
    response = world.http.post(world.host.urls["ingest"], json=body, headers={**TRACE, **world.webhook_auth})
    assert response.status_code == 204, response.text
    (event,) = world.sink.wait_for(FILE_CHANGED, 1) and [
        e for e in world.sink.of_type(FILE_CHANGED) if e["subject"] == path
    ]
    assert event["traceparent"] == TRACE["traceparent"]


def test_every_resync_nudge_carries_the_ticks_trace(world: Testbed) -> None:
    ns = world.namespace()
    for name in ("never-a", "never-b"):  # no finalizer, no status: both nudged to admit
        world.create(VLLM_ADAPTER, ns, {"metadata": {"name": name}, "spec": {"model": "m1"}})
    world.sink.clear()
    response = post(world, "resync", world.event(PING, {"resync": True}))
    assert response.status_code == 204, response.text
    nudges = [e for e in world.sink.of_type(ADAPTER_DRIFTED) if e.get_data()["adapter"]["namespace"] == ns]
    assert len(nudges) == 2
    assert {(e["traceparent"], e["tracestate"]) for e in nudges} == {tuple(TRACE.values())}


def test_admits_re_admissions_carry_the_model_events_trace(world: Testbed) -> None:
    ns = world.namespace()
    for name in ("wait-a", "wait-b"):  # their Model is missing: ModelNotFound, waiting for it
        created = world.create(VLLM_ADAPTER, ns, {"metadata": {"name": name}, "spec": {"model": "llama"}})
        assert world.post("admit", world.apiserver_event("add", created)).status_code == 200
    world.sink.clear()
    model = world.create(MODEL, ns, {"metadata": {"name": "llama"}, "spec": {}})
    assert post(world, "admit", world.apiserver_event("add", model)).status_code == 204
    admitted = [e for e in world.sink.of_type(ADAPTER_ADMITTED) if e.get_data()["adapter"]["namespace"] == ns]
    assert sorted(e.get_data()["adapter"]["name"] for e in admitted) == ["wait-a", "wait-b"]
    assert {e["traceparent"] for e in admitted} == {TRACE["traceparent"]}

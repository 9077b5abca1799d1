"""The dead-letter sink: every dead-lettered event of the catalog is answered 204, logged once
with what Knative says of its failure (decoded, bounded), and counted by type and status; a type
outside the catalog is refused, never a new counter label."""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import flask
import pytest
from cloudevents.conversion import to_binary
from cloudevents.http import CloudEvent
from prometheus_client.parser import text_string_to_metric_families

from functions.dead_letters import dead_letters, error_data, status_code
from functions.observability import REGISTRY

READY = "io.loraflow.adapter.ready.v1"


def post(event: CloudEvent) -> flask.Response:
    headers, body = to_binary(event)
    with flask.Flask("t").test_request_context("/", method="POST", headers=headers, data=body):
        response: flask.Response = dead_letters(flask.request)
    return response


def counted(type_: str, code: str) -> float:
    for family in text_string_to_metric_families(REGISTRY.exposition().decode()):
        for sample in family.samples:
            if sample.name == "loraflow_dead_letters_total" and sample.labels == {
                "type": type_,
                "code": code,
            }:
                return float(sample.value)
    return 0.0


def dead(type_: str = READY, **extensions: str) -> CloudEvent:
    attributes = {"type": type_, "source": "/loraflow/verify", "id": "dl-1", **extensions}
    return CloudEvent(attributes, {"adapter": {"namespace": "a", "name": "b"}})


def test_a_dead_letter_is_answered_logged_and_counted(lines: io.StringIO) -> None:
    before = counted(READY, "503")
    answer = base64.b64encode(b"filer unavailable\n").decode()
    event = dead(
        knativeerrorcode="503",
        knativeerrordest="http://loraflow-load.loraflow.svc.cluster.local",
        knativeerrordata=answer,
        traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    )
    assert post(event).status_code == 204
    assert counted(READY, "503") == before + 1
    logged = [json.loads(line) for line in lines.getvalue().splitlines()]
    (line,) = [r for r in logged if r["msg"] == "Dead letter"]
    assert line["level"] == "warning" and line["ce_type"] == READY
    assert line["error_dest"] == "http://loraflow-load.loraflow.svc.cluster.local"
    assert line["error_code"] == "503" and line["error_data"] == "filer unavailable\n"
    assert line["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"


def test_a_type_outside_the_catalog_is_refused_without_a_label() -> None:
    assert post(dead("com.example.flood.v1", knativeerrorcode="400")).status_code == 400
    assert counted("com.example.flood.v1", "400") == 0.0


@pytest.mark.parametrize(
    ("value", "expected"),
    [("503", "503"), ("5031", "unknown"), ("abc", "unknown"), (None, "unknown"), (404, "404")],
)
def test_status_codes_are_three_digits_or_unknown(value: Any, expected: str) -> None:
    assert status_code(value) == expected


def test_error_data_is_decoded_and_bounded() -> None:
    assert error_data(base64.b64encode("ünï\xff".encode("latin-1")).decode()) == "\ufffdn\ufffd\ufffd"
    assert len(error_data(base64.b64encode(b"x" * 10_000).decode())) == 1024
    assert error_data(None) == ""
    assert error_data("%%%not base64") == "%%%not base64"  # not base64: shown as it came

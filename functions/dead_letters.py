"""dead_letters: the Broker's and every Trigger's dead-letter sink (Service loraflow-dead-letters).

Knative delivers here what it gave up on (a 4xx answer, or 5xx after the last retry) with the
extensions `knativeerrordest` (the subscriber), `knativeerrorcode` (its last HTTP status) and
`knativeerrordata` (base64 of its answer, at most 1024 characters). Each one is logged as one
Warning line carrying those and the event's own trace, and counted in
`loraflow_dead_letters_total{type, code}`, which the monitoring component alerts on.

Outcome: 204 for every event of the catalog, so nothing dead-lettered loops back; any other type
is refused (400), and its line logged all the same: no Trigger of ours routes such a type, and a
counter label per hostile type name would grow without bound.
"""

from __future__ import annotations

import base64
import binascii
import logging

from cloudevents.http import CloudEvent

from events.catalog import BY_TYPE
from functions.edge import shell
from functions.edge.bootstrap import Deps
from functions.observability import DEAD_LETTERS

log = logging.getLogger("loraflow.dead_letters")

NAME = "dead_letters"
ACCEPTS = tuple(BY_TYPE)
ERROR_DATA_MAX = 1024


def error_data(value: object) -> str:
    """The subscriber's answer, decoded as far as it is text, bounded."""
    if not isinstance(value, str):
        return ""
    try:
        raw = base64.b64decode(value[: ERROR_DATA_MAX * 2], validate=False)
    except (binascii.Error, ValueError):
        return value[:ERROR_DATA_MAX]
    return raw.decode("utf-8", errors="replace")[:ERROR_DATA_MAX]


def status_code(value: object) -> str:
    text = str(value) if value is not None else ""
    return text if text.isdigit() and len(text) == 3 else "unknown"


def handle(event: CloudEvent, deps: Deps) -> None:
    del deps
    code = status_code(event.get("knativeerrorcode"))
    DEAD_LETTERS.labels(event["type"], code).inc()
    log.warning(
        "Dead letter",
        extra={
            "ce_id": event["id"],
            "ce_type": event["type"],
            "ce_source": event["source"],
            "ce_subject": event.get("subject"),
            "error_dest": str(event.get("knativeerrordest") or "")[:512],
            "error_code": code,
            "error_data": error_data(event.get("knativeerrordata")),
        },
    )


dead_letters = shell.function(NAME, ACCEPTS, handle)

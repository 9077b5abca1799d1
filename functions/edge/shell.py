"""The thin shell around every step: CloudEvent in, outcome out, in exactly one place.

| outcome                        | HTTP                                   |
|--------------------------------|----------------------------------------|
| done, nothing to say           | 204, empty body                        |
| done, next step to run         | 200 + reply CloudEvent (binary mode)   |
| Reject (never processable)     | 400 + a message naming the problem     |
| BodyTooLarge (a Reject)        | 413 before the body is read, closed    |
| Unauthorized (webhook token)   | 401                                    |
| Retryable (dependency, race)   | 503 (the Broker redelivers)            |
| Refused (RBAC, validation)     | 204, logged once as a warning          |
| anything else (a bug)          | 500                                    |

An empty body or a real CloudEvent is all a Knative broker accepts from a subscriber (a
non-CloudEvent body is a failed delivery), so nothing else is ever answered with 2xx.
`GET /healthz` and `GET /metrics` are answered here too (probes and Prometheus).
"""

from __future__ import annotations

import contextvars
import logging
import re
import time
from collections.abc import Callable, Collection
from typing import Any

import flask
import functions_framework
from cloudevents.http import CloudEvent

from events import binary_mode
from functions import observability
from functions.adapters import concurrency
from functions.edge.bootstrap import Deps, deps
from functions.edge.messages import Reply, parse
from functions.errors import BodyTooLarge, Refused, Reject, Retryable, Unauthorized
from functions.metrics import CONTENT_TYPE
from functions.observability import EVENTS, REGISTRY, STEP_SECONDS

log = logging.getLogger("loraflow.edge")

Handler = Callable[[CloudEvent, Deps], Reply]
WebhookHandler = Callable[[flask.Request, Deps], Reply]


def function(
    name: str,
    accepts: Collection[str],
    handle: Handler,
    webhook: WebhookHandler | None = None,
) -> Callable[[flask.Request], flask.Response]:
    """Turn `handle(event, deps)` into a functions-framework `http` function named `name`."""

    def view(request: flask.Request) -> flask.Response:
        if request.method == "GET":
            return _probe(request)
        # The trace and adapter context of this event, set in a copy: gone with the request.
        return contextvars.copy_context().run(serve, request)

    def serve(request: flask.Request) -> flask.Response:
        started = time.perf_counter()
        event: CloudEvent | None = None
        refusal = ""
        observability.enter(request.headers)
        try:
            if webhook is not None and not _looks_like_cloudevent(request):
                with observability.step_span(name, None):
                    result = webhook(request, deps(name))
            else:
                event = parse(request)
                observability.enter(request.headers, event)
                if event["type"] not in accepts:
                    raise Reject(f"{name} does not handle events of type {event['type']!r}")
                observability.observe_age(name, event["type"], event.get("time"), time.time())
                with observability.step_span(name, event), concurrency.serving():
                    result = handle(event, deps(name))
            response, outcome = _answer(result)
        except Exception as err:  # every failure, a crash included, has its answer
            response, outcome, refusal = _failed(err, name, event)
        _report(name, event, response, outcome, refusal, time.perf_counter() - started)
        return response

    view.__name__ = name
    view.__qualname__ = name
    functions_framework.http(view)  # registers `name` as an http-signature target
    return view


def _failed(err: Exception, name: str, event: CloudEvent | None) -> tuple[flask.Response, str, str]:
    """The answer to a handler's failure, its outcome, and what to log of a refusal (the table
    in this module's docstring); called while `err` is being handled, so a crash logs its trace."""
    if isinstance(err, BodyTooLarge):
        # streamed, so functions-framework's after_request hook does not read the rest of the
        # body (it reads whole bodies "to avoid connection errors"), and the connection closes
        body = iter([str(err).encode() + b"\n"])
        response = flask.Response(body, 413, mimetype="text/plain", headers={"Connection": "close"})
        return response, "rejected", str(err)  # logged from here: reading `body` would buffer it
    if isinstance(err, Reject):
        code = 401 if isinstance(err, Unauthorized) else 400
        return flask.Response(str(err) + "\n", code, mimetype="text/plain"), "rejected", ""
    if isinstance(err, Retryable):
        return flask.Response(str(err) + "\n", 503, mimetype="text/plain"), "retry", ""
    if isinstance(err, Refused):
        # answered no on purpose (RBAC, validation, size): no retry changes it, no crash to
        # log. 204: a Knative broker takes any other 2xx body for a failed delivery.
        return flask.Response(status=204), "refused", str(err)
    log.exception("Handler crashed", extra=_context(name, event))
    return flask.Response("internal error\n", 500, mimetype="text/plain"), "error", ""


def _report(
    name: str,
    event: CloudEvent | None,
    response: flask.Response,
    outcome: str,
    refusal: str,
    elapsed: float,
) -> None:
    """The event's metrics and its one log line."""
    event_type = event["type"] if event is not None else "webhook"
    EVENTS.labels(name, event_type if outcome != "rejected" else "-", outcome).inc()
    STEP_SECONDS.labels(name).observe(elapsed)
    level = logging.WARNING if outcome in ("rejected", "retry", "error", "refused") else logging.INFO
    detail = refusal or (response.get_data(as_text=True).strip() if response.status_code >= 400 else "")
    log.log(
        level,
        "Handled event",
        extra={
            **_context(name, event),
            "outcome": outcome,
            "status": response.status_code,
            "detail": detail,
            "duration_ms": round(elapsed * 1000, 2),
        },
    )


def _looks_like_cloudevent(request: flask.Request) -> bool:
    return "ce-specversion" in request.headers or (request.mimetype or "").startswith(
        "application/cloudevents"
    )


def _answer(result: Reply) -> tuple[flask.Response, str]:
    if result is None:
        return flask.Response(status=204), "done"
    headers, body = binary_mode.write(result)
    return flask.Response(body, 200, headers=headers), "replied"


_SCHEMA_PATH = re.compile(r"/schemas/([a-z0-9_]{1,200}\.json)")


def _probe(request: flask.Request) -> flask.Response:
    if request.path.rstrip("/") == "/metrics":
        return flask.Response(REGISTRY.exposition(), 200, content_type=CONTENT_TYPE)
    schema = _SCHEMA_PATH.fullmatch(request.path)
    if schema is not None:
        return _schema(schema.group(1))
    return flask.Response("ok\n", 200, mimetype="text/plain")


def _schema(name: str) -> flask.Response:
    """A committed JSON Schema of events/schemas (the name is checked: no path leaves it)."""
    from events.catalog import SCHEMAS

    try:
        text = (SCHEMAS / name).read_bytes()
    except OSError:
        return flask.Response("no such schema\n", 404, mimetype="text/plain")
    return flask.Response(text, 200, content_type="application/schema+json")


def _context(function_name: str, event: CloudEvent | None) -> dict[str, Any]:
    context: dict[str, Any] = {"function": function_name}
    if event is not None:
        context.update(
            ce_id=event.get("id"),
            ce_type=event.get("type"),
            ce_subject=event.get("subject"),
            traceparent=event.get("traceparent"),
        )
    return context

"""A platform team's own step: a Trigger applied with kubectl, its subscriber a local URL.

The embedded broker routes by the Trigger objects in the real API server (list+watch, as
Knative's broker filter does), so the Trigger routes from the moment it is applied: the
subscriber gets `io.loraflow.adapter.ready.v1` by its filter, with the retries and the dead
letter its `spec.delivery` asks for, and nothing once the Trigger is deleted.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from cloudevents.http import CloudEvent, from_http

from devstack.stack import Stack
from functions.resources.kinds import VLLM_ADAPTER
from tests.support.builders import upload_vllm_adapter
from tests.support.cluster import Cluster, serving_a1
from tests.support.wait import eventually

READY = "io.loraflow.adapter.ready.v1"


class Receiver:
    """A subscriber on 127.0.0.1 answering `statuses` in turn, then `default`."""

    def __init__(self, statuses: list[int] | None = None, default: int = 200) -> None:
        self.events: list[CloudEvent] = []
        self.statuses = list(statuses or [])
        self.default = default
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                event = from_http(dict(self.headers.items()), body)
                with receiver._lock:
                    receiver.events.append(event)
                    status = receiver.statuses.pop(0) if receiver.statuses else receiver.default
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/"

    def received(self) -> list[CloudEvent]:
        with self._lock:
            return list(self.events)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def receivers() -> Iterator[list[Receiver]]:
    made: list[Receiver] = []
    yield made
    for receiver in made:
        receiver.stop()


def kubectl(stack: Stack, *args: str, manifest: dict[str, Any] | None = None) -> str:
    """The real kubectl, as a platform team runs it (a manifest goes in on stdin)."""
    stdin = json.dumps(manifest) if manifest is not None else None
    return stack.control_plane.kubectl_run(*args, stdin=stdin).stdout


def trigger(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "eventing.knative.dev/v1",
        "kind": "Trigger",
        "metadata": {"name": name, "namespace": "loraflow"},
        "spec": {"broker": "loraflow", **spec},
    }


def trigger_rows(stack: Stack, *names: str) -> list[tuple[str, str]]:
    """(status.subscriberUri, Ready) of each Trigger, as `kubectl get -o json` shows them."""
    found = json.loads(kubectl(stack, "get", "triggers", "-n", "loraflow", *names, "-o", "json"))
    rows = []
    for item in found["items"]:
        status = item.get("status") or {}
        ready = [c["status"] for c in status.get("conditions") or [] if c["type"] == "Ready"]
        rows.append((str(status.get("subscriberUri")), ready[0] if ready else ""))
    return rows


def adapter_subject(namespace: str, name: str = "") -> str:
    return VLLM_ADAPTER.path(namespace, name) if name else VLLM_ADAPTER.path(namespace, "x")[:-1]


def ready(cluster: Cluster, name: str) -> bool:
    return ((cluster.get(VLLM_ADAPTER, name) or {}).get("status") or {}).get("phase") in ("Ready", "Loaded")


def test_applied_trigger_routes_ready_events_with_retries_and_dead_letter(
    stack: Stack, receivers: list[Receiver]
) -> None:
    cluster = serving_a1(stack, "composed")
    ns = cluster.namespace
    flaky = Receiver(statuses=[500, 500])  # fails twice, then takes the event
    broken = Receiver(default=500)  # never takes it
    dead = Receiver(default=202)
    receivers += [flaky, broken, dead]
    # `filters` (SubscriptionsAPI): ready events of this namespace's adapters only
    kubectl(
        stack,
        "apply",
        "-f",
        "-",
        manifest=trigger(
            "team-ready",
            {
                "filters": [{"exact": {"type": READY}}, {"prefix": {"subject": adapter_subject(ns)}}],
                "subscriber": {"uri": flaky.url},
                "delivery": {"retry": 3, "backoffPolicy": "linear", "backoffDelay": "PT0.5S"},
            },
        ),
    )
    # the legacy `filter.attributes`: exact attributes, here the ready events of a1 only
    kubectl(
        stack,
        "apply",
        "-f",
        "-",
        manifest=trigger(
            "team-broken",
            {
                "filter": {"attributes": {"type": READY, "subject": adapter_subject(ns, "a1")}},
                "subscriber": {"uri": broken.url},
                "delivery": {"retry": 2, "backoffDelay": "PT0.2S", "deadLetterSink": {"uri": dead.url}},
            },
        ),
    )
    # the broker resolved both: `kubectl get` shows what Knative's trigger reconciler writes
    eventually(
        lambda: (
            trigger_rows(stack, "team-ready", "team-broken") == [(flaky.url, "True"), (broken.url, "True")]
        ),
        what="both Triggers Ready with their subscriber URIs",
    )

    upload_vllm_adapter(cluster, "a1")
    eventually(lambda: ready(cluster, "a1"), 30, what="a1 Ready")

    # retries: the same event three times, the third answered 200, and nothing but ready events
    got = eventually(
        lambda: [e for e in flaky.received() if e["type"] == READY] if len(flaky.received()) >= 3 else []
    )
    assert {e["type"] for e in got} == {READY}
    assert len({e["id"] for e in got}) == 1 and len(got) == 3
    assert got[0]["subject"] == adapter_subject(ns, "a1")
    assert got[0].data["adapter"]["name"] == "a1"

    # a dead letter: one try and two retries answered 500, then the deadLetterSink uri gets it
    (letter,) = eventually(lambda: dead.received(), 30, what="a dead letter")
    assert len(broken.received()) == 3
    assert letter["type"] == READY and letter["id"] == broken.received()[0]["id"]
    assert letter["knativeerrordest"] == broken.url
    assert letter["knativeerrorcode"] == "500"

    # deleting the Trigger stops delivery: a2's ready event reaches the broker, not the team
    kubectl(stack, "delete", "trigger", "team-ready", "-n", "loraflow")
    eventually(lambda: "team-ready" not in {t.name for t in stack.broker.triggers}, what="route removed")
    before = len(flaky.received())
    upload_vllm_adapter(cluster, "a2")
    eventually(lambda: ready(cluster, "a2"), 30, what="a2 Ready")
    assert stack.settle(quiet=1.0)
    received = [
        e
        for e in stack.broker.log.since(0)
        if e["outcome"] == "received" and e["type"] == READY and e["subject"] == adapter_subject(ns, "a2")
    ]
    assert received and all("team-ready" not in e["triggers"] for e in received)
    assert len(flaky.received()) == before


def test_deleting_a_trigger_ends_its_pending_retries(stack: Stack, receivers: list[Receiver]) -> None:
    cluster = serving_a1(stack, "retries")
    refusing = Receiver(default=503)
    dead = Receiver(default=202)
    receivers += [refusing, dead]
    # slow retries that would end in the dead-letter sink, were the Trigger not deleted first
    kubectl(
        stack,
        "apply",
        "-f",
        "-",
        manifest=trigger(
            "team-slow",
            {
                "filters": [{"exact": {"type": READY, "subject": adapter_subject(cluster.namespace, "a1")}}],
                "subscriber": {"uri": refusing.url},
                "delivery": {"retry": 5, "backoffDelay": "PT2S", "deadLetterSink": {"uri": dead.url}},
            },
        ),
    )
    eventually(lambda: "team-slow" in {t.name for t in stack.broker.triggers}, what="route added")
    upload_vllm_adapter(cluster, "a1")
    eventually(lambda: refusing.received(), 30, what="a first attempt")
    kubectl(stack, "delete", "trigger", "team-slow", "-n", "loraflow")
    assert stack.settle(timeout=30, quiet=1.0)
    outcomes = [e["outcome"] for e in stack.broker.log.since(0) if e.get("trigger") == "team-slow"]
    assert "trigger-gone" in outcomes
    assert dead.received() == []
    assert len(refusing.received()) < 6

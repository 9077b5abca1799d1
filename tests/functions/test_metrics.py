"""Every function's `GET /metrics` moves with a lifecycle: events by type/outcome, step latency,
Kubernetes requests. Functions share one process here, so the test compares before/after."""

from __future__ import annotations

from collections.abc import Mapping

from cloudevents.http import CloudEvent
from prometheus_client.parser import text_string_to_metric_families

from events.domain import (
    ADAPTER_ADMITTED,
    ADAPTER_FAILED,
    ADAPTER_READY,
    ADAPTER_STAT_COMPLETED,
    FILE_CHANGED,
)
from events.external import API_ADD
from tests.support.builders import CONFIG, WEIGHTS, Flow, setup_adapter
from tests.support.testbed import Testbed

Sample = tuple[str, tuple[tuple[str, str], ...]]


def scrape(world: Testbed, function: str) -> dict[Sample, float]:
    response = world.http.get(world.host.urls[function] + "metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples: dict[Sample, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Mapping[Sample, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def delta(before: Mapping[Sample, float], after: Mapping[Sample, float], name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def kube_total(samples: Mapping[Sample, float], resource: str) -> float:
    return sum(
        v
        for (name, labels), v in samples.items()
        if name == "loraflow_kube_requests_total" and ("resource", resource) in labels
    )


def events(samples: Mapping[Sample, float], function: str, type_: str, outcome: str) -> float:
    return value(samples, "loraflow_events_total", function=function, type=type_, outcome=outcome)


def test_a_lifecycle_moves_the_counters(world: Testbed) -> None:
    before = scrape(world, "admit")
    flow = Flow(world)
    _, directory = setup_adapter(world, flow)  # admit (apiserver add) -> stat
    world.upload(directory + "adapter_config.json", CONFIG)
    world.upload(directory + "adapter_model.safetensors", WEIGHTS)
    change = world.event(FILE_CHANGED, {"path": directory + "adapter_config.json", "eventType": "create"})
    replies = flow.send("stat", change)
    assert [r["type"] for r in replies][-1] == ADAPTER_READY

    after = scrape(world, "verify")  # one registry per process: any function shows them all
    assert events(after, "admit", API_ADD, "replied") - events(before, "admit", API_ADD, "replied") == 1
    assert events(after, "stat", ADAPTER_ADMITTED, "replied") > events(
        before, "stat", ADAPTER_ADMITTED, "replied"
    )
    assert events(after, "stat", FILE_CHANGED, "replied") > events(before, "stat", FILE_CHANGED, "replied")
    assert events(after, "verify", ADAPTER_STAT_COMPLETED, "replied") > events(
        before, "verify", ADAPTER_STAT_COMPLETED, "replied"
    )
    for function in ("admit", "stat", "verify"):
        assert delta(before, after, "loraflow_step_duration_seconds_count", function=function) >= 1
        assert delta(before, after, "loraflow_step_duration_seconds_sum", function=function) > 0
    assert kube_total(after, "loraadapters") > kube_total(before, "loraadapters")
    assert kube_total(after, "models") > kube_total(before, "models")
    # every accepted event's age (its `time` attribute to its handling), by function and type
    for function, type_ in (("admit", API_ADD), ("stat", FILE_CHANGED), ("verify", ADAPTER_STAT_COMPLETED)):
        assert delta(before, after, "loraflow_event_age_seconds_count", function=function, type=type_) >= 1
    assert value(after, "process_resident_memory_bytes") > 0


def test_a_failing_verdict_counts_its_warning_event(world: Testbed) -> None:
    before = scrape(world, "verify")
    flow = Flow(world)
    _, directory = setup_adapter(world, flow)
    world.upload(directory + "adapter_config.json", b"{}")  # not the declared bytes: IntegrityCheckFailed
    world.upload(directory + "adapter_model.safetensors", WEIGHTS)
    change = world.event(FILE_CHANGED, {"path": directory + "adapter_config.json", "eventType": "create"})
    assert [r["type"] for r in flow.send("stat", change)][-1] == ADAPTER_FAILED
    after = scrape(world, "verify")
    assert (
        delta(
            before, after, "loraflow_warning_events_total", function="verify", reason="IntegrityCheckFailed"
        )
        == 1
    )


def test_rejected_and_ignored_events_are_counted_by_outcome(world: Testbed) -> None:
    before = scrape(world, "verify")
    not_an_event = world.http.post(
        world.host.urls["verify"], content=b"{}", headers={"content-type": "text/plain"}
    )
    assert not_an_event.status_code == 400
    foreign = CloudEvent({"type": "com.example.other", "source": "/tests", "id": "x1"}, {})
    assert world.post("verify", foreign).status_code == 400

    after = scrape(world, "verify")
    assert delta(before, after, "loraflow_events_total", function="verify", type="-", outcome="rejected") == 2
    assert delta(before, after, "loraflow_step_duration_seconds_count", function="verify") == 2


def test_every_function_serves_metrics(world: Testbed) -> None:
    families = (
        "loraflow_events_total counter",
        "loraflow_step_duration_seconds histogram",
        "loraflow_kube_requests_total counter",
        "loraflow_engine_request_duration_seconds histogram",
        "loraflow_event_age_seconds histogram",
        "loraflow_warning_events_total counter",
        "loraflow_dead_letters_total counter",
        "process_cpu_seconds_total counter",
    )
    for function, url in world.host.urls.items():
        response = world.http.get(url + "metrics")
        assert response.status_code == 200, function
        for family in families:
            assert f"# TYPE {family}" in response.text, (function, family)

"""functions.metrics against prometheus_client: the same operations give the same text (less
prometheus_client's optional `_created` series), which its own parser reads back."""

from __future__ import annotations

import threading

import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from functions import metrics

BUCKETS = (0.001, 0.5, 1, 10)
LABELS = [("plain", "x"), ('quo"te', "back\\slash"), ("new\nline", "ünï")]


def ours() -> tuple[metrics.Registry, metrics.Counter, metrics.Histogram, metrics.Counter]:
    registry = metrics.Registry()
    counter = metrics.Counter("calls_total", "Calls, by a and b\nwith a \\ in the help", ["a", "b"], registry)
    histogram = metrics.Histogram("call_seconds", "Call latency", ["a"], registry, buckets=BUCKETS)
    unused = metrics.Counter("unused_total", "Never incremented", ["z"], registry)
    return registry, counter, histogram, unused


def theirs() -> tuple[
    prometheus_client.CollectorRegistry, prometheus_client.Counter, prometheus_client.Histogram
]:
    registry = prometheus_client.CollectorRegistry()
    counter = prometheus_client.Counter(
        "calls_total", "Calls, by a and b\nwith a \\ in the help", ["a", "b"], registry=registry
    )
    histogram = prometheus_client.Histogram(
        "call_seconds", "Call latency", ["a"], registry=registry, buckets=BUCKETS
    )
    prometheus_client.Counter("unused_total", "Never incremented", ["z"], registry=registry)
    return registry, counter, histogram


def without_created(text: str) -> str:
    """prometheus_client's text less its `_created` families (HELP, TYPE and samples)."""
    return "".join(line + "\n" for line in text.splitlines() if "_created" not in line.split("{")[0])


def exercise(counter: object, histogram: object) -> None:
    for a, b in LABELS:
        counter.labels(a, b).inc()  # type: ignore[attr-defined]
    counter.labels("plain", "x").inc(2.5)  # type: ignore[attr-defined]
    for value in (0.0005, 0.5, 0.7, 10, 11, 3):  # 0.5 and 10 land in their own bucket: `le` is inclusive
        histogram.labels("plain").observe(value)  # type: ignore[attr-defined]
    histogram.labels('quo"te').observe(0.2)  # type: ignore[attr-defined]


def test_the_same_operations_give_prometheus_clients_text() -> None:
    registry, counter, histogram, _ = ours()
    reference, their_counter, their_histogram = theirs()
    exercise(counter, histogram)
    exercise(their_counter, their_histogram)
    text = registry.exposition().decode()
    assert text == without_created(prometheus_client.generate_latest(reference).decode())
    assert 'call_seconds_bucket{a="plain",le="0.5"} 2.0' in text.splitlines()


def test_prometheus_clients_parser_reads_it_back() -> None:
    registry, counter, histogram, _ = ours()
    exercise(counter, histogram)
    families = {f.name: f for f in text_string_to_metric_families(registry.exposition().decode())}
    assert {name: f.type for name, f in families.items()} == {
        "calls": "counter",
        "call_seconds": "histogram",
        "unused": "counter",
    }
    calls = {tuple(s.labels.values()): s.value for s in families["calls"].samples}
    assert calls == {("plain", "x"): 3.5, ('quo"te', "back\\slash"): 1.0, ("new\nline", "ünï"): 1.0}
    assert families["calls"].documentation == "Calls, by a and b\nwith a \\ in the help"
    plain = {
        (s.name, s.labels.get("le")): s.value
        for s in families["call_seconds"].samples
        if s.labels["a"] == "plain"
    }
    assert plain[("call_seconds_bucket", "1.0")] == 3
    assert plain[("call_seconds_bucket", "+Inf")] == plain[("call_seconds_count", None)] == 6
    assert plain[("call_seconds_sum", None)] == pytest.approx(25.2005)


def test_counts_are_exact_under_threads() -> None:
    registry, counter, histogram, _ = ours()

    def work() -> None:
        for _ in range(5000):
            counter.labels("plain", "x").inc()
            histogram.labels("plain").observe(0.2)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert counter.labels("plain", "x").value == 40000
    assert 'call_seconds_count{a="plain"} 40000.0' in registry.exposition().decode().splitlines()


def test_misuse_is_refused() -> None:
    registry, counter, _, _ = ours()
    with pytest.raises(ValueError, match="takes labels"):
        counter.labels("only-one")
    with pytest.raises(ValueError, match="only goes up"):
        counter.labels("a", "b").inc(-1)
    with pytest.raises(ValueError, match="registered already"):
        metrics.Counter("calls_total", "again", [], registry)


def test_values_are_spelled_as_the_text_format_wants() -> None:
    assert [metrics.number(v) for v in (1, 2.5, 1e-07, 1e21, float("inf"), float("-inf"))] == [
        "1.0",
        "2.5",
        "1e-07",
        "1e+21",
        "+Inf",
        "-Inf",
    ]
    assert metrics.number(float("nan")) == "NaN"


def test_process_metrics_are_prometheus_clients_names_types_and_values() -> None:
    """The process_* families of prometheus_client's ProcessCollector, read the same way."""
    registry = metrics.Registry()
    metrics.ProcessCollector(registry)
    theirs = prometheus_client.CollectorRegistry()
    prometheus_client.ProcessCollector(registry=theirs)
    mine = {f.name: f for f in text_string_to_metric_families(registry.exposition().decode())}
    reference = {
        f.name: f for f in text_string_to_metric_families(prometheus_client.generate_latest(theirs).decode())
    }
    assert {(n, f.type, f.documentation) for n, f in mine.items()} == {
        (n, f.type, f.documentation) for n, f in reference.items()
    }
    value = {f.samples[0].name: f.samples[0].value for f in mine.values()}
    expected = {f.samples[0].name: f.samples[0].value for f in reference.values()}
    assert value["process_start_time_seconds"] == pytest.approx(
        expected["process_start_time_seconds"], abs=0.02
    )
    assert value["process_max_fds"] == expected["process_max_fds"]
    assert value["process_cpu_seconds_total"] == pytest.approx(expected["process_cpu_seconds_total"], abs=0.5)
    assert value["process_resident_memory_bytes"] == pytest.approx(
        expected["process_resident_memory_bytes"], rel=0.2
    )
    assert abs(value["process_open_fds"] - expected["process_open_fds"]) <= 2


def test_without_proc_there_are_no_process_metrics(tmp_path: object) -> None:
    registry = metrics.Registry()
    metrics.ProcessCollector(registry, proc=str(tmp_path))
    assert registry.exposition() == b""


def test_event_age_is_observed_from_the_time_attribute() -> None:
    from functions.observability import EVENT_AGE_SECONDS, observe_age

    now = 1_796_110_010.0
    observe_age("agetest", "t.v1", "2026-12-01T07:26:45Z", now)  # 5 s old
    observe_age("agetest", "t.v1", "2026-12-01T07:27:50+00:00", now)  # a clock ahead: 0
    for unreadable in (None, "yesterday", 42, "x" * 100):
        observe_age("agetest", "t.v1", unreadable, now)
    text = "".join(EVENT_AGE_SECONDS.text())
    assert 'loraflow_event_age_seconds_count{function="agetest",type="t.v1"} 2.0' in text
    assert 'loraflow_event_age_seconds_sum{function="agetest",type="t.v1"} 5.0' in text

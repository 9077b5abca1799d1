"""Counters and histograms with labels, exposed in Prometheus' text format (0.0.4).

What the functions need from a metrics library is this small: thread-safe counters and
histograms by label, and their text at `GET /metrics`. prometheus_client did it, but its
exposition module pulls wsgiref, http.server, urllib and more into every cold start
(docs/benchmarks.md).
The text follows https://prometheus.io/docs/instrumenting/exposition_formats/ (0.0.4);
tests/unit/test_metrics.py holds it to prometheus_client's own parser and output. Omitted:
the optional `_created` series.
"""

from __future__ import annotations

import bisect
import math
import os
import resource
import threading
from collections.abc import Sequence
from typing import ClassVar, Generic, Protocol, TypeVar

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def number(value: float) -> str:
    """A sample value or bucket bound: the shortest repr that reads back exactly, which Go's
    ParseFloat (the Prometheus server's reader) accepts, and the format's +Inf, -Inf, NaN."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(float(value))


def _label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


class CounterValue:
    __slots__ = ("_lock", "_value")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        with self._lock:
            self._value += amount

    @property
    def value(self) -> float:
        return self._value

    def samples(self, name: str, labels: str) -> list[str]:
        return [f"{name}{labels} {number(self._value)}"]


class HistogramValue:
    __slots__ = ("_bounds", "_counts", "_lock", "_sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._lock = threading.Lock()
        self._bounds = bounds
        self._counts = [0] * len(bounds)
        self._sum = 0.0

    def observe(self, value: float) -> None:
        bucket = bisect.bisect_left(self._bounds, value)  # bounds are inclusive (`le`)
        with self._lock:
            self._counts[bucket] += 1
            self._sum += value

    def samples(self, name: str, labels: str) -> list[str]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        inner = labels[1:-1] + "," if labels else ""
        lines, cumulative = [], 0
        for bound, count in zip(self._bounds, counts, strict=True):
            cumulative += count
            lines.append(f'{name}_bucket{{{inner}le="{number(bound)}"}} {number(cumulative)}')
        lines.append(f"{name}_count{labels} {number(cumulative)}")
        lines.append(f"{name}_sum{labels} {number(total)}")
        return lines


V = TypeVar("V", CounterValue, HistogramValue)


class Family(Generic[V]):
    """One metric name, one value per combination of label values."""

    kind: ClassVar[str]

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], registry: Registry) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._lock = threading.Lock()
        self._values: dict[tuple[str, ...], V] = {}
        registry.register(self)

    def labels(self, *values: str) -> V:
        found = self._values.get(values)  # label values seen before: a dict read (atomic)
        if found is not None:
            return found
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
        key = tuple(str(v) for v in values)
        with self._lock:
            found = self._values.get(key)
            if found is None:
                found = self._values[key] = self._new()
        return found

    def _new(self) -> V:
        raise NotImplementedError

    def text(self) -> list[str]:
        lines = [f"# HELP {self.name} {_help(self.documentation)}", f"# TYPE {self.name} {self.kind}"]
        with self._lock:
            values = list(self._values.items())
        for key, value in values:
            pairs = ",".join(f'{n}="{_label_value(v)}"' for n, v in zip(self.labelnames, key, strict=True))
            lines += value.samples(self.name, f"{{{pairs}}}" if pairs else "")
        return lines


class Counter(Family[CounterValue]):
    kind = "counter"

    def _new(self) -> CounterValue:
        return CounterValue()


class Histogram(Family[HistogramValue]):
    kind = "histogram"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        registry: Registry,
        buckets: Sequence[float],
    ) -> None:
        self._bounds = (*sorted(float(b) for b in buckets if not math.isinf(b)), math.inf)
        super().__init__(name, documentation, labelnames, registry)

    def _new(self) -> HistogramValue:
        return HistogramValue(self._bounds)


class ProcessCollector:
    """The standard `process_*` metrics of the process serving them, under prometheus_client's
    names, types and units (its ProcessCollector, which dashboards and alerts expect): CPU
    seconds, resident and virtual memory, start time, open and maximum file descriptors.
    Read from /proc/self at scrape time, so a start pays nothing; without /proc, none."""

    name = "process"

    def __init__(self, registry: Registry, proc: str = "/proc") -> None:
        self._proc = proc
        self._ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._page = resource.getpagesize()
        self._boot: float | None = None
        registry.register(self)

    def _boot_time(self) -> float:
        if self._boot is None:
            with open(f"{self._proc}/stat", encoding="ascii") as stat:
                self._boot = next(float(line.split()[1]) for line in stat if line.startswith("btime"))
        return self._boot

    def text(self) -> list[str]:
        try:
            with open(f"{self._proc}/self/stat", encoding="ascii", errors="replace") as stat:
                # after the command name in parentheses (which may hold spaces): state is field 3
                fields = stat.read().rpartition(")")[2].split()
            open_fds = len(os.listdir(f"{self._proc}/self/fd"))
            boot = self._boot_time()
        except (OSError, StopIteration, ValueError):
            return []
        utime, stime = float(fields[11]), float(fields[12])
        start, vsize, rss = float(fields[19]), float(fields[20]), float(fields[21])
        samples = [
            ("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", vsize),
            ("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", rss * self._page),
            (
                "process_start_time_seconds",
                "gauge",
                "Start time of the process since unix epoch in seconds.",
                boot + start / self._ticks,
            ),
            (
                "process_cpu_seconds_total",
                "counter",
                "Total user and system CPU time spent in seconds.",
                (utime + stime) / self._ticks,
            ),
            ("process_open_fds", "gauge", "Number of open file descriptors.", float(open_fds)),
            (
                "process_max_fds",
                "gauge",
                "Maximum number of open file descriptors.",
                float(resource.getrlimit(resource.RLIMIT_NOFILE)[0]),
            ),
        ]
        lines: list[str] = []
        for name, kind, documentation, value in samples:
            lines += [f"# HELP {name} {documentation}", f"# TYPE {name} {kind}", f"{name} {number(value)}"]
        return lines


class Collector(Protocol):
    """What a Registry exposes: one name (unique) and its text lines."""

    name: str

    def text(self) -> list[str]: ...


class Registry:
    def __init__(self) -> None:
        self._families: list[Collector] = []

    def register(self, family: Collector) -> None:
        if any(f.name == family.name for f in self._families):
            raise ValueError(f"metric {family.name} is registered already")
        self._families.append(family)

    def exposition(self) -> bytes:
        """Every family's HELP, TYPE and samples, as GET /metrics answers them."""
        return "".join(line + "\n" for family in self._families for line in family.text()).encode()

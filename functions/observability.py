"""Prometheus metrics (`functions.metrics`) and JSON logs shared by every function.

Metric names follow Prometheus conventions (`loraflow_` prefix, `_total` counters,
`_seconds` histograms). Each function process exposes them at `GET /metrics`.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from functions.metrics import Counter, Histogram, Registry

REGISTRY = Registry()

EVENTS = Counter(
    "loraflow_events_total",
    "CloudEvents handled, by function, type and outcome",
    ["function", "type", "outcome"],
    registry=REGISTRY,
)
STEP_SECONDS = Histogram(
    "loraflow_step_duration_seconds",
    "Time to handle one event, by function",
    ["function"],
    registry=REGISTRY,
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
ENGINE_SECONDS = Histogram(
    "loraflow_engine_request_duration_seconds",
    "Engine load/unload/list latency",
    ["runtime", "operation"],
    registry=REGISTRY,
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
ENGINE_FAILURES = Counter(
    "loraflow_engine_failures_total",
    "Engine calls that failed, by runtime, operation and reason",
    ["runtime", "operation", "reason"],
    registry=REGISTRY,
)
KUBE_REQUESTS = Counter(
    "loraflow_kube_requests_total",
    "Kubernetes API requests, by verb and resource",
    ["verb", "resource"],
    registry=REGISTRY,
)
KUBE_CONFLICTS = Counter(
    "loraflow_kube_conflicts_total",
    "409 Conflict answers to our writes, by resource",
    ["resource"],
    registry=REGISTRY,
)

_SECRET_KEYS = ("token", "authorization", "password", "secret", "credential")


class JsonFormatter(logging.Formatter):
    """One JSON object per line; extra fields from `logger.info(..., extra={...})` included.

    Values under keys that look like credentials are replaced, so a token can never reach
    the logs by accident.
    """

    _STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
        "message",
        "asctime",
    }

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in self._STANDARD and not key.startswith("_"):
                entry[key] = "[redacted]" if any(s in key.lower() for s in _SECRET_KEYS) else value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(level: int = logging.INFO) -> None:
    root = logging.getLogger("loraflow")
    if any(isinstance(h.formatter, JsonFormatter) for h in root.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False

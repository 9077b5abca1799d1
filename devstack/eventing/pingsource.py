"""A PingSource stand-in: a timer that sends `dev.knative.sources.ping` to a sink.

Mirrors knative/eventing PingSource v1 (`pkg/adapter/mtping`): type `dev.knative.sources.ping`,
source `/apis/v1/namespaces/<ns>/pingsources/<name>`, data = `spec.data` with
`datacontenttype` = `spec.contentType` (or `spec.dataBase64` decoded), fired on the cron
`spec.schedule` (UTC, minute resolution; default `* * * * *`). The embedded stack may override
the schedule with a fixed period (a tick every few seconds instead of every minute).
"""

from __future__ import annotations

import base64
import threading
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from cloudevents.http import CloudEvent

from devstack.eventing.broker import BrokerClient

PING_TYPE = "dev.knative.sources.ping"
_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 6))


def _field(text: str, low: int, high: int) -> set[int]:
    """One cron field: `*`, `*/n`, `a`, `a-b`, `a-b/n`, comma lists."""
    values: set[int] = set()
    for part in text.split(","):
        span, _, step_text = part.partition("/")
        step = int(step_text) if step_text else 1
        if span == "*":
            start, end = low, high
        elif "-" in span:
            start, end = (int(x) for x in span.split("-", 1))
        else:
            start = end = int(span)
        values.update(range(start, end + 1, step))
    return values


def next_fire(schedule: str, after: datetime) -> datetime:
    """The first minute strictly after `after` matching the 5-field cron `schedule`."""
    fields = schedule.split()
    if len(fields) != 5:
        raise ValueError(f"unsupported schedule {schedule!r} (5 cron fields expected)")
    minute, hour, dom, month, dow = (_field(f, lo, hi) for f, (lo, hi) in zip(fields, _RANGES, strict=True))
    t = after.replace(second=0, microsecond=0) + timedelta(minutes=1)
    for _ in range(366 * 24 * 60):
        if (
            t.minute in minute
            and t.hour in hour
            and t.day in dom
            and t.month in month
            and (t.isoweekday() % 7) in dow
        ):
            return t
        t += timedelta(minutes=1)
    raise ValueError(f"schedule {schedule!r} never fires")


def ping_event(manifest: Mapping[str, Any]) -> CloudEvent:
    meta, spec = manifest["metadata"], manifest.get("spec") or {}
    attributes = {
        "type": PING_TYPE,
        "source": f"/apis/v1/namespaces/{meta.get('namespace', 'default')}/pingsources/{meta['name']}",
        "id": str(uuid.uuid4()),
        "time": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
    }
    data: bytes | None = None
    if spec.get("dataBase64"):
        data = base64.b64decode(spec["dataBase64"])
    elif spec.get("data") is not None:
        data = str(spec["data"]).encode()
    if data is not None:
        attributes["datacontenttype"] = str(spec.get("contentType") or "text/plain")
    return CloudEvent(attributes, data)


class PingSource:
    """Fires `manifest`'s ping to `sink` on its schedule, or every `period_s` when given."""

    def __init__(
        self, manifest: Mapping[str, Any], sink: BrokerClient, period_s: float | None = None
    ) -> None:
        self.manifest = manifest
        self.schedule = str((manifest.get("spec") or {}).get("schedule") or "* * * * *")
        next_fire(self.schedule, datetime.now(UTC))  # refuse a schedule we cannot honour, at start
        self.period_s = period_s
        self.sent = 0
        self._sink = sink
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pingsource", daemon=True)

    def start(self) -> PingSource:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def fire(self) -> bool:
        sent = self._sink.send(ping_event(self.manifest))
        self.sent += int(sent)
        return sent

    def _delay(self) -> float:
        if self.period_s is not None:
            return self.period_s
        now = datetime.now(UTC)
        return (next_fire(self.schedule, now) - now).total_seconds()

    def _run(self) -> None:
        while not self._stop.wait(self._delay()):
            self.fire()

"""`loraflow events`: tail the domain events that went through the embedded broker.

Contract (devstack/eventing/broker.py, `EventLog`): `GET <broker>/_devstack/events?since=N` answers a
JSON list of log entries with `seq > N`, oldest first. An entry is
`{seq, time, id, type, subject, outcome, ...}` where `outcome` is `received` (the event entered
the broker; `triggers` names the matching Triggers), `delivered`, `retrying`, `failed`,
`dead-lettered`, `dropped` or `ttl-exhausted` (with `trigger`, `subscriber`, `status`,
`attempts`, `duration_ms`, `error`). A `{"events": [...], "next": M}` object is accepted too.
By default one line per received event plus every delivery problem; `--deliveries` adds the
successful deliveries.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from rich.console import Console
from rich.text import Text

from loraflow.errors import CliError

Obj = dict[str, Any]
PATH = "/_devstack/events"
OURS = "io.loraflow."
RECEIVED, DELIVERED = "received", "delivered"
OUTCOME_STYLE = {RECEIVED: "bold cyan", DELIVERED: "green", "retrying": "yellow"}


@dataclass(frozen=True)
class Page:
    entries: list[Obj]
    next: int


def _cursor(value: Any) -> int | None:
    if isinstance(value, int):
        return value
    return int(value) if isinstance(value, str) and value.isdigit() else None


def parse_page(payload: Any, since: int) -> Page:
    """Entries and the next cursor (the highest `seq` seen; `since` is exclusive)."""
    if isinstance(payload, dict):
        raw = payload.get("events", payload.get("items")) or []
        explicit = _cursor(payload.get("next", payload.get("cursor")))
    elif isinstance(payload, list):
        raw, explicit = payload, None
    else:
        raise CliError(f"unexpected answer from {PATH}: {str(payload)[:120]}")
    entries = [item for item in raw if isinstance(item, dict)]
    seqs = [s for s in (_cursor(e.get("seq")) for e in entries) if s is not None]
    if explicit is not None:
        return Page(entries, explicit)
    return Page(entries, max([since, *seqs]) if seqs else since + len(entries))


def fetch(http: httpx.Client, broker: str, since: int) -> Page:
    url = broker.rstrip("/") + PATH
    try:
        response = http.get(url, params={"since": str(since)})
    except httpx.HTTPError as err:
        raise CliError(f"cannot reach the broker at {broker}: {err}") from err
    if response.status_code == 404:
        raise CliError(f"{url} not found: the broker does not expose the embedded stack's event log")
    if response.status_code >= 400:
        raise CliError(f"{url}: HTTP {response.status_code} {response.text.strip()[:200]}")
    try:
        return parse_page(response.json(), since)
    except ValueError as err:
        raise CliError(f"{url} did not answer JSON: {err}") from err


def _detail(entry: Obj) -> str:
    if entry.get("outcome") == RECEIVED:
        triggers = entry.get("triggers") or []
        return f"-> {', '.join(map(str, triggers))}" if triggers else "-> no trigger"
    parts = [str(entry.get("trigger") or "")]
    if entry.get("status") is not None:
        parts.append(f"HTTP {entry['status']}")
    if entry.get("attempts"):
        parts.append(f"attempt {entry['attempts']}")
    if entry.get("error"):
        parts.append(str(entry["error"])[:120])
    return " ".join(p for p in parts if p)


def line(entry: Obj) -> Text:
    """One log entry as one line: time, trace (its first 8 hex digits: what one adapter's chain of
    events shares), outcome, type, subject, detail."""
    outcome = str(entry.get("outcome") or "event")
    text = Text()
    text.append(str(entry.get("time") or "-"), style="dim")
    text.append(f"  {str(entry.get('trace_id') or '-')[:8]:<8}", style="cyan")
    text.append(f"  {outcome:<13}", style=OUTCOME_STYLE.get(outcome, "bold red"))
    text.append(f" {entry.get('type') or '?'}", style="bold")
    text.append(f"  {entry.get('subject') or '-'}")
    text.append(f"  {_detail(entry)}", style="dim")
    return text


def shown(entry: Obj, prefix: str, deliveries: bool) -> bool:
    if not str(entry.get("type") or "").startswith(prefix):
        return False
    return deliveries or entry.get("outcome") != DELIVERED


def _pause(seconds: float) -> None:
    """Between polls (a seam for tests)."""
    time.sleep(seconds)


def tail(
    broker: str,
    console: Console,
    prefix: str = OURS,
    follow: bool = False,
    deliveries: bool = False,
    interval: float = 1.0,
    sleep: Callable[[float], None] | None = None,
) -> int:
    """Print matching entries; with `follow`, keep polling until interrupted. Returns how many."""
    since, printed = 0, 0
    with httpx.Client(timeout=10.0) as http:
        while True:
            page = fetch(http, broker, since)
            for entry in page.entries:
                if shown(entry, prefix, deliveries):
                    console.print(line(entry), soft_wrap=True, highlight=False)
                    printed += 1
            since = page.next
            if not follow:
                return printed
            (sleep or _pause)(interval)

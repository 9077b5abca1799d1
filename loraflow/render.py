"""Rich tables for `loraflow status` (kubectl-like: upper-case headers, no borders)."""

from __future__ import annotations

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from loraflow.status import LOADED, NOT_LOADED, AdapterRow

HEADERS = (
    "NAME",
    "KIND",
    "PHASE/AVAILABLE",
    "READY/LOADED",
    "MODEL/TARGET",
    "SIZE",
    "USED-BY",
    "PODS",
    "AGE",
)
STATE_STYLE = {LOADED: "green", NOT_LOADED: "yellow"}


def _table(headers: tuple[str, ...], title: str | None = None) -> Table:
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, title=title, title_justify="left")
    for header in headers:
        table.add_column(header, no_wrap=True, overflow="fold")
    return table


def adapters_table(rows: list[AdapterRow], all_namespaces: bool) -> Table:
    headers = (("NAMESPACE",) if all_namespaces else ()) + HEADERS + ("REASON",)
    table = _table(headers)
    for row in rows:
        cells = [row.name, row.kind, row.phase, row.ready, row.target, row.size, row.used_by]
        cells += [row.loaded_count, row.age]
        prefix = [row.namespace] if all_namespaces else []
        table.add_row(*prefix, *cells, Text(row.reason or "-", overflow="fold"))
    table.columns[-1].no_wrap = False
    return table


def pods_table(rows: list[AdapterRow], all_namespaces: bool) -> Table:
    table = _table(
        ("ADAPTER", "KIND", "TARGET", "POD", "RUNTIME", "STATE"), title="Loaded in (engine /v1/models)"
    )
    for row in rows:
        adapter = f"{row.namespace}/{row.name}" if all_namespaces else row.name
        for pod in row.pods:
            state = Text(pod.state, style=STATE_STYLE.get(pod.state, "red"))
            table.add_row(adapter, row.kind, pod.target, pod.pod, pod.runtime, state)
    return table


def status_view(rows: list[AdapterRow], all_namespaces: bool) -> Group | Text:
    if not rows:
        return Text("No LoRAAdapters found.")
    parts: list[Table | Text] = [adapters_table(rows, all_namespaces)]
    if any(row.pods for row in rows):
        parts += [Text(""), pods_table(rows, all_namespaces)]
    return Group(*parts)

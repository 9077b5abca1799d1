"""How many adapters one engine replica holds, from what it reports or how it was started (pure).

SGLang reports its settings: `GET /server_info` (older releases: `/get_server_info`) answers
its ServerArgs, `max_loaded_loras` among them (null: no limit). What a replica cannot hold
leaves its `/v1/models` (evicted, or refused on older releases), so the serving planner never
asks it to hold more. vLLM reports nothing (its `/server_info` exists in dev mode only): its
capacity comes from the engine arguments (`--max-cpu-loras`, else `--max-loras`), and since it
lists every name and reads an evicted adapter again on its next request, capacity only says
whether an adapter stays resident or is reloaded on demand.

Arguments come from the pod's engine container (`args`, else `command`), else from the
target's `spec.engineArgs`, in that order; `--flag value` and `--flag=value` are the same, as
argparse reads them. A value that is not a sane count (0, negative, absurd, not an integer) is
a verdict on that pod, never a crash: the planner loads nothing there and says why.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple

from functions.logic import reasons

Runtime = Literal["vllm", "sglang"]
MAX_SLOTS = 65_536
"""More adapters than this in one replica is not a setting, it is garbage."""
INFO_MAX_BYTES = 1 << 20


class Capacity(NamedTuple):
    slots: int | None
    """Adapters the replica holds at most; None: no limit (or none known)."""
    evicts_listed: bool
    """sglang: what does not fit leaves the listing (plan within `slots`). vllm: it stays listed
    and is read again on demand (`slots` says resident or reloadable)."""
    source: str = ""
    """Where `slots` came from: `engine`, `pod args`, `spec.engineArgs` ('' when unknown)."""
    problem: tuple[str, str] | None = None
    """(reason, message) when the replica's capacity is garbage: nothing is loaded into it."""

    @property
    def evicts_when_full(self) -> bool:
        """A load into a full replica puts out another adapter (sglang with a known limit)."""
        return self.evicts_listed and self.slots is not None


def unbounded(runtime: Runtime) -> Capacity:
    return Capacity(None, runtime == "sglang")


def _count(value: object, what: str, source: str, runtime: Runtime) -> Capacity:
    evicts = runtime == "sglang"
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_SLOTS:
        return Capacity(value, evicts, source)
    shown = repr(value)[:60]
    message = f"{what} from {source} is {shown}: not a count of adapters between 1 and {MAX_SLOTS}"
    return Capacity(None, evicts, source, (reasons.ENGINE_CAPACITY_INVALID, message))


def flag_values(args: Sequence[object]) -> dict[str, str]:
    """`--flag value` / `--flag=value` pairs of an argument list (the last one wins)."""
    found: dict[str, str] = {}
    items = [str(a) for a in args]
    for i, item in enumerate(items):
        if not item.startswith("--"):
            continue
        flag, eq, inline = item.partition("=")
        if eq:
            found[flag] = inline
        elif i + 1 < len(items) and not items[i + 1].startswith("--"):
            found[flag] = items[i + 1]
    return found


FLAGS: dict[Runtime, tuple[str, ...]] = {
    "sglang": ("--max-loaded-loras",),
    "vllm": ("--max-cpu-loras", "--max-loras"),
}


def from_args(runtime: Runtime, args: Sequence[object] | None, source: str) -> Capacity | None:
    """The capacity engine arguments set; None when they do not set one."""
    if not args:
        return None
    values = flag_values(args)
    for flag in FLAGS[runtime]:
        if flag in values:
            raw = values[flag].strip()
            parsed: object = int(raw) if raw.lstrip("-").isdigit() else raw
            return _count(parsed, flag, source, runtime)
    return None


def from_server_info(body: bytes) -> Capacity | None:
    """SGLang's `/server_info` answer: its `max_loaded_loras` (null: no limit); None when the
    answer does not report it (another engine, an older release without the setting)."""
    try:
        info: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        message = "GET /server_info is not JSON"
        return Capacity(None, True, "engine", (reasons.ENGINE_CAPACITY_INVALID, message))
    if not isinstance(info, Mapping):
        message = "GET /server_info is not a JSON object"
        return Capacity(None, True, "engine", (reasons.ENGINE_CAPACITY_INVALID, message))
    if "max_loaded_loras" not in info:
        return None
    value = info["max_loaded_loras"]
    if value is None:
        return Capacity(None, True, "engine")
    return _count(value, "max_loaded_loras", "engine", "sglang")


def container_args(pod: Mapping[str, Any]) -> list[object]:
    """The engine container's `args` (else `command`): the one exposing the port named `http`."""
    spec = pod.get("spec")
    containers = spec.get("containers") if isinstance(spec, Mapping) else None
    for container in containers if isinstance(containers, list) else ():
        if not isinstance(container, Mapping):
            continue
        ports = container.get("ports")
        if any(isinstance(p, Mapping) and p.get("name") == "http" for p in ports or ()):
            args = container.get("args") or container.get("command")
            return list(args) if isinstance(args, list) else []
    return []


def of_pod(
    runtime: Runtime,
    reported: Capacity | None,
    pod_args: Sequence[object] | None,
    spec_args: Sequence[object] | None,
) -> Capacity:
    """What the engine reports, else its pod's arguments, else its target's spec, else no limit."""
    return (
        reported
        or from_args(runtime, pod_args, "pod args")
        or from_args(runtime, spec_args, "spec.engineArgs")
        or unbounded(runtime)
    )

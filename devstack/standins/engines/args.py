"""Engine command-line arguments, as a deployment passes them, turned into replica settings.

A pod's container `args` (which devstack/workload.py copies from the target's `spec.engineArgs`)
set an engine's capacity the way they do in a cluster. Both engines parse them with argparse,
so `--flag value` and `--flag=value` are the same; flags the stand-ins do not model are ignored.

* SGLang (python/sglang/srt/server_args.py ``ServerArgs.add_cli_args``): `--max-loaded-loras`,
  `--max-loras-per-batch`, `--lora-eviction-policy {lru,fifo}`, `--max-lora-rank`.
* vLLM (vllm/engine/arg_utils.py ``EngineArgs.add_cli_args``, vllm/config/lora.py
  ``LoRAConfig``): `--max-loras` (default 1), `--max-cpu-loras` (default: `--max-loras`),
  `--max-lora-rank`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_INT = int
_FLAGS: dict[str, dict[str, tuple[str, type]]] = {
    "sglang": {
        "--max-loaded-loras": ("max_loaded_loras", _INT),
        "--max-loras-per-batch": ("max_loras_per_batch", _INT),
        "--lora-eviction-policy": ("lora_eviction_policy", str),
        "--max-lora-rank": ("max_lora_rank", _INT),
    },
    "vllm": {
        "--max-loras": ("max_loras", _INT),
        "--max-cpu-loras": ("max_cpu_loras", _INT),
        "--max-lora-rank": ("max_lora_rank", _INT),
    },
}


class EngineArgsError(ValueError):
    """An argument the engine's argparse would refuse (the container would not start)."""


def replica_settings(engine: str, args: Sequence[str] | None) -> dict[str, Any]:
    """The replica keyword arguments `args` set for `engine` (`vllm` or `sglang`)."""
    flags = _FLAGS[engine]
    found: dict[str, Any] = {}
    items = list(args or ())
    i = 0
    while i < len(items):
        item = str(items[i])
        flag, _, inline = item.partition("=")
        spec = flags.get(flag)
        if spec is None:
            i += 1
            continue
        if inline or "=" in item:
            raw = inline
            i += 1
        elif i + 1 < len(items):
            raw = str(items[i + 1])
            i += 2
        else:
            raise EngineArgsError(f"argument {flag}: expected one argument")
        key, kind = spec
        try:
            found[key] = kind(raw)
        except ValueError as err:
            raise EngineArgsError(f"argument {flag}: invalid {kind.__name__} value: {raw!r}") from err
    return found

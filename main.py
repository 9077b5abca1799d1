"""functions-framework source: every step, chosen at run time by FUNCTION_TARGET.

functions-framework --source main.py --target admit --signature-type http

Each function's module is imported on first access (PEP 562 module `__getattr__`), so a
process serving one step imports only that step and what it needs, not all eight: the
container runs one target per process, and cold start is paid per process.
"""

from __future__ import annotations

import gc
import importlib
from typing import Any

FUNCTIONS = ("admit", "dead_letters", "ingest", "load", "reload", "resync", "stat", "unload", "verify")
__all__ = list(FUNCTIONS)  # resolved lazily by __getattr__ below


def __getattr__(name: str) -> Any:
    if name in FUNCTIONS:
        gc.disable()
        try:
            function = getattr(importlib.import_module(f"functions.{name}"), name)
        finally:
            # What is loaded now lives as long as the process: out of the collector's sight, later
            # collections do not walk it (the first event's clients import more),
            # and the server's forked worker shares its pages (the gc.freeze documentation's advice).
            gc.freeze()
            gc.enable()
        globals()[name] = function
        return function
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *FUNCTIONS])

"""The vllm kind's `phase` and `ready`, derived from the Ready condition and the observation (pure).

`phase` is never set on its own: every writer (admit, stat, verify) calls `summarize` on the
conditions it is about to write, so phase and ready always agree with Ready.

| Ready condition                                   | phase       | ready |
|---------------------------------------------------|-------------|-------|
| True                                              | Ready       | true  |
| False with a terminal reason (TERMINAL)           | Failed      | false |
| absent / Unknown / a waiting reason, files seen   | Processing  | false |
| absent / Unknown / a waiting reason, no files     | Pending     | false |
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from functions.logic import reasons
from functions.logic.conditions import find

if TYPE_CHECKING:  # the vllm models are not imported by the steps that do not read them
    from functions.resources.meta import Condition
    from functions.resources.rackai import Phase

# The reasons live in functions/logic/reasons.py; these names are the ones phase is read by.
READY = reasons.READY
ADMITTED = reasons.ADMITTED
AWAITING_VERIFICATION = reasons.AWAITING_VERIFICATION
MODEL_NOT_FOUND = reasons.MODEL_NOT_FOUND
INTEGRITY_PATH_OUTSIDE_ADAPTER = reasons.INTEGRITY_PATH_OUTSIDE_ADAPTER
AWAITING_INTEGRITY = reasons.AWAITING_INTEGRITY
AWAITING_FILES = reasons.AWAITING_FILES
MD5_UNAVAILABLE = reasons.MD5_UNAVAILABLE
INTEGRITY_CHECK_FAILED = reasons.INTEGRITY_CHECK_FAILED
INTEGRITY_VERIFIED = reasons.INTEGRITY_VERIFIED
ADMIT_FAILURES = reasons.ADMIT_FAILURES
TERMINAL = reasons.TERMINAL
AVAILABLE = reasons.AVAILABLE
ERROR = reasons.ERROR
INFERENCE_SERVICE_READY = reasons.INFERENCE_SERVICE_READY
INFERENCE_SERVICE_NOT_FOUND = reasons.INFERENCE_SERVICE_NOT_FOUND
RUNTIME_MISMATCH = reasons.RUNTIME_MISMATCH
REFERENCE_NOT_PERMITTED = reasons.REFERENCE_NOT_PERMITTED
PATH_NOT_ALLOWED = reasons.PATH_NOT_ALLOWED
NO_ERROR = reasons.NO_ERROR
ADMIT_ERRORS = reasons.ADMIT_ERRORS


def summarize(conditions: Sequence[Condition] | None, files_seen: bool) -> tuple[Phase, bool]:
    """(phase, ready) of a vllm adapter."""
    ready = find(conditions, READY)
    if ready is not None and ready.status == "True":
        return "Ready", True
    if ready is not None and ready.status == "False" and ready.reason in TERMINAL:
        return "Failed", False
    return ("Processing" if files_seen else "Pending"), False

"""Seed-1 `phase` and `ready`, derived from the Ready condition and the observation (pure).

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

from functions.logic.conditions import find

if TYPE_CHECKING:  # the seed-1 models are not imported by the steps that do not read them
    from functions.resources.meta import Condition
    from functions.resources.rackai import Phase

READY = "Ready"

# Seed 1, condition Ready ------------------------------------------------------------------------
ADMITTED = "Admitted"
"""Unknown: the spec was accepted; storage has not been verified against it yet."""
MODEL_NOT_FOUND = "ModelNotFound"
"""False: spec.model names no Model in the adapter's namespace (admit)."""
INTEGRITY_PATH_OUTSIDE_ADAPTER = "IntegrityPathOutsideAdapter"
"""False: a spec.integrity.md5 key lies outside /loraadapters/{ns}/{model}/{name}/ (admit)."""
AWAITING_INTEGRITY = "AwaitingIntegrity"
"""False: no spec.integrity.md5 declared yet; nothing to verify (verify)."""
AWAITING_FILES = "AwaitingFiles"
"""False: some declared files are not in storage yet; the message names them (verify)."""
MD5_UNAVAILABLE = "Md5Unavailable"
"""False: storage reported no MD5 for a declared file and it could not be hashed (verify)."""
INTEGRITY_CHECK_FAILED = "IntegrityCheckFailed"
"""False: a declared file's MD5 differs; the message names paths, expected vs observed (verify)."""
INTEGRITY_VERIFIED = "IntegrityVerified"
"""True: every declared file is in storage with a matching MD5 (verify)."""

ADMIT_FAILURES = frozenset({MODEL_NOT_FOUND, INTEGRITY_PATH_OUTSIDE_ADAPTER})
"""Verdicts owned by admit: the later steps keep them until admit clears them."""
TERMINAL = frozenset(
    {MODEL_NOT_FOUND, INTEGRITY_PATH_OUTSIDE_ADAPTER, MD5_UNAVAILABLE, INTEGRITY_CHECK_FAILED}
)
"""Reasons that need a human (or a changed spec/file) to move: phase Failed."""

# Seed 2, conditions Available and Error -----------------------------------------------------------
AVAILABLE = "Available"
ERROR = "Error"
INFERENCE_SERVICE_READY = "InferenceServiceReady"
"""Available=True: the referenced InferenceService exists and runs sglang."""
INFERENCE_SERVICE_NOT_FOUND = "InferenceServiceNotFound"
"""Available=False, Error=True: the referenced InferenceService does not exist."""
RUNTIME_MISMATCH = "RuntimeMismatch"
"""Available=False, Error=True: the referenced InferenceService's runtime is not sglang."""
NO_ERROR = "NoError"
"""Error=False: no reconcile step reports a failure."""
ADMIT_ERRORS = frozenset({INFERENCE_SERVICE_NOT_FOUND, RUNTIME_MISMATCH})
"""Error reasons owned by admit (it clears only these; load owns its own)."""


def summarize(conditions: Sequence[Condition] | None, files_seen: bool) -> tuple[Phase, bool]:
    """(phase, ready) of a seed-1 adapter."""
    ready = find(conditions, READY)
    if ready is not None and ready.status == "True":
        return "Ready", True
    if ready is not None and ready.status == "False" and ready.reason in TERMINAL:
        return "Failed", False
    return ("Processing" if files_seen else "Pending"), False

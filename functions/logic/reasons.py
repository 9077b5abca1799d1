"""Every condition type and reason loraflow writes, in one place (pure constants).

Reasons are part of the public contract: pipelines and alerts match on them, `kubectl get`
shows them. docs/operations.md explains each; a test keeps that page and this module in step.
The two LoRAAdapter kinds are called `vllm` (rackai.rackspace.com, files in SeaweedFS, loaded
into ModelDeployments) and `sglang` (inference.rackai.rackspace.com, a path inside the pods of
one InferenceService) everywhere in the code.
"""

from __future__ import annotations

# -- condition types ---------------------------------------------------------------------------
READY = "Ready"
"""vllm: the declared files are in storage with their MD5s (admit, stat, verify)."""
AVAILABLE = "Available"
"""sglang: the InferenceService exists, runs sglang, accepts this adapter (admit)."""
LOADED = "Loaded"
"""Both kinds: every Ready pod of every target that should serve the adapter serves it, with the
current file set (load, reload, unload)."""
ERROR = "Error"
"""sglang: True when a step reports a failure; the reason says which."""

# -- Ready (vllm) --------------------------------------------------------------------------------
ADMITTED = "Admitted"
"""Unknown: the spec was accepted; storage has not been verified against it yet."""
AWAITING_VERIFICATION = "AwaitingVerification"
"""Unknown: storage reported a changed file; verify has not ruled on it yet (stat)."""
MODEL_NOT_FOUND = "ModelNotFound"
INTEGRITY_PATH_OUTSIDE_ADAPTER = "IntegrityPathOutsideAdapter"
AWAITING_INTEGRITY = "AwaitingIntegrity"
AWAITING_FILES = "AwaitingFiles"
MD5_UNAVAILABLE = "Md5Unavailable"
INTEGRITY_CHECK_FAILED = "IntegrityCheckFailed"
INTEGRITY_VERIFIED = "IntegrityVerified"

ADMIT_FAILURES = frozenset({MODEL_NOT_FOUND, INTEGRITY_PATH_OUTSIDE_ADAPTER})
"""Ready verdicts owned by admit: the later steps keep them until admit clears them."""
TERMINAL = frozenset(
    {MODEL_NOT_FOUND, INTEGRITY_PATH_OUTSIDE_ADAPTER, MD5_UNAVAILABLE, INTEGRITY_CHECK_FAILED}
)
"""Ready reasons that need a human (or a changed spec/file) to move: phase Failed."""

# -- Available and Error (sglang) ------------------------------------------------------------------
INFERENCE_SERVICE_READY = "InferenceServiceReady"
INFERENCE_SERVICE_NOT_FOUND = "InferenceServiceNotFound"
RUNTIME_MISMATCH = "RuntimeMismatch"
REFERENCE_NOT_PERMITTED = "ReferenceNotPermitted"
"""The InferenceService is in another namespace and does not accept adapters from this one."""
PATH_NOT_ALLOWED = "PathNotAllowed"
"""spec.path is not absolute and normalised, or lies outside the configured roots."""
NO_ERROR = "NoError"
ADMIT_ERRORS = frozenset(
    {INFERENCE_SERVICE_NOT_FOUND, RUNTIME_MISMATCH, REFERENCE_NOT_PERMITTED, PATH_NOT_ALLOWED}
)
"""Available=False / Error=True reasons owned by admit (it clears only these)."""

# -- Loaded (both kinds) ---------------------------------------------------------------------------
LOADED_REASON = "Loaded"
LOADING = "Loading"
"""Some Ready pods lack it only because their own load has not run yet."""
UPDATING = "Updating"
"""A newer verified file set is being put into pods that still serve an older one."""
LOAD_FAILED = "LoadFailed"
NO_READY_REPLICAS = "NoReadyReplicas"
MODEL_MISMATCH = "ModelMismatch"
NOT_REFERENCED = "NotReferenced"
ADAPTER_NOT_READY = "AdapterNotReady"
NAME_CONFLICT = "NameConflict"
"""The engine name is claimed by an older adapter, or served from a path that is not ours."""
UNLOADED = "Unloaded"
UNLOAD_FAILED = "UnloadFailed"
CONFIG_MISSING = "AdapterConfigMissing"
CONFIG_INVALID = "AdapterConfigInvalid"
CONFIG_TOO_LARGE = "AdapterConfigTooLarge"
UNSUPPORTED_PEFT_TYPE = "UnsupportedPeftType"
RANK_TOO_HIGH = "RankTooHigh"
CONFIG_VERDICTS = frozenset(
    {CONFIG_MISSING, CONFIG_INVALID, CONFIG_TOO_LARGE, UNSUPPORTED_PEFT_TYPE, RANK_TOO_HIGH}
)
"""Verdicts about the adapter's own files: only new files (stat -> verify -> load) change them."""

# -- one pod's answer (engine calls and listings) ----------------------------------------------------
POD_LOADED = "Loaded"
POD_REPLACED = "Replaced"
POD_ALREADY_LOADED = "AlreadyLoaded"
POD_PRESENT = "Present"
POD_NOT_LOADED = "NotLoaded"
POD_STALE = "StaleFileSet"
POD_OCCUPIED = "NameOccupied"
POD_UNLOADED = "Unloaded"
ENGINE_UNREACHABLE = "EngineUnreachable"
ENGINE_TIMEOUT = "EngineTimeout"
ENGINE_ERROR = "EngineError"
ENGINE_ANSWER_INVALID = "EngineAnswerInvalid"
"""The engine answered something that is not its protocol (a listing without cards, garbage)."""
ENGINE_ANSWER_TOO_LARGE = "EngineAnswerTooLarge"
ADAPTER_PATH_NOT_FOUND = "AdapterPathNotFound"
RUNTIME_UPDATES_DISABLED = "RuntimeUpdatesDisabled"
LOAD_REJECTED = "LoadRejected"
ENGINE_FULL = "EngineFull"
"""The engine refused a load because it holds all it may (SGLang before the LRU release:
"Maximum number of loaded LoRA adapters is N"): another writer filled the slot after the pod was
listed, so the load is tried again from a new listing."""

# -- Kubernetes Events ---------------------------------------------------------------------------------
EVENT_LOAD_FAILED = LOAD_FAILED
EVENT_UNLOAD_FAILED = UNLOAD_FAILED
EVENT_FILES_TRUNCATED = "StatusFilesTruncated"
EVENT_STATUS_SHRUNK = "StatusShrunk"
EVENT_FORBIDDEN = "Forbidden"

# -- engine capacity -------------------------------------------------------------------------------
ENGINE_CAPACITY_EXCEEDED = "EngineCapacityExceeded"
"""The target wants more adapters than a pod's engine holds; this one ranks outside them
(docs/operations.md, "Engine capacity"). It is loaded by itself when room appears."""
ENGINE_CAPACITY_INVALID = "EngineCapacityInvalid"
"""A pod's engine reports (or was started with) a capacity that is not a sane count."""
EVENT_CAPACITY_EXCEEDED = ENGINE_CAPACITY_EXCEEDED
EVENT_CAPACITY_AVAILABLE = "EngineCapacityAvailable"
"""A Normal Event: an adapter left out by capacity is now served everywhere it should be."""
RESIDENT = "resident"
RELOADABLE = "reloadable"
"""vllm residency of a served adapter: its weights fit the pod's CPU cache, or more adapters
are loaded than fit and the engine reads an evicted one again on its next request."""

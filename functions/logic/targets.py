"""Which targets should serve which adapter, and what each pod should hold (pure).

Seed 1: a ModelDeployment serves the LoRAAdapters (same namespace) named in its
`spec.loraAdapters` that are Ready and fine-tuned from the deployment's `spec.model`.
Seed 2: an InferenceService (runtime sglang) serves every Available seed-2 adapter, in any
namespace, whose `spec.inferenceServiceRef` resolves to it.

"Managed" adapters are ones loraflow loaded and may therefore unload. An adapter the engine
was started with (vLLM `--lora-modules`, SGLang `--lora-paths`) is static and never touched.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from functions.logic.paths import STORAGE_ROOT, adapter_dir, engine_path, is_under

Obj = dict[str, Any]
MAX_RANK_ANNOTATION = "loraflow.io/max-lora-rank"
FINALIZER_NAME = "loraflow.io/unload"  # = functions.resources.kinds.FINALIZER


class Wanted(NamedTuple):
    """One adapter a target should serve: the object that asks for it and the engine's view."""

    namespace: str
    name: str
    lora_name: str
    lora_path: str


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("spec") or {}


def name_of(obj: Mapping[str, Any]) -> str:
    return str(_meta(obj).get("name") or "")


def namespace_of(obj: Mapping[str, Any]) -> str:
    return str(_meta(obj).get("namespace") or "")


def condition_true(obj: Mapping[str, Any], type_: str) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == type_ and c.get("status") == "True" for c in conditions)


def is_deleting(obj: Mapping[str, Any]) -> bool:
    return bool(_meta(obj).get("deletionTimestamp"))


def ready_v1(adapter: Mapping[str, Any]) -> bool:
    """Seed 1: files verified (Ready=True) and not being deleted."""
    return condition_true(adapter, "Ready") and not is_deleting(adapter)


def available_v2(adapter: Mapping[str, Any]) -> bool:
    """Seed 2: admitted against an sglang InferenceService (Available=True), not being deleted."""
    return condition_true(adapter, "Available") and not is_deleting(adapter)


def references(deployment: Mapping[str, Any], adapter_name: str) -> bool:
    return adapter_name in (_spec(deployment).get("loraAdapters") or [])


def used_by(adapter_name: str, deployments: Iterable[Mapping[str, Any]]) -> list[str]:
    """Sorted names of the ModelDeployments whose spec.loraAdapters names the adapter."""
    return sorted({name_of(d) for d in deployments if references(d, adapter_name)})


def model_matches(adapter: Mapping[str, Any], deployment: Mapping[str, Any]) -> bool:
    model = _spec(adapter).get("model")
    return bool(model) and model == _spec(deployment).get("model")


def isvc_ref(adapter: Mapping[str, Any]) -> tuple[str, str]:
    """(namespace, name) of a seed-2 adapter's InferenceService; namespace defaults to its own."""
    ref = _spec(adapter).get("inferenceServiceRef") or {}
    return str(ref.get("namespace") or namespace_of(adapter)), str(ref.get("name") or "")


def targets_isvc(adapter: Mapping[str, Any], namespace: str, name: str) -> bool:
    return isvc_ref(adapter) == (namespace, name)


def max_rank(target: Mapping[str, Any], default: int) -> int:
    """The target's `loraflow.io/max-lora-rank` annotation when it is a positive integer."""
    value = (_meta(target).get("annotations") or {}).get(MAX_RANK_ANNOTATION)
    try:
        parsed = int(str(value).strip())
    except ValueError:
        return default
    return parsed if parsed > 0 else default


def storage_dir(adapter: Mapping[str, Any]) -> str:
    """status.storageRef.path (set by admit), else the seed-1 layout for the adapter."""
    ref = ((adapter.get("status") or {}).get("storageRef") or {}).get("path")
    if isinstance(ref, str) and ref:
        return ref
    return adapter_dir(namespace_of(adapter), str(_spec(adapter).get("model") or ""), name_of(adapter))


def config_path(adapter: Mapping[str, Any]) -> str:
    return posixpath.join(storage_dir(adapter), "adapter_config.json")


def config_md5(adapter: Mapping[str, Any]) -> str | None:
    """The MD5 stat observed for the adapter's config (status.integrity.files), if any."""
    files = ((adapter.get("status") or {}).get("integrity") or {}).get("files") or {}
    observed = files.get(config_path(adapter)) if isinstance(files, Mapping) else None
    md5 = observed.get("md5") if isinstance(observed, Mapping) else None
    return md5 if isinstance(md5, str) and md5 else None


def wanted_v1(adapter: Mapping[str, Any], mount_root: str) -> Wanted:
    name = name_of(adapter)
    return Wanted(namespace_of(adapter), name, name, engine_path(mount_root, storage_dir(adapter)))


def wanted_v2(adapter: Mapping[str, Any]) -> Wanted:
    spec = _spec(adapter)
    return Wanted(namespace_of(adapter), name_of(adapter), str(spec.get("name")), str(spec.get("path")))


def serves_v1(deployment: Mapping[str, Any], adapter: Mapping[str, Any]) -> bool:
    """The deployment should serve the adapter: it names it, the adapter is Ready, models match."""
    return (
        namespace_of(deployment) == namespace_of(adapter)
        and references(deployment, name_of(adapter))
        and ready_v1(adapter)
        and model_matches(adapter, deployment)
    )


def desired_v1(
    deployment: Mapping[str, Any], adapters: Mapping[str, Mapping[str, Any]], mount_root: str
) -> dict[str, Wanted]:
    """lora_name -> Wanted for a ModelDeployment; `adapters` are its namespace's, by name."""
    result: dict[str, Wanted] = {}
    for name in _spec(deployment).get("loraAdapters") or []:
        adapter = adapters.get(name)
        if adapter is not None and serves_v1(deployment, adapter):
            result[name] = wanted_v1(adapter, mount_root)
    return result


def isvc_serves(isvc: Mapping[str, Any]) -> bool:
    return _spec(isvc).get("runtime") == "sglang" and not is_deleting(isvc)


def desired_v2(isvc: Mapping[str, Any], adapters: Iterable[Mapping[str, Any]]) -> dict[str, Wanted]:
    """lora_name -> Wanted for an InferenceService: Available seed-2 adapters that target it."""
    if not isvc_serves(isvc):
        return {}
    namespace, name = namespace_of(isvc), name_of(isvc)
    chosen = sorted(
        (a for a in adapters if targets_isvc(a, namespace, name) and available_v2(a)),
        key=lambda a: (namespace_of(a), name_of(a)),
    )
    result: dict[str, Wanted] = {}
    for adapter in chosen:
        wanted = wanted_v2(adapter)
        result.setdefault(wanted.lora_name, wanted)  # duplicates: the first by namespace/name wins
    return result


def managed_v1(lora_name: str, root: str, namespace: str, mount_root: str) -> bool:
    """Ours: loaded from our own layout, `{mount}/loraadapters/{namespace}/{model}/{lora_name}`.

    Only loraflow loads from there, so this holds even after the LoRAAdapter is gone (a load
    that raced a deletion must still be cleaned up); a static adapter the engine was started
    with lives elsewhere and is never ours.
    """
    home = posixpath.join(mount_root, STORAGE_ROOT[1:], namespace)
    if not is_under(root, home):
        return False
    parts = posixpath.relpath(posixpath.normpath(root), home).split("/")
    return len(parts) == 2 and parts[1] == lora_name


def managed_v2(lora_name: str, isvc: Mapping[str, Any], adapters: Iterable[Mapping[str, Any]]) -> bool:
    """Ours: the `spec.name` of a seed-2 adapter that targets this InferenceService."""
    namespace, name = namespace_of(isvc), name_of(isvc)
    return any(targets_isvc(a, namespace, name) and _spec(a).get("name") == lora_name for a in adapters)


def missing(listing: Mapping[str, str], desired: Mapping[str, Wanted]) -> list[str]:
    """Desired lora names the pod's own listing lacks, sorted."""
    return sorted(name for name in desired if name not in listing)


def surplus_v1(
    listing: Mapping[str, str], desired: Mapping[str, Wanted], namespace: str, mount_root: str
) -> list[str]:
    """Managed seed-1 adapters a pod holds but should not: unload them (static ones never)."""
    return sorted(
        lora
        for lora, root in listing.items()
        if lora not in desired and managed_v1(lora, root, namespace, mount_root)
    )


def surplus_v2(
    listing: Mapping[str, str],
    desired: Mapping[str, Wanted],
    isvc: Mapping[str, Any],
    adapters: Iterable[Mapping[str, Any]],
) -> list[str]:
    candidates = list(adapters)
    return sorted(lora for lora in listing if lora not in desired and managed_v2(lora, isvc, candidates))

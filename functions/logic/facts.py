"""From Kubernetes objects to what the serving planner reasons about (pure).

The observe step reads objects; these functions turn each into the planner's value, once, so
that the planner never looks into an object itself. A file set is the identity of an adapter's
content: for vllm the digest of the MD5s verify accepted, for sglang its `spec.path` (what is
inside the pods is out of our sight).
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Mapping
from typing import Any

from functions.errors import Reject
from functions.logic import reasons
from functions.logic.adapter_config import CONFIG_FILE, ConfigVerdict
from functions.logic.paths import (
    FROZEN_ROOT,
    STORAGE_ROOT,
    adapter_dir,
    engine_path,
    is_label,
    is_subdomain,
    is_under,
)
from functions.logic.serving import Adapter, AdapterKey, Serve, Target, TargetKey
from functions.resources.kinds import FINALIZER

Obj = Mapping[str, Any]
MAX_RANK_ANNOTATION = "loraflow.io/max-lora-rank"
ACCEPT_ANNOTATION = "loraflow.io/accept-adapters-from"
"""On an InferenceService: the other namespaces whose sglang adapters it serves (comma or space
separated; `*` for any). Without it only adapters of its own namespace are served."""
FILE_SET_PREFIX = "md5set:"
PRIORITY_ANNOTATION = "loraflow.io/serving-priority"
"""On a LoRAAdapter: an integer; when a pod cannot hold every adapter its target wants, higher
ranks first (then the oldest). Anything else counts as 0."""


def priority(m: Mapping[str, Any]) -> int:
    annotations = m.get("annotations")
    value = annotations.get(PRIORITY_ANNOTATION) if isinstance(annotations, Mapping) else None
    if not isinstance(value, str):
        return 0
    text = value.strip()
    try:
        parsed = int(text) if len(text) <= 10 else 0
    except ValueError:
        return 0
    return parsed


def _mapping(value: object) -> Mapping[str, Any]:
    # a decoded object's parts are dicts: `type(...) is dict` spares the Mapping ABC check,
    # which a resync of 100,000 adapters made a tenth of its planning time
    if type(value) is dict or isinstance(value, Mapping):
        return value
    return {}


def meta(obj: Obj) -> Mapping[str, Any]:
    return _mapping(obj.get("metadata"))


def spec(obj: Obj) -> Mapping[str, Any]:
    return _mapping(obj.get("spec"))


def status(obj: Obj) -> Mapping[str, Any]:
    return _mapping(obj.get("status"))


def name_of(obj: Obj) -> str:
    return str(meta(obj).get("name") or "")


def namespace_of(obj: Obj) -> str:
    return str(meta(obj).get("namespace") or "")


def deleting(obj: Obj) -> bool:
    return bool(meta(obj).get("deletionTimestamp"))


def deletion_held(obj: Obj) -> bool:
    """Deleted while our finalizer holds it: unload has copies to take back before it goes."""
    return deleting(obj) and FINALIZER in (meta(obj).get("finalizers") or [])


def condition(obj: Obj, type_: str) -> Mapping[str, Any] | None:
    return _condition(status(obj), type_)


def _condition(status_: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    for item in status_.get("conditions") or []:
        if (type(item) is dict or isinstance(item, Mapping)) and item.get("type") == type_:
            return item
    return None


def condition_true(obj: Obj, type_: str) -> bool:
    found = condition(obj, type_)
    return found is not None and found.get("status") == "True"


def declared_md5s(obj: Obj) -> dict[str, str]:
    return _declared_md5s(spec(obj))


def _declared_md5s(spec_: Mapping[str, Any]) -> dict[str, str]:
    integrity = spec_.get("integrity")
    md5 = integrity.get("md5") if isinstance(integrity, Mapping) else None
    return {str(k): str(v) for k, v in md5.items()} if isinstance(md5, Mapping) else {}


def file_set(md5s: Mapping[str, str]) -> str:
    """The identity of a verified vllm file set: a digest of its declared path -> MD5 pairs."""
    lines = "".join(f"{path}\t{md5.strip().lower()}\n" for path, md5 in sorted(md5s.items()))
    return FILE_SET_PREFIX + hashlib.sha256(lines.encode()).hexdigest()[:16]


def storage_dir(obj: Obj) -> str | None:
    """status.storageRef.path (set by admit), else the vllm layout; None for names that cannot be a path."""
    m = meta(obj)
    return _storage_dir(status(obj), spec(obj), str(m.get("namespace") or ""), str(m.get("name") or ""))


def _storage_dir(
    status_: Mapping[str, Any], spec_: Mapping[str, Any], namespace: str, name: str
) -> str | None:
    ref = status_.get("storageRef")
    path = ref.get("path") if type(ref) is dict or isinstance(ref, Mapping) else None
    if isinstance(path, str) and is_under(path, STORAGE_ROOT):
        return path
    model = str(spec_.get("model") or "")
    if not (is_label(namespace) and is_subdomain(model) and is_subdomain(name)):
        return None
    return adapter_dir(namespace, model, name)


def config_path(obj: Obj) -> str | None:
    """Where the adapter_config.json the engines will read is in storage: in the frozen copy of
    the served set when there is one, else in the upload directory."""
    directory = served_dir(obj) or storage_dir(obj)
    return posixpath.join(directory, CONFIG_FILE) if directory else None


def config_md5(obj: Obj) -> str | None:
    """The MD5 of that config: declared (a frozen copy was checked against it), else the one
    stat observed (status.integrity.files), if any."""
    directory = storage_dir(obj)
    upload = posixpath.join(directory, CONFIG_FILE) if directory else None
    if served_dir(obj) is not None and upload is not None:
        declared = declared_md5s(obj).get(upload)
        return declared.strip().lower() if declared else None
    integrity = status(obj).get("integrity")
    files = integrity.get("files") if isinstance(integrity, Mapping) else None
    observed = files.get(upload) if isinstance(files, Mapping) and upload else None
    md5 = observed.get("md5") if isinstance(observed, Mapping) else None
    return md5 if isinstance(md5, str) and md5 else None


def frozen_dir_of(status_: Mapping[str, Any], file_set_: str) -> str | None:
    """The storage directory of `file_set_`'s frozen copy (status.frozen), when it is frozen and
    lies in the frozen area."""
    for item in status_.get("frozen") or ():
        if (type(item) is dict or isinstance(item, Mapping)) and item.get("fileSet") == file_set_:
            path = item.get("path")
            if isinstance(path, str) and is_under(path.rstrip("/"), FROZEN_ROOT):
                return path
    return None


def served_dir(obj: Obj) -> str | None:
    """The frozen directory of the file set the pods should serve (serve or hold), if frozen."""
    serve, fs = vllm_serve(obj)
    return frozen_dir_of(status(obj), fs) if serve != "drop" and fs else None


def vllm_serve(obj: Obj) -> tuple[Serve, str]:
    """(serve|hold|drop, file set) of a vllm adapter.

    serve: Ready=True for exactly the MD5s the spec declares now. hold: a verified file set exists
    but is not the declared one (a change waits for verify): keep serving what pods have, and
    load it nowhere new. drop: never verified, failed, or being deleted.
    """
    return _vllm_serve(deleting(obj), spec(obj), status(obj))


def _vllm_serve(deleting_: bool, spec_: Mapping[str, Any], status_: Mapping[str, Any]) -> tuple[Serve, str]:
    if deleting_:
        return "drop", ""
    declared = file_set(_declared_md5s(spec_))
    verified = status_.get("fileSet")
    ready = _condition(status_, reasons.READY)
    if ready is not None and ready.get("status") == "True":
        if verified == declared or not verified:
            # no file set recorded: a status verify wrote before it recorded them; it records one
            # the next time it rules
            return "serve", declared
        return "hold", str(verified)
    if ready is not None and ready.get("status") == "Unknown" and isinstance(verified, str) and verified:
        return "hold", verified
    return "drop", ""


def vllm_adapter(obj: Obj, mount_root: str, config: ConfigVerdict | None = None) -> Adapter:
    # each part of the object is looked up once: a resync builds this for 100,000 adapters a tick
    m, spec_, status_ = meta(obj), spec(obj), status(obj)
    namespace, name = str(m.get("namespace") or ""), str(m.get("name") or "")
    deleting_ = bool(m.get("deletionTimestamp"))
    directory = _storage_dir(status_, spec_, namespace, name)
    serve, fs = _vllm_serve(deleting_, spec_, status_)
    # the frozen copy of the set to serve: what the engines read is then what was verified;
    # an adapter verified before sets were frozen is served from its upload directory until
    # resync has the set frozen (drift.frozen_drift)
    frozen = frozen_dir_of(status_, fs) if serve != "drop" and fs and status_.get("frozen") else None
    where = frozen or directory
    try:
        lora_path = engine_path(mount_root, where) if where else ""
    except Reject:  # a storage path that escapes the mount: never a path an engine reads
        lora_path = ""
    if not lora_path:
        serve = "drop"
    served = {
        str(item.get("pod")): str(item.get("fileSet"))
        for item in status_.get("served") or []
        if (type(item) is dict or isinstance(item, Mapping)) and item.get("pod") and item.get("fileSet")
    }
    return Adapter(
        key=AdapterKey("vllm", namespace, name),
        uid=str(m.get("uid") or ""),
        created=str(m.get("creationTimestamp") or ""),
        lora_name=name,
        lora_path=lora_path,
        file_set=fs,
        serve=serve,
        deleting=deleting_,
        model=str(spec_.get("model") or ""),
        served=served,
        config=config,
        priority=priority(m) if m.get("annotations") else 0,
    )


def isvc_ref(obj: Obj) -> TargetKey:
    """An sglang adapter's InferenceService; the namespace defaults to the adapter's own."""
    ref = spec(obj).get("inferenceServiceRef")
    ref = ref if isinstance(ref, Mapping) else {}
    return TargetKey(
        "InferenceService", str(ref.get("namespace") or namespace_of(obj)), str(ref.get("name") or "")
    )


def sglang_adapter(obj: Obj) -> Adapter:
    m = meta(obj)
    available = condition_true(obj, reasons.AVAILABLE) and not deleting(obj)
    path = str(spec(obj).get("path") or "")
    verdict = condition(obj, reasons.AVAILABLE) or {}
    not_served = (
        str(verdict.get("reason") or reasons.ADAPTER_NOT_READY),
        str(verdict.get("message") or "the adapter is not Available"),
    )
    return Adapter(
        key=AdapterKey("sglang", namespace_of(obj), name_of(obj)),
        uid=str(m.get("uid") or ""),
        created=str(m.get("creationTimestamp") or ""),
        lora_name=str(spec(obj).get("name") or ""),
        lora_path=path,
        file_set=path,
        serve="serve" if available else "drop",
        not_served=not_served,
        deleting=deleting(obj),
        target=isvc_ref(obj),
        loaded_path=str(status(obj).get("loadedPath") or ""),
        served={
            str(item.get("pod")): str(item.get("path"))
            for item in status(obj).get("served") or []
            if isinstance(item, Mapping) and item.get("pod") and item.get("path")
        },
        priority=priority(m) if m.get("annotations") else 0,
    )


def max_rank(obj: Obj, default: int) -> int:
    """The target's `loraflow.io/max-lora-rank` annotation when it is a positive integer."""
    annotations = meta(obj).get("annotations")
    value = annotations.get(MAX_RANK_ANNOTATION) if isinstance(annotations, Mapping) else None
    try:
        parsed = int(str(value).strip())
    except ValueError:
        return default
    return parsed if parsed > 0 else default


def deployment(obj: Obj, default_rank: int) -> Target:
    named = spec(obj).get("loraAdapters")
    return Target(
        key=TargetKey("ModelDeployment", namespace_of(obj), name_of(obj)),
        serves=not deleting(obj),
        model=str(spec(obj).get("model") or ""),
        adapters=tuple(str(n) for n in named if isinstance(n, str)) if isinstance(named, list) else (),
        max_rank=max_rank(obj, default_rank),
    )


def accepted_namespaces(obj: Obj) -> frozenset[str]:
    return accepted_from(meta(obj).get("annotations"))


def accepted_from(annotations: object) -> frozenset[str]:
    """The namespaces an InferenceService's `loraflow.io/accept-adapters-from` names."""
    value = annotations.get(ACCEPT_ANNOTATION) if isinstance(annotations, Mapping) else None
    if not isinstance(value, str):
        return frozenset()
    names = {part.strip() for part in value.replace(",", " ").split()}
    return frozenset(n for n in names if n == "*" or is_label(n))


def inference_service(obj: Obj) -> Target:
    key = TargetKey("InferenceService", namespace_of(obj), name_of(obj))
    runtime = spec(obj).get("runtime")
    problem: tuple[str, str] | None = None
    if runtime != "sglang":
        problem = (
            reasons.RUNTIME_MISMATCH,
            f"InferenceService {key} runs {runtime!r}, this adapter kind needs sglang",
        )
    elif deleting(obj):
        problem = (reasons.INFERENCE_SERVICE_NOT_FOUND, f"InferenceService {key} is being deleted")
    return Target(key=key, serves=problem is None, problem=problem, accepts=accepted_namespaces(obj))

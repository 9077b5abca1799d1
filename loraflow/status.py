"""`loraflow status`: both LoRAAdapter kinds, like `kubectl get`, plus where each is loaded.

"Loaded" comes from the engines themselves: for every serving pod of an adapter's targets
(ModelDeployments naming it for the vllm kind, the referenced InferenceService for the sglang kind; pods
found by the label selectors of docs/contracts.md) the engine's `GET /v1/models` is asked,
at podIP + the container port named `http`, exactly as the load step does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
from kubernetes import client

from functions.logic.pods import Runtime, endpoint, is_ready
from functions.resources.kinds import (
    INFERENCE_SERVICE_LABEL,
    MODEL_DEPLOYMENT,
    MODEL_DEPLOYMENT_LABEL,
    SGLANG_ADAPTER,
    VLLM_ADAPTER,
)
from loraflow.kubeapi import KubeCall, list_pods

Obj = dict[str, Any]
KIND_V1 = "LoRAAdapter.rackai"
KIND_V2 = "LoRAAdapter.inference"
LOADED, NOT_LOADED, UNREACHABLE, NOT_READY = "loaded", "not loaded", "unreachable", "not ready"
ENGINE_TIMEOUT = 3.0


@dataclass(frozen=True)
class PodLoad:
    pod: str
    target: str
    runtime: str
    state: str


@dataclass(frozen=True)
class TargetRef:
    """A serving workload whose pods should hold the adapter, and the engine name to look for."""

    namespace: str
    name: str
    selector: str
    runtime: Runtime
    lora_name: str


@dataclass
class AdapterRow:
    namespace: str
    name: str
    kind: str
    phase: str
    ready: str
    target: str
    size: str
    used_by: str
    age: str
    reason: str
    targets: list[TargetRef] = field(default_factory=list)
    pods: list[PodLoad] = field(default_factory=list)

    @property
    def loaded_count(self) -> str:
        if not self.pods:
            return "0/0"
        return f"{sum(p.state == LOADED for p in self.pods)}/{len(self.pods)}"


# -- pure helpers ----------------------------------------------------------------------------
def age(created: str | None, now: datetime) -> str:
    """kubectl-style age: 45s, 12m, 5h, 3d."""
    if not created:
        return "-"
    try:
        then = datetime.fromisoformat(created.replace("Z", "+00:00"))
    except ValueError:
        return "-"
    seconds = max(0, int((now - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size * (2 if unit == "m" else 1):
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def human_size(value: Any) -> str:
    if value in (None, ""):
        return "-"
    if isinstance(value, str) and not value.isdigit():
        return value
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f}{unit}" if unit == "B" else f"{size:.1f}{unit}"
        size /= 1024
    return f"{size:.1f}GiB"


def _unhealthy(condition: Mapping[str, Any]) -> bool:
    """Error=True is the bad state of an Error condition; for every other type, anything but True."""
    status = condition.get("status")
    return status == "True" if condition.get("type") == "Error" else status != "True"


def last_reason(conditions: Iterable[Mapping[str, Any]] | None) -> str:
    """`Reason: message` of the most recently changed condition that is not in its good state."""
    bad = [c for c in conditions or [] if _unhealthy(c)]
    if not bad:
        return ""
    latest = max(bad, key=lambda c: str(c.get("lastTransitionTime") or ""))
    message = str(latest.get("message") or "").strip()
    reason = str(latest.get("reason") or latest.get("type") or "")
    return f"{reason}: {message}" if message else reason


def _condition(obj: Obj, type_: str) -> str:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return str(c.get("status") or "Unknown")
    return "-"


def _meta(obj: Obj) -> Obj:
    meta: Obj = obj.get("metadata") or {}
    return meta


def row_v1(adapter: Obj, deployments: list[Obj], now: datetime) -> AdapterRow:
    meta, spec, status = _meta(adapter), adapter.get("spec") or {}, adapter.get("status") or {}
    name, namespace = meta.get("name", ""), meta.get("namespace", "")
    ready = status.get("ready")
    return AdapterRow(
        namespace=namespace,
        name=name,
        kind=KIND_V1,
        phase=str(status.get("phase") or "-"),
        ready="-" if ready is None else str(bool(ready)).lower(),
        target=str(spec.get("model") or "-"),
        size=human_size(status.get("size")),
        used_by=",".join(status.get("usedBy") or []) or "-",
        age=age(meta.get("creationTimestamp"), now),
        reason=last_reason(status.get("conditions")),
        targets=targets_v1(namespace, name, deployments),
    )


def targets_v1(namespace: str, name: str, deployments: list[Obj]) -> list[TargetRef]:
    """ModelDeployments of the adapter's namespace whose spec.loraAdapters names it."""
    found = []
    for deployment in deployments:
        meta, spec = _meta(deployment), deployment.get("spec") or {}
        if meta.get("namespace") == namespace and name in (spec.get("loraAdapters") or []):
            selector = f"{MODEL_DEPLOYMENT_LABEL}={meta.get('name')}"
            found.append(TargetRef(namespace, str(meta.get("name")), selector, "vllm", name))
    return found


def row_v2(adapter: Obj, now: datetime) -> AdapterRow:
    meta, spec, status = _meta(adapter), adapter.get("spec") or {}, adapter.get("status") or {}
    namespace = meta.get("namespace", "")
    ref = spec.get("inferenceServiceRef") or {}
    ref_ns, ref_name = ref.get("namespace") or namespace, str(ref.get("name") or "")
    target = ref_name if ref_ns == namespace else f"{ref_ns}/{ref_name}"
    selector = f"{INFERENCE_SERVICE_LABEL}={ref_name}"
    targets = (
        [TargetRef(ref_ns, ref_name, selector, "sglang", str(spec.get("name") or ""))] if ref_name else []
    )
    return AdapterRow(
        namespace=namespace,
        name=meta.get("name", ""),
        kind=KIND_V2,
        phase=_condition(adapter, "Available"),
        ready=_condition(adapter, "Loaded"),
        target=target or "-",
        size="-",
        used_by=target if _condition(adapter, "Loaded") == "True" else "-",
        age=age(meta.get("creationTimestamp"), now),
        reason=last_reason(status.get("conditions")),
        targets=targets,
    )


# -- engines ---------------------------------------------------------------------------------
def engine_adapters(http: httpx.Client, url: str) -> set[str] | None:
    """Adapter ids an engine lists in /v1/models (cards with a `parent`); None if unreachable."""
    try:
        response = http.get(url + "/v1/models")
        response.raise_for_status()
        cards = response.json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return {str(c.get("id")) for c in cards if isinstance(c, dict) and c.get("parent")}


@dataclass
class PodProbe:
    """Pods per target and each pod's engine listing, each fetched once per refresh."""

    api: client.ApiClient
    http: httpx.Client
    _pods: dict[tuple[str, str], list[Obj]] = field(default_factory=dict)
    _listings: dict[str, set[str] | None] = field(default_factory=dict)

    def pods(self, target: TargetRef) -> list[Obj]:
        key = (target.namespace, target.selector)
        if key not in self._pods:
            self._pods[key] = list_pods(self.api, target.namespace, target.selector)
        return self._pods[key]

    def probe_all(self, rows: list[AdapterRow]) -> None:
        urls: dict[str, str] = {}
        for row in rows:
            for target in row.targets:
                for pod in self.pods(target):
                    found = endpoint(pod, target.runtime)
                    if found is not None:
                        urls[found.url] = found.url
        with ThreadPoolExecutor(max_workers=16) as pool:
            for url, listing in zip(
                urls, pool.map(lambda u: engine_adapters(self.http, u), urls), strict=True
            ):
                self._listings[url] = listing

    def state(self, pod: Obj, target: TargetRef) -> PodLoad:
        found = endpoint(pod, target.runtime)
        name = _meta(pod).get("name", "")
        runtime = found.runtime if found else target.runtime
        if found is None:
            return PodLoad(name, target.name, runtime, NOT_READY if not is_ready(pod) else UNREACHABLE)
        listing = self._listings.get(found.url)
        if listing is None:
            return PodLoad(name, target.name, runtime, UNREACHABLE)
        return PodLoad(name, target.name, runtime, LOADED if target.lora_name in listing else NOT_LOADED)


def attach_pods(rows: list[AdapterRow], probe: PodProbe) -> None:
    probe.probe_all(rows)
    for row in rows:
        row.pods = [probe.state(pod, t) for t in row.targets for pod in probe.pods(t)]


# -- the command -----------------------------------------------------------------------------
def collect(
    api: client.ApiClient,
    namespace: str | None,
    name: str | None = None,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> list[AdapterRow]:
    """Every adapter (both kinds) in `namespace` (None = all), optionally only those named `name`."""
    v1 = KubeCall(api, VLLM_ADAPTER).list(namespace)
    v2 = KubeCall(api, SGLANG_ADAPTER).list(namespace)
    deployments = KubeCall(api, MODEL_DEPLOYMENT).list(namespace) if v1 else []
    moment = now()
    rows = [row_v1(a, deployments, moment) for a in v1] + [row_v2(a, moment) for a in v2]
    if name is not None:
        rows = [r for r in rows if r.name == name]
    rows.sort(key=lambda r: (r.namespace, r.name, r.kind))
    with httpx.Client(timeout=ENGINE_TIMEOUT) as http:
        attach_pods(rows, PodProbe(api, http))
    return rows

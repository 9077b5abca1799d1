"""Knative Trigger / Broker / source manifests, read from the rendered `knative/` tree.

The local broker routes by the very manifests a cluster applies: `kubectl kustomize knative/`
when the tree has a kustomization (the same rendering `kubectl apply -k` does), otherwise every
YAML file under it. Filters are compiled once at load time, so a dialect the broker cannot
evaluate (`cesql`) fails loudly when the stack starts, never silently at delivery time.

Mirrors `pkg/apis/eventing/v1/trigger_types.go` and `pkg/apis/duck/v1/delivery_types.go`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

Attributes = Mapping[str, str]
Predicate = Callable[[Attributes], bool]

ROOT = Path(__file__).resolve().parents[2]
KNATIVE_DIR = ROOT / "knative"
_DURATION = re.compile(
    r"^P(?:(?P<d>\d+(?:\.\d+)?)D)?(?:T(?:(?P<h>\d+(?:\.\d+)?)H)?(?:(?P<m>\d+(?:\.\d+)?)M)?"
    r"(?:(?P<s>\d+(?:\.\d+)?)S)?)?$"
)


class ManifestError(ValueError):
    """A manifest the local broker cannot honour faithfully (it refuses to start)."""


def parse_duration(text: str) -> float:
    """ISO-8601 duration (`PT0.2S`, `PT1M`, `P1DT2H`) in seconds, as `backoffDelay`/`timeout`."""
    match = _DURATION.match(text.strip())
    if not match or text.strip() in ("P", "PT"):
        raise ManifestError(f"invalid ISO-8601 duration {text!r}")
    units = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
    return sum(float(v) * units[k] for k, v in match.groupdict().items() if v)


# -- loading -------------------------------------------------------------------------------------
COMPONENTS = "components"
"""knative/components/<name>: the optional parts (kustomize Components), rendered only when named."""


def render(root: Path = KNATIVE_DIR, components: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Every manifest of the tree with the named components: `kubectl kustomize` of an overlay
    (what `kubectl apply -k` of a user's overlay renders) when possible, else the raw files."""
    if (root / "kustomization.yaml").exists() and shutil.which("kubectl"):
        with tempfile.TemporaryDirectory(prefix="loraflow-overlay-") as overlay:
            target = str(root)
            if components:  # kustomize takes no absolute paths: name them relative to the overlay
                relative = os.path.relpath(root, overlay)
                overlay_file = {
                    "apiVersion": "kustomize.config.k8s.io/v1beta1",
                    "kind": "Kustomization",
                    "resources": [relative],
                    "components": [f"{relative}/{COMPONENTS}/{name}" for name in components],
                }
                (Path(overlay) / "kustomization.yaml").write_text(yaml.safe_dump(overlay_file))
                target = overlay
            out = subprocess.run(
                ["kubectl", "kustomize", target], capture_output=True, text=True, timeout=60, check=False
            )
        if out.returncode == 0:
            return [d for d in yaml.safe_load_all(out.stdout) if isinstance(d, dict)]
    parts = [p for p in _yaml_files(root) if COMPONENTS not in p.relative_to(root).parts[:1]]
    for name in components:
        parts += _yaml_files(root / COMPONENTS / name)
    return read_files(parts)


def _yaml_files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.yaml")) + sorted(root.rglob("*.yml"))


def read_files(paths: Iterable[Path]) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in paths:
        if path.name.startswith("kustomization"):
            continue
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict))
    return docs


def of_kind(docs: Iterable[Mapping[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [dict(d) for d in docs if d.get("kind") == kind]


# -- delivery --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Delivery:
    """`spec.delivery` (DeliverySpec). No spec -> no retries, like Knative."""

    retry: int = 0
    backoff_policy: str = "exponential"
    backoff_delay_s: float = 0.0
    timeout_s: float | None = None
    dead_letter: Mapping[str, Any] | None = None
    structured: bool = False

    def backoff(self, attempt: int) -> float:
        """Delay before retry `attempt` (1-based): exponential delay*2^n, linear delay*n
        (`pkg/kncloudevents/retries.go`)."""
        if self.backoff_policy == "linear":
            return self.backoff_delay_s * attempt
        return float(self.backoff_delay_s * 2**attempt)

    @classmethod
    def parse(cls, spec: Mapping[str, Any] | None, base: Delivery | None = None) -> Delivery:
        """A DeliverySpec; what it leaves out comes from `base` (the defaults when None)."""
        base = base or cls()
        if not spec:
            return base
        policy = str(spec.get("backoffPolicy", base.backoff_policy))
        if policy not in ("linear", "exponential"):
            raise ManifestError(f"unknown backoffPolicy {policy!r}")
        delay = spec.get("backoffDelay")
        timeout = spec.get("timeout")
        fmt = spec.get("format")
        return cls(
            retry=int(spec.get("retry", base.retry)),
            backoff_policy=policy,
            backoff_delay_s=parse_duration(delay) if delay else base.backoff_delay_s,
            timeout_s=parse_duration(timeout) if timeout else base.timeout_s,
            dead_letter=spec.get("deadLetterSink", base.dead_letter),
            structured=(fmt == "json") if fmt else base.structured,
        )


# -- filters ---------------------------------------------------------------------------------------
# Each filter compiles to one flat closure. Every event the broker takes is matched against every
# Trigger, as the MT broker's filter does; written as loops (SIM110 declined), which cost a
# fraction of all()/any() over generators.
def _attribute_filter(attributes: Mapping[str, Any]) -> Predicate:
    """`spec.filter.attributes`: exact match on every attribute; `""` matches any value
    (`pkg/broker/filter/filter_handler.go`, legacy attributes filter)."""
    present = tuple(str(k) for k, v in attributes.items() if str(v) == "")
    equal = tuple((str(k), str(v)) for k, v in attributes.items() if str(v) != "")

    def match(attrs: Attributes) -> bool:
        for key in present:
            if key not in attrs:
                return False
        for key, value in equal:  # noqa: SIM110
            if attrs.get(key) != value:
                return False
        return True

    return match


def _string_dialect(name: str, spec: Any) -> Predicate:
    if not isinstance(spec, Mapping) or not spec or any(not v for v in spec.values()):
        raise ManifestError(f"filter dialect {name!r} needs a non-empty map of non-empty strings")
    pairs = tuple((str(k), str(v)) for k, v in spec.items())
    if name == "exact":
        if len(pairs) == 1:
            ((key, value),) = pairs
            return lambda attrs: attrs.get(key) == value  # a wanted value is never empty
        return lambda attrs: all(attrs.get(k) == v for k, v in pairs)
    test: Callable[[str, str], bool] = str.startswith if name == "prefix" else str.endswith

    def match(attrs: Attributes) -> bool:
        for key, value in pairs:
            have = attrs.get(key)
            if have is None or not test(have, value):
                return False
        return True

    return match


def _all(parts: tuple[Predicate, ...]) -> Predicate:
    def match(attrs: Attributes) -> bool:
        for part in parts:  # noqa: SIM110
            if not part(attrs):
                return False
        return True

    return match


def _any(parts: tuple[Predicate, ...]) -> Predicate:
    def match(attrs: Attributes) -> bool:
        for part in parts:  # noqa: SIM110
            if part(attrs):
                return True
        return False

    return match


def compile_filter(expression: Mapping[str, Any]) -> Predicate:
    """One SubscriptionsAPIFilter: exactly one dialect of exact/prefix/suffix/all/any/not.
    `cesql` is refused at load time (this broker cannot evaluate it)."""
    if len(expression) != 1:
        raise ManifestError(f"a filter has exactly one dialect, got {sorted(expression)}")
    ((dialect, spec),) = expression.items()
    if dialect in ("exact", "prefix", "suffix"):
        return _string_dialect(dialect, spec)
    if dialect in ("all", "any"):
        parts = tuple(compile_filter(e) for e in spec or [])
        return _all(parts) if dialect == "all" else _any(parts)
    if dialect == "not":
        inner = compile_filter(spec)
        return lambda attrs: not inner(attrs)
    if dialect == "cesql":
        raise ManifestError(f"cesql filter {spec!r} is not supported by the local broker")
    raise ManifestError(f"unknown filter dialect {dialect!r}")


def compile_trigger_filter(spec: Mapping[str, Any]) -> Predicate:
    """`spec.filters` (ANDed) wins over `spec.filter.attributes`; neither -> every event."""
    filters = spec.get("filters")
    if filters:
        return _all(tuple(compile_filter(f) for f in filters))
    attributes = (spec.get("filter") or {}).get("attributes") or {}
    return _attribute_filter(attributes)


# -- triggers ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Trigger:
    name: str
    namespace: str
    broker: str
    subscriber: Mapping[str, Any]
    matches: Predicate = field(repr=False, compare=False)
    delivery: Delivery = Delivery()
    uid: str = ""
    """The object's uid in the API server ("" for a manifest read from a file)."""

    @classmethod
    def parse(cls, doc: Mapping[str, Any], broker_delivery: Delivery | None = None) -> Trigger:
        """`spec.delivery` when the Trigger has one, else the Broker's, whole: the trigger
        reconciler copies one or the other into the Subscription, never a merge of the two
        (`pkg/reconciler/broker/trigger/trigger.go`, subscribeToBrokerChannel)."""
        meta, spec = doc.get("metadata") or {}, doc.get("spec") or {}
        if not spec.get("subscriber"):
            raise ManifestError(f"Trigger {meta.get('name')!r} has no subscriber")
        own = spec.get("delivery")
        return cls(
            name=str(meta.get("name", "")),
            namespace=str(meta.get("namespace", "default")),
            broker=str(spec.get("broker", "default")),
            subscriber=spec["subscriber"],
            matches=compile_trigger_filter(spec),
            delivery=Delivery.parse(own) if own else (broker_delivery or Delivery()),
            uid=str(meta.get("uid") or ""),
        )


def load_triggers(docs: Iterable[Mapping[str, Any]], broker: str | None = None) -> list[Trigger]:
    """Triggers of `broker` (every broker when None), with the Broker's delivery as defaults."""
    docs = list(docs)
    brokers = {str(b["metadata"]["name"]): b for b in of_kind(docs, "Broker")}
    triggers = []
    for doc in of_kind(docs, "Trigger"):
        target = str((doc.get("spec") or {}).get("broker", "default"))
        if broker is not None and target != broker:
            continue
        base = Delivery.parse((brokers.get(target, {}).get("spec") or {}).get("delivery"))
        triggers.append(Trigger.parse(doc, base))
    return triggers


def subscriber_service(destination: Mapping[str, Any]) -> str | None:
    """The Knative Service name a Destination refers to (`ref.name`), if any."""
    ref = destination.get("ref") or {}
    return str(ref["name"]) if ref.get("name") else None

"""Resource types served by the stand-in: core Pods/Namespaces/Events, Leases and CRDs from manifests."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from devstack.standins.kube.validation import Schema, compile_schema

JSON = dict[str, Any]

READ_VERBS = ("get", "list", "watch")
ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class PrinterColumn:
    """A CRD `additionalPrinterColumns` entry."""

    name: str
    type: str
    json_path: str
    description: str = ""
    priority: int = 0
    format: str = ""


@dataclass(frozen=True)
class ResourceType:
    """One served resource (group, version, plural) and how it behaves."""

    group: str
    version: str
    plural: str
    singular: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    status_subresource: bool = False
    schema: Schema | None = None
    printer_columns: tuple[PrinterColumn, ...] = ()
    verbs: tuple[str, ...] = ALL_VERBS
    builtin: bool = False
    crd: JSON | None = field(default=None, compare=False, hash=False)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_version(self) -> str:
        return self.api_version

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.plural)


def _core(
    plural: str, singular: str, kind: str, namespaced: bool, short: tuple[str, ...], status: bool
) -> ResourceType:
    return ResourceType(
        "",
        "v1",
        plural,
        singular,
        kind,
        namespaced,
        short_names=short,
        status_subresource=status,
        builtin=True,
    )


CORE_TYPES = (
    _core("pods", "pod", "Pod", True, ("po",), True),
    _core("namespaces", "namespace", "Namespace", False, ("ns",), True),
    _core("events", "event", "Event", True, ("ev",), False),
    ResourceType("events.k8s.io", "v1", "events", "event", "Event", True, short_names=("ev",), builtin=True),
    # The filer source keeps its cursor in annotations of a Lease (knative/components/filer-source).
    ResourceType("coordination.k8s.io", "v1", "leases", "lease", "Lease", True, builtin=True),
)

CRD_TYPE = ResourceType(
    "apiextensions.k8s.io",
    "v1",
    "customresourcedefinitions",
    "customresourcedefinition",
    "CustomResourceDefinition",
    False,
    short_names=("crd", "crds"),
    verbs=READ_VERBS,
    builtin=True,
)


def _yaml_documents(path: Path) -> Iterator[JSON]:
    with path.open(encoding="utf-8") as handle:
        for doc in yaml.safe_load_all(handle):
            if isinstance(doc, dict):
                yield doc


def manifest_documents(directory: Path | None, kinds: set[str]) -> list[JSON]:
    """Every YAML document of the given kinds under directory (kustomization.yaml ignored)."""
    if directory is None or not directory.is_dir():
        return []
    docs: list[JSON] = []
    for path in sorted(directory.rglob("*.y*ml")):
        if path.name in ("kustomization.yaml", "kustomization.yml"):
            continue
        docs.extend(doc for doc in _yaml_documents(path) if doc.get("kind") in kinds)
    return docs


def _printer_columns(version: JSON) -> tuple[PrinterColumn, ...]:
    columns = version.get("additionalPrinterColumns")
    if columns is None:  # apiextensions defaulting: an Age column when none is declared
        columns = [{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}]
    return tuple(
        PrinterColumn(
            c["name"],
            c.get("type", "string"),
            c["jsonPath"],
            c.get("description", ""),
            int(c.get("priority", 0)),
            c.get("format", ""),
        )
        for c in columns
    )


def crd_resource_types(crd: JSON) -> list[ResourceType]:
    """The served versions of one CustomResourceDefinition manifest."""
    spec = crd["spec"]
    names = spec["names"]
    types = []
    for version in spec.get("versions", []):
        if not version.get("served", True):
            continue
        schema_doc = (version.get("schema") or {}).get("openAPIV3Schema") or {}
        types.append(
            ResourceType(
                group=spec["group"],
                version=version["name"],
                plural=names["plural"],
                singular=names.get("singular", names["kind"].lower()),
                kind=names["kind"],
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                short_names=tuple(names.get("shortNames", ())),
                categories=tuple(names.get("categories", ())),
                status_subresource="status" in (version.get("subresources") or {}),
                schema=compile_schema(schema_doc),
                printer_columns=_printer_columns(version),
                crd=crd,
            )
        )
    return types


def served_crd(crd: JSON) -> JSON:
    """The CRD as listed by the apiserver: with Established/NamesAccepted status."""
    names = crd["spec"]["names"]
    accepted = {
        "plural": names["plural"],
        "singular": names.get("singular", ""),
        "kind": names["kind"],
        "listKind": names.get("listKind", names["kind"] + "List"),
    }
    conditions = [
        {"type": t, "status": "True", "reason": r, "message": m, "lastTransitionTime": "2026-01-01T00:00:00Z"}
        for t, r, m in (
            ("NamesAccepted", "NoConflicts", "no conflicts found"),
            ("Established", "InitialNamesAccepted", "the initial names have been accepted"),
        )
    ]
    status = {
        "acceptedNames": accepted,
        "conditions": conditions,
        "storedVersions": [v["name"] for v in crd["spec"]["versions"] if v.get("storage")],
    }
    return {**crd, "status": status}


class Registry:
    """Lookup of served resource types by group/version/plural, kind or short name."""

    def __init__(self, crds: list[JSON]) -> None:
        self.crds = {crd["metadata"]["name"]: served_crd(crd) for crd in crds}
        self.types: list[ResourceType] = [*CORE_TYPES, CRD_TYPE]
        for crd in crds:
            self.types.extend(crd_resource_types(crd))
        self._by_path = {(t.group, t.version, t.plural): t for t in self.types}

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._by_path.get((group, version, plural))

    def groups(self) -> dict[str, list[str]]:
        """API group -> served versions (preferred first), core group excluded."""
        result: dict[str, list[str]] = {}
        for rtype in self.types:
            if rtype.group and rtype.version not in result.setdefault(rtype.group, []):
                result[rtype.group].append(rtype.version)
        return result

    def in_group_version(self, group: str, version: str) -> list[ResourceType]:
        return [t for t in self.types if t.group == group and t.version == version]

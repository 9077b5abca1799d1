"""The filer source's cursor, kept in two annotations of one Lease (coordination.k8s.io/v1).

A Lease because it is the API's object for small state written often by one holder (node
heartbeats, leader election), cheap to patch, and nothing else reads it. The Lease ships with
the source's manifests (knative/components/filer-source), so the source needs only `get` and
`patch` on that one name (its Role's `resourceNames`), never `create`. The annotations are
functions.logic.filer_log's SINCE_ANNOTATION and SIGNATURE_ANNOTATION.
"""

from __future__ import annotations

from functions.adapters.kube import Kube
from functions.errors import LoraflowError
from functions.logic.filer_log import Cursor, annotations_of, cursor_of
from functions.resources.kinds import LEASE


class LeaseMissing(LoraflowError):
    """The Lease is not there: the source's manifests were not applied (or it was deleted)."""


class LeaseCursor:
    def __init__(self, kube: Kube, namespace: str, name: str) -> None:
        self._kube = kube
        self.namespace = namespace
        self.name = name

    @property
    def where(self) -> str:
        return f"Lease {self.namespace}/{self.name}"

    def load(self) -> Cursor | None:
        """The stored cursor (None: none yet, or not readable as one). Raises LeaseMissing."""
        lease = self._kube.get(LEASE, self.namespace, self.name)
        if lease is None:
            raise LeaseMissing(f"{self.where} not found: apply knative/components/filer-source")
        return cursor_of((lease.get("metadata") or {}).get("annotations"))

    def save(self, cursor: Cursor) -> None:
        """Raises LeaseMissing, or KubeUnavailable/KubeRefused (functions.errors) from the API."""
        if self._kube.annotate(LEASE, self.namespace, self.name, annotations_of(cursor)) is None:
            raise LeaseMissing(f"{self.where} not found: apply knative/components/filer-source")

"""The stack as the end-to-end tiers drive it: the user's client plus what tests check."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from devstack.demo import StackUser
from devstack.stack import Stack
from functions.resources.kinds import MODEL, MODEL_DEPLOYMENT, MODEL_DEPLOYMENT_LABEL
from tests.support.wait import eventually

D1_PODS = f"{MODEL_DEPLOYMENT_LABEL}=d1"


@dataclass
class Cluster(StackUser):
    """One namespace of a running Stack: act as a user would, read the truth from the engines."""

    def listings(self, selector: str) -> dict[str, set[str] | None]:
        """Each Ready pod's adapters as its engine lists them (None: it did not answer)."""
        return {p["metadata"]["name"]: self.listing(p) for p in self.pods(selector)}

    def loaded_in(self, selector: str, handle: str, pods: int) -> bool:
        """Exactly `pods` Ready pods, and every one of them lists `handle`."""
        found = self.listings(selector)
        return len(found) == pods and all(handle in (s or set()) for s in found.values())

    def unloaded_everywhere(self, selector: str, handle: str) -> bool:
        """At least one Ready pod, every one answering, none listing `handle`."""
        found = self.listings(selector)
        return bool(found) and all(s is not None and handle not in s for s in found.values())


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    """The condition of `type_` in an object's status ({} when it has none)."""
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return dict(cond)
    return {}


def serving_a1(stack: Stack, prefix: str, replicas: int = 2) -> Cluster:
    """A fresh namespace `<prefix>-<hex>` with the Model `llama` and the ModelDeployment `d1`
    (serving `a1`), once its `replicas` pods run (selector D1_PODS)."""
    namespace = f"{prefix}-{secrets.token_hex(3)}"
    stack.core.create_namespace({"metadata": {"name": namespace}})
    cluster = Cluster(stack, namespace)
    cluster.create(MODEL, "llama", {})
    cluster.create(MODEL_DEPLOYMENT, "d1", {"model": "llama", "replicas": replicas, "loraAdapters": ["a1"]})
    eventually(lambda: len(cluster.pods(D1_PODS)) == replicas, what=f"{replicas} pods")
    return cluster

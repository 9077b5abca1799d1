"""The real Kubernetes control plane under the embedded stack, the tests and the benchmarks.

`ControlPlane` runs etcd and kube-apiserver built from Go modules (build.sh); `Kube` is how the
stack's parts see it: the server, a fault-injecting proxy in front of it that the functions
use, the audit log that counts what they asked, and credentials (the admin's, and each
ServiceAccount's token from the TokenRequest API). `prepare()` installs what a cluster running
loraflow has: Knative's CRDs and ours, the `loraflow` namespace, the functions' RBAC."""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from devstack.kubernetes.audit import AuditLog, AuthorizedRequest
from devstack.kubernetes.controlplane import ControlPlane
from devstack.kubernetes.faultproxy import KubeFault, KubeFaultProxy
from devstack.kubernetes.pki import Certificate

__all__ = ["ControlPlane", "Kube", "KubeFault", "close_client", "prepare", "prepared", "shared"]

HERE = Path(__file__).resolve().parent
KNATIVE_CRDS = HERE / "knative-crds"
FUNCTIONS_USERS = "system:serviceaccount:loraflow:"
"""Whose requests `Kube.requests` counts: the functions' ServiceAccounts, not the stack's own."""


def documents(paths: Iterable[Path]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for path in paths:
        found += [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
    return found


def knative_crds() -> list[dict[str, Any]]:
    """Knative Eventing's and Serving's CRDs as published (devstack/kubernetes/knative-crds),
    but for their conversion: Knative's webhook, which converts between their versions, does not
    run here, and a CRD whose webhook cannot be reached fails every read in another version than
    the stored one (the namespace controller's among them, so no namespace could be deleted).
    Without it the server only relabels the version (strategy None); the stack stores each kind
    at the version knative/ writes."""
    crds = documents(sorted(KNATIVE_CRDS.glob("*.yaml")))
    for crd in crds:
        if (crd.get("spec") or {}).get("conversion", {}).get("strategy") == "Webhook":
            crd["spec"]["conversion"] = {"strategy": "None"}
    return crds


def close_client(api: Any) -> None:
    """Close a kubernetes ApiClient and its kept connections: its own close() ends only its thread pool."""
    api.close()
    manager = api.rest_client.pool_manager
    for key in list(manager.pools.keys()):
        pool = manager.pools.get(key)
        if pool is not None:
            pool.close()
    manager.clear()


def prepare(plane: ControlPlane, manifests: Iterable[Mapping[str, Any]]) -> None:
    """Install Knative's CRDs and `manifests` (our CRDs, namespace, RBAC, ...)."""
    plane.install([*knative_crds(), *manifests])


SEEDED = "LORAFLOW_KUBE_SEEDED"
"""Set (to anything): `prepared` installs each set of manifests once per process, into a seed
that later control planes start from. For a process that starts many (the test suite); one that
starts one (`make run`, each benchmark) would only pay for the seed."""


def prepared(
    manifests: Iterable[Mapping[str, Any]], base_dir: Path | None = None, *, controllers: bool = False
) -> ControlPlane:
    """A started control plane holding Knative's CRDs and `manifests`, as `prepare` installs
    them: applied to this one, or (with LORAFLOW_KUBE_SEEDED) already in the etcd it starts from."""
    documents = [*knative_crds(), *(dict(m) for m in manifests)]
    if not os.environ.get(SEEDED):
        plane = ControlPlane(base_dir, controllers=controllers).start()
        _or_stop(plane, lambda: plane.install(documents))
        return plane
    plane = ControlPlane(base_dir, controllers=controllers, seed=_seed(documents)).start()
    crds = [d for d in documents if d.get("kind") == "CustomResourceDefinition"]
    _or_stop(plane, lambda: plane.await_served(crds))
    return plane


def _or_stop(plane: ControlPlane, step: Callable[[], None]) -> None:
    try:
        step()
    except BaseException:
        plane.stop()
        raise


_seeds: dict[str, Path] = {}
_seeds_lock = threading.Lock()


def _seed(documents: list[dict[str, Any]]) -> Path:
    """The etcd data directory of a control plane that installed `documents` and stopped: made
    on first use (about one start and install), removed when the interpreter exits."""
    key = hashlib.sha256(json.dumps(documents, sort_keys=True).encode()).hexdigest()
    with _seeds_lock:
        found = _seeds.get(key)
        if found is None:
            root = Path(tempfile.mkdtemp(prefix="loraflow-etcd-seed-"))
            atexit.register(shutil.rmtree, root, True)
            with ControlPlane(root / "plane") as plane:
                plane.install(documents)
            found = _seeds[key] = root / "plane" / "etcd"
        return found


class Kube:
    """One control plane as the stack's parts use it.

    `url` is the server itself (the stack, kubectl, the sources); `functions_url` is what the
    functions' kubeconfigs name: the fault proxy when there is one. `inject()` makes the proxy
    answer or delay matching requests; `requests` counts the functions' requests since
    `reset_counters()` from the server's own audit log."""

    def __init__(self, plane: ControlPlane, proxy: bool = True) -> None:
        self.plane = plane
        self.proxy = KubeFaultProxy(plane.url, self.tls) if proxy else None
        if self.proxy is not None:
            self.proxy.start()
        self._mark = 0
        self._lock = threading.Lock()

    def stop(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()

    @property
    def url(self) -> str:
        return self.plane.url

    @property
    def functions_url(self) -> str:
        return self.proxy.url if self.proxy is not None else self.plane.url

    @property
    def admin_token(self) -> str:
        return self.plane.admin_token

    @property
    def tls(self) -> Certificate:
        assert self.plane.tls is not None, "the control plane is not started"
        return self.plane.tls

    @property
    def audit(self) -> AuditLog:
        return self.plane.audit

    # -- credentials ----------------------------------------------------------------------------
    def write_kubeconfig(self, path: Path, token: str | None = None, namespace: str = "default") -> Path:
        """An admin (or `token`) kubeconfig for the server itself."""
        return self.plane.write_kubeconfig(path, token, namespace)

    def service_account_kubeconfig(self, path: Path, namespace: str, name: str) -> Path:
        """A kubeconfig holding a TokenRequest token of the ServiceAccount, naming `functions_url`."""
        token = self.plane.service_account_token(namespace, name)
        return self.plane.write_kubeconfig(path, token, namespace, server=self.functions_url)

    # -- faults ---------------------------------------------------------------------------------------
    def inject(
        self,
        status: int | None = None,
        times: int | None = 1,
        verb: str | None = None,
        resource: str | None = None,
        delay_s: float = 0.0,
    ) -> KubeFault:
        """Answer the functions' next `times` matching requests with `status` and/or after `delay_s`."""
        if self.proxy is None:
            raise RuntimeError("this Kube has no fault proxy (proxy=False)")
        return self.proxy.inject_kube(status, times, verb, resource, delay_s)

    def clear_faults(self) -> None:
        if self.proxy is not None:
            self.proxy.clear_faults()

    # -- what the server counted ------------------------------------------------------------------------
    def reset_counters(self) -> None:
        with self._lock:
            self._mark = self.audit.mark()

    @property
    def requests(self) -> Counter[tuple[str, str]]:
        """The functions' requests by (verb, resource[/subresource]) since `reset_counters()`."""
        return self.audit.counts(self._mark, FUNCTIONS_USERS)

    @property
    def request_count(self) -> int:
        return sum(self.requests.values())

    @property
    def authorized_requests(self) -> set[AuthorizedRequest]:
        """Every (user, verb, group, resource, subresource) the authorizer allowed a ServiceAccount."""
        return {
            AuthorizedRequest(r.user, r.verb, r.group, r.resource, r.subresource)
            for r in self.audit.since(0)
            if r.allowed and r.user.startswith("system:serviceaccount:")
        }


_shared: ControlPlane | None = None
_shared_lock = threading.Lock()


def shared(manifests: Iterable[Mapping[str, Any]] = ()) -> ControlPlane:
    """The process's one control plane, started (and `manifests` installed with Knative's CRDs)
    on first use, stopped when the interpreter exits: the tiers whose tests each keep to a
    namespace of their own share it, as tests share a cluster."""
    global _shared
    with _shared_lock:
        if _shared is None:
            plane = prepared(manifests)
            atexit.register(plane.stop)
            _shared = plane
        return _shared

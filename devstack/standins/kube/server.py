"""`KubeServer`: the embeddable Kubernetes API server stand-in."""

from __future__ import annotations

import base64
import json
import threading
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from devstack.standins.kube.api import Api, Counters
from devstack.standins.kube.faults import Fault, Faults
from devstack.standins.kube.http import KubeHTTPServer
from devstack.standins.kube.rbac import Authenticator, AuthorizedRequest, Authorizer
from devstack.standins.kube.resources import CORE_TYPES, Registry, manifest_documents
from devstack.standins.kube.store import Store, WriteOptions
from devstack.standins.kube.tls import loopback_certificate

DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


class KubeServer:
    """A Kubernetes API server stand-in on loopback (CRDs from crd_dir, RBAC from rbac_dir)."""

    def __init__(
        self,
        crd_dir: Path | None = None,
        rbac_dir: Path | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        namespaces: tuple[str, ...] = DEFAULT_NAMESPACES,
        watch_history: int = 10000,
        tls: bool = False,
        rbac: Sequence[dict[str, Any]] = (),
    ) -> None:
        """`rbac`: RBAC documents beside those of `rbac_dir` (an optional component's)."""
        self.host, self._port = host, port
        self.tls = loopback_certificate() if tls else None
        self.registry = Registry(manifest_documents(crd_dir, {"CustomResourceDefinition"}))
        self.store = Store(watch_history)
        self._authn = Authenticator()
        self._authz = Authorizer(rbac_dir, rbac)
        self.faults = Faults()
        self._counters = Counters()
        self.api = Api(
            self.registry,
            self.store,
            self._authn,
            self._authz,
            self.faults,
            self._counters,
            lambda: f"{self.host}:{self.port}",
        )
        self._httpd: KubeHTTPServer | None = None
        self._thread: threading.Thread | None = None
        for namespace in namespaces:
            self.store.create(CORE_TYPES[1], "", {"metadata": {"name": namespace}}, WriteOptions())

    # ------------------------------------------------------------ lifecycle

    def start(self) -> KubeServer:
        """Bind and serve in a background thread; returns at once."""
        context = self.tls.server_context() if self.tls else None
        self._httpd = KubeHTTPServer((self.host, self._port), self.api, context)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"kube-stand-in:{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting, end watches, close keep-alive connections, join every thread."""
        if self._httpd is None:
            return
        self.store.close()
        self._httpd.shutdown()
        self._httpd.close_connections()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join()
        self._httpd, self._thread = None, None

    def __enter__(self) -> KubeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            return self._port
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://{self.host}:{self.port}"

    # ------------------------------------------------------------ credentials

    @property
    def admin_token(self) -> str:
        """Bearer token of a cluster-admin (system:masters) user; bypasses RBAC."""
        return self._authn.admin_token

    def issue_token(self, user: str, groups: tuple[str, ...] = ()) -> str:
        """A bearer token for `user` (e.g. `system:serviceaccount:<ns>:<name>`); RBAC applies."""
        return self._authn.issue(user, groups)

    def client_configuration(self, token: str | None = None) -> Any:
        """A `kubernetes.client.Configuration` for this server (bearer token, admin default)."""
        from kubernetes import client  # imported lazily: only users of this helper need it

        configuration = client.Configuration()
        configuration.host = self.url
        configuration.api_key = {"BearerToken": token or self.admin_token}
        configuration.api_key_prefix = {"BearerToken": "Bearer"}
        if self.tls is not None:
            configuration.ssl_ca_cert = str(self.tls.ca_file)
        return configuration

    def kubeconfig(self, token: str | None = None, namespace: str = "default") -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "devstack",
            "clusters": [{"name": "devstack", "cluster": self._cluster_entry()}],
            "users": [{"name": "devstack", "user": {"token": token or self.admin_token}}],
            "contexts": [
                {
                    "name": "devstack",
                    "context": {"cluster": "devstack", "user": "devstack", "namespace": namespace},
                }
            ],
            "preferences": {},
        }

    def _cluster_entry(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"server": self.url}
        if self.tls is not None:
            entry["certificate-authority-data"] = base64.b64encode(self.tls.ca_pem).decode()
        return entry

    def write_kubeconfig(self, path: Path, token: str | None = None, namespace: str = "default") -> Path:
        """Write a kubeconfig for kubectl / kubernetes.config.load_kube_config. kubectl sends
        bearer tokens only over TLS (clientcmd): start the server with `tls=True` for kubectl.
        Written as JSON (which is YAML too), as `kubectl config view -o json` prints one."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.kubeconfig(token, namespace), indent=2), encoding="utf-8")
        return path

    # ------------------------------------------------------------ observability

    @property
    def request_count(self) -> int:
        return self._counters.total

    @property
    def requests(self) -> Counter[tuple[str, str]]:
        """Requests by (verb, resource), e.g. ("patch", "loraadapters/status")."""
        return self._counters.by_key

    @property
    def request_seconds(self) -> dict[tuple[str, str], float]:
        """CPU seconds spent answering requests by (verb, resource): a page's cost is
        `request_seconds[("list", plural)] / requests[("list", plural)]`."""
        return self._counters.seconds

    def reset_counters(self) -> None:
        self._counters.reset()

    @property
    def authorized_requests(self) -> set[AuthorizedRequest]:
        """Every (user, verb, group, resource, subresource) RBAC allowed (admin excluded)."""
        return self._authz.authorized

    # ------------------------------------------------------------ faults

    def inject(
        self,
        status: int | None = None,
        times: int | None = 1,
        verb: str | None = None,
        resource: str | None = None,
        delay_s: float = 0.0,
    ) -> Fault:
        """Answer the next `times` matching requests with `status` and/or after `delay_s`."""
        return self.faults.add(Fault(status, times, verb, resource, delay_s))

    def clear_faults(self) -> None:
        self.faults.clear()

"""A real Kubernetes control plane on 127.0.0.1: etcd and kube-apiserver, built from Go modules.

What envtest does for controller-runtime, for the embedded stack, the tests and the benchmarks:
- etcd on two free ports, its data in a temporary directory, `--unsafe-no-fsync` (as envtest);
- kube-apiserver over TLS with the stack's own CA (pki.py), an admin bearer token from a token
  file (user `loraflow-admin` in `system:masters`), RBAC as the only authorizer, ServiceAccount
  tokens signed by a key of its own and issued through the TokenRequest API, the audit log
  (audit.py) as the record of every request, and `--endpoint-reconciler-type=none` (a loopback
  advertise address may not be a Service endpoint);
- the ServiceAccount admission plugin off, as envtest has it: nothing here runs the
  controller that creates each namespace's `default` ServiceAccount, which Pods would need;
- `install()` applies manifests with the real `kubectl apply --server-side` and waits until
  every CustomResourceDefinition is Established.
Either server can be stopped and started again on the same ports and data (the fault tests).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

import httpx

from devstack.kubernetes.audit import AUDIT_POLICY, AuditLog
from devstack.kubernetes.binaries import Binaries, binaries
from devstack.kubernetes.pki import Certificate, SigningKey, issue, signing_key
from devstack.ports import free_ports

log = logging.getLogger("devstack.kubernetes")

ADMIN_USER = "loraflow-admin"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
TOKEN_SECONDS = 24 * 3600
"""ServiceAccount tokens outlive any run here; a cluster's projected tokens rotate hourly."""


class ControlPlane:
    """etcd + kube-apiserver in `base_dir` (a temporary one unless given), stopped by `stop()`."""

    def __init__(
        self,
        base_dir: Path | None = None,
        *,
        host: str = "127.0.0.1",
        controllers: bool = False,
        seed: Path | None = None,
    ) -> None:
        """`controllers`: also run kube-controller-manager's namespace, garbage-collector and
        serviceaccount controllers, so that a deleted namespace empties and goes, the Pods of a
        deleted target go, and each namespace gets its `default` ServiceAccount. `seed`: an etcd
        data directory (of a stopped etcd) that the first start copies and starts from."""
        self.host = host
        self.controllers = controllers
        self.seed = seed
        self._owns_dir = base_dir is None
        self.dir = Path(tempfile.mkdtemp(prefix="loraflow-kube-")) if base_dir is None else Path(base_dir)
        etcd_client, etcd_peer, secure = free_ports(3, host)
        self.ports = {"etcd": etcd_client, "etcd_peer": etcd_peer, "apiserver": secure}
        self.admin_token = secrets.token_urlsafe(32)
        self.tls: Certificate | None = None
        self._signer: SigningKey | None = None
        self._bin: Binaries | None = None
        self._etcd: subprocess.Popen[bytes] | None = None
        self._apiserver: subprocess.Popen[bytes] | None = None
        self._controller_manager: subprocess.Popen[bytes] | None = None
        self._logs: list[IO[bytes]] = []
        self._lock = threading.Lock()
        self.audit = AuditLog(self.dir / "audit.log")

    # -- where it answers -------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.ports['apiserver']}"

    @property
    def etcd_url(self) -> str:
        return f"http://{self.host}:{self.ports['etcd']}"

    @property
    def ca_file(self) -> Path:
        assert self.tls is not None, "start() first"
        return self.tls.ca_file

    @property
    def kubectl(self) -> Path:
        """The kubectl built with the server (same minor version: no skew warning)."""
        return (self._bin or binaries()).kubectl

    def pids(self) -> dict[str, int]:
        found = {}
        named = (
            ("etcd", self._etcd),
            ("kube-apiserver", self._apiserver),
            ("kube-controller-manager", self._controller_manager),
        )
        for name, process in named:
            if process is not None and process.poll() is None:
                found[name] = process.pid
        return found

    # -- lifecycle ------------------------------------------------------------------------------------
    def start(self, timeout: float = 120.0) -> ControlPlane:
        self._bin = binaries()
        pki = self.dir / "pki"
        self.tls = issue(pki)
        self._signer = signing_key(pki)
        tokens = pki / "tokens.csv"
        tokens.touch(mode=0o600)
        tokens.write_text(f'{self.admin_token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n')
        (self.dir / "audit-policy.yaml").write_text(AUDIT_POLICY)
        try:
            self.start_etcd(timeout)
            self.start_apiserver(timeout)
            if self.controllers:
                self.start_controller_manager()
        except BaseException:
            self.stop()
            raise
        log.info("kube-apiserver up at %s (etcd %s, dir %s)", self.url, self.etcd_url, self.dir)
        return self

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Everything goes with it, so nothing waits for a graceful end: a second each."""
        with self._lock:
            process, self._controller_manager = self._controller_manager, None
        self._halt(process, 1.0)
        self.stop_apiserver(grace_s=1.0)
        self.stop_etcd(grace_s=1.0)
        for opened in self._logs:
            opened.close()
        self._logs.clear()
        if self._owns_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _spawn(self, argv: list[str], log_name: str) -> subprocess.Popen[bytes]:
        out = (self.dir / log_name).open("ab")
        self._logs.append(out)
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )

    def start_etcd(self, timeout: float = 60.0) -> None:
        assert self._bin is not None
        peer = f"http://{self.host}:{self.ports['etcd_peer']}"
        if self.seed is not None and not (self.dir / "etcd").exists():
            # a single member keeps its stored membership and serves on the ports given here
            shutil.copytree(self.seed, self.dir / "etcd")
        argv = [
            str(self._bin.etcd),
            "--name=loraflow",
            f"--data-dir={self.dir / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}",
            f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=loraflow={peer}",
            "--unsafe-no-fsync=true",
            "--quota-backend-bytes=8589934592",  # the 100,000-adapter benchmark world fits
            "--log-level=warn",
        ]
        with self._lock:
            self._etcd = self._spawn(argv, "etcd.log")
        self._await(
            "etcd",
            self._etcd,
            lambda http: http.get(self.etcd_url + "/health").json()["health"] == "true",
            timeout,
        )

    def start_apiserver(self, timeout: float = 120.0) -> None:
        assert self._bin is not None and self.tls is not None and self._signer is not None
        argv = [
            str(self._bin.kube_apiserver),
            f"--etcd-servers={self.etcd_url}",
            f"--bind-address={self.host}",
            f"--advertise-address={self.host}",
            f"--secure-port={self.ports['apiserver']}",
            f"--cert-dir={self.dir / 'pki'}",
            f"--tls-cert-file={self.tls.cert_file}",
            f"--tls-private-key-file={self.tls.key_file}",
            f"--token-auth-file={self.dir / 'pki' / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={self._signer.public_file}",
            f"--service-account-signing-key-file={self._signer.private_file}",
            "--service-cluster-ip-range=10.96.0.0/24",
            "--endpoint-reconciler-type=none",
            "--disable-admission-plugins=ServiceAccount",
            "--allow-privileged=true",
            f"--audit-log-path={self.audit.path}",
            f"--audit-policy-file={self.dir / 'audit-policy.yaml'}",
            "--audit-log-format=json",
            "--audit-log-maxsize=1000000",  # never rotated: AuditLog reads one file by offset
            "--profiling=false",
            "--v=0",
        ]
        with self._lock:
            self._apiserver = self._spawn(argv, "kube-apiserver.log")
        headers = {"Authorization": f"Bearer {self.admin_token}"}
        self._await(
            "kube-apiserver",
            self._apiserver,
            lambda http: http.get(self.url + "/readyz", headers=headers).status_code == 200,
            timeout,
        )

    def start_controller_manager(self) -> None:
        """kube-controller-manager as the admin, with only the controllers named in __init__; it
        serves nothing (no metrics port) and elects no leader (it is the only one)."""
        assert self._bin is not None
        config = self.write_kubeconfig(self.dir / "controller-manager.kubeconfig")
        argv = [
            str(self._bin.kube_controller_manager),
            f"--kubeconfig={config}",
            "--controllers=namespace-controller,garbage-collector-controller,serviceaccount-controller",
            "--leader-elect=false",
            "--secure-port=0",
            "--use-service-account-credentials=false",
            "--v=0",
        ]
        with self._lock:
            self._controller_manager = self._spawn(argv, "kube-controller-manager.log")

    def _await(self, name: str, process: subprocess.Popen[bytes], ready: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        context = ssl.create_default_context(cafile=str(self.ca_file)) if self.tls else True
        with httpx.Client(timeout=5, verify=context) as http:
            while time.monotonic() < deadline:
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited with {process.returncode}: {self.log_tail(name)}")
                with contextlib.suppress(httpx.HTTPError, KeyError, ValueError):
                    if ready(http):
                        return
                time.sleep(0.1)
        raise TimeoutError(f"{name} not ready within {timeout} s: {self.log_tail(name)}")

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.dir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def _halt(self, process: subprocess.Popen[bytes] | None, grace_s: float) -> None:
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)

    def stop_apiserver(self, grace_s: float = 5.0) -> None:
        """Stop kube-apiserver (SIGTERM, then SIGKILL); `start_apiserver()` brings it back."""
        with self._lock:
            process, self._apiserver = self._apiserver, None
        self._halt(process, grace_s)

    def stop_etcd(self, grace_s: float = 5.0) -> None:
        """Stop etcd; its data stays for `start_etcd()`."""
        with self._lock:
            process, self._etcd = self._etcd, None
        self._halt(process, grace_s)

    # -- credentials ------------------------------------------------------------------------------------
    def http(self, token: str | None = None, timeout: float = 30.0) -> httpx.Client:
        """An httpx client for this server with `token` (the admin's by default)."""
        return httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token or self.admin_token}"},
            verify=ssl.create_default_context(cafile=str(self.ca_file)),
            timeout=timeout,
        )

    def service_account_token(self, namespace: str, name: str, seconds: int = TOKEN_SECONDS) -> str:
        """A token for the ServiceAccount, issued by the TokenRequest API (as kubelet projects one)."""
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": seconds},
        }
        with self.http() as http:
            answer = http.post(f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", json=body)
        answer.raise_for_status()
        return str(answer.json()["status"]["token"])

    def kubeconfig(
        self, token: str | None = None, namespace: str = "default", server: str | None = None
    ) -> dict[str, Any]:
        assert self.tls is not None
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "devstack",
            "clusters": [
                {
                    "name": "devstack",
                    "cluster": {
                        "server": server or self.url,
                        "certificate-authority-data": base64.b64encode(self.tls.ca_pem).decode(),
                    },
                }
            ],
            "users": [{"name": "devstack", "user": {"token": token or self.admin_token}}],
            "contexts": [
                {
                    "name": "devstack",
                    "context": {"cluster": "devstack", "user": "devstack", "namespace": namespace},
                }
            ],
            "preferences": {},
        }

    def write_kubeconfig(
        self, path: Path, token: str | None = None, namespace: str = "default", server: str | None = None
    ) -> Path:
        """A kubeconfig (JSON, which is YAML too) for kubectl and the clients; 0600, it holds a token."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(json.dumps(self.kubeconfig(token, namespace, server), indent=2), encoding="utf-8")
        return path

    # -- objects ------------------------------------------------------------------------------------------
    def kubectl_run(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """The real kubectl as the admin."""
        config = self.dir / "admin.kubeconfig"
        if not config.exists():
            self.write_kubeconfig(config)
        return subprocess.run(
            [str(self.kubectl), f"--kubeconfig={config}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            check=check,
            timeout=120,
        )

    def install(self, manifests: Iterable[Mapping[str, Any]], timeout: float = 60.0) -> None:
        """Apply `manifests` as the admin (server-side, field manager `loraflow-devstack`): the
        CustomResourceDefinitions first, until each is Established, then the rest, namespaces
        first, so that an object may come in the same call as its kind and its namespace."""
        documents = [dict(m) for m in manifests]
        crds = [m for m in documents if m.get("kind") == "CustomResourceDefinition"]
        rest = sorted((m for m in documents if m not in crds), key=lambda m: m.get("kind") != "Namespace")
        if crds:
            self._apply(crds)
            names = [f"customresourcedefinition/{m['metadata']['name']}" for m in crds]
            self.kubectl_run("wait", "--for=condition=Established", f"--timeout={int(timeout)}s", *names)
        if rest:
            self._apply(rest)

    def await_served(self, crds: Iterable[Mapping[str, Any]], timeout: float = 60.0) -> None:
        """Wait until the server lists the objects of each CustomResourceDefinition in `crds` (at
        its storage version): a server started on a seed serves them soon after it is ready."""
        paths = [
            f"/apis/{crd['spec']['group']}/{version['name']}/{crd['spec']['names']['plural']}?limit=1"
            for crd in crds
            for version in crd["spec"]["versions"]
            if version.get("storage")
        ]
        deadline = time.monotonic() + timeout
        with self.http() as http:
            for path in paths:
                while http.get(path).status_code != 200:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{path} not served within {timeout} s")
                    time.sleep(0.1)

    def await_watch_caches(self, resources: Iterable[tuple[str, str, str]], timeout: float = 600.0) -> float:
        """Wait until the server has filled its watch cache of each (group, version, plural) in
        `resources`, and return the seconds waited. A server started on a large store lists from
        etcd page by page until then, each page seconds slow; the cache answers in milliseconds.
        A custom resource's cache is made at its first request, so each is listed once first."""
        wanted: set[str] = set()
        started = time.monotonic()
        with self.http() as http:
            for group, version, plural in resources:
                prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
                http.get(f"{prefix}/{plural}", params={"limit": "1"})
                wanted.add(f'group="{group}",resource="{plural}"')
            while True:
                metrics = http.get("/metrics").text
                filled = {
                    labels
                    for line in metrics.splitlines()
                    if line.startswith("apiserver_watch_cache_initializations_total{")
                    for labels in wanted
                    if labels in line
                }
                if filled == wanted:
                    return round(time.monotonic() - started, 1)
                if time.monotonic() - started > timeout:
                    missing = sorted(wanted - filled)
                    raise TimeoutError(f"watch caches {missing} not filled within {timeout} s")
                time.sleep(1.0)

    def _apply(self, documents: list[dict[str, Any]]) -> None:
        listing = json.dumps({"apiVersion": "v1", "kind": "List", "items": documents})
        self.kubectl_run(
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=loraflow-devstack",
            "-f",
            "-",
            stdin=listing,
        )

"""Where the Kubernetes API is and how to authenticate to it, without the `kubernetes` package.

Two sources, as `kubernetes.config` has them:

- in cluster: the service-account token and CA under /var/run/secrets/kubernetes.io/serviceaccount
  and `KUBERNETES_SERVICE_HOST`/`_PORT` (https); the token is projected and rotates, so it is
  re-read from its file (at most every TOKEN_TTL seconds);
- a kubeconfig file (or a `:`-separated list, merged the kubectl way: the first file to set a
  value wins): the current context's cluster (`server`, `certificate-authority[-data]`,
  `insecure-skip-tls-verify`, `tls-server-name`, `proxy-url`) and user (`token`, `tokenFile`,
  `client-certificate[-data]` + `client-key[-data]`, `username`/`password`). Relative paths are
  relative to the file that names them. Users with `exec` or `auth-provider` are handed to
  the `kubernetes` package's loader, imported only then.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from functions.errors import ConfigError

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_TTL = 60.0
"""Seconds a token read from a file is used before the file is read again (kubelet rotates
projected tokens well before they expire, and the old one stays valid until then)."""


class KubeConfigError(ConfigError):
    """No usable Kubernetes configuration (a deployment mistake, not a retryable failure)."""


class Credentials(Protocol):
    def authorization(self) -> str | None:
        """The Authorization header value for the next request (None: send none)."""


class StaticToken(NamedTuple):
    token: str

    def authorization(self) -> str | None:
        return f"Bearer {self.token}"

    def __repr__(self) -> str:  # credentials stay out of logs and tracebacks
        return "StaticToken(token=<hidden>)"


class BasicAuth(NamedTuple):
    username: str
    password: str

    def authorization(self) -> str | None:
        pair = f"{self.username}:{self.password}".encode()
        return "Basic " + base64.b64encode(pair).decode()

    def __repr__(self) -> str:
        return f"BasicAuth(username={self.username!r}, password=<hidden>)"


@dataclass
class FileToken:
    """A bearer token read from a file, re-read once it is older than `ttl` seconds."""

    path: Path
    ttl: float = TOKEN_TTL
    clock: Callable[[], float] = time.monotonic
    _token: str | None = field(default=None, init=False, repr=False)
    _read_at: float = field(default=0.0, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def authorization(self) -> str | None:
        now = self.clock()
        with self._lock:
            if self._token is None or now - self._read_at >= self.ttl:
                try:
                    token = self.path.read_text(encoding="utf-8").strip()
                except OSError as err:
                    if self._token is None:
                        raise KubeConfigError(f"cannot read the token file {self.path}: {err}") from err
                    token = self._token  # keep the last good one; try again next time
                self._token, self._read_at = token, now
            return f"Bearer {self._token}" if self._token else None


class HookedToken(NamedTuple):
    """The `kubernetes` loader's token (exec / auth-provider), refreshed by its own hook."""

    configuration: Any

    def authorization(self) -> str | None:
        value = self.configuration.get_api_key_with_prefix("BearerToken", alias="authorization")
        return str(value) if value else None

    def __repr__(self) -> str:
        return "HookedToken(<the kubernetes loader's configuration>)"


class KubeConfig(NamedTuple):
    """Everything the REST client needs: where, whom to trust, who we are."""

    server: str
    ca_file: str | None = None
    ca_data: str | None = None
    """PEM text of the CA bundle."""
    insecure: bool = False
    cert_file: str | None = None
    key_file: str | None = None
    cert_data: bytes | None = None
    key_data: bytes | None = None
    credentials: Credentials | None = None
    proxy: str | None = None
    tls_server_name: str | None = None
    """The name to expect in the server's certificate (and send as SNI) instead of the host."""

    def authorization(self) -> str | None:
        return self.credentials.authorization() if self.credentials is not None else None

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS context for `server`: its CA (or the system's), our client certificate."""
        if self.insecure:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        elif self.ca_file or self.ca_data:
            context = ssl.create_default_context(cafile=self.ca_file, cadata=self.ca_data)
        else:
            context = ssl.create_default_context()
        if self.cert_file or self.cert_data:
            _load_client_certificate(context, self)
        return context


def _load_client_certificate(context: ssl.SSLContext, config: KubeConfig) -> None:
    """ssl loads a certificate chain from files only: data goes to private temporary files
    (mode 0600, in a 0700 directory) that are removed as soon as the context holds the key."""
    with tempfile.TemporaryDirectory(prefix="loraflow-kube-") as tmp:
        cert_file, key_file = config.cert_file, config.key_file
        if config.cert_data is not None:
            cert_file = _private_file(Path(tmp) / "client.crt", config.cert_data)
        if config.key_data is not None:
            key_file = _private_file(Path(tmp) / "client.key", config.key_data)
        if not cert_file or not key_file:
            raise KubeConfigError("a client certificate needs both a certificate and a key")
        context.load_cert_chain(cert_file, key_file)


def _private_file(path: Path, data: bytes) -> str:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    return str(path)


# -- in cluster ----------------------------------------------------------------------------------
def in_cluster(
    sa_dir: Path = SERVICE_ACCOUNT_DIR,
    env: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> KubeConfig:
    """The pod's service account: https://KUBERNETES_SERVICE_HOST:PORT, its CA, its token."""
    env = os.environ if env is None else env
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise KubeConfigError("no kubeconfig and not in a cluster (KUBERNETES_SERVICE_HOST/PORT are not set)")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # IPv6
    token_file, ca_file = Path(sa_dir) / "token", Path(sa_dir) / "ca.crt"
    if not token_file.is_file():
        raise KubeConfigError(f"service-account token {token_file} not found")
    if not ca_file.is_file():
        raise KubeConfigError(f"service-account CA {ca_file} not found")
    credentials = FileToken(token_file, clock=clock)
    credentials.authorization()  # fail now, not at the first request, when it is unreadable
    return KubeConfig(server=f"https://{host}:{port}", ca_file=str(ca_file), credentials=credentials)


# -- kubeconfig ----------------------------------------------------------------------------------
class _Entry(NamedTuple):
    value: dict[str, Any]
    base: Path
    """Directory of the file the entry came from (relative paths resolve against it)."""


def _document(path: Path) -> Any:
    """A kubeconfig file's content. JSON is YAML too, and parsed without importing the YAML
    parser into every cold start; in a cluster there is no kubeconfig at all."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise KubeConfigError(f"cannot read kubeconfig {path}: {err}") from err
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except ValueError:
            pass  # YAML flow style, not JSON: the YAML parser decides
    import yaml

    try:
        return yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        raise KubeConfigError(f"cannot read kubeconfig {path}: {err}") from err


def _merged(paths: list[Path]) -> tuple[str | None, dict[str, dict[str, _Entry]]]:
    """current-context and the named clusters/users/contexts; the first file to set one wins."""
    current: str | None = None
    named: dict[str, dict[str, _Entry]] = {"clusters": {}, "users": {}, "contexts": {}}
    inner = {"clusters": "cluster", "users": "user", "contexts": "context"}
    for path in paths:
        document = _document(path)
        if not isinstance(document, dict):
            raise KubeConfigError(f"kubeconfig {path} is not a mapping")
        current = current or document.get("current-context") or None
        for section, key in inner.items():
            for item in document.get(section) or []:
                if isinstance(item, dict) and item.get("name") and item["name"] not in named[section]:
                    named[section][item["name"]] = _Entry(item.get(key) or {}, path.parent)
    return current, named


def _path(entry: _Entry, key: str) -> str | None:
    value = entry.value.get(key)
    if not value:
        return None
    resolved = Path(os.path.expanduser(str(value)))
    return str(resolved if resolved.is_absolute() else entry.base / resolved)


def _data(entry: _Entry, key: str) -> bytes | None:
    value = entry.value.get(key)
    if not value:
        return None
    try:
        return base64.b64decode(value, validate=False)
    except (ValueError, TypeError) as err:
        raise KubeConfigError(f"{key} is not base64: {err}") from err


def _fallback_needed(user: _Entry) -> bool:
    return bool(user.value.get("exec") or user.value.get("auth-provider"))


def from_kubeconfig(kubeconfig: str, context: str | None = None) -> KubeConfig:
    """The current (or named) context of a kubeconfig file or `:`-separated list of files."""
    paths = [Path(os.path.expanduser(p)) for p in kubeconfig.split(os.pathsep) if p]
    if not paths:
        raise KubeConfigError("empty kubeconfig path")
    current, named = _merged(paths)
    name = context or current
    if not name:
        raise KubeConfigError(f"kubeconfig {kubeconfig} has no current-context")
    ctx = named["contexts"].get(name)
    if ctx is None:
        raise KubeConfigError(f"kubeconfig {kubeconfig}: context {name!r} not found")
    cluster = named["clusters"].get(ctx.value.get("cluster") or "")
    if cluster is None or not cluster.value.get("server"):
        raise KubeConfigError(f"kubeconfig {kubeconfig}: context {name!r} names no cluster with a server")
    user = named["users"].get(ctx.value.get("user") or "") or _Entry({}, paths[0].parent)
    if _fallback_needed(user):
        return via_kubernetes_package(kubeconfig, name)

    ca_data = _data(cluster, "certificate-authority-data")
    credentials: Credentials | None = None
    if user.value.get("token"):
        credentials = StaticToken(str(user.value["token"]))
    elif user.value.get("tokenFile"):
        token_file = _path(user, "tokenFile")
        assert token_file is not None
        credentials = FileToken(Path(token_file))
    elif user.value.get("username") and user.value.get("password"):
        credentials = BasicAuth(str(user.value["username"]), str(user.value["password"]))
    return KubeConfig(
        server=str(cluster.value["server"]).rstrip("/"),
        ca_file=None if ca_data else _path(cluster, "certificate-authority"),
        ca_data=ca_data.decode("ascii", errors="replace") if ca_data else None,
        insecure=bool(cluster.value.get("insecure-skip-tls-verify")),
        cert_file=_path(user, "client-certificate"),
        key_file=_path(user, "client-key"),
        cert_data=_data(user, "client-certificate-data"),
        key_data=_data(user, "client-key-data"),
        credentials=credentials,
        proxy=cluster.value.get("proxy-url") or None,
        tls_server_name=cluster.value.get("tls-server-name") or None,
    )


def via_kubernetes_package(kubeconfig: str, context: str | None = None) -> KubeConfig:
    """exec / auth-provider users: the `kubernetes` package runs the plugin (imported here only)."""
    try:
        from kubernetes import client, config  # heavy (~0.5 s): only for these users
    except ImportError as err:  # the functions' image does not ship it: in a pod, the SA is used
        raise KubeConfigError(
            f"kubeconfig {kubeconfig}: its user runs an exec or auth-provider plugin, which needs "
            "the kubernetes package (pip install 'loraflow[cli]')"
        ) from err

    configuration = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=configuration)
    return KubeConfig(
        server=str(configuration.host).rstrip("/"),
        ca_file=configuration.ssl_ca_cert or None,
        insecure=not configuration.verify_ssl,
        cert_file=configuration.cert_file or None,
        key_file=configuration.key_file or None,
        credentials=HookedToken(configuration),
        proxy=configuration.proxy or None,
        tls_server_name=getattr(configuration, "tls_server_name", None) or None,
    )


def load(kubeconfig: str | None, sa_dir: Path = SERVICE_ACCOUNT_DIR) -> KubeConfig:
    """A kubeconfig when one is given, else the in-cluster service account."""
    return from_kubeconfig(kubeconfig) if kubeconfig else in_cluster(sa_dir)

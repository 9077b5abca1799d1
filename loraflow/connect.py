"""Where the CLI talks to: a real cluster and filer, or the embedded stack's endpoints file.

Resolution (first match wins):
- Kubernetes: `--endpoints FILE` > `--kubeconfig FILE` > `.devstack/endpoints.json` when present >
  the kubernetes client's standard loading (`$KUBECONFIG`, `~/.kube/config`, then in-cluster).
- Filer: `--filer-url` > the endpoints file > `$LORAFLOW_FILER_URL` > the in-cluster default.
- Broker: `--broker-url` > the endpoints file.
- Filer write token (a filer with `jwt.filer_signing` refuses writes without one):
  `--filer-token-file` > `$LORAFLOW_FILER_TOKEN` > the endpoints file's token for the namespace >
  none.
- Where in the filer: the functions' storage paths as they are, or under the S3 bucket's folder
  when the storage backend is S3 (the endpoints file's `storage.backend`, else
  `$LORAFLOW_STORAGE`): the functions then read the files through the gateway.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException

from loraflow.errors import CliError

DEFAULT_ENDPOINTS = Path(".devstack/endpoints.json")
DEFAULT_FILER_URL = "http://seaweedfs-filer.seaweedfs:8888"
BUCKET, BUCKETS_DIR = "loraadapters", "/buckets"
"""The functions' LORAFLOW_S3_BUCKET and LORAFLOW_S3_BUCKETS_DIR defaults (functions.settings;
not imported: pydantic would cost every command its start-up time)."""


@dataclass(frozen=True)
class Endpoints:
    """The embedded stack's `.devstack/endpoints.json` (only the keys the CLI uses)."""

    kube_url: str | None = None
    kube_token: str | None = None
    kube_ca_file: str | None = None
    """PEM of the CA the stack's API server certificate is signed by (it serves HTTPS)."""
    filer_url: str | None = None
    broker_url: str | None = None
    functions: dict[str, str] = field(default_factory=dict)
    s3_bucket: str | None = None
    """The bucket the functions read when the stack's storage backend is S3 (None: the filer)."""
    filer_tokens: dict[str, str] = field(default_factory=dict)
    """Namespace -> the tenant's filer write token, when the stack's filer requires tokens."""

    @classmethod
    def load(cls, path: Path) -> Endpoints:
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError as err:
            raise CliError(f"endpoints file {path} does not exist (is `make serve` running?)") from err
        except (OSError, ValueError) as err:
            raise CliError(f"endpoints file {path} is not readable JSON: {err}") from err
        if not isinstance(raw, dict):
            raise CliError(f"endpoints file {path} does not hold a JSON object")
        return cls.from_json(raw)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Endpoints:
        kube, filer, broker = (_section(raw, key) for key in ("kubernetes", "filer", "broker"))
        storage = _section(raw, "storage")
        functions = raw.get("functions")
        tokens = filer.get("tenant_tokens")
        s3_bucket = (
            _str(_section(storage, "s3").get("bucket")) or BUCKET if storage.get("backend") == "s3" else None
        )
        return cls(
            kube_url=_str(kube.get("url")),
            kube_token=_str(kube.get("token")),
            kube_ca_file=_str(kube.get("certificate_authority")),
            filer_url=_str(filer.get("url")),
            broker_url=_str(broker.get("url")),
            functions={str(k): str(v) for k, v in functions.items()} if isinstance(functions, dict) else {},
            s3_bucket=s3_bucket,
            filer_tokens={str(k): str(v) for k, v in tokens.items()} if isinstance(tokens, dict) else {},
        )


def _section(raw: dict[str, Any], key: str) -> dict[str, Any]:
    value = raw.get(key)
    return value if isinstance(value, dict) else {}


def _str(value: Any) -> str | None:
    return str(value) if value else None


@dataclass(frozen=True)
class Target:
    """What one CLI invocation was pointed at."""

    endpoints: Endpoints | None
    kubeconfig: str | None
    filer_url: str
    broker_url: str | None
    filer_root: str = ""
    """Where the functions' storage paths are in the filer: "" for the filer backend, the
    bucket's folder for S3 (the gateway keeps an object's bytes at /buckets/<bucket>/<key>)."""


def resolve(
    endpoints: str | None = None,
    kubeconfig: str | None = None,
    filer_url: str | None = None,
    broker_url: str | None = None,
) -> Target:
    found = _endpoints(endpoints, kubeconfig)
    filer = (
        filer_url
        or (found.filer_url if found else None)
        or os.environ.get("LORAFLOW_FILER_URL")
        or DEFAULT_FILER_URL
    )
    broker = broker_url or (found.broker_url if found else None)
    root = filer_root(found)
    return Target(found, kubeconfig, filer.rstrip("/"), broker.rstrip("/") if broker else None, root)


def filer_root(found: Endpoints | None) -> str:
    """The embedded stack's backend when its endpoints file is used, else the functions' own
    settings from the environment (LORAFLOW_STORAGE, LORAFLOW_S3_BUCKET, LORAFLOW_S3_BUCKETS_DIR)."""
    if found is not None:
        bucket = found.s3_bucket
    else:
        bucket = (
            os.environ.get("LORAFLOW_S3_BUCKET") or BUCKET
            if os.environ.get("LORAFLOW_STORAGE") == "s3"
            else None
        )
    if bucket is None:
        return ""
    buckets = os.environ.get("LORAFLOW_S3_BUCKETS_DIR") or BUCKETS_DIR
    return f"{buckets.rstrip('/')}/{bucket}"


def filer_token(target: Target, namespace: str, token_file: Path | None = None) -> str | None:
    """The filer write token of an upload into `namespace` (None: send none)."""
    if token_file is not None:
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as err:
            raise CliError(f"cannot read the filer token file {token_file}: {err}") from err
        if not token:
            raise CliError(f"the filer token file {token_file} is empty")
        return token
    found = os.environ.get("LORAFLOW_FILER_TOKEN", "").strip()
    if found:
        return found
    return target.endpoints.filer_tokens.get(namespace) if target.endpoints is not None else None


def _endpoints(explicit: str | None, kubeconfig: str | None) -> Endpoints | None:
    if explicit:
        return Endpoints.load(Path(explicit))
    if kubeconfig is None and DEFAULT_ENDPOINTS.is_file():
        return Endpoints.load(DEFAULT_ENDPOINTS)
    return None


def kube_client(target: Target) -> client.ApiClient:
    """An ApiClient for the embedded stack (url + bearer token) or from kubeconfig/in-cluster."""
    endpoints = target.endpoints
    if endpoints is not None and endpoints.kube_url:
        configuration = client.Configuration()
        configuration.host = endpoints.kube_url.rstrip("/")
        if endpoints.kube_token:
            configuration.api_key = {"BearerToken": endpoints.kube_token}
            configuration.api_key_prefix = {"BearerToken": "Bearer"}
        if endpoints.kube_ca_file:
            configuration.ssl_ca_cert = endpoints.kube_ca_file
        configuration.retries = 0
        return client.ApiClient(configuration)
    return _standard_client(target.kubeconfig)


def _standard_client(kubeconfig: str | None) -> client.ApiClient:
    configuration = client.Configuration()
    try:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    except (ConfigException, OSError, TypeError) as kube_err:
        if kubeconfig:
            raise CliError(f"cannot load kubeconfig {kubeconfig}: {kube_err}") from kube_err
        try:
            config.load_incluster_config(client_configuration=configuration)
        except ConfigException as err:
            raise CliError(
                "no Kubernetes configuration: pass --kubeconfig or --endpoints, set KUBECONFIG, "
                f"or start the embedded stack (`make serve`) ({kube_err})"
            ) from err
    configuration.retries = 0
    return client.ApiClient(configuration)


def default_namespace(target: Target) -> str:
    """The kubeconfig context's namespace (like kubectl), else `default`."""
    if target.endpoints is not None and target.endpoints.kube_url:
        return "default"
    try:
        _, active = config.list_kube_config_contexts(config_file=target.kubeconfig)
    except (ConfigException, OSError, TypeError):
        return "default"
    namespace = ((active or {}).get("context") or {}).get("namespace")
    return str(namespace) if namespace else "default"

"""The embedded stack: every part of a loraflow cluster, on one laptop, in one process.

    with Stack(ping_period=5) as stack:
        stack.endpoints()      # URLs and the admin token, as `serve` writes them
        stack.settle()         # wait until the broker is quiet

Parts (ARCHITECTURE.md section 7): a real kube-apiserver and etcd (devstack.kubernetes: Knative's
CRDs and the whole rendered knative/ tree applied, RBAC enforced; the functions and the watcher
use their ServiceAccounts' tokens from the TokenRequest API, the functions through a
fault-injecting proxy, `stack.kube`), a real SeaweedFS (`weed server`, devstack.seaweedfs:
master, volume, filer and, for the S3 backend, the S3 gateway) whose webhook queue notifies
ingest, every function served by functions-framework, the broker routing by the Triggers, the
ApiServerSource and PingSource stand-ins, the workload stand-in (Pods and engine replicas that
read adapter files through the filer, as through a SeaweedFS mount), and an EventSink as the
dead-letter sink.

Storage (`storage=`, else LORAFLOW_STORAGE as for the functions): "filer" (uploads through
the filer's HTTP API) or "s3" (uploads through the real S3 gateway into the bucket
`loraadapters`; the functions read it with boto3 and the engines through the filer folder
/buckets/loraadapters). The functions reach the filer through a FaultProxy (`stack.filer`),
so a test can make it fail without touching the real server (`stack.seaweed`).

`filer_signing=True` (what `make run` and `make serve` start): the stack's own SeaweedFS requires
a write token (`[jwt.filer_signing]`, devstack.seaweedfs.tokens). The functions get loraflow's
unscoped token in a file (LORAFLOW_FILER_TOKEN_FILE), `upload()` sends the token of the namespace
it writes into (scoped to `/loraadapters/<ns>`), and `endpoints()` lists a tenant token per
namespace for the CLI. A shared server keeps the key it was started with.

The webhook goes through a WebhookRelay (`stack.relay`) that forwards each delivery to ingest
unchanged; it lets `settle()` know when the filer's notifications are out, and lets a test
session share one SeaweedFS between stacks (`seaweed=devstack.seaweedfs.shared()`).

Notifications (`notifications=`, else LORAFLOW_NOTIFICATIONS, default "webhook"): "webhook"
(the filer's webhook queue posts to ingest), "source" (the filer source, `python -m
functions.filer_source`, follows the filer's metadata log as knative/components/filer-source
deploys it: its own process, its ServiceAccount, its Lease, its Trigger), or "both" (the events
are idempotent). Processes of their own (the filer source; the functions with
`function_processes=True`) are supervised: one that dies is started again, as a kubelet would
(devstack.supervisor), and `endpoints()["processes"]` names each with its pid.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Literal, get_args

import boto3
import httpx
from kubernetes import client, config

from devstack.eventing.apiserversource import ApiServerSource
from devstack.eventing.broker import Broker, BrokerClient, Faults
from devstack.eventing.informer import Connection
from devstack.eventing.pingsource import PingSource
from devstack.eventing.sink import EventSink
from devstack.eventing.triggers import (
    KNATIVE_DIR,
    ManifestError,
    of_kind,
    read_files,
    render,
    subscriber_service,
)
from devstack.eventing.triggerwatch import TriggerWatch
from devstack.functions_host import FUNCTIONS, FunctionHost, ProcessFunctionHost, launch_source
from devstack.kubernetes import Kube, close_client, prepared
from devstack.seaweedfs import (
    BUCKET,
    MOUNT_ROOT,
    FaultProxy,
    SeaweedServer,
    Shared,
    Webhook,
    WebhookRelay,
    settle_marker,
)
from devstack.seaweedfs.tokens import loraflow_token, tenant_token
from devstack.supervisor import Supervisor
from devstack.workload import Workload
from functions.adapters.storage import quote_path
from functions.edge.bootstrap import reset_deps
from functions.logic.paths import STORAGE_ROOT, is_label

log = logging.getLogger("devstack.stack")

FUNCTION_SERVICE_PREFIX = "loraflow-"
DEAD_LETTER_SERVICE = "loraflow-dead-letters"
Storage = Literal["filer", "s3"]
Notifications = Literal["webhook", "source", "both"]
SOURCE_COMPONENT = "filer-source"
SOURCE_ACCOUNT = "loraflow-filer-source"
SOURCE_PROCESS = "filer-source"
FUNCTIONS_TOKEN_TTL_S = 365 * 86400
"""The functions' filer token is written once at start: it outlives any `make serve`."""


def storage_from_env() -> Storage:
    value = os.environ.get("LORAFLOW_STORAGE") or "filer"
    if value not in ("filer", "s3"):
        raise ValueError(f"LORAFLOW_STORAGE={value!r}: expected 'filer' or 's3'")
    return "s3" if value == "s3" else "filer"


def notifications_from_env() -> Notifications:
    value = os.environ.get("LORAFLOW_NOTIFICATIONS") or "webhook"
    for known in get_args(Notifications):
        if value == known:
            return known  # type: ignore[no-any-return]
    raise ValueError(f"LORAFLOW_NOTIFICATIONS={value!r}: expected 'webhook', 'source' or 'both'")


def component(knative_dir: Path, name: str) -> list[dict[str, Any]]:
    """The manifests of an optional component (knative/components/<name>), as its files say."""
    folder = knative_dir / "components" / name
    return read_files(sorted(folder.glob("*.yaml"))) if folder.is_dir() else []


def _quietly(stopper: Callable[[], None]) -> None:
    try:
        stopper()
    except Exception:
        log.exception("stopping %s failed", stopper)


def service_account_user(manifest: Mapping[str, Any], default_namespace: str) -> str:
    meta = manifest.get("metadata") or {}
    return f"system:serviceaccount:{meta.get('namespace', default_namespace)}:{meta['name']}"


class Stack:
    """Compose, start and stop every part; `start()` returns once each part answers.

    `function_processes`: each function in its own functions-framework process, as each
    Knative Service in a cluster (slower to start; what latency measurements want), instead
    of in this process. `filer_proxy=False`: the functions call the filer directly, without
    the FaultProxy hop (the benchmarks)."""

    def __init__(
        self,
        data_dir: Path | None = None,
        *,
        ping_period: float | None = 5.0,
        engine_defaults: Mapping[str, Any] | None = None,
        faults: Faults | None = None,
        storage: Storage | None = None,
        seaweed: Shared | None = None,
        time_scale: float = 1.0,
        manifests: Sequence[Mapping[str, Any]] | None = None,
        knative_dir: Path = KNATIVE_DIR,
        function_env: Mapping[str, str] | None = None,
        function_processes: bool = False,
        filer_proxy: bool = True,
        kube_proxy: bool = True,
        notifications: Notifications | None = None,
        filer_signing: bool = False,
    ) -> None:
        self._own_dir = data_dir is None
        self.base = (
            Path(tempfile.mkdtemp(prefix="loraflow-devstack-")) if data_dir is None else Path(data_dir)
        )
        self.mount_root = MOUNT_ROOT
        self.ping_period = ping_period
        self.engine_defaults = dict(engine_defaults or {})
        self.faults = faults
        self.storage: Storage = storage or storage_from_env()
        self.bucket = BUCKET
        self._shared = seaweed
        self.time_scale = time_scale
        self.knative_dir = knative_dir
        self.notifications: Notifications = notifications or notifications_from_env()
        source = self.notifications != "webhook"
        self.manifests = (
            [dict(m) for m in manifests]
            if manifests is not None
            else render(knative_dir, components=(SOURCE_COMPONENT,) if source else ())
        )
        self.source_manifests: list[dict[str, Any]] = []
        if source:  # the component's objects as rendered (given manifests without them: its files)
            ours = {(m["kind"], m["metadata"]["name"]) for m in component(knative_dir, SOURCE_COMPONENT)}
            rendered = {(m.get("kind"), (m.get("metadata") or {}).get("name")): m for m in self.manifests}
            self.manifests += [
                m
                for m in component(knative_dir, SOURCE_COMPONENT)
                if (m["kind"], m["metadata"]["name"]) not in rendered
            ]
            self.source_manifests = [
                m for m in self.manifests if (m.get("kind"), (m.get("metadata") or {}).get("name")) in ours
            ]
        self.function_env = dict(function_env or {})
        self.function_processes = function_processes
        self.filer_proxy = filer_proxy
        self.filer_signing = filer_signing
        self.kube_proxy = kube_proxy
        self.webhook_token = seaweed.webhook_token if seaweed is not None else secrets.token_hex(16)
        self._stoppers: list[tuple[int, Callable[[], None]]] = []
        self._saved_env: dict[str, str | None] = {}

    # -- lifecycle ----------------------------------------------------------------------------------
    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Stack:
        self.supervisor = Supervisor()
        self._on_stop(self.supervisor.stop, tier=1)
        try:
            self._start_kube()
            self._start_storage()
            self._start_functions_and_broker()
            self._start_notifications()
            self._start_sources()
            self._start_workload()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every part, tier by tier (sources, then functions and broker, then the servers,
        then the workload, whose watches end as soon as the API server is gone); the parts of a
        tier stop concurrently. Restores the environment and forgets the functions' clients."""
        for tier in sorted({t for t, _ in self._stoppers}):
            stoppers = [fn for t, fn in reversed(self._stoppers) if t == tier]
            threads = [threading.Thread(target=_quietly, args=(fn,), name="stack-stop") for fn in stoppers]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=30)
        self._stoppers.clear()
        self._restore_env()
        if self._own_dir:
            shutil.rmtree(self.base, ignore_errors=True)

    def _on_stop(self, stopper: Callable[[], None], tier: int = 2) -> None:
        self._stoppers.append((tier, stopper))

    # -- parts ---------------------------------------------------------------------------------------
    def _start_kube(self) -> None:
        # The real kube-apiserver and etcd, with every manifest of the rendered knative/ tree
        # applied (and Knative's CRDs first), as a cluster running loraflow has them. The
        # functions reach it through the fault proxy with their ServiceAccounts' tokens.
        self.base.mkdir(parents=True, exist_ok=True)
        self.control_plane = prepared(self.manifests, self.base / "kube", controllers=True)
        self._on_stop(self.control_plane.stop, tier=3)
        self.kube = Kube(self.control_plane, proxy=self.kube_proxy)
        self._on_stop(self.kube.stop)
        admin = self.base / "admin.kubeconfig"
        self.kube.write_kubeconfig(admin)
        self.admin_kubeconfig = admin
        self.api = config.new_client_from_config(str(admin))
        self._on_stop(partial(close_client, self.api), tier=4)

    def _kubeconfig_for(self, service_account: str, proxied: bool = True) -> Path:
        """A kubeconfig holding a token of the ServiceAccount named in knative/rbac (TokenRequest);
        `proxied`: through the fault proxy (loraflow's own processes), else to the server itself."""
        accounts = {m["metadata"]["name"]: m for m in of_kind(self.manifests, "ServiceAccount")}
        if service_account not in accounts:
            raise ManifestError(f"ServiceAccount {service_account!r} not found in the manifests")
        namespace = accounts[service_account]["metadata"].get("namespace", "loraflow")
        path = self.base / f"{service_account}.kubeconfig"
        if proxied:
            return self.kube.service_account_kubeconfig(path, namespace, service_account)
        token = self.control_plane.service_account_token(namespace, service_account)
        return self.kube.write_kubeconfig(path, token, namespace)

    def _start_storage(self) -> None:
        if self._shared is not None:
            self.seaweed, self.relay = self._shared.server, self._shared.relay
        else:
            self.relay = WebhookRelay().start()
            self._on_stop(self.relay.stop, tier=3)
            self.seaweed = SeaweedServer(
                webhook=Webhook(self.relay.url, bearer_token=self.webhook_token),
                s3=self.storage == "s3",
                base_dir=self.base / "seaweedfs",
                signing_key=secrets.token_hex(32) if self.filer_signing else None,
            ).start()
            self._on_stop(self.seaweed.stop)
        self.filer = FaultProxy(self.seaweed.url).start()
        self._on_stop(self.filer.stop)
        self.http = httpx.Client(timeout=30)  # the stack's and its users' client: closed at stop
        self.filer_token_file: Path | None = None
        if self.seaweed.signing_key is not None:
            self.filer_token_file = self.base / "filer-token"
            self.filer_token_file.write_text(loraflow_token(self.seaweed.signing_key, FUNCTIONS_TOKEN_TTL_S))
            self.filer_token_file.chmod(0o600)
        self._on_stop(self.http.close, tier=4)
        if self.storage == "s3":
            # the stack uploads as the platform's operator; the functions sign as loraflow
            self.s3 = boto3.client("s3", endpoint_url=self.seaweed.s3_url, **self.seaweed.s3_operator.boto())
            with contextlib.suppress(self.s3.exceptions.BucketAlreadyOwnedByYou):
                self.s3.create_bucket(Bucket=self.bucket)
        self.sink = EventSink().start()
        self._on_stop(self.sink.stop)

    def _start_functions_and_broker(self) -> None:
        brokers = of_kind(self.manifests, "Broker")
        name = str(brokers[0]["metadata"]["name"]) if brokers else "default"
        namespace = str(brokers[0]["metadata"].get("namespace", "default")) if brokers else "default"
        self.broker = Broker([], self._resolve, name=name, time_scale=self.time_scale, faults=self.faults)
        self._on_stop(self.broker.stop, tier=1)
        self._set_env(self._function_env())
        self.functions: FunctionHost | ProcessFunctionHost = self._function_host().start()
        self._on_stop(self.functions.stop, tier=1)
        self.broker.start()
        # Routes come from the Trigger objects in the API server, watched as Knative's broker
        # filter does: what `kubectl apply` adds or changes routes, what it deletes stops.
        admin = Connection(self.kube.url, self.kube.admin_token, str(self.kube.tls.ca_file))
        self.trigger_watch = TriggerWatch(admin, self.broker, namespace).start()
        self._on_stop(self.trigger_watch.stop, tier=1)

    def _function_host(self) -> FunctionHost | ProcessFunctionHost:
        """Where the functions run (not started yet). A subclass may put them elsewhere:
        bench/activator.py starts each process on its first request, as a Service scaled to zero."""
        if self.function_processes:
            return ProcessFunctionHost(log_dir=self.base / "functions", supervisor=self.supervisor)
        return FunctionHost()

    def _function_env(self) -> dict[str, str]:
        """docs/contracts.md's configuration table, pointed at the stand-ins."""
        return {
            # each function as its own ServiceAccount (knative/rbac/functions.yaml); ingest has none
            **{
                f"KUBECONFIG_{name.upper()}": str(self._kubeconfig_for(f"loraflow-{name}"))
                for name in FUNCTIONS
                if name != "ingest"
            },
            "LORAFLOW_STORAGE": self.storage,
            "LORAFLOW_FILER_URL": self.filer.url if self.filer_proxy else self.seaweed.url,
            "LORAFLOW_LOOPBACK_ENGINES": "allow",  # the engine stand-ins listen on 127.0.0.x
            "LORAFLOW_MOUNT_ROOT": str(self.mount_root),
            **(self._s3_env() if self.storage == "s3" else {}),
            "LORAFLOW_BROKER_URL": self.broker.url,
            "K_SINK": self.broker.url,
            "LORAFLOW_WEBHOOK_TOKEN": self.webhook_token,
            **({"LORAFLOW_FILER_TOKEN_FILE": str(self.filer_token_file)} if self.filer_token_file else {}),
            "LORAFLOW_ENGINE_TIMEOUT": "5",
            **self.function_env,
        }

    def _s3_env(self) -> dict[str, str]:
        return {
            "LORAFLOW_S3_ENDPOINT": self.seaweed.s3_url,
            "LORAFLOW_S3_BUCKET": self.bucket,
            **self.seaweed.s3_loraflow.env(),
        }

    def _resolve(self, destination: Mapping[str, Any]) -> str:
        """A Destination -> URL: Service `loraflow-<fn>` -> that function, the dead-letter Service
        -> the EventSink, `uri` as is. Anything else fails the start (never a silent no-route)."""
        if destination.get("uri") and not destination.get("ref"):
            return str(destination["uri"])
        service = subscriber_service(destination)
        if service == DEAD_LETTER_SERVICE:
            return self.sink.url
        function = (service or "").removeprefix(FUNCTION_SERVICE_PREFIX)
        if function in self.functions.urls:
            return self.functions.urls[function]
        raise ManifestError(f"cannot resolve destination {dict(destination)!r} to a local URL")

    def _start_notifications(self) -> None:
        if self.notifications != "source":
            subscription = contextlib.ExitStack()
            subscription.enter_context(self.relay.subscribed(self.functions.urls["ingest"]))
            self._on_stop(subscription.close, tier=0)
        if self.notifications != "webhook":
            self._start_filer_source()

    def _start_filer_source(self) -> None:
        """The ContainerSource of knative/components/filer-source, as a process of its own: its
        ServiceAccount's token, its Lease, K_SINK the broker, the real filer's gRPC port."""
        (source,) = of_kind(self.source_manifests, "ContainerSource")
        (container,) = source["spec"]["template"]["spec"]["containers"]
        env = {
            **os.environ,  # the functions' configuration (loraflow-config in a cluster)
            **{e["name"]: e["value"] for e in container.get("env") or [] if "value" in e},
            "KUBECONFIG": str(self._kubeconfig_for(source["spec"]["template"]["spec"]["serviceAccountName"])),
            "LORAFLOW_FILER_URL": self.seaweed.url,
            "LORAFLOW_FILER_GRPC": f"{self.seaweed.host}:{self.seaweed.ports['filer_grpc']}",
            "K_SINK": self.broker.url,
            "LORAFLOW_BROKER_URL": self.broker.url,
        }
        out = (self.base / "filer-source.log").open("ab")
        self._on_stop(out.close, tier=4)
        self.supervisor.add(SOURCE_PROCESS, lambda: launch_source(env, out))
        self._on_stop(lambda: self.supervisor.remove(SOURCE_PROCESS), tier=0)  # before the broker

    def _start_sources(self) -> None:
        sink = BrokerClient(self.broker.url)
        self._on_stop(sink.close, tier=1)
        self.sources: list[ApiServerSource] = []
        for manifest in of_kind(self.manifests, "ApiServerSource"):
            account = str((manifest.get("spec") or {}).get("serviceAccountName") or "default")
            api = config.new_client_from_config(str(self._kubeconfig_for(account, proxied=False)))
            self._on_stop(partial(close_client, api), tier=4)
            source = ApiServerSource(manifest, api, sink, source_url=self.kube.url).start()
            self._on_stop(source.stop, tier=0)
            self.sources.append(source)
        self.pings = [
            PingSource(m, sink, self.ping_period).start() for m in of_kind(self.manifests, "PingSource")
        ]
        for ping in self.pings:
            self._on_stop(ping.stop, tier=0)

    def _start_workload(self) -> None:
        self.workload = Workload(
            self.api,
            mount_root=self.mount_root,
            filer_url=self.seaweed.url,
            filer_root=f"/buckets/{self.bucket}" if self.storage == "s3" else "",
            **self.engine_defaults,
        )
        self.workload.run()
        self._on_stop(self.workload.stop, tier=3)

    # -- environment -----------------------------------------------------------------------------------
    def _set_env(self, env: Mapping[str, str]) -> None:
        for key, value in env.items():
            self._saved_env.setdefault(key, os.environ.get(key))
            os.environ[key] = value
        reset_deps()

    def _restore_env(self) -> None:
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_env.clear()
        reset_deps()

    # -- what callers use ---------------------------------------------------------------------------------
    def upload(self, path: str, content: bytes) -> None:
        """Store a file as a user would on this stack's backend: a filer PUT, or an S3 PutObject
        through the gateway (key = the path without its leading slash)."""
        if self.storage == "s3":
            self.s3.put_object(Bucket=self.bucket, Key=path.lstrip("/"), Body=content)
        else:
            headers = self.seaweed.write_headers(tenant_of(path))
            put = self.http.put(self.seaweed.url + quote_path(path), content=content, headers=headers)
            put.raise_for_status()

    def settle(self, timeout: float = 10.0, quiet: float = 0.3) -> bool:
        """Wait until the filer's notifications so far are out, then until the broker had
        nothing in flight for `quiet` s. The barrier is a marker file: the webhook queue has
        one worker, and the filer source publishes in the log's order, so once the marker's
        notification went through, so did every earlier one."""
        delivered = True
        if self.notifications != "source":
            marker = settle_marker()
            ours = self.seaweed.write_headers()
            self.http.put(self.seaweed.url + marker, content=b"", headers=ours).raise_for_status()
            delivered = self.relay.await_key(marker, timeout)
            self.http.delete(self.seaweed.url + marker, headers=ours)
        if self.notifications != "webhook":
            delivered = self._source_barrier(timeout) and delivered
        idle = self.broker.wait_idle(timeout, quiet=quiet)
        if not (idle and delivered):
            log.warning(
                "not settled in %.0f s: notifications out %s, broker idle %s", timeout, delivered, idle
            )
        return idle and delivered

    def _source_barrier(self, timeout: float) -> bool:
        """A marker's file.changed at the broker means the source published everything before it."""
        key = settle_marker()
        filer_path = (f"/buckets/{self.bucket}" if self.storage == "s3" else "") + key
        seq = max((e["seq"] for e in self.broker.log.since(0)), default=0)
        ours = self.seaweed.write_headers()
        self.http.put(self.seaweed.url + filer_path, content=b"", headers=ours).raise_for_status()
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                for entry in self.broker.log.since(seq):
                    if entry["subject"] == key and entry["outcome"] == "received":
                        return True
                time.sleep(0.01)
            return False
        finally:
            self.http.delete(self.seaweed.url + filer_path, headers=ours)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    def engines(self) -> list[dict[str, str]]:
        rows = []
        for key, replica in sorted(self.workload.fleet.items()):
            namespace, pod = key.split("/", 1)
            rows.append({"namespace": namespace, "pod": pod, "runtime": replica.engine, "url": replica.url})
        return rows

    def storage_endpoints(self) -> dict[str, Any]:
        """Where the files are: the backend, the real filer, and for S3 the gateway and bucket."""
        found: dict[str, Any] = {"backend": self.storage, "filer": self.seaweed.url}
        if self.storage == "s3":
            operator = self.seaweed.s3_operator  # the platform's own identity: it may do anything
            found["s3"] = {
                "url": self.seaweed.s3_url,
                "bucket": self.bucket,
                "access_key_id": operator.access_key,
                "secret_access_key": operator.secret_key,
            }
        return found

    def processes(self) -> list[dict[str, Any]]:
        """Every process the stack runs, with its pid: this one, the real SeaweedFS when the
        stack started it (a shared one belongs to its owner), and the supervised ones (which
        are started again when they die)."""
        found: list[dict[str, Any]] = [{"name": "devstack", "pid": os.getpid(), "supervised": False}]
        if self._shared is None and self.seaweed.pid is not None:
            found.append({"name": "seaweedfs", "pid": self.seaweed.pid, "supervised": False})
        found += [{**p, "supervised": True} for p in self.supervisor.processes()]
        return found

    def filer_endpoints(self) -> dict[str, Any]:
        """The filer's URL and, when it requires write tokens, a tenant token per namespace
        there is now (the CLI's upload picks its namespace's; `serve` rewrites them each second,
        so a new namespace gets one and none expires)."""
        found: dict[str, Any] = {"url": self.filer.url}
        if self.seaweed.signing_key is not None:
            names = sorted(n.metadata.name for n in self.core.list_namespace().items)
            found["tenant_tokens"] = {n: self.tenant_token(n) for n in names if is_label(n)}
        return found

    def tenant_token(self, namespace: str) -> str | None:
        """The filer write token of a tenant writing into `namespace` (None: none needed)."""
        if self.seaweed.signing_key is None:
            return None
        roots = ("", f"/buckets/{self.bucket}") if self.storage == "s3" else ("",)
        return tenant_token(self.seaweed.signing_key, namespace, filer_roots=roots)

    def endpoints(self) -> dict[str, Any]:
        """Everything a client needs, with exactly the keys `serve` writes to endpoints.json."""
        return {
            "notifications": self.notifications,
            "processes": self.processes(),
            "kubernetes": {
                "url": self.kube.url,
                "token": self.kube.admin_token,
                "certificate_authority": str(self.kube.tls.ca_file),
                "kubeconfig": str(self.admin_kubeconfig),
            },
            "filer": self.filer_endpoints(),
            "storage": self.storage_endpoints(),
            "broker": {"url": self.broker.url},
            "functions": dict(self.functions.urls),
            "engines": self.engines(),
        }


def tenant_of(path: str) -> str | None:
    """The namespace whose upload folder `path` lies in (None: not an upload, the stack's own)."""
    parts = path.split("/")
    if len(parts) > 3 and "/".join(parts[:2]) == STORAGE_ROOT and is_label(parts[2]):
        return parts[2]
    return None


@contextlib.contextmanager
def running(**options: Any) -> Any:
    with Stack(**options) as stack:
        yield stack

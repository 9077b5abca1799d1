"""The embedded stack: every part of a loraflow cluster, on one laptop, in one process.

    with Stack(ping_period=5) as stack:
        stack.endpoints()      # URLs and the admin token, as `serve` writes them
        stack.settle()         # wait until the broker is quiet

Parts (ARCHITECTURE.md section 7): the Kubernetes stand-in (CRDs from knative/crds, RBAC from
knative/rbac; the functions and the watcher use their ServiceAccounts' tokens, so RBAC is
enforced), the SeaweedFS filer (its data dir is the functions' LORAFLOW_MOUNT_ROOT, as a
SeaweedFS mount is in a cluster) notifying ingest by webhook (default) or through SQS (moto)
and the IntegrationSource stand-in, every function served by functions-framework, the broker
routing by knative/triggers, the ApiServerSource and PingSource stand-ins, the workload
stand-in (Pods and engine replicas), and an EventSink as the dead-letter sink.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import boto3
from kubernetes import client, config

from devstack.eventing.apiserversource import ApiServerSource
from devstack.eventing.broker import Broker, BrokerClient, Faults
from devstack.eventing.pingsource import PingSource
from devstack.eventing.sink import EventSink
from devstack.eventing.triggers import (
    KNATIVE_DIR,
    ManifestError,
    load_triggers,
    of_kind,
    render,
    subscriber_service,
)
from devstack.functions_host import FunctionHost, ProcessFunctionHost
from devstack.standins.filer import FilerServer
from devstack.standins.kube import KubeServer
from devstack.standins.sqs_bridge import SqsBridge
from devstack.workload import Workload
from functions._edge import reset_deps

log = logging.getLogger("devstack.stack")

FUNCTION_SERVICE_PREFIX = "loraflow-"
DEAD_LETTER_SERVICE = "loraflow-dead-letters"
QUEUE_NAME = "seaweedfs-notifications"
AWS = {"region_name": "us-east-1", "aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


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
    of in this process."""

    def __init__(
        self,
        data_dir: Path | None = None,
        *,
        ping_period: float | None = 5.0,
        engine_defaults: Mapping[str, Any] | None = None,
        faults: Faults | None = None,
        notifications: Literal["webhook", "sqs"] = "webhook",
        time_scale: float = 1.0,
        manifests: Sequence[Mapping[str, Any]] | None = None,
        knative_dir: Path = KNATIVE_DIR,
        function_env: Mapping[str, str] | None = None,
        function_processes: bool = False,
    ) -> None:
        self._own_dir = data_dir is None
        self.base = (
            Path(tempfile.mkdtemp(prefix="loraflow-devstack-")) if data_dir is None else Path(data_dir)
        )
        self.mount_root = self.base / "filer"
        self.ping_period = ping_period
        self.engine_defaults = dict(engine_defaults or {})
        self.faults = faults
        self.notifications = notifications
        self.time_scale = time_scale
        self.knative_dir = knative_dir
        # SQS notifications need the optional part that brings them in (knative/components/sqs).
        components = ("sqs",) if notifications == "sqs" else ()
        self.manifests = (
            [dict(m) for m in manifests] if manifests is not None else render(knative_dir, components)
        )
        self.function_env = dict(function_env or {})
        self.function_processes = function_processes
        self.webhook_token = secrets.token_hex(16)
        self._stoppers: list[tuple[int, Callable[[], None]]] = []
        self._saved_env: dict[str, str | None] = {}

    # -- lifecycle ----------------------------------------------------------------------------------
    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Stack:
        try:
            self._start_kube()
            self._start_storage()
            self._start_sqs()
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
        # HTTPS with the stand-in's own CA, as a cluster's API server: the functions, the sources and
        # kubectl verify it through the kubeconfigs (and kubectl sends a token over TLS only).
        self.kube = KubeServer(
            crd_dir=self.knative_dir / "crds",
            rbac_dir=self.knative_dir / "rbac",
            namespaces=("default",),
            tls=True,
        ).start()
        self._on_stop(self.kube.stop)
        self.base.mkdir(parents=True, exist_ok=True)
        admin = self.base / "admin.kubeconfig"
        self.kube.write_kubeconfig(admin, self.kube.admin_token)
        self.admin_kubeconfig = admin
        self.api = config.new_client_from_config(str(admin))
        self._on_stop(self.api.close, tier=4)

    def _kubeconfig_for(self, service_account: str) -> Path:
        """A kubeconfig holding the token of the ServiceAccount named in knative/rbac."""
        accounts = {m["metadata"]["name"]: m for m in of_kind(self.manifests, "ServiceAccount")}
        if service_account not in accounts:
            raise ManifestError(f"ServiceAccount {service_account!r} not found in the manifests")
        path = self.base / f"{service_account}.kubeconfig"
        token = self.kube.issue_token(service_account_user(accounts[service_account], "loraflow"))
        self.kube.write_kubeconfig(path, token)
        return path

    def _start_storage(self) -> None:
        self.mount_root.mkdir(parents=True, exist_ok=True)
        self.filer = FilerServer(data_dir=self.mount_root).start()
        self._on_stop(self.filer.stop)
        self.sink = EventSink().start()
        self._on_stop(self.sink.stop)

    def _start_sqs(self) -> None:
        from moto.server import ThreadedMotoServer

        self.moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.moto.start()
        self._on_stop(self.moto.stop)
        host, port = self.moto.get_host_and_port()
        self.sqs_url = f"http://{host}:{port}"
        self.sqs = boto3.client("sqs", endpoint_url=self.sqs_url, **AWS)
        self.queue_url: str = self.sqs.create_queue(QueueName=QUEUE_NAME)["QueueUrl"]

    def _start_functions_and_broker(self) -> None:
        brokers = of_kind(self.manifests, "Broker")
        name = str(brokers[0]["metadata"]["name"]) if brokers else "default"
        self.triggers = load_triggers(self.manifests, broker=name)
        self.broker = Broker(
            self.triggers, self._resolve, name=name, time_scale=self.time_scale, faults=self.faults
        )
        self._on_stop(self.broker.stop, tier=1)
        self._set_env(self._function_env())
        self.functions: FunctionHost | ProcessFunctionHost = self._function_host().start()
        self._on_stop(self.functions.stop, tier=1)
        self.broker.start()

    def _function_host(self) -> FunctionHost | ProcessFunctionHost:
        """Where the functions run (not started yet). A subclass may put them elsewhere:
        bench/activator.py starts each process on its first request, as a Service scaled to zero."""
        if self.function_processes:
            return ProcessFunctionHost(log_dir=self.base / "functions")
        return FunctionHost()

    def _function_env(self) -> dict[str, str]:
        """docs/contracts.md's configuration table, pointed at the stand-ins."""
        return {
            "KUBECONFIG": str(self._kubeconfig_for("loraflow-functions")),
            "LORAFLOW_STORAGE": "filer",
            "LORAFLOW_FILER_URL": self.filer.url,
            "LORAFLOW_MOUNT_ROOT": str(self.mount_root),
            "LORAFLOW_BROKER_URL": self.broker.url,
            "K_SINK": self.broker.url,
            "LORAFLOW_WEBHOOK_TOKEN": self.webhook_token,
            "LORAFLOW_ENGINE_TIMEOUT": "5",
            **self.function_env,
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
        self.bridge = SqsBridge(self.sqs, self.queue_url, BrokerClient(self.broker.url)).start()
        self._on_stop(self.bridge.stop, tier=0)
        if self.notifications == "sqs":
            self.filer.subscribe_sqs(self.sqs, self.queue_url)
        else:
            self.filer.subscribe_webhook(self.functions.urls["ingest"], bearer_token=self.webhook_token)

    def _start_sources(self) -> None:
        sink = BrokerClient(self.broker.url)
        self._on_stop(sink.close, tier=1)
        self.sources: list[ApiServerSource] = []
        for manifest in of_kind(self.manifests, "ApiServerSource"):
            account = str((manifest.get("spec") or {}).get("serviceAccountName") or "default")
            api = config.new_client_from_config(str(self._kubeconfig_for(account)))
            self._on_stop(api.close, tier=4)
            source = ApiServerSource(manifest, api, sink, source_url=self.kube.url).start()
            self._on_stop(source.stop, tier=0)
            self.sources.append(source)
        self.pings = [
            PingSource(m, sink, self.ping_period).start() for m in of_kind(self.manifests, "PingSource")
        ]
        for ping in self.pings:
            self._on_stop(ping.stop, tier=0)

    def _start_workload(self) -> None:
        self.workload = Workload(self.api, mount_root=self.mount_root, **self.engine_defaults)
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
    def settle(self, timeout: float = 10.0, quiet: float = 0.3) -> bool:
        """Wait until notifications are out and the broker had nothing in flight for `quiet` s."""
        self.filer.flush_notifications(timeout)
        return self.broker.wait_idle(timeout, quiet=quiet)

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

    def endpoints(self) -> dict[str, Any]:
        """Everything a client needs, with exactly the keys `serve` writes to endpoints.json."""
        return {
            "kubernetes": {
                "url": self.kube.url,
                "token": self.kube.admin_token,
                "certificate_authority": str(self.kube.tls.ca_file) if self.kube.tls else None,
                "kubeconfig": str(self.admin_kubeconfig),
            },
            "filer": {"url": self.filer.url},
            "broker": {"url": self.broker.url},
            "functions": dict(self.functions.urls),
            "sqs": {"url": self.sqs_url, "queue_url": self.queue_url},
            "engines": self.engines(),
        }


@contextlib.contextmanager
def running(**options: Any) -> Any:
    with Stack(**options) as stack:
        yield stack

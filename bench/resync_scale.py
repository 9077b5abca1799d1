"""8. Resync at internet scale on the real API server: 100,000 vllm and 10,000 sglang adapters,
1,000 ModelDeployments, 5,000 Ready pods.

The cluster: 100 tenant namespaces, each with 10 ModelDeployments of 4 replicas and 2
InferenceServices (sglang) of 5 replicas; every ModelDeployment names 100 adapters and every
InferenceService is claimed by 50 (the small size: 10 and 5, the same targets and pods). It
lives in a real kube-apiserver and etcd of the row's own (devstack.kubernetes.ControlPlane,
the rendered knative/ tree applied), each adapter Ready/Available, used and Loaded as load
writes it, each Pod Ready with its engine's address; each engine replica (5,000 vLLM/SGLang
stand-ins, each on its own 127.0.x.y address) lists what its pod serves (set in the stand-in's
state, no HTTP). 1% drifts: vllm adapters missing from one pod or with a stale `usedBy`, sglang
adapters missing from one pod, and an orphan copy (its LoRAAdapter gone) in one namespace in ten.

The world is built once: the namespaces, targets and the first object of each kind through the
API (creates and status writes), every further Pod and adapter written into etcd as the API
server stored that first one (`Etcd`), then etcd's history is compacted and defragmented and
its data directory kept under
.bench-cache/etcd/, keyed by the shape, the size, WORLD (bumped when the objects change) and the
control plane's versions; a later run starts etcd from a copy of it (and patches a Pod's
podIP where this run's engine got another address).

resync runs in functions-framework processes of its own (as in the cluster) with the default
page size (500), straight to the API server with its ServiceAccount's token: two instances,
one per core, with LORAFLOW_RESYNC_SHARDS=2, so that the tick (one ping per repeat, to the
first) is dealt into two parts by namespace, which `Parts` (the Broker's part: take each event
with a 202, then deliver it) hands to the instances in turn; the nudges go to the same sink.
Measured per size: the time from the ping to the last part's answer (the median of the ticks
after a first one, which is reported apart: the functions' first listings connect anew), the
peak RSS (VmHWM of the largest worker), the API requests made (the API server's audit log),
the server's time per adapter page (the audit log's) and the CPU of a tick: resync's, and
kube-apiserver's and etcd's apart; and at the small size, one instance judging the tick whole
(LORAFLOW_RESYNC_SHARDS=1). Reference: the bare reads in one process of their own (the same
paginated lists from the same server and one GET /v1/models per Ready pod, raw JSON, nothing
else), run after the measured ticks (once at the large size: minutes each on this machine).
Target: <= 1.3x the bare reads, <= 300 MiB and flat in N (large / small peak RSS), nudges only
for the drifted; the absolute tick time reported.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, Literal, NamedTuple
from urllib.parse import urlsplit

import httpx
from cloudevents.http import CloudEvent

from bench import world as w
from bench.common import Result, median_of
from bench.cpu import server_cpu
from devstack.eventing.sink import EventSink
from devstack.eventing.triggers import render
from devstack.kubernetes import FUNCTIONS_USERS, ControlPlane, Kube, prepare
from devstack.kubernetes.binaries import binaries
from devstack.ports import free_port
from devstack.processes import descendants
from devstack.seaweedfs import MOUNT_ROOT
from devstack.standins.engines.base import EngineReplica, LoadedAdapter
from devstack.standins.engines.fleet import EngineFleet
from devstack.workload import pod_body, pod_status
from events.domain import RESYNC_SHARD
from events.external import PING
from functions.logic.facts import file_set
from functions.resources.kinds import (
    FINALIZER,
    INFERENCE_SERVICE,
    MODEL_DEPLOYMENT,
    POD,
    SGLANG_ADAPTER,
    VLLM_ADAPTER,
    Kind,
)
from tests.support.objects import condition
from tests.support.testbed import environment
from tests.support.wait import NotReached, eventually

PAGE = 500  # LORAFLOW_LIST_PAGE_SIZE's default
WATCHED = (MODEL_DEPLOYMENT, INFERENCE_SERVICE, POD, VLLM_ADAPTER, SGLANG_ADAPTER)
"""The kinds a resync tick lists, whose watch caches a started server must fill first."""
INSTANCES = 2
"""resync instances a tick is dealt over (LORAFLOW_RESYNC_SHARDS): this machine's cores."""
ENGINE_POLL_S = None
"""Idle serving loops sleep until a connection arrives: 5,000 of them waking 20 times a second
would take the interpreter lock from the measuring."""
BUILDERS = 12
"""Requests in flight while a world is built (the server's two cores are the limit)."""
WORLD = "2"
"""The objects' version: bumped when what the world holds changes, so that no older copy is used."""
CACHE = w.ROOT / ".bench-cache" / "etcd"
RATIO = 1.3
MERGE = {"Content-Type": "application/merge-patch+json"}


class Shape(NamedTuple):
    namespaces: int
    deployments: int  # per namespace
    md_replicas: int
    services: int  # per namespace
    isvc_replicas: int


class Size(NamedTuple):
    per_deployment: int
    per_service: int


FULL = Shape(100, 10, 4, 2, 5)
SMOKE = Shape(3, 2, 2, 1, 2)


def _cond(type_: str, reason: str, message: str = "ok", status: str = "True") -> dict[str, Any]:
    return {**condition(type_, status, reason, message), "observedGeneration": 1}


def _path(kind: Kind, ns: str, name: str = "") -> str:
    prefix = f"/apis/{kind.group}/{kind.version}" if kind.group else f"/api/{kind.version}"
    return f"{prefix}/namespaces/{ns}/{kind.plural}" + (f"/{name}" if name else "")


def cache_dir(shape: Shape, size: Size) -> Path:
    """Where the etcd data of this world is kept: its shape, size, WORLD and the binaries' versions."""
    key = "-".join(map(str, (*shape, *size)))
    return CACHE / f"resync-{key}-w{WORLD}-{binaries().folder.name}"


class Builder:
    """Requests to the API server, BUILDERS at a time, each thread on a keep-alive client of its own."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self._local = threading.local()
        self._clients: list[httpx.Client] = []
        self._lock = threading.Lock()
        self.pool = ThreadPoolExecutor(BUILDERS, thread_name_prefix="build")

    def http(self) -> httpx.Client:
        client: httpx.Client | None = getattr(self._local, "client", None)
        if client is None:
            client = self.plane.http(timeout=120)
            self._local.client = client
            with self._lock:
                self._clients.append(client)
        return client

    def create(self, path: str, body: dict[str, Any], status: dict[str, Any] | None = None) -> dict[str, Any]:
        """POST `body` to the collection `path`; then, if given, its status (a subresource)."""
        http = self.http()
        answer = http.post(path, json=body)
        if answer.status_code >= 300:
            raise RuntimeError(f"POST {path}: {answer.status_code} {answer.text[:500]}")
        created: dict[str, Any] = answer.json()
        if status is not None:
            self.status(f"{path}/{created['metadata']['name']}", status)
        return created

    def status(self, path: str, status: dict[str, Any]) -> None:
        answer = self.http().patch(f"{path}/status", content=json.dumps({"status": status}), headers=MERGE)
        if answer.status_code >= 300:
            raise RuntimeError(f"PATCH {path}/status: {answer.status_code} {answer.text[:500]}")

    def all(self, work: Sequence[Callable[[], Any]]) -> list[Any]:
        return [f.result() for f in [self.pool.submit(job) for job in work]]

    def close(self) -> None:
        self.pool.shutdown()
        for client in self._clients:
            client.close()


class Cluster:
    """The engines (one per pod, in this process) and the objects of one size in the API server."""

    def __init__(self, fleet: EngineFleet, shape: Shape, root: Path) -> None:
        self.fleet, self.shape, self.root = fleet, shape, root
        self.namespaces = [f"tenant-{n:03d}" for n in range(shape.namespaces)]
        self.md_pods: dict[tuple[str, str], list[str]] = {}
        self.isvc_pods: dict[tuple[str, str], list[str]] = {}
        for ns in self.namespaces:  # in a fixed order: a fresh process gives each the same address
            for s in range(shape.services):
                self.isvc_pods[(ns, f"svc{s}")] = self._engines(ns, f"svc{s}", shape.isvc_replicas, "sglang")
            for d in range(shape.deployments):
                self.md_pods[(ns, f"d{d}")] = self._engines(ns, f"d{d}", shape.md_replicas, "vllm")

    @property
    def pods(self) -> int:
        return sum(map(len, self.md_pods.values())) + sum(map(len, self.isvc_pods.values()))

    def _engines(self, ns: str, target: str, replicas: int, runtime: Literal["vllm", "sglang"]) -> list[str]:
        names = [f"{target}-{r}" for r in range(replicas)]
        for name in names:
            if f"{ns}/{name}" not in self.fleet:
                self.fleet.create(
                    f"{ns}/{name}", runtime, served_model=w.MODEL, mount_root=self.root,
                    poll_interval_s=ENGINE_POLL_S,
                )  # fmt: skip
        return names

    def replica(self, ns: str, pod: str) -> EngineReplica:
        return self.fleet[f"{ns}/{pod}"]

    # -- the objects -------------------------------------------------------------------------------
    def build(self, builder: Builder, size: Size) -> None:
        """Every object of the world: the namespaces and targets through the API; of the Pods and
        each adapter kind the first through the API too (create and status write), and the rest
        written into etcd as the API server stored that first one (bench/resync_scale.Etcd)."""
        shape = self.shape
        builder.all(
            [
                partial(builder.create, "/api/v1/namespaces", {"metadata": {"name": ns}})
                for ns in self.namespaces
            ]
        )
        targets: list[Callable[[], tuple[Kind, dict[str, Any]]]] = []
        for ns in self.namespaces:
            for s in range(shape.services):
                body = {
                    "metadata": {"name": f"svc{s}"},
                    "spec": {"runtime": "sglang", "replicas": shape.isvc_replicas},
                }
                targets.append(partial(self._target, builder, INFERENCE_SERVICE, ns, body))
            for d in range(shape.deployments):
                names = [f"a{d}-{i:03d}" for i in range(size.per_deployment)]
                spec = {"model": w.MODEL, "replicas": shape.md_replicas, "loraAdapters": names}
                body = {"metadata": {"name": f"d{d}"}, "spec": spec}
                targets.append(partial(self._target, builder, MODEL_DEPLOYMENT, ns, body))
        etcd = Etcd(builder)
        for kind, created in builder.all(targets):
            ns, name = created["metadata"]["namespace"], created["metadata"]["name"]
            pods = (self.isvc_pods if kind is INFERENCE_SERVICE else self.md_pods)[(ns, name)]
            for pod in pods:
                replica = self.replica(ns, pod)
                etcd.put(POD, ns, pod_body(kind, created, pod, replica), pod_status(replica, True, 0))
        for n, ns in enumerate(self.namespaces):
            for d in range(shape.deployments):
                md, pods = f"d{d}", self.md_pods[(ns, f"d{d}")]
                for index in range(size.per_deployment):
                    stale = _vllm_drift(n, d, index) == "stale-used"
                    etcd.put(VLLM_ADAPTER, ns, *self._vllm(ns, md, f"a{d}-{index:03d}", pods, stale))
            for s in range(shape.services):
                pods = self.isvc_pods[(ns, f"svc{s}")]
                for index in range(size.per_service):
                    etcd.put(SGLANG_ADAPTER, ns, *self._sglang(ns, f"svc{s}", index, len(pods)))
        etcd.flush()
        etcd.close()
        with builder.plane.http() as http:  # what the API server now serves is the world
            for kind, count in (
                (VLLM_ADAPTER, shape.namespaces * shape.deployments * size.per_deployment),
                (SGLANG_ADAPTER, shape.namespaces * shape.services * size.per_service),
                (POD, self.pods),
            ):
                prefix = f"/apis/{kind.group}/{kind.version}" if kind.group else f"/api/{kind.version}"

                def served(path: str = f"{prefix}/{kind.plural}") -> int:
                    page = http.get(path, params={"limit": "1"}).json()
                    return len(page["items"]) + int(page["metadata"].get("remainingItemCount") or 0)

                with contextlib.suppress(NotReached):
                    eventually(partial(_equal, served, count), 60, interval=0.5)
                log = builder.plane.log_tail("kube-apiserver")
                assert served() == count, f"{kind.plural}: {served()} served, {count} built: {log}"

    def _target(
        self, builder: Builder, kind: Kind, ns: str, body: dict[str, Any]
    ) -> tuple[Kind, dict[str, Any]]:
        created = builder.create(_path(kind, ns), {"apiVersion": kind.api_version, "kind": kind.kind, **body})
        return kind, created

    def adopt(self, builder: Builder) -> int:
        """A restored world: each Pod's podIP made its engine's address in this run; how many moved."""
        moved: list[Callable[[], object]] = []
        with self.http(builder) as http:
            token = ""
            while True:
                params = {"limit": "1000", **({"continue": token} if token else {})}
                page = http.get("/api/v1/pods", params=params).json()
                for pod in page.get("items") or []:
                    meta = pod["metadata"]
                    replica = self.replica(meta["namespace"], meta["name"])
                    if (pod.get("status") or {}).get("podIP") != replica.host:
                        moved.append(
                            partial(
                                builder.status,
                                _path(POD, meta["namespace"], meta["name"]),
                                pod_status(replica, True, 0),
                            )
                        )
                token = (page.get("metadata") or {}).get("continue") or ""
                if not token:
                    break
        builder.all(moved)
        return len(moved)

    @staticmethod
    def http(builder: Builder) -> httpx.Client:
        return builder.plane.http(timeout=120)

    # -- the engines -------------------------------------------------------------------------------
    def load_engines(self, size: Size) -> set[tuple[str, str, str]]:
        """Set what every engine serves for `size`; returns (namespace, name, step) of the drifted."""
        shape = self.shape
        drifted: set[tuple[str, str, str]] = set()
        for replica in self.fleet._replicas.values():
            with replica._lock:
                replica._adapters.clear()
        for n, ns in enumerate(self.namespaces):
            for d in range(shape.deployments):
                pods = self.md_pods[(ns, f"d{d}")]
                for index in range(size.per_deployment):
                    name = f"a{d}-{index:03d}"
                    drift = _vllm_drift(n, d, index)
                    if drift:
                        drifted.add((ns, name, "load"))
                    for pod in pods[1:] if drift == "missing" else pods:
                        self._engine_has(ns, pod, name, f"{self.root}/loraadapters/{ns}/{w.MODEL}/{name}")
            if n % 10 == 0:  # an orphan: loaded from our layout, its LoRAAdapter gone
                pod = self.md_pods[(ns, "d0")][0]
                self._engine_has(ns, pod, "gone", f"{self.root}/loraadapters/{ns}/{w.MODEL}/gone")
                drifted.add((ns, "gone", "unload"))
            for s in range(shape.services):
                pods = self.isvc_pods[(ns, f"svc{s}")]
                for index in range(size.per_service):
                    missing = s == 1 and index % 25 == 0 and n % 10 == 3
                    if missing:
                        drifted.add((ns, f"s{s}-{index:03d}", "load"))
                    for pod in pods[1:] if missing else pods:
                        self._engine_has(ns, pod, f"l{s}-{index:03d}", f"/sglang/{ns}/s{s}-{index:03d}")
        return drifted

    def _engine_has(self, ns: str, pod: str, name: str, path: str) -> None:
        replica = self.replica(ns, pod)
        with replica._lock:  # the stand-in's own state: 500,000 loads over HTTP would be setup
            replica._adapters[name] = LoadedAdapter(name, path)

    @staticmethod
    def _vllm(
        ns: str, md: str, name: str, pods: list[str], stale: bool
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        message = f"loaded in {len(pods)} Ready pod(s): {md} {len(pods)}/{len(pods)}"
        body = {
            "apiVersion": VLLM_ADAPTER.api_version,
            "kind": VLLM_ADAPTER.kind,
            "metadata": {"name": name, "finalizers": [FINALIZER]},
            "spec": {"model": w.MODEL},
        }
        return body, {
            "observedGeneration": 1,
            "phase": "Ready",
            "ready": True,
            "usedBy": [] if stale else [md],
            "storageRef": {"path": f"/loraadapters/{ns}/{w.MODEL}/{name}/"},
            "conditions": [_cond("Ready", "IntegrityVerified"), _cond("Loaded", "Loaded", message)],
            "served": [{"pod": pod, "fileSet": file_set({})} for pod in pods],
        }

    @staticmethod
    def _sglang(ns: str, svc: str, index: int, pods: int) -> tuple[dict[str, Any], dict[str, Any]]:
        s = svc.removeprefix("svc")
        name, lora, path = f"s{s}-{index:03d}", f"l{s}-{index:03d}", f"/sglang/{ns}/s{s}-{index:03d}"
        body = {
            "apiVersion": SGLANG_ADAPTER.api_version,
            "kind": SGLANG_ADAPTER.kind,
            "metadata": {"name": name, "finalizers": [FINALIZER]},
            "spec": {"name": lora, "path": path, "inferenceServiceRef": {"name": svc}},
        }
        return body, {
            "conditions": [
                _cond("Available", "InferenceServiceReady"),
                _cond("Error", "NoError", "no error", "False"),
                _cond("Loaded", "Loaded", f"loaded in {pods} Ready pod(s) of {ns}/{svc}"),
            ],
            "loadedPath": path,
            "lastLoadedAt": "2026-01-01T00:00:00Z",
        }


class Etcd:
    """Objects written straight into etcd as the API server stores them: the first of each kind is
    created through the API (and its status written), read back, and each further one is a copy
    of it with its own metadata, spec and status (JSON, which the API server reads for every
    kind; its own writes of built-in kinds are protobuf). 110,000 adapters through the API took
    over an hour on this shared machine; this way a few minutes. Puts go BATCH to a transaction."""

    BATCH = 100  # under etcd's --max-txn-ops (128)

    def __init__(self, builder: Builder) -> None:
        self.builder = builder
        self._templates: dict[str, dict[str, Any]] = {}
        self._pending: list[dict[str, Any]] = []
        self._http = httpx.Client(base_url=builder.plane.etcd_url, timeout=120)
        self.written = 0

    def put(self, kind: Kind, ns: str, body: dict[str, Any], status: dict[str, Any]) -> None:
        key = f"{kind.group}/{kind.plural}"
        template = self._templates.get(key)
        if template is None:  # the first one: through the API, then the template
            created = self.builder.create(
                _path(kind, ns), {"apiVersion": kind.api_version, "kind": kind.kind, **body}, status
            )
            self._templates[key] = (
                self.builder.http().get(_path(kind, ns, created["metadata"]["name"])).json()
            )
            return
        obj = json.loads(json.dumps(template))
        meta = obj["metadata"]
        meta.pop("resourceVersion", None)
        meta.update(
            name=body["metadata"]["name"],
            namespace=ns,
            uid=str(uuid.uuid4()),
            creationTimestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        )
        for field in ("labels", "ownerReferences", "finalizers"):
            if field in body["metadata"]:
                meta[field] = body["metadata"][field]
        if kind is POD:  # the defaulted spec and status of the first, with this pod's own parts
            obj["spec"]["containers"][0]["image"] = body["spec"]["containers"][0]["image"]
            obj["status"] = {**obj["status"], **status}
        else:
            obj["spec"], obj["status"] = body["spec"], status
        prefix = f"/registry/{kind.plural}" if not kind.group else f"/registry/{kind.group}/{kind.plural}"
        self._pending.append(
            {
                "requestPut": {
                    "key": base64.b64encode(f"{prefix}/{ns}/{meta['name']}".encode()).decode(),
                    "value": base64.b64encode(json.dumps(obj, separators=(",", ":")).encode()).decode(),
                }
            }
        )
        if len(self._pending) >= self.BATCH:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            answer = self._http.post("/v3/kv/txn", json={"success": self._pending})
            answer.raise_for_status()
            self.written += len(self._pending)
            self._pending = []

    def close(self) -> None:
        self._http.close()


def _equal(read: Callable[[], int], expected: int) -> bool:
    return read() == expected


def _vllm_drift(n: int, d: int, index: int) -> str | None:
    """1% at either size, the same adapters: (index * 10 + d) % 100 == 7."""
    if (index * 10 + d) % 100 != 7:
        return None
    return "missing" if (n + index // 10) % 2 == 0 else "stale-used"


def settle_etcd(plane: ControlPlane) -> None:
    """Compact etcd's history to now and defragment: the kept world is a settled cluster's."""
    with httpx.Client(base_url=plane.etcd_url, timeout=600) as http:
        key = base64.b64encode(b"/").decode()
        revision = http.post("/v3/kv/range", json={"key": key, "limit": 1}).json()["header"]["revision"]
        http.post("/v3/kv/compaction", json={"revision": revision, "physical": True}).raise_for_status()
        http.post("/v3/maintenance/defragment", json={}).raise_for_status()


@contextlib.contextmanager
def control_plane(
    shape: Shape, size: Size, cluster: Cluster, base: Path
) -> Iterator[tuple[ControlPlane, dict[str, Any]]]:
    """The world of `size` in a control plane of its own: from the cache when it is there, else
    built through the API (and then kept)."""
    kept = cache_dir(shape, size)
    restored = (kept / "member").is_dir()
    if restored:
        shutil.copytree(kept, base / "etcd")
    plane = ControlPlane(base)
    started = time.monotonic()
    plane.start()
    facts: dict[str, Any] = {"restored": restored}
    try:
        prepare(plane, render())
        builder = Builder(plane)
        try:
            if restored:
                facts["pods_moved"] = cluster.adopt(builder)
            else:
                cluster.build(builder, size)
        finally:
            builder.close()
        facts["setup_s"] = round(time.monotonic() - started, 1)
        if not restored:
            settle_etcd(plane)
            plane.stop_apiserver()
            plane.stop_etcd()
            partial_copy = kept.with_name(kept.name + ".partial")
            shutil.rmtree(partial_copy, ignore_errors=True)
            shutil.copytree(base / "etcd", partial_copy)
            partial_copy.rename(kept)
            plane.start_etcd()
            plane.start_apiserver()
        # a started server lists each kind from etcd until its watch cache is full, a page of
        # 500 taking seconds: the ticks time a server in service, not one warming up
        facts["cache_fill_s"] = plane.await_watch_caches(
            (kind.group, kind.version, kind.plural) for kind in WATCHED
        )
        facts["etcd_mib"] = round(
            sum(f.stat().st_size for f in (base / "etcd").rglob("*") if f.is_file()) / 2**20
        )
        yield plane, facts
    finally:
        plane.stop()


def _answers(http: httpx.Client, url: str) -> bool:
    try:
        return http.get(url + "healthz").status_code == 200
    except httpx.TransportError:
        return False


def _answer_into(out: list[httpx.Response], http: httpx.Client, url: str, event: CloudEvent) -> None:
    out.append(w.first_answer(http, url, event, 600))


def bare_reads(kube_url: str, token: str, ca_file: str) -> float:
    """The reads resync cannot do without, raw: every paginated list, one listing per pod."""
    import ssl

    started = time.perf_counter()
    headers = {"Authorization": f"Bearer {token}"}
    pods: list[dict[str, Any]] = []
    verify = ssl.create_default_context(cafile=ca_file)
    with httpx.Client(base_url=kube_url, headers=headers, timeout=120, verify=verify) as http:
        for kind, selector in (
            (MODEL_DEPLOYMENT, None),
            (INFERENCE_SERVICE, None),
            (POD, "loraflow.io/serving=true"),
            (VLLM_ADAPTER, None),
            (SGLANG_ADAPTER, None),
            (SGLANG_ADAPTER, None),  # resync reads the sglang kind twice (claimants from elsewhere first)
        ):
            prefix = f"/apis/{kind.group}/{kind.version}" if kind.group else f"/api/{kind.version}"
            token_ = ""
            while True:
                params = {"limit": str(PAGE), **({"labelSelector": selector} if selector else {})}
                if token_:
                    params["continue"] = token_
                page = http.get(f"{prefix}/{kind.plural}", params=params).json()
                if kind is POD:
                    pods += page.get("items") or []
                token_ = (page.get("metadata") or {}).get("continue") or ""
                if not token_:
                    break
    urls = [
        f"http://{p['status']['podIP']}:{p['spec']['containers'][0]['ports'][0]['containerPort']}"
        for p in pods
    ]
    with ThreadPoolExecutor(10) as pool:
        list(pool.map(_listing, urls))
    return time.perf_counter() - started


def _listing(url: str) -> object:
    """One GET /v1/models by the standard library, decoded: the cheapest read of a listing
    (one httpx pool for 5,000 hosts re-examines every connection it holds on each request)."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=60)
    try:
        connection.request("GET", "/v1/models")
        return json.loads(connection.getresponse().read())
    finally:
        connection.close()


def _reference(plane: ControlPlane, repeats: int) -> list[float]:
    code = "import sys; from bench.resync_scale import bare_reads; print(bare_reads(*sys.argv[1:4]))"
    samples = []
    for _ in range(repeats):
        out = subprocess.run(
            [sys.executable, "-c", code, plane.url, plane.admin_token, str(plane.ca_file)],
            cwd=w.ROOT, capture_output=True, text=True, check=True, timeout=600,
        )  # fmt: skip
        samples.append(float(out.stdout.strip().splitlines()[-1]))
    return samples


def _cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of live processes (/proc/<pid>/stat utime, stime)."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


class Parts:
    """The Broker between a tick and its parts, for `instances` resync processes: each event is
    taken with a 202 (as a Broker's ingress takes it) and then delivered, a part to the next
    instance in turn (as Knative's activator spreads requests over a Service's instances at
    containerConcurrency 1), every other event kept (the nudges)."""

    def __init__(self, sink: EventSink, urls: list[str]) -> None:
        self.sink, self._urls = sink, urls
        self._turn = 0
        self._pool = ThreadPoolExecutor(max(1, len(urls)), thread_name_prefix="parts")
        self._http = httpx.Client(timeout=600)
        self._delivered: list[Future[tuple[int, float]]] = []
        self._lock = threading.Lock()
        sink.on_event = self._route

    def _route(self, event: CloudEvent) -> bool:
        """True: the part was taken for delivery (not kept)."""
        if event["type"] != RESYNC_SHARD:
            return False
        with self._lock:
            url = self._urls[self._turn % len(self._urls)]
            self._turn += 1
            self._delivered.append(self._pool.submit(self._deliver, url, event))
        return True

    def _deliver(self, url: str, event: CloudEvent) -> tuple[int, float]:
        answer = w.first_answer(self._http, url, event, 600)
        if answer.status_code != 204:
            print(f"part {event['subject']}: {answer.status_code} {answer.text[:500]}", file=sys.stderr)
        return answer.status_code, time.perf_counter()

    def answered(self) -> list[tuple[int, float]]:
        """(status, when answered) of every part delivered since the last call, once all are."""
        with self._lock:
            taken, self._delivered = self._delivered, []
        return [future.result() for future in taken]

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._http.close()


def _measure(
    kube: Kube,
    sink: EventSink,
    env: dict[str, str],
    drifted: set[tuple[str, str, str]],
    repeats: int,
    instances: int,
    warm_up: int = 0,
) -> dict[str, Any]:
    """resync in `instances` functions-framework processes: one instance judges the tick
    itself; more, and the tick is dealt into that many parts (LORAFLOW_RESYNC_SHARDS), each
    delivered to an instance in turn. Timed from the ping to the last part's answer; the first
    `warm_up` ticks are reported apart (`warm_up_s`), not in the median."""
    env = {**env, "LORAFLOW_RESYNC_SHARDS": str(instances)}
    ports = [free_port() for _ in range(instances)]
    processes = [w.spawn("resync", w.ROOT / "main.py", port, env) for port in ports]
    urls = [f"http://127.0.0.1:{port}/" for port in ports]
    parts = Parts(sink, urls)
    http = httpx.Client(timeout=600)
    samples: list[float] = []
    requests: list[int] = []
    page_ms: list[float] = []
    resync_cpu: list[float] = []
    servers_cpu: list[dict[str, float]] = []
    mine_cpu: list[float] = []
    parts_s: list[list[float]] = []
    exact = True
    try:
        for url in urls:
            eventually(partial(_answers, http, url), 60, what="resync answers", interval=0.01)  # not measured
        for _ in range(warm_up + repeats):
            sink.clear()
            kube.reset_counters()
            mark = kube.audit.mark()
            ping = w.event(PING, {"message": "resync"})
            responses: list[httpx.Response] = []
            workers = [pid for p in processes for pid in (p.pid, *descendants(p.pid))]
            cpu, servers, mine = _cpu_s(workers), server_cpu(kube.plane), os.times()
            started = time.perf_counter()
            _answer_into(responses, http, urls[0], ping)  # its parts were taken before it answered
            ticked = time.perf_counter()
            answered = parts.answered()
            samples.append(max([ticked, *(when for _, when in answered)]) - started)
            resync_cpu.append(_cpu_s(workers) - cpu)
            servers_cpu.append({k: v - servers.get(k, 0.0) for k, v in server_cpu(kube.plane).items()})
            after = os.times()
            mine_cpu.append(after.user + after.system - mine.user - mine.system)
            assert responses[0].status_code == 204, responses[0].text
            assert all(status == 204 for status, _ in answered), answered
            assert len(answered) == (instances if instances > 1 else 0), answered
            parts_s.append(sorted(round(when - started, 2) for _, when in answered))
            audited = [r for r in kube.audit.since(mark) if r.user.startswith(FUNCTIONS_USERS)]
            requests.append(len(audited))
            pages = [r.seconds for r in audited if r.key == ("list", VLLM_ADAPTER.plural)]
            page_ms.append(1000 * median_of(pages) if pages else 0.0)
            nudged = {
                (e.get_data()["adapter"]["namespace"], e.get_data()["adapter"]["name"], e["loraflowstep"])  # type: ignore[index]
                for e in sink.events
            }
            exact = exact and nudged == drifted and len(sink.events) == len(drifted)
        peak = max(w.peak_rss_mib(p.pid) for p in processes)
    finally:
        for process in processes:
            process.terminate()
            process.wait(30)
        parts.close()
        http.close()
    first, samples = samples[:warm_up], samples[warm_up:]
    measured = servers_cpu[warm_up:]
    return {
        "instances": instances,
        "seconds": median_of(samples),
        "samples_s": [round(s, 3) for s in samples],
        "warm_up_s": [round(s, 3) for s in first],
        "parts_answered_s": parts_s,
        "peak_rss_mib": round(peak, 1),
        "api_requests": requests[-1],
        "adapter_list_page_ms": round(median_of(page_ms[warm_up:]), 1),
        "resync_cpu_s": round(median_of(resync_cpu[warm_up:]), 2),
        "apiserver_cpu_s": round(median_of([c.get("kube-apiserver", 0.0) for c in measured]), 2),
        "etcd_cpu_s": round(median_of([c.get("etcd", 0.0) for c in measured]), 2),
        "bench_process_cpu_s": round(median_of(mine_cpu[warm_up:]), 2),
        "drifted": len(drifted),
        "nudges_exactly_the_drifted": exact,
    }


def run(smoke: bool) -> Result:
    shape = SMOKE if smoke else FULL
    sizes = [Size(5, 2), Size(20, 10)] if smoke else [Size(10, 5), Size(100, 50)]
    repeats = 1 if smoke else 2
    measured: dict[str, dict[str, Any]] = {}
    started = time.monotonic()
    fleet = EngineFleet()
    sink = EventSink().start()
    cluster = Cluster(fleet, shape, MOUNT_ROOT)
    try:
        for size in sizes:
            with (
                tempfile.TemporaryDirectory(prefix="loraflow-resync-") as tmp,
                control_plane(shape, size, cluster, Path(tmp)) as (plane, facts),
            ):
                kube = Kube(plane, proxy=False)
                token = plane.service_account_token("loraflow", "loraflow-resync")
                config = plane.write_kubeconfig(Path(tmp) / "resync.kubeconfig", token, "loraflow")
                env = {
                    "KUBECONFIG_RESYNC": str(config),
                    "LORAFLOW_LOOPBACK_ENGINES": "allow",  # the engine stand-ins listen on 127.0.x.y
                    "LORAFLOW_MOUNT_ROOT": str(MOUNT_ROOT),
                    "LORAFLOW_BROKER_URL": sink.url,
                    "K_SINK": sink.url,
                }
                drifted = cluster.load_engines(size)
                v1 = shape.namespaces * shape.deployments * size.per_deployment
                v2 = shape.namespaces * shape.services * size.per_service
                label = f"{v1}+{v2}"
                measured[label] = {"v1": v1, "v2": v2, **facts}
                with environment(**env):
                    measured[label] |= _measure(
                        kube, sink, env, drifted, repeats, INSTANCES, warm_up=0 if smoke else 1
                    )
                    if size == sizes[0]:  # the tick judged whole, by one instance (the large: minutes)
                        one = _measure(kube, sink, env, drifted, 1, 1)
                        measured[label] |= {
                            f"one_instance_{k}": one[k] for k in ("seconds", "peak_rss_mib", "resync_cpu_s")
                        }
                        measured[label]["one_instance_exact"] = one["nudges_exactly_the_drifted"]
                # the large size's bare reads take minutes on this machine: one sample there
                reference = _reference(plane, repeats if size == sizes[0] else 1)
                measured[label]["reference_s"] = round(median_of(reference), 3)
                measured[label]["reference_samples_s"] = [round(s, 3) for s in reference]
    finally:
        sink.stop()
        fleet.stop_all()
    setup_s = time.monotonic() - started
    small, large = (measured[k] for k in measured)
    flat = large["peak_rss_mib"] / small["peak_rss_mib"]
    value, ref = large["seconds"], large["reference_s"]
    ratio = value / ref
    exact = all(
        m["nudges_exactly_the_drifted"] and m.get("one_instance_exact", True) for m in measured.values()
    )
    met = ratio <= RATIO and large["peak_rss_mib"] <= 300 and flat <= 1.15 and exact
    deployments = shape.namespaces * shape.deployments
    pages = (large["v1"] + 2 * large["v2"]) / PAGE
    return Result(
        name="resync_scale",
        title=(
            f"Resync over {large['v1']:,} vllm + {large['v2']:,} sglang adapters, "
            f"{deployments:,} deployments, {cluster.pods:,} pods, on the real API server"
        ),
        value=round(value, 2),
        unit="s",
        reference=round(ref, 2),
        ratio=round(ratio, 2),
        target=f"<= {RATIO}x the bare paged reads and listings, <= 300 MiB, flat in N; "
        "nudges only for the drifted",
        met=met,
        details={
            "page_size": PAGE,
            "pods": cluster.pods,
            "deployments": deployments,
            "sizes": measured,
            "total_s": round(setup_s, 1),
            "rss_large_over_small": round(flat, 2),
        },
        note=(
            f"dealt into {INSTANCES} parts, one instance each; median of "
            + " / ".join(f"{x:.1f}" for x in large["samples_s"])
            + " s"
            + (f" after a first tick of {large['warm_up_s'][0]:.1f} s" if large["warm_up_s"] else "")
            + f"; bare reads {ref:.1f} s; peak RSS {large['peak_rss_mib']:.0f} MiB "
            f"at {large['v1'] + large['v2']:,} adapters, {small['peak_rss_mib']:.0f} MiB at "
            f"{small['v1'] + small['v2']:,} ({flat:.2f}x); {small['seconds']:.2f} s at the small size "
            f"(bare reads {small['reference_s']:.2f} s; one instance judging it whole "
            f"{small['one_instance_seconds']:.1f} s, {small['one_instance_resync_cpu_s']:.1f} s CPU); "
            f"{large['api_requests']} API requests by the audit log (adapters / page = {pages:.0f}), "
            f"the server {large['adapter_list_page_ms']:.0f} ms per page of {PAGE} adapters; "
            f"{large['drifted']} nudges for {large['drifted']} drifted; CPU per tick: resync "
            f"{large['resync_cpu_s']:.1f} s, kube-apiserver {large['apiserver_cpu_s']:.1f} s, "
            f"etcd {large['etcd_cpu_s']:.1f} s (2 cores); world "
            + ("from the etcd cache" if large["restored"] else "built through the API")
            + f" in {large['setup_s']:.0f} s"
        ),
    )


if __name__ == "__main__":  # pragma: no cover - `python -m bench --only resync_scale` is the entry
    print(json.dumps(run("--smoke" in sys.argv[1:]).details, indent=2))

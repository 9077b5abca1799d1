"""8. Resync at internet scale: 100,000 vllm and 10,000 sglang adapters, 1,000 ModelDeployments,
5,000 Ready pods (issue 20).

The cluster: 100 tenant namespaces, each with 10 ModelDeployments of 4 replicas and 2
InferenceServices (sglang) of 5 replicas; every ModelDeployment names 100 adapters and every
InferenceService is claimed by 50 (the small size: 10 and 5, the same targets and pods). The
objects are stored in bulk through the Kubernetes stand-in's store (`Store.seed`: the state a
create and a status write leave), each adapter Ready/Available, used and Loaded as load writes
it; each engine replica (5,000 vLLM/SGLang stand-ins, each on its own 127.0.x.y address) lists
what its pod serves (set in the stand-in's state, no HTTP). 1% drifts: vllm adapters missing
from one pod or with a stale `usedBy`, sglang adapters missing from one pod, and an orphan copy
(its LoRAAdapter gone) in one namespace in ten. resync runs in functions-framework processes
of its own (as in the cluster) with the default page size (500): two instances, one per core,
with LORAFLOW_RESYNC_SHARDS=2, so that the tick (one ping per repeat, to the first) is dealt
into two parts by namespace, which `Parts` (the Broker's part: take each event with a 202, then
deliver it) hands to the instances in turn; the nudges go to the same sink (K_SINK).
Measured per size: the time from the ping to the last part's answer (the median of three ticks
after a first one, which is reported apart: the stand-in's first answers encode every object),
the peak RSS (VmHWM of the largest worker), the API requests made, the nudges (exactly the
drifted), the stand-in's own cost per adapter list page (seconds spent answering / pages); and
once, one instance judging the tick whole (LORAFLOW_RESYNC_SHARDS=1). Reference: the bare reads
in one process of their own (the same paginated lists and one GET /v1/models per Ready pod, raw
JSON, nothing else), run after the measured ticks.
Target: <= 10 s, <= 300 MiB and flat in N (large / small peak RSS), nudges only for the drifted.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, Literal, NamedTuple
from urllib.parse import urlsplit

import httpx
from cloudevents.http import CloudEvent

from bench import world as w
from bench.common import Result, median_of
from devstack.eventing.sink import EventSink
from devstack.functions_host import free_port
from devstack.processes import descendants
from devstack.standins.engines.base import LoadedAdapter
from devstack.standins.kube.resources import ResourceType
from devstack.standins.kube.store import WriteOptions
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
from tests.support.wait import eventually

PAGE = 500  # LORAFLOW_LIST_PAGE_SIZE's default
INSTANCES = 2
"""resync instances a tick is dealt over (LORAFLOW_RESYNC_SHARDS): this machine's cores."""
ENGINE_POLL_S = None
"""Idle serving loops sleep until a connection arrives: 5,000 of them waking 20 times a second
would take the interpreter lock from the stand-ins being measured."""


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


def _rtype(world: w.World, group: str, version: str, plural: str) -> ResourceType:
    found = world.kube.registry.lookup(group, version, plural)
    assert found is not None
    return found


def _kind_type(world: w.World, kind: Kind) -> ResourceType:
    return _rtype(world, kind.group, kind.version, kind.plural)


def _naming(names: list[str], deployment: dict[str, Any]) -> dict[str, Any]:
    """The ModelDeployment as a user's edit leaves it: it names `names`."""
    return {**deployment, "spec": {**deployment["spec"], "loraAdapters": names}}


def _answer_into(out: list[httpx.Response], http: httpx.Client, url: str, event: CloudEvent) -> None:
    out.append(w.first_answer(http, url, event, 600))


class Cluster:
    """The targets and pods (built once) and the adapters of the size being measured."""

    def _type(self, kind: Kind) -> ResourceType:
        return _kind_type(self.world, kind)

    def __init__(self, world: w.World, shape: Shape) -> None:
        self.world, self.shape = world, shape
        store = world.kube.store
        namespaces = _rtype(world, "", "v1", "namespaces")
        self.namespaces = [f"tenant-{n:03d}" for n in range(shape.namespaces)]
        for ns in self.namespaces:
            store.create(namespaces, "", {"metadata": {"name": ns}}, WriteOptions())
        self.md_pods: dict[tuple[str, str], list[str]] = {}
        self.isvc_pods: dict[tuple[str, str], list[str]] = {}
        for ns in self.namespaces:
            isvcs = [
                {
                    "metadata": {"name": f"svc{s}"},
                    "spec": {"runtime": "sglang", "replicas": shape.isvc_replicas},
                }
                for s in range(shape.services)
            ]
            store.seed(_kind_type(world, INFERENCE_SERVICE), ns, isvcs)
            for s in range(shape.services):
                self.isvc_pods[(ns, f"svc{s}")] = self._pods(
                    INFERENCE_SERVICE, ns, f"svc{s}", shape.isvc_replicas
                )
        self.size: Size | None = None

    def _pods(self, kind: Kind, ns: str, target: str, replicas: int) -> list[str]:
        store, fleet = self.world.kube.store, self.world.workload.fleet
        body = store.get(self._type(kind), ns, target)
        runtime: Literal["vllm", "sglang"] = "sglang" if kind is INFERENCE_SERVICE else "vllm"
        names, pods = [], []
        for r in range(replicas):
            name = f"{target}-{r}"
            replica = fleet.create(
                f"{ns}/{name}", runtime, served_model=w.MODEL, mount_root=self.world.mount_root,
                poll_interval_s=ENGINE_POLL_S,
            )  # fmt: skip
            pods.append({**pod_body(kind, body, name, replica), "status": pod_status(replica, True, 0)})
            names.append(name)
        store.seed(self._type(POD), ns, pods)
        return names

    def grow(self, size: Size) -> tuple[set[tuple[str, str, str]], int, int]:
        """Store (more) adapters up to `size`, set every engine's state, pick the drifted;
        returns (namespace, name, step) of the drifted and the adapter counts."""
        store, shape = self.world.kube.store, self.shape
        before = self.size or Size(0, 0)
        drifted: set[tuple[str, str, str]] = set()
        v1 = v2 = 0
        for n, ns in enumerate(self.namespaces):
            deployments = []
            for d in range(shape.deployments):
                md = f"d{d}"
                names = [f"a{d}-{i:03d}" for i in range(size.per_deployment)]
                deployments.append((md, names))
            if before.per_deployment == 0:
                for md, names in deployments:
                    spec = {"model": w.MODEL, "replicas": shape.md_replicas, "loraAdapters": names}
                    store.seed(
                        self._type(MODEL_DEPLOYMENT),
                        ns,
                        [{"metadata": {"name": md}, "spec": spec}],
                    )
                    self.md_pods[(ns, md)] = self._pods(MODEL_DEPLOYMENT, ns, md, shape.md_replicas)
            else:
                for md, names in deployments:
                    store.mutate(
                        self._type(MODEL_DEPLOYMENT), ns, md, partial(_naming, names), "", WriteOptions()
                    )  # fmt: skip
            adapters = []
            for md, names in deployments:
                pods = self.md_pods[(ns, md)]
                d = int(md[1:])
                for index, name in enumerate(names):
                    v1 += 1
                    # 1% at either size, the same adapters: (index * 10 + d) % 100 == 7
                    drift = None
                    if (index * 10 + d) % 100 == 7:
                        drift = "missing" if (n + index // 10) % 2 == 0 else "stale-used"
                    if index >= before.per_deployment:
                        adapters.append(self._vllm(ns, md, name, pods, stale=drift == "stale-used"))
                    if drift:
                        drifted.add((ns, name, "load"))
                    loaded = pods[1:] if drift == "missing" else pods
                    for pod in loaded:
                        self._engine_has(
                            ns, pod, name, f"{self.world.mount_root}/loraadapters/{ns}/{w.MODEL}/{name}"
                        )
            store.seed(
                self._type(VLLM_ADAPTER),
                ns,
                sorted(adapters, key=lambda a: a["metadata"]["name"]),
            )
            if n % 10 == 0:  # an orphan: loaded from our layout, its LoRAAdapter gone
                pod = self.md_pods[(ns, "d0")][0]
                self._engine_has(ns, pod, "gone", f"{self.world.mount_root}/loraadapters/{ns}/{w.MODEL}/gone")
                drifted.add((ns, "gone", "unload"))
            claims = []
            for s in range(shape.services):
                svc, pods = f"svc{s}", self.isvc_pods[(ns, f"svc{s}")]
                for index in range(size.per_service):
                    v2 += 1
                    name, lora, path = (
                        f"s{s}-{index:03d}",
                        f"l{s}-{index:03d}",
                        f"/sglang/{ns}/s{s}-{index:03d}",
                    )
                    missing = s == 1 and index % 25 == 0 and n % 10 == 3
                    if index >= before.per_service:
                        claims.append(self._sglang(ns, svc, name, lora, path, len(pods)))
                    if missing:
                        drifted.add((ns, name, "load"))
                    for pod in pods[1:] if missing else pods:
                        self._engine_has(ns, pod, lora, path)
            store.seed(
                self._type(SGLANG_ADAPTER),
                ns,
                sorted(claims, key=lambda a: a["metadata"]["name"]),
            )
        self.size = size
        return drifted, v1, v2

    def _engine_has(self, ns: str, pod: str, name: str, path: str) -> None:
        replica = self.world.workload.replica(ns, pod)
        with replica._lock:  # the stand-in's own state: 500,000 loads over HTTP would be setup
            replica._adapters[name] = LoadedAdapter(name, path)

    @staticmethod
    def _vllm(ns: str, md: str, name: str, pods: list[str], stale: bool) -> dict[str, Any]:
        message = f"loaded in {len(pods)} Ready pod(s): {md} {len(pods)}/{len(pods)}"
        return {
            "metadata": {"name": name, "finalizers": [FINALIZER]},
            "spec": {"model": w.MODEL},
            "status": {
                "observedGeneration": 1,
                "phase": "Ready",
                "ready": True,
                "usedBy": [] if stale else [md],
                "storageRef": {"path": f"/loraadapters/{ns}/{w.MODEL}/{name}/"},
                "conditions": [_cond("Ready", "IntegrityVerified"), _cond("Loaded", "Loaded", message)],
                "served": [{"pod": pod, "fileSet": file_set({})} for pod in pods],
            },
        }

    @staticmethod
    def _sglang(ns: str, svc: str, name: str, lora: str, path: str, pods: int) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "finalizers": [FINALIZER]},
            "spec": {"name": lora, "path": path, "inferenceServiceRef": {"name": svc}},
            "status": {
                "conditions": [
                    _cond("Available", "InferenceServiceReady"),
                    _cond("Error", "NoError", "no error", "False"),
                    _cond("Loaded", "Loaded", f"loaded in {pods} Ready pod(s) of {ns}/{svc}"),
                ],
                "loadedPath": path,
                "lastLoadedAt": "2026-01-01T00:00:00Z",
            },
        }


def _answers(http: httpx.Client, url: str) -> bool:
    try:
        return http.get(url + "healthz").status_code == 200
    except httpx.TransportError:
        return False


def bare_reads(kube_url: str, token: str) -> float:
    """The reads resync cannot do without, raw: every paginated list, one listing per pod."""
    started = time.perf_counter()
    headers = {"Authorization": f"Bearer {token}"}
    pods: list[dict[str, Any]] = []
    with httpx.Client(base_url=kube_url, headers=headers, timeout=120) as http:
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


def _reference(world: w.World, repeats: int) -> list[float]:
    code = (
        "import sys; from bench.resync_scale import bare_reads; print(bare_reads(sys.argv[1], sys.argv[2]))"
    )
    samples = []
    for _ in range(repeats):
        out = subprocess.run(
            [sys.executable, "-c", code, world.kube.url, world.kube.admin_token],
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
    world: w.World, drifted: set[tuple[str, str, str]], repeats: int, instances: int, warm_up: int = 0
) -> dict[str, Any]:
    """resync in `instances` functions-framework processes: one instance judges the tick
    itself; more, and the tick is dealt into that many parts (LORAFLOW_RESYNC_SHARDS), each
    delivered to an instance in turn. Timed from the ping to the last part's answer; the first
    `warm_up` ticks are reported apart (`warm_up_s`), not in the median: the first tick at a
    size is the one where the Kubernetes stand-in encodes every object it has not answered
    with yet (13.6-15.9 s against 7.4-10.0 s for the next two at 110,000 adapters), and the
    reference's bare reads run after the measured ticks, on a stand-in warmed by them."""
    env = {"LORAFLOW_RESYNC_SHARDS": str(instances)}
    ports = [free_port() for _ in range(instances)]
    processes = [w.spawn("resync", w.ROOT / "main.py", port, env) for port in ports]
    urls = [f"http://127.0.0.1:{port}/" for port in ports]
    parts = Parts(world.sink, urls)
    http = httpx.Client(timeout=600)
    samples: list[float] = []
    requests: list[int] = []
    page_ms: list[float] = []
    resync_cpu: list[float] = []
    stand_in_cpu: list[float] = []
    parts_s: list[list[float]] = []
    exact = True
    try:
        for url in urls:
            eventually(partial(_answers, http, url), 60, what="resync answers", interval=0.01)  # not measured
        for _ in range(warm_up + repeats):
            world.sink.clear()
            world.kube.reset_counters()
            ping = w.event(PING, {"message": "resync"})
            responses: list[httpx.Response] = []
            workers = [pid for p in processes for pid in (p.pid, *descendants(p.pid))]
            cpu, mine = _cpu_s(workers), os.times()
            started = time.perf_counter()
            _answer_into(responses, http, urls[0], ping)  # its parts were taken before it answered
            ticked = time.perf_counter()
            answered = parts.answered()
            samples.append(max([ticked, *(when for _, when in answered)]) - started)
            resync_cpu.append(_cpu_s(workers) - cpu)
            after = os.times()
            stand_in_cpu.append(after.user + after.system - mine.user - mine.system)
            assert responses[0].status_code == 204, responses[0].text
            assert all(status == 204 for status, _ in answered), answered
            assert len(answered) == (instances if instances > 1 else 0), answered
            parts_s.append(sorted(round(when - started, 2) for _, when in answered))
            requests.append(world.kube.request_count)
            pages = world.kube.requests[("list", VLLM_ADAPTER.plural)]
            spent = world.kube.request_seconds.get(("list", VLLM_ADAPTER.plural), 0.0)
            page_ms.append(1000 * spent / max(1, pages))
            nudged = {
                (e.get_data()["adapter"]["namespace"], e.get_data()["adapter"]["name"], e["loraflowstep"])  # type: ignore[index]
                for e in world.sink.events
            }
            exact = exact and nudged == drifted and len(world.sink.events) == len(drifted)
        peak = max(w.peak_rss_mib(p.pid) for p in processes)
    finally:
        for process in processes:
            process.terminate()
            process.wait(30)
        parts.close()
        http.close()
    first, samples = samples[:warm_up], samples[warm_up:]
    return {
        "instances": instances,
        "seconds": median_of(samples),
        "samples_s": [round(s, 3) for s in samples],
        "warm_up_s": [round(s, 3) for s in first],
        "parts_answered_s": parts_s,
        "peak_rss_mib": round(peak, 1),
        "api_requests": requests[-1],
        "adapter_list_page_ms": round(median_of(page_ms[warm_up:]), 2),
        "resync_cpu_s": round(median_of(resync_cpu[warm_up:]), 2),
        "stand_ins_cpu_s": round(median_of(stand_in_cpu[warm_up:]), 2),
        "drifted": len(drifted),
        "nudges_exactly_the_drifted": exact,
    }


def run(smoke: bool) -> Result:
    shape = SMOKE if smoke else FULL
    sizes = [Size(5, 2), Size(20, 10)] if smoke else [Size(10, 5), Size(100, 50)]
    repeats = 1 if smoke else 3
    measured: dict[str, dict[str, Any]] = {}
    with w.world(functions=False) as world:
        started = time.monotonic()
        cluster = Cluster(world, shape)
        pods = sum(map(len, cluster.md_pods.values())) + sum(map(len, cluster.isvc_pods.values()))
        for size in sizes:
            grown = time.monotonic()
            drifted, v1, v2 = cluster.grow(size)
            label = f"{v1}+{v2}"
            pods = sum(map(len, cluster.md_pods.values())) + sum(map(len, cluster.isvc_pods.values()))
            measured[label] = {"v1": v1, "v2": v2, "setup_s": round(time.monotonic() - grown, 1)}
            measured[label] |= _measure(world, drifted, repeats, INSTANCES, warm_up=0 if smoke else 1)
            one = _measure(world, drifted, 1, 1)  # the tick judged whole, by one instance
            measured[label] |= {
                f"one_instance_{k}": one[k] for k in ("seconds", "peak_rss_mib", "resync_cpu_s")
            }
            measured[label]["one_instance_exact"] = one["nudges_exactly_the_drifted"]
            reference = _reference(world, repeats)
            measured[label]["reference_s"] = round(median_of(reference), 3)
            measured[label]["reference_samples_s"] = [round(s, 3) for s in reference]
        setup_s = time.monotonic() - started
    small, large = (measured[k] for k in measured)
    flat = large["peak_rss_mib"] / small["peak_rss_mib"]
    value, ref = large["seconds"], large["reference_s"]
    exact = all(m["nudges_exactly_the_drifted"] and m["one_instance_exact"] for m in measured.values())
    met = value <= 10 and large["peak_rss_mib"] <= 300 and flat <= 1.15 and exact
    deployments = shape.namespaces * shape.deployments
    return Result(
        name="resync_scale",
        title=(
            f"Resync over {large['v1']:,} vllm + {large['v2']:,} sglang adapters, "
            f"{deployments:,} deployments, {pods:,} pods"
        ),
        value=round(value, 2),
        unit="s",
        reference=round(ref, 2),
        ratio=round(value / ref, 2),
        target="<= 10 s, <= 300 MiB, flat in N; about N / page size requests; nudges only for the drifted",
        met=met,
        details={
            "page_size": PAGE,
            "pods": pods,
            "deployments": deployments,
            "sizes": measured,
            "setup_s": round(setup_s, 1),
            "rss_large_over_small": round(flat, 2),
        },
        note=(
            f"dealt into {INSTANCES} parts, one instance each; median of "
            + " / ".join(f"{x:.1f}" for x in large["samples_s"])
            + " s"
            + (f" after a first tick of {large['warm_up_s'][0]:.1f} s" if large["warm_up_s"] else "")
            + f"; peak RSS {large['peak_rss_mib']:.0f} MiB "
            f"at {large['v1'] + large['v2']:,} adapters, {small['peak_rss_mib']:.0f} MiB at "
            f"{small['v1'] + small['v2']:,} ({flat:.2f}x); {small['seconds']:.2f} s at the small size; "
            f"one instance judging the tick whole: {large['one_instance_seconds']:.1f} s "
            f"({large['one_instance_resync_cpu_s']:.1f} s CPU); {large['api_requests']} API requests "
            f"(adapters / page = {(large['v1'] + 2 * large['v2']) / PAGE:.0f}; a part lists its adapters "
            f"namespace by namespace and reads the whole sglang kind once); "
            f"{large['drifted']} nudges for {large['drifted']} drifted; the stand-in spends "
            f"{large['adapter_list_page_ms']:.1f} ms per page of {PAGE} adapters; CPU per tick: resync "
            f"{large['resync_cpu_s']:.1f} s, the stand-ins {large['stand_ins_cpu_s']:.1f} s (2 cores, shared)"
        ),
    )


if __name__ == "__main__":  # pragma: no cover - `python -m bench --only resync_scale` is the entry
    print(json.dumps(run("--smoke" in sys.argv[1:]).details, indent=2))

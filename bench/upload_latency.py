"""1. Upload-to-serving latency on the embedded stack (devstack.stack.Stack, as `make run`), on
the real kube-apiserver and etcd (the functions call it directly, no fault proxy).

An adapter declares its MD5s (spec.integrity.md5) and is named by a ModelDeployment of N
replicas (engine load latency 0); its config file is uploaded first and the stack settles
(admit, stat, verify: not Ready, a file is missing). The clock starts as the last file's PUT
to the filer begins (the filer then queues its notification to the ingest webhook) and stops when
the adapter is Ready=True and Loaded=True (as a watch on the API server reports it: bench/watch.py)
and every replica's engine lists it. In between,
everything is the real chain: filer webhook -> ingest -> broker -> stat -> verify -> load,
each step a functions-framework process over HTTP, routed by the knative/ Triggers, with the
ApiServerSource emulation watching the real server and turning our own status writes into
events as in a cluster. The CPU per adapter of each process over the measured adapters
(settling included) is reported: kube-apiserver and etcd apart from ours, less what they spend
idle (measured over 3 s once the replicas settled). So is the broker stand-in's own time in the
chain's three deliveries (file.changed to stat, statcompleted to verify, ready to load: from each
event's arrival to its logged delivery, less the subscriber's answer, by the broker's log).

Reference, timed in the same run, a run of it after each of the pipeline's (broker deliveries
dropped meanwhile, so no function competes), made by a process of its own with one keep-alive
client kept between runs (as each function has both): the same PUT of the last file (the clock
above starts before it, so both sides time it), then the minimal sequence of HTTP calls the
chain needs against the same real servers: adapter GET, filer listing, status PATCH (stat);
adapter GET, the declared files frozen (each GET from the upload and PUT with its Content-MD5
into the frozen directory, side by side), status PATCH (verify); adapter GET, deployments list,
config GET, pods list, per pod (concurrently, LORAFLOW_LOAD_CONCURRENCY) POST
/v1/load_lora_adapter of the frozen directory, status PATCH (load). A new adapter's loads need
no listing first: the engine's "already loaded" answer tells the same.
Target: the median <= 1.2x the reference at 3 and at 20 replicas; the absolute times reported.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import multiprocessing
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

import httpx

from bench import world as w
from bench.common import Result, median_of, percentile
from bench.cpu import idle_server_cpu, net, stack_cpu
from bench.watch import Conditions
from devstack.eventing.broker import Faults
from devstack.seaweedfs import shared
from devstack.stack import Stack
from events.domain import ADAPTER_READY, ADAPTER_STAT_COMPLETED, FILE_CHANGED
from functions.adapters.storage import quote_path
from functions.logic import frozen
from functions.logic.facts import file_set
from functions.logic.paths import engine_path
from functions.resources.kinds import MODEL as MODEL_KIND
from functions.resources.kinds import MODEL_DEPLOYMENT, MODEL_DEPLOYMENT_LABEL, VLLM_ADAPTER
from functions.settings import Settings
from tests.support.wait import NotReached, eventually

NS = "default"
MERGE = {"Content-Type": "application/merge-patch+json"}
RATIO = 1.2


def adapter_files(name: str) -> dict[str, bytes]:
    base = f"/loraadapters/{NS}/{w.MODEL}/{name}/"
    return {
        base + "adapter_config.json": json.dumps({"peft_type": "LORA", "r": 8}).encode(),
        base + "adapter_model.safetensors": f"weights of {name}".encode(),
    }


def md5s_of(files: dict[str, bytes]) -> dict[str, str]:
    return {p: hashlib.md5(c, usedforsecurity=False).hexdigest() for p, c in files.items()}


class Probe:
    """What `done` waits for: the adapters' conditions as a watch on the API server says them,
    and the engine stand-ins' own state in process (no HTTP). `close()` ends the watch."""

    def __init__(self, stack: Stack, deployment: str) -> None:
        self.stack = stack
        self.watch = Conditions(stack.control_plane, NS)
        pods = stack.workload.pods(NS, f"{MODEL_DEPLOYMENT_LABEL}={deployment}")
        self.replicas = [stack.workload.replica(NS, p["metadata"]["name"]) for p in pods]

    def conditions(self, name: str) -> dict[str, str]:
        return self.watch.get(name)

    def everywhere(self, name: str) -> bool:
        return bool(self.replicas) and all(name in r.loaded for r in self.replicas)

    def close(self) -> None:
        self.watch.close()


def create_deployment(stack: Stack, replicas: int, adapters: list[str]) -> None:
    custom = stack.custom
    with contextlib.suppress(Exception):  # already there (second size in the same stack)
        custom.create_namespaced_custom_object(
            MODEL_KIND.group,
            MODEL_KIND.version,
            NS,
            MODEL_KIND.plural,
            {
                "apiVersion": MODEL_KIND.api_version,
                "kind": MODEL_KIND.kind,
                "metadata": {"name": w.MODEL},
                "spec": {"displayName": "bench model"},
            },
        )
    custom.create_namespaced_custom_object(
        MODEL_DEPLOYMENT.group,
        MODEL_DEPLOYMENT.version,
        NS,
        MODEL_DEPLOYMENT.plural,
        {
            "apiVersion": MODEL_DEPLOYMENT.api_version,
            "kind": MODEL_DEPLOYMENT.kind,
            "metadata": {"name": f"d{replicas}"},
            "spec": {"model": w.MODEL, "replicas": replicas, "loraAdapters": adapters},
        },
    )


def ready_pods(stack: Stack, deployment: str) -> int:
    pods = stack.workload.pods(NS, f"{MODEL_DEPLOYMENT_LABEL}={deployment}")
    ready = 0
    for pod in pods:
        conditions = (pod.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
            ready += 1
    return ready


def create_adapter(stack: Stack, name: str, md5s: dict[str, str]) -> None:
    stack.custom.create_namespaced_custom_object(
        VLLM_ADAPTER.group,
        VLLM_ADAPTER.version,
        NS,
        VLLM_ADAPTER.plural,
        {
            "apiVersion": VLLM_ADAPTER.api_version,
            "kind": VLLM_ADAPTER.kind,
            "metadata": {"name": name},
            "spec": {"model": w.MODEL, "integrity": {"md5": md5s}},
        },
    )


def measure_one(
    stack: Stack,
    probe: Probe,
    name: str,
    before_last: Callable[[], object] = lambda: None,
    timeout: float = 30,
) -> tuple[float, float]:
    """(seconds to Ready, seconds to Ready and loaded everywhere) from the last file's write;
    `before_last` runs once the stack has settled on the first file, just before the clock starts."""
    files = adapter_files(name)
    create_adapter(stack, name, md5s_of(files))
    first, last = list(files.items())
    stack.upload(*first)
    stack.settle(timeout=20, quiet=0.2)
    assert probe.conditions(name).get("Ready") != "True"
    before_last()
    started = time.perf_counter()
    stack.upload(*last)
    deadline = started + timeout
    # woken by the watch as each status write arrives (no polling beside the broker)
    if probe.watch.wait(name, lambda c: "True" in (c.get("Ready"), c.get("Loaded")), timeout) is None:
        raise AssertionError(f"{name}: not Ready after {timeout:.0f} s: {probe.conditions(name)}")
    ready_at = time.perf_counter()
    if probe.watch.wait(name, lambda c: c.get("Loaded") == "True", deadline - ready_at) is None:
        raise AssertionError(f"{name}: not served after {timeout:.0f} s: {probe.conditions(name)}")
    while not probe.everywhere(name):  # Loaded is written once the engines answered: at once
        if time.perf_counter() > deadline:
            raise AssertionError(f"{name}: Loaded but not in every replica after {timeout:.0f} s")
        time.sleep(0.001)
    done = time.perf_counter()
    stack.settle(timeout=20, quiet=0.2)
    return ready_at - started, done - started


def stat_status(listing: dict[str, Any]) -> dict[str, Any]:
    """The status stat writes for a filer listing (files, size, integrity), built directly."""
    entries = listing.get("Entries") or []
    files = [{"path": e["FullPath"], "size": e.get("FileSize") or 0} for e in entries]
    integrity = {
        e["FullPath"]: {"md5": base64.b64decode(e["Md5"]).hex(), "size": e.get("FileSize") or 0}
        for e in entries
    }
    return {"files": files, "size": "1Ki", "integrity": {"files": integrity}}


def engine_urls(pods: list[dict[str, Any]]) -> list[str]:
    """Each pod's engine address, as load reads it from the Pod."""
    return [
        f"http://{p['status']['podIP']}:{p['spec']['containers'][0]['ports'][0]['containerPort']}"
        for p in pods
    ]


def deployment_engines(http: httpx.Client, kube: str, auth: dict[str, str], deployment: str) -> list[str]:
    """The direct sequence's pods list (load's: by the deployment's label) and their engines."""
    pods = http.get(
        f"{kube}/api/v1/namespaces/{NS}/pods",
        params={"labelSelector": f"{MODEL_DEPLOYMENT_LABEL}={deployment}"},
        headers=auth,
    ).json()["items"]
    return engine_urls(pods)


class Job(NamedTuple):
    """One run of the direct sequence: everything it needs, sent to its process."""

    name: str
    deployment: str
    kube: str
    admin_token: str
    filer: str
    upload: tuple[str, bytes]
    """The last file, PUT with the tenant's write headers."""
    tenant_headers: dict[str, str]
    loraflow_headers: dict[str, str]
    md5s: dict[str, str]
    mount_root: str


def direct_sequences(pipe: Connection, concurrency: int) -> None:
    """A process of its own, as each function has (in the benchmark's process it would share
    one interpreter lock with the broker and every engine stand-in): for each Job received, the
    minimal sequence, over one keep-alive client kept between runs as the functions' clients
    are (the first run opens its connections); sends back (seconds, {step: seconds}). None ends it."""
    limits = httpx.Limits(max_keepalive_connections=256, keepalive_expiry=300)
    with (
        httpx.Client(timeout=30, verify=False, limits=limits) as http,
        ThreadPoolExecutor(concurrency) as pool,
    ):
        while (job := pipe.recv()) is not None:
            pipe.send(_direct(http, pool, job))


def _direct(http: httpx.Client, pool: ThreadPoolExecutor, job: Job) -> tuple[float, dict[str, float]]:
    auth = {"Authorization": f"Bearer {job.admin_token}"}
    group_version = f"{VLLM_ADAPTER.group}/{VLLM_ADAPTER.version}"
    obj_url = f"{job.kube}/apis/{group_version}/namespaces/{NS}/{VLLM_ADAPTER.plural}/{job.name}"
    directory = f"/loraadapters/{NS}/{w.MODEL}/{job.name}/"
    ready = w.ready_condition()
    steps: dict[str, float] = {}
    started = time.perf_counter()

    def step(label: str) -> None:
        steps[label] = time.perf_counter() - started

    # the last file's PUT: the pipeline's clock starts before it too
    path, content = job.upload
    http.put(job.filer + quote_path(path), content=content, headers=job.tenant_headers).raise_for_status()
    step("put")
    # stat
    http.get(obj_url, headers=auth).raise_for_status()
    listing = http.get(job.filer + directory, headers={"Accept": "application/json"}).json()
    http.patch(
        obj_url + "/status",
        headers={**auth, **MERGE},
        content=json.dumps({"status": stat_status(listing)}),
    ).raise_for_status()
    step("stat")
    # verify: the declared set frozen as verify freezes it, each file streamed from the
    # upload into a PUT with its Content-MD5 (the filer checks it), side by side
    http.get(obj_url, headers=auth).raise_for_status()
    planned = frozen.plan(NS, w.MODEL, job.name, directory, job.md5s, file_set(job.md5s))

    def freeze(copy: frozen.Copy) -> None:
        source = http.get(job.filer + copy.source)
        source.raise_for_status()
        digest = base64.b64encode(bytes.fromhex(copy.md5)).decode()
        headers = {"Content-MD5": digest, **job.loraflow_headers}
        http.put(job.filer + copy.target, content=source.content, headers=headers).raise_for_status()

    list(pool.map(freeze, planned.copies))
    step("frozen")
    http.patch(
        obj_url + "/status",
        headers={**auth, **MERGE},
        content=json.dumps(
            {"status": {"conditions": [ready], "phase": "Ready", "ready": True, "uploadComplete": True}}
        ),
    ).raise_for_status()
    step("verify")
    # load
    http.get(obj_url, headers=auth).raise_for_status()
    http.get(
        f"{job.kube}/apis/{MODEL_DEPLOYMENT.group}/{MODEL_DEPLOYMENT.version}/namespaces/{NS}/"
        f"{MODEL_DEPLOYMENT.plural}",
        headers=auth,
    ).raise_for_status()
    http.get(job.filer + planned.directory + "adapter_config.json").raise_for_status()
    urls = deployment_engines(http, job.kube, auth, job.deployment)
    engine = engine_path(job.mount_root, planned.directory)

    def serve(url: str) -> None:
        http.post(
            url + "/v1/load_lora_adapter", json={"lora_name": job.name, "lora_path": engine}
        ).raise_for_status()

    step("planned")
    list(pool.map(serve, urls))
    step("loaded")
    loaded = {**w.ready_condition("Loaded"), "type": "Loaded"}
    http.patch(
        obj_url + "/status",
        headers={**auth, **MERGE},
        content=json.dumps({"status": {"usedBy": [job.deployment], "conditions": [ready, loaded]}}),
    ).raise_for_status()
    step("written")
    return time.perf_counter() - started, steps


def _reference(stack: Stack, pipe: Connection, name: str, deployment: str, steps: dict[str, float]) -> float:
    """The minimal HTTP sequence, made directly by its own process once the adapter and its
    first file are there (functions idle: broker drops deliveries)."""
    files = adapter_files(name)
    md5s = md5s_of(files)
    create_adapter(stack, name, md5s)
    first, last = list(files.items())
    stack.upload(*first)
    stack.settle(timeout=20, quiet=0.1)
    token_file = stack.filer_token_file
    job = Job(
        name=name,
        deployment=deployment,
        kube=stack.kube.url.rstrip("/"),
        admin_token=stack.kube.admin_token,
        filer=stack.seaweed.url,
        upload=last,
        tenant_headers=stack.seaweed.write_headers(NS),
        loraflow_headers={"Authorization": f"Bearer {token_file.read_text().strip()}"} if token_file else {},
        md5s=md5s,
        mount_root=str(stack.mount_root),
    )
    pipe.send(job)
    seconds, times = pipe.recv()
    for label, at in times.items():
        steps[label] = steps.get(label, 0.0) + at
    return float(seconds)


CHAIN = {
    "loraflow-stat-steps": FILE_CHANGED,
    "loraflow-verify-steps": ADAPTER_STAT_COMPLETED,
    "loraflow-load-steps": ADAPTER_READY,
}
"""The chain's three deliveries after the filer's notification: trigger -> the event it carries."""


def _mark(stack: Stack, marks: list[int]) -> None:
    """Where the broker's log stands as the clock starts."""
    marks.append(stack.broker.log.last_seq())


def broker_own_ms(entries: list[dict[str, Any]], name: str) -> float:
    """The broker stand-in's own time in the chain's deliveries of adapter `name`: each one's
    time from its event's arrival to its logged delivery, less the subscriber's answer."""
    return sum(
        float(e["duration_ms"]) - float(e["answer_ms"])
        for e in entries
        if e["outcome"] == "delivered"
        and CHAIN.get(str(e.get("trigger"))) == e["type"]
        and f"/{name}" in str(e.get("subject"))
    )


def _size(stack: Stack, replicas: int, repeats: int, concurrency: int) -> dict[str, Any]:
    deployment = f"d{replicas}"
    names = [f"r{replicas}-u{i}" for i in range(repeats + 1)]  # +1: warm-up
    create_deployment(stack, replicas, names)
    eventually(lambda: ready_pods(stack, deployment) == replicas, 60, what="replicas Ready", interval=0.05)
    stack.settle(timeout=20, quiet=0.3)
    # measured once the replicas settled: the servers are busy for a while after they start
    idle = idle_server_cpu(stack.control_plane)
    probe = Probe(stack, deployment)
    ours, theirs = multiprocessing.get_context("spawn").Pipe()
    direct = multiprocessing.get_context("spawn").Process(target=direct_sequences, args=(theirs, concurrency))
    direct.start()
    runs: list[tuple[float, float]] = []
    brokered: list[float] = []
    reference: list[float] = []
    steps: dict[str, float] = {}
    spent: dict[str, float] = {}
    took = 0.0
    try:
        # each pipeline run is followed by a reference run, so both meet the machine as it is
        # then (the first size starts beside the stack's own start-up work)
        for i, name in enumerate(names):
            cpu, began = stack_cpu(stack), time.perf_counter()
            marks: list[int] = []
            runs.append(measure_one(stack, probe, name, partial(_mark, stack, marks)))
            brokered.append(broker_own_ms(stack.broker.log.since(marks[0]), name))
            took += time.perf_counter() - began
            for k, v in stack_cpu(stack).items():
                spent[k] = spent.get(k, 0.0) + v - cpu.get(k, 0.0)
            stack.broker.set_faults(Faults(drop=1.0))
            try:
                reference.append(_reference(stack, ours, f"r{replicas}-ref{i}", deployment, steps))
                # the events of its writes are dropped too, not run in the next pipeline run's window
                stack.settle(timeout=20, quiet=0.2)
            finally:
                stack.broker.set_faults(None)
    finally:
        probe.close()
        ours.send(None)
        direct.join(30)
    spent = net(spent, idle, took)
    runs, reference, brokered = runs[1:], reference[1:], brokered[1:]  # the first: warm-up, dropped
    # the replicas are removed so the next size starts from the same state
    stack.custom.delete_namespaced_custom_object(
        MODEL_DEPLOYMENT.group, MODEL_DEPLOYMENT.version, NS, MODEL_DEPLOYMENT.plural, deployment
    )
    served = [s for _, s in runs]
    paired = [s / r for s, r in zip(served, reference, strict=True)]
    return {
        "replicas": replicas,
        "median_ms": round(median_of(served) * 1000, 1),
        "p90_ms": round(percentile(served, 90) * 1000, 1),
        "to_ready_median_ms": round(median_of([r for r, _ in runs]) * 1000, 1),
        "broker_own_median_ms": round(median_of(brokered), 1),
        "samples_ms": [round(s * 1000, 1) for s in served],
        "reference_ms": round(median_of(reference) * 1000, 1),
        "reference_samples_ms": [round(s * 1000, 1) for s in reference],
        "ratio": round(median_of(served) / median_of(reference), 2),
        # each run against the reference run right after it: the spread within this run (reported;
        # the verdict is the ratio of the medians above)
        "paired_ratio_p25_p50_p75": [round(percentile(paired, q), 2) for q in (25, 50, 75)],
        "reference_mean_cumulative_ms": {k: round(v / (repeats + 1) * 1000, 1) for k, v in steps.items()},
        # CPU per adapter while the pipeline ran (settling included): the servers' apart from ours
        "cpu_ms_per_adapter": {k: round(v * 1000 / len(names), 1) for k, v in sorted(spent.items())},
    }


def run(smoke: bool) -> Result:
    sizes = (2,) if smoke else (3, 20)
    # medians of 25: single samples of both sides vary by +-20% on 2 shared cores
    repeats = 1 if smoke else 25
    concurrency = Settings.from_env().load_concurrency
    results: dict[int, dict[str, Any]] = {}
    # the functions in their own processes, as in a cluster: in this one they would share one
    # interpreter (and its lock) with each other, the broker and every stand-in
    with Stack(
        ping_period=None, function_processes=True, seaweed=shared(), filer_proxy=False, kube_proxy=False
    ) as stack:
        for replicas in sizes:
            results[replicas] = _size(stack, replicas, repeats, concurrency)
            # the deployment was deleted: let its replicas go before the next size (best effort)
            with contextlib.suppress(NotReached):
                eventually(lambda: not stack.workload.pods(NS, MODEL_DEPLOYMENT_LABEL), 5, interval=0.05)
    main = results[sizes[0]]
    value = main["median_ms"]
    met = all(r["ratio"] <= RATIO for r in results.values())
    notes = "; ".join(
        f"{n} replicas: {r['median_ms']:.0f} ms (Ready at {r['to_ready_median_ms']:.0f} ms; the broker "
        f"stand-in's own time between the steps {r['broker_own_median_ms']:.1f} ms) vs "
        f"direct {r['reference_ms']:.0f} ms = {r['ratio']:.2f}x; CPU per adapter: kube-apiserver "
        f"{r['cpu_ms_per_adapter'].get('kube-apiserver', 0):.0f} ms, "
        f"etcd {r['cpu_ms_per_adapter'].get('etcd', 0):.0f}, "
        f"functions {sum(v for k, v in r['cpu_ms_per_adapter'].items() if k.startswith('function/')):.0f}, "
        f"broker and engines {r['cpu_ms_per_adapter'].get('standins', 0):.0f}"
        for n, r in results.items()
    )
    return Result(
        name="upload_latency",
        title=f"Upload to serving: last file's notification to Ready and loaded in {sizes[0]} replicas",
        value=value,
        unit="ms",
        reference=main["reference_ms"],
        ratio=main["ratio"],
        target=f"<= {RATIO}x the direct HTTP sequence against the same servers at "
        + " and ".join(map(str, sizes))
        + " replicas",
        met=met,
        details={
            "sizes": {str(k): v for k, v in results.items()},
            "concurrency": concurrency,
            "engine_latency_ms": 0,
        },
        note=notes,
    )

"""15. Upload storm: N adapters uploaded at once for a ModelDeployment of R replicas.

Embedded stack (devstack.stack.Stack, as `make run`): the real kube-apiserver and etcd (the
functions call it directly, no fault proxy), the real SeaweedFS `weed` (its webhook queue
notifies ingest), the broker stand-in routing by the knative/ Triggers, the ApiServerSource
emulation watching the real server and turning every write into an event, one functions-
framework process per function, the workload stand-in's R engine replicas (load latency 0). A
ModelDeployment of R replicas names all N adapters; the N LoRAAdapters (spec.integrity.md5) are
created and the stack settles (admit, stat: files missing). Then the storm: the 2N files are
written to the filer at once (16 uploaders; each adapter's two files back to back). The clock
starts at the first write; an adapter is done when it is Ready=True and Loaded=True and each of
the R engines lists it (polled every POLL_S = 250 ms: the conditions from a watch on the API
server, bench/watch.py, the engines' state in process; the latencies are tens of seconds).
Reported: the makespan (first write to the last adapter done), p50/p99 of each adapter's last
file written -> done, the broker's counters (retries, dead letters, failures), every delivery's
status, and the CPU per adapter of every process (kube-apiserver and etcd apart from ours).

Reference, in the same run (broker deliveries dropped meanwhile, so no function competes): the
minimal HTTP sequence the chain needs for the same N adapters, made directly with keep-alive
clients against the same real servers, WIDTH adapters at a time (a function process serves 8
requests at once: one worker, 4 threads per CPU), each adapter's R loads at
LORAFLOW_LOAD_CONCURRENCY: adapter GET, filer listing, status PATCH (stat); adapter GET, status
PATCH (verify); adapter GET, deployments list, config GET, pods list, R loads, status PATCH
(load); as in bench/upload_latency.py. The sequences are independent of each other, so
REFERENCE_SAMPLE of them are timed and the time scaled to N (a second N adapters would double
the row's run time). Target: every adapter Ready and Loaded, the makespan <= 1.2x the
reference, no dead letter, every delivery answered 2xx in the end.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from bench import world as w
from bench.common import Result, percentile
from bench.cpu import idle_server_cpu, net, stack_cpu
from bench.upload_latency import (
    NS,
    Probe,
    adapter_files,
    create_adapter,
    create_deployment,
    deployment_engines,
    md5s_of,
    ready_pods,
    stat_status,
)
from devstack.eventing.broker import Faults
from devstack.keepalive import Pools
from devstack.seaweedfs import shared
from devstack.stack import Stack
from functions.adapters.storage import quote_path
from functions.logic.paths import engine_path
from functions.resources.kinds import MODEL_DEPLOYMENT, VLLM_ADAPTER
from functions.settings import Settings
from tests.support.wait import eventually

POLL_S = 0.25
UPLOADERS = 16
WIDTH = 8
REFERENCE_SAMPLE = 200
MERGE = {"Content-Type": "application/merge-patch+json"}
STAMP = "2026-01-01T00:00:00Z"
RATIO = 1.2


def _condition(kind: str, reason: str) -> dict[str, str]:
    return {"type": kind, "status": "True", "reason": reason, "message": "ok", "lastTransitionTime": STAMP}


def _create_all(stack: Stack, names: list[str]) -> None:
    with ThreadPoolExecutor(UPLOADERS) as pool:
        list(pool.map(lambda n: create_adapter(stack, n, md5s_of(adapter_files(n))), names))


def _storm(
    stack: Stack, probe: Probe, names: list[str], timeout: float, idle: dict[str, float]
) -> dict[str, Any]:
    """Write every file at once; per adapter, last file written -> Ready, Loaded, listed by all."""
    written: dict[str, float] = {}
    lock = threading.Lock()

    # the uploads' client: pooled http.client PUTs (devstack.keepalive) on the filer backend, so
    # the pipeline's own client costs the stand-ins' interpreter it shares as little as it can
    uploads_client = Pools(60.0)

    def upload(name: str) -> None:
        for path, content in adapter_files(name).items():
            if stack.storage == "filer":
                answer = uploads_client.request("PUT", stack.seaweed.url + quote_path(path), {}, content)
                if not 200 <= answer.status < 300:
                    raise RuntimeError(f"PUT {path}: HTTP {answer.status}")
            else:
                stack.upload(path, content)
        with lock:
            written[name] = time.perf_counter()

    done: dict[str, float] = {}
    before = dict(vars(stack.broker.counters))
    since = max((e["seq"] for e in stack.broker.log.since(0)), default=0)
    cpu_before = stack_cpu(stack)
    expired_before = sum(s.expired for s in stack.sources)
    unsent_before = sum(s.unsent for s in stack.sources)
    started = time.perf_counter()
    with ThreadPoolExecutor(UPLOADERS) as pool:
        uploads = [pool.submit(upload, n) for n in names]
        pending = set(names)
        deadline = started + timeout
        while pending and time.perf_counter() < deadline:
            now = time.perf_counter()
            # each engine asked only about the adapters still pending that every engine before
            # it serves, and the object read only of one every engine serves: the probe shares
            # this interpreter with the stand-ins it measures
            listed = {n for n in pending if n in written}
            for replica in probe.replicas:
                listed = replica.serving(listed)
            for name in listed:
                conditions = probe.conditions(name)
                if conditions.get("Ready") == "True" and conditions.get("Loaded") == "True":
                    done[name] = now
                    pending.discard(name)
            time.sleep(POLL_S)
        for future in uploads:
            future.result()
    uploads_client.close()
    # the last adapter done, or the timeout when some never were (the row is then not met)
    makespan = (max(done.values()) if len(done) == len(names) else time.perf_counter()) - started
    uploaded = max(written.values()) - started
    cpu_after = net(stack_cpu(stack), idle, time.perf_counter() - started)
    cpu_ms = {k: round((cpu_after[k] - cpu_before.get(k, 0.0)) * 1000 / len(names), 1) for k in cpu_after}
    stack.settle(timeout=60, quiet=0.5)
    after = dict(vars(stack.broker.counters))
    # what was retried, by trigger and answer (the log keeps its last 20,000 entries)
    retries = Counter(
        f"{e.get('trigger')} {e.get('status') or e.get('error', '')[:40]}"
        for e in stack.broker.log.since(since)
        if e["outcome"] == "retrying"
    )
    latencies = [done[n] - written[n] for n in done]
    # what an adapter never done looks like: its conditions, the engines lacking it, and what
    # the broker did with its events (the first steps to find where it was lost)
    stuck = {
        name: {
            "conditions": probe.conditions(name),
            "missing_in": sum(name not in r.loaded for r in probe.replicas),
            "events": Counter(
                " ".join(str(e.get(k) or "") for k in ("type", "trigger", "outcome", "status"))
                for e in stack.broker.log.since(since)
                if f"/{name}/" in f"{e.get('subject') or ''}/"
            ),
        }
        for name in sorted(set(names) - set(done))[:5]
    }

    def served(name: str) -> bool:
        conditions = probe.conditions(name)
        listed = all(name in r.loaded for r in probe.replicas)
        return listed and conditions.get("Ready") == "True" and conditions.get("Loaded") == "True"

    # not done by the timeout but done once the broker is quiet: slow, not lost
    late = sorted(n for n in set(names) - set(done) if served(n))
    return {
        "adapters": len(names),
        "done": len(done),
        "not_done": sorted(set(names) - set(done))[:10],
        "done_after_timeout": len(late),
        "makespan_s": round(makespan, 2),
        "uploads_s": round(uploaded, 2),
        "p50_s": round(percentile(latencies, 50), 2),
        "p99_s": round(percentile(latencies, 99), 2),
        "max_s": round(max(latencies, default=float("nan")), 2),
        "slowest": {
            n: round(done[n] - written[n], 2) for n in sorted(done, key=lambda n: written[n] - done[n])[:5]
        },
        "broker": {k: after[k] - before.get(k, 0) for k in after},
        # CPU per adapter, first write to the last done (less load-dependent than the clock on a
        # shared machine): "standins" is this process, the rest one entry per function process
        "cpu_ms_per_adapter": cpu_ms,
        "dead_letters": len(stack.sink.events),
        # where an event can be lost without a dead letter: a source watch that expired (410,
        # relisted without events, as an informer) and sends the broker never accepted
        "source_watch_expired": sum(s.expired for s in stack.sources) - expired_before,
        "source_unsent": sum(s.unsent for s in stack.sources) - unsent_before,
        "retries_by_trigger_and_answer": dict(retries.most_common(10)),
        "not_done_detail": stuck,
    }


def _load(http: httpx.Client, url: str, body: dict[str, str]) -> httpx.Response:
    """One engine load (idempotent), sent again when 80 threads on one httpx pool lose its connection
    ("Bad file descriptor" in the first full run on the real server)."""
    for attempt in range(3):
        try:
            return http.post(url, json=body)
        except httpx.TransportError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _reference(stack: Stack, names: list[str], deployment: str, concurrency: int) -> float:
    """The minimal HTTP sequence for every adapter, WIDTH adapters at a time (functions idle)."""
    for name in names:
        create_adapter(stack, name, md5s_of(adapter_files(name)))
    with ThreadPoolExecutor(UPLOADERS) as pool:
        list(pool.map(lambda item: stack.upload(*item), [f for n in names for f in adapter_files(n).items()]))
    stack.settle(timeout=60, quiet=0.2)
    kube = stack.kube.url.rstrip("/")
    auth = {"Authorization": f"Bearer {stack.kube.admin_token}"}
    group_version = f"{VLLM_ADAPTER.group}/{VLLM_ADAPTER.version}"
    deployments = (
        f"{kube}/apis/{MODEL_DEPLOYMENT.group}/{MODEL_DEPLOYMENT.version}/namespaces/{NS}/"
        f"{MODEL_DEPLOYMENT.plural}"
    )
    limits = httpx.Limits(max_connections=WIDTH * (concurrency + 4))
    with (
        httpx.Client(timeout=60, verify=False, limits=limits) as http,
        ThreadPoolExecutor(WIDTH) as adapters,
        ThreadPoolExecutor(WIDTH * concurrency) as loads,
    ):

        def sequence(name: str) -> None:
            obj_url = f"{kube}/apis/{group_version}/namespaces/{NS}/{VLLM_ADAPTER.plural}/{name}"
            directory = f"/loraadapters/{NS}/{w.MODEL}/{name}/"
            # stat
            http.get(obj_url, headers=auth).raise_for_status()
            listing = http.get(stack.seaweed.url + directory, headers={"Accept": "application/json"}).json()
            status = stat_status(listing)
            patch = {**auth, **MERGE}
            http.patch(obj_url + "/status", headers=patch, content=json.dumps({"status": status}))
            # verify
            http.get(obj_url, headers=auth).raise_for_status()
            ready = _condition("Ready", "IntegrityVerified")
            verified = {"conditions": [ready], "phase": "Ready", "ready": True, "uploadComplete": True}
            http.patch(obj_url + "/status", headers=patch, content=json.dumps({"status": verified}))
            # load
            http.get(obj_url, headers=auth).raise_for_status()
            http.get(deployments, headers=auth).raise_for_status()
            http.get(stack.seaweed.url + directory + "adapter_config.json").raise_for_status()
            urls = deployment_engines(http, kube, auth, deployment)
            path = engine_path(str(stack.mount_root), directory)
            body = {"lora_name": name, "lora_path": path}
            calls = [loads.submit(_load, http, u + "/v1/load_lora_adapter", body) for u in urls]
            for call in calls:
                call.result().raise_for_status()
            loaded = {"usedBy": [deployment], "conditions": [ready, _condition("Loaded", "Loaded")]}
            http.patch(obj_url + "/status", headers=patch, content=json.dumps({"status": loaded}))

        http.get(f"{kube}/api/v1/namespaces/{NS}/pods", headers=auth)  # warm the connections
        started = time.perf_counter()
        list(adapters.map(sequence, names))
        return time.perf_counter() - started


def run(smoke: bool) -> Result:
    return measure(20, 2) if smoke else measure(1000, 10)


def measure(adapters: int, replicas: int) -> Result:
    timeout = 240.0  # 4x the target: a storm that misses it still says by how much
    concurrency = Settings.from_env().load_concurrency
    deployment = f"d{replicas}"
    names = [f"s{i:04d}" for i in range(adapters)]
    # the reference's sequences are independent of each other: a sample of them, scaled to N
    sample = min(adapters, REFERENCE_SAMPLE)
    reference_names = [f"ref{i:04d}" for i in range(sample)]
    with Stack(
        ping_period=None, function_processes=True, seaweed=shared(), filer_proxy=False, kube_proxy=False
    ) as stack:
        create_deployment(stack, replicas, names + reference_names)
        eventually(
            lambda: ready_pods(stack, deployment) == replicas, 60, what="replicas Ready", interval=0.05
        )
        stack.settle(timeout=30, quiet=0.3)
        setup_started = time.perf_counter()
        _create_all(stack, names)
        stack.settle(timeout=120, quiet=0.5)
        setup_s = time.perf_counter() - setup_started
        idle = idle_server_cpu(stack.control_plane)
        probe = Probe(stack, deployment)
        try:
            storm = _storm(stack, probe, names, timeout, idle)
        finally:
            probe.close()
        stack.broker.set_faults(Faults(drop=1.0))
        try:
            reference = _reference(stack, reference_names, deployment, concurrency) * adapters / sample
        finally:
            stack.broker.set_faults(None)
        with contextlib.suppress(Exception):
            stack.settle(timeout=10, quiet=0.2)
    makespan = storm["makespan_s"]
    broker = storm["broker"]
    cpu = storm.get("cpu_ms_per_adapter") or {}
    clean = (
        broker.get("dead_lettered", 0) == 0 and broker.get("failed", 0) == 0 and storm["dead_letters"] == 0
    )
    ratio = makespan / reference if reference else None
    met = storm["done"] == adapters and ratio is not None and ratio <= RATIO and clean
    return Result(
        name="upload_storm",
        title=f"Upload storm: {adapters} adapters at once, Ready and loaded in {replicas} replicas",
        value=makespan,
        unit="s",
        reference=round(reference, 2),
        ratio=round(ratio, 2) if ratio is not None else None,
        target=f"every adapter Ready and Loaded; <= {RATIO}x the direct HTTP sequence against the same "
        "servers; no dead letter; every event answered 2xx",
        met=met,
        details={
            **storm,
            "replicas": replicas,
            "concurrency": concurrency,
            "reference_width": WIDTH,
            "reference_sample": sample,
            "engine_latency_ms": 0,
            "poll_ms": POLL_S * 1000,
            "setup_create_s": round(setup_s, 2),
        },
        note=(
            f"{storm['done']}/{adapters} done in {makespan:.1f} s (uploads took {storm['uploads_s']:.1f} s); "
            f"last file -> loaded p50 {storm['p50_s']:.1f} s, p99 {storm['p99_s']:.1f} s; "
            f"broker: {broker.get('retried', 0)} retries, {broker.get('dead_lettered', 0)} dead letters; "
            f"reference: the direct HTTP sequence, {WIDTH} adapters at a time, {reference:.1f} s "
            f"({sample} timed, scaled to {adapters}); CPU per adapter: kube-apiserver "
            f"{cpu.get('kube-apiserver', 0):.0f} ms, etcd {cpu.get('etcd', 0):.0f} ms, the functions "
            f"{sum(v for k, v in cpu.items() if k.startswith('function/')):.0f} ms, broker, sources and "
            f"engines {cpu.get('standins', 0):.0f} ms"
        ),
    )

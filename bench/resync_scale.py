"""8. Resync over 10,000 adapters and 200 ModelDeployments (one Ready replica each).

The objects are created in bulk through the Kubernetes stand-in's store (its Python API), each
adapter Ready, used by its deployment and Loaded; each engine replica lists its 50 adapters
(set through the stand-in's state, no HTTP). 1% of the adapters drift: half are missing from
their pod's engine, half have a stale `usedBy`. resync runs in its own functions-framework
process (as in the cluster), is sent one ping, and publishes nudges to an EventSink (K_SINK).
Measured: its answer time, its peak RSS (VmHWM of that process), the API requests it made,
the nudges (exactly the drifted adapters). Reference: the bare reads (the same paginated lists
and the per-pod GET /v1/models, raw JSON, nothing else).
Target: <= 10 s and <= 300 MiB.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx

from bench import world as w
from bench.common import Result, median_of, timed
from devstack.standins.engines.base import LoadedAdapter
from devstack.standins.kube.store import WriteOptions
from events.external import PING
from functions.logic.facts import file_set
from functions.resources.kinds import MODEL_DEPLOYMENT, VLLM_ADAPTER
from tests.support.wait import eventually


def _bulk(world: w.World, ns: str, adapters: int, deployments: int) -> tuple[set[str], dict[str, str]]:
    """Create everything; returns the drifted adapter names and each adapter's deployment."""
    registry, store = world.kube.registry, world.kube.store
    rt_adapter = registry.lookup(VLLM_ADAPTER.group, VLLM_ADAPTER.version, VLLM_ADAPTER.plural)
    assert rt_adapter is not None
    owner = {f"a{i:05d}": f"d{i % deployments:03d}" for i in range(adapters)}
    for d in range(deployments):
        md = f"d{d:03d}"
        world.deployment(ns, md, 1, sorted(a for a, o in owner.items() if o == md))
    world.workload.sync()
    names = sorted(owner)
    drifted = set(names[:: max(1, adapters // (adapters // 100 or 1))][: max(2, adapters // 100)])
    stale_used = set(sorted(drifted)[::2])
    missing = drifted - stale_used
    pod_of = {f"d{d:03d}": world.pods(ns, f"d{d:03d}")[0] for d in range(deployments)}
    for name in names:
        md = owner[name]
        loaded = {  # as load writes it: every Ready pod counted, each served from this file set
            "type": "Loaded",
            "status": "True",
            "reason": "Loaded",
            "message": f"loaded in 1 Ready pod(s): {md} 1/1",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
        directory = world.adapter_dir(ns, name)
        store.create(
            rt_adapter,
            ns,
            {
                "apiVersion": VLLM_ADAPTER.api_version,
                "kind": VLLM_ADAPTER.kind,
                "metadata": {"name": name, "namespace": ns},
                "spec": {"model": w.MODEL},
            },
            WriteOptions(),
        )
        status = {
            "observedGeneration": 1,
            "phase": "Ready",
            "ready": True,
            "usedBy": [] if name in stale_used else [owner[name]],
            "storageRef": {"path": directory},
            "conditions": [w.ready_condition(), loaded],
            "served": [{"pod": pod_of[md], "fileSet": file_set({})}],
        }
        store.mutate(
            rt_adapter, ns, name, lambda obj, s=status: {**obj, "status": s}, "status", WriteOptions()
        )
    for md, pod in pod_of.items():
        replica = world.workload.replica(ns, pod)
        with replica._lock:  # the stand-in's own state: 10,000 loads over HTTP would be setup, not bench
            for name in sorted(a for a, o in owner.items() if o == md and a not in missing):
                replica._adapters[name] = LoadedAdapter(name, w.engine_path(world, ns, name))
    return drifted, owner


def _bare_reads(http: httpx.Client, world: w.World, token: str) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    base = world.kube.url
    paths = [
        f"/apis/{VLLM_ADAPTER.group}/{VLLM_ADAPTER.version}/{VLLM_ADAPTER.plural}",
        f"/apis/{MODEL_DEPLOYMENT.group}/{MODEL_DEPLOYMENT.version}/{MODEL_DEPLOYMENT.plural}",
        "/api/v1/pods?labelSelector=loraflow.io/serving%3Dtrue",
    ]
    pods: list[dict[str, object]] = []
    for path in paths:
        token_ = ""
        while True:
            sep = "&" if "?" in path else "?"
            url = f"{base}{path}{sep}limit=500" + (f"&continue={token_}" if token_ else "")
            page = http.get(url, headers=headers).json()
            if path.startswith("/api/v1/pods"):
                pods += page.get("items") or []
            token_ = (page.get("metadata") or {}).get("continue") or ""
            if not token_:
                break
    urls = [
        f"http://{p['status']['podIP']}:{p['spec']['containers'][0]['ports'][0]['containerPort']}"  # type: ignore[index]
        for p in pods
    ]
    with ThreadPoolExecutor(10) as pool:
        list(pool.map(lambda u: http.get(u + "/v1/models").json(), urls))


def _answers(http: httpx.Client, url: str) -> bool:
    try:
        return http.get(url + "healthz").status_code == 200
    except httpx.TransportError:
        return False


def run(smoke: bool) -> Result:
    adapters, deployments = (200, 4) if smoke else (10_000, 200)
    repeats = 1 if smoke else 3
    with w.world(functions=False) as world:
        ns = world.namespace()
        drifted, _ = _bulk(world, ns, adapters, deployments)
        port = w.free_port()
        process = w.spawn("resync", w.ROOT / "main.py", port)
        url = f"http://127.0.0.1:{port}/"
        http = httpx.Client(timeout=120)
        try:
            eventually(lambda: _answers(http, url), 60, what="resync answers", interval=0.01)  # not measured
            samples: list[float] = []
            requests: list[int] = []
            nudged: set[str] = set()
            for _ in range(repeats):
                world.sink.clear()
                world.kube.reset_counters()
                ping = w.event(PING, {"message": "resync"})
                responses: list[httpx.Response] = []
                samples.append(
                    timed(lambda e=ping, out=responses: out.append(w.first_answer(http, url, e, 60)))
                )
                assert responses[0].status_code == 204, responses[0].text
                requests.append(world.kube.request_count)
                nudged = {e.get_data()["adapter"]["name"] for e in world.sink.events}  # type: ignore[index]
                assert len(world.sink.events) == len(drifted), (len(world.sink.events), len(drifted))
            peak = w.peak_rss_mib(process.pid)
        finally:
            process.terminate()
            process.wait(10)
        reference = [timed(lambda: _bare_reads(http, world, world.kube.admin_token)) for _ in range(repeats)]
        http.close()
    value, ref = median_of(samples), median_of(reference)
    met = value <= 10 and peak <= 300 and nudged == drifted
    return Result(
        name="resync_scale",
        title=f"Resync over {adapters:,} adapters and {deployments} deployments",
        value=round(value, 3),
        unit="s",
        reference=round(ref, 3),
        ratio=round(value / ref, 2),
        target="<= 10 s and <= 300 MiB; nudges only for what drifted",
        met=met,
        details={
            "adapters": adapters,
            "deployments": deployments,
            "samples_s": [round(s, 3) for s in samples],
            "first_call_s": round(samples[0], 3),
            "peak_rss_mib": round(peak, 1),
            "api_requests": requests,
            "drifted": len(drifted),
            "nudges": len(nudged),
            "nudges_exactly_the_drifted": nudged == drifted,
        },
        note=(
            f"peak RSS {peak:.0f} MiB; {requests[-1]} API requests; "
            f"{len(nudged)} nudges for {len(drifted)} drifted"
        ),
    )

"""6. Storage scale: stat + verify of an adapter directory of 10,000 files (paginated listing).

An admitted adapter whose directory holds 10,000 files (the real SeaweedFS filer, page size
1000): `adapter.admitted` -> stat (paginated listing, one status write) and its
`statcompleted` -> verify (declared MD5s against the listing, one status write). A fresh
adapter per repetition over the same directory: deleted and created again under its name, so
that each stat finds an empty status to fill. The status records LORAFLOW_STATUS_MAX_FILES
(1,000) of the files, the declared ones first: all 10,000 would make a ~1.8 MB object, which
a real API server refuses (etcd's 1.5 MiB request limit).

Counted: the wall clock from posting `adapter.admitted` to stat until verify answered its
reply. stat and verify each run in their own process (functions/edge/server.py, as each
Knative Service's pod runs them), so they share no interpreter with this process or each
other; their first event (imports, clients) is a warm-up on a small adapter, not measured.
The real kube-apiserver and etcd answer their requests (the testbed's fault proxy in front):
their time is counted, as in a cluster, and their CPU over each measured pair is reported
apart (`server_cpu_ms`, /proc, less what they spend idle; the other parts' watches share the
server, so it is an upper bound), with the requests the API server's audit log counted and the
time stat and verify waited on it for them (`server_waited_ms`: the union of their times there).
Not counted: the broker between the two steps (the bench hands stat's reply to verify).

Reference: the bare paginated listing of the same directory (the same GETs with
`limit`/`lastFileName`, each page decoded by json.loads, nothing else), timed just before
each repetition: on this shared 2-core machine a listing drifts by +-30% within a minute, so
the ratio is the median of the pairs' ratios. `stat_dir_ms`: the listing as stat makes it
(FilerStorage.stat_dir in this process: the adapter's directory, then its subdirectory),
timed beside it. It decodes only the four fields it reads, so it is usually faster than the
reference; `samples_ms` minus it is what stat and verify add to their own listing.
Peak memory: the stat process's peak RSS (VmHWM of its worker), and its growth during the
measured calls.
Target: <= 2x the bare listing.
"""

from __future__ import annotations

import contextlib
import json
import signal
import statistics
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
from cloudevents.http import CloudEvent

from bench import world as w
from bench.common import Result, median_of, timed
from bench.cpu import idle_server_cpu, server_cpu
from devstack.kubernetes.audit import time_on_server
from devstack.ports import free_port
from devstack.processes import kill_tree
from events.domain import ADAPTER_ADMITTED
from functions.adapters.storage import FilerStorage
from functions.resources.kinds import VLLM_ADAPTER
from functions.settings import Settings

NAME = "big"
"""The adapter whose directory holds the files (created afresh for each repetition)."""
Send = Callable[[httpx.Client, str, CloudEvent], httpx.Response]


def bare_listing(http: httpx.Client, url: str, directory: str, page_size: int) -> int:
    count, last = 0, ""
    while True:
        params = {"limit": str(page_size)}
        if last:
            params["lastFileName"] = last
        page = http.get(url + directory, params=params, headers={"Accept": "application/json"}).json()
        count += len(page.get("Entries") or [])
        if not page.get("ShouldDisplayLoadMore") or not page.get("LastFileName"):
            return count
        last = page["LastFileName"]


@contextlib.contextmanager
def served(name: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`name` in its own functions-framework process (configured by the environment `world()`
    set): its URL, and the process for its peak RSS; it answers once it has started (the
    warm-up posts with `first_answer`). Stopped on exit."""
    port = free_port()
    process = w.spawn(name, w.ROOT / "main.py", port)
    try:
        yield f"http://127.0.0.1:{port}/", process
    finally:
        process.send_signal(signal.SIGINT)  # stops as on SIGTERM
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:  # a loaded machine: the arbiter and its worker
            kill_tree(process)


def fresh_adapter(world: w.World, ns: str, name: str, md5s: dict[str, str]) -> None:
    """The adapter as admit leaves it before stat: spec declared, status observedGeneration 1."""
    if world.get(VLLM_ADAPTER, ns, name) is not None:
        world.custom.delete_namespaced_custom_object(
            VLLM_ADAPTER.group, VLLM_ADAPTER.version, ns, VLLM_ADAPTER.plural, name
        )
    world.create(VLLM_ADAPTER, ns, {"metadata": {"name": name}, "spec": world.spec(md5s)})
    world.patch_status(VLLM_ADAPTER, ns, name, {"observedGeneration": 1})


def server_seconds(world: w.World) -> float:
    """CPU seconds kube-apiserver and etcd have used so far."""
    return sum(server_cpu(world.kube.plane).values())


def run(smoke: bool) -> Result:
    files = 200 if smoke else 10_000
    repeats = 1 if smoke else 7
    settings = Settings.from_env()
    page_size, recorded = settings.filer_page_size, min(files, settings.status_max_files)
    ours: list[float] = []
    bare: list[float] = []
    listing: list[float] = []
    server: list[float] = []
    waited: list[float] = []
    requests = 0
    status_bytes = 0
    with (
        w.world(functions=False) as world,
        served("stat") as (stat_url, stat_process),
        served("verify") as (verify_url, _),
    ):
        ns = world.namespace()
        md5s = world.put_files(ns, NAME)
        base = world.adapter_dir(ns, NAME)
        with ThreadPoolExecutor(8) as pool:  # setup only: many small PUTs to the real filer
            list(pool.map(lambda i: world.files.put_file(f"{base}extra/part-{i:05d}.bin", b"x"),
                          range(files - len(md5s))))  # fmt: skip
        http = httpx.Client(timeout=60)
        filer = world.seaweed.server.url
        storage = FilerStorage(filer, page_size)

        def stat_and_verify(name: str, listed: int, send: Send = w.post_to) -> None:
            admitted = w.event(ADAPTER_ADMITTED, {**w.adapter_data(VLLM_ADAPTER, ns, name), "generation": 1})
            response = send(http, stat_url, admitted)
            assert response.status_code == 200, response.text
            reply = w.reply_of(response)
            assert reply is not None
            data = reply.get_data()
            assert isinstance(data, dict) and data["files"] == listed, data
            verdict = send(http, verify_url, reply)
            assert verdict.status_code == 200, verdict.text

        # warm-up, not measured: each process starts, imports its modules and builds its clients
        fresh_adapter(world, ns, "warm", world.put_files(ns, "warm"))
        stat_and_verify("warm", 2, send=w.first_answer)
        assert bare_listing(http, filer, base + "extra/", page_size) == files - len(md5s)
        idle = sum(idle_server_cpu(world.kube.plane).values())  # after the warm-up: the servers settled
        peak_before = w.peak_rss_mib(stat_process.pid)
        for _ in range(repeats):
            fresh_adapter(world, ns, NAME, md5s)
            bare.append(timed(lambda: bare_listing(http, filer, base + "extra/", page_size)))
            listing.append(timed(lambda: storage.stat_dir(base)))
            world.kube.reset_counters()
            before, mark = server_seconds(world), world.kube.audit.mark()
            ours.append(timed(lambda: stat_and_verify(NAME, files)))
            server.append(max(0.0, server_seconds(world) - before - idle * ours[-1]))
            waited.append(time_on_server(world.kube.audit.since(mark)))
            requests = world.kube.request_count
            obj = world.read(VLLM_ADAPTER, ns, NAME)
            assert len(obj["status"]["files"]) == recorded
            assert set(md5s) <= set(obj["status"]["integrity"]["files"])
            status_bytes = len(json.dumps(obj["status"], separators=(",", ":")))
            assert any(c["type"] == "Ready" and c["status"] == "True" for c in obj["status"]["conditions"])
        peak_after = w.peak_rss_mib(stat_process.pid)
        http.close()
        storage.close()
    value, reference = median_of(ours), median_of(bare)
    pairs = [o / b for o, b in zip(ours, bare, strict=True)]
    ratio = statistics.median(pairs)
    growth = max(0.0, peak_after - peak_before)
    server_ms = round(median_of(server) * 1000, 1)
    waited_ms = round(median_of(waited) * 1000, 1)
    return Result(
        name="storage_scale",
        title=f"stat + verify of an adapter directory of {files:,} files",
        value=round(value * 1000, 1),
        unit="ms",
        reference=round(reference * 1000, 1),
        ratio=round(ratio, 2),
        target="<= 2x the bare paginated listing",
        met=ratio <= 2,
        details={
            "files": files,
            "page_size": page_size,
            "samples_ms": [round(s * 1000, 1) for s in ours],
            "bare_listing_ms": [round(s * 1000, 1) for s in bare],
            "stat_dir_ms": [round(s * 1000, 1) for s in listing],
            "pair_ratios": [round(r, 2) for r in pairs],
            "server_cpu_ms": server_ms,
            "server_cpu_samples_ms": [round(s * 1000, 1) for s in server],
            "server_waited_ms": waited_ms,
            "server_waited_samples_ms": [round(s * 1000, 1) for s in waited],
            "kube_requests": requests,
            "stat_peak_rss_mib": round(peak_after, 1),
            "stat_peak_rss_growth_mib": round(growth, 1),
            "status_files_recorded": recorded,
            "status_bytes": status_bytes,
        },
        note="stat and verify in their own processes, on the real kube-apiserver and etcd"
        + f" ({requests} requests, waited on for {waited_ms:.0f} ms; the servers' CPU {server_ms:.0f} ms)"
        + f"; status records {recorded:,} of {files:,} files ({status_bytes / 1024:.0f} KiB; all would be "
        "~1.8 MB, over etcd's 1.5 MiB); "
        f"stat's peak RSS {peak_after:.0f} MiB (+{growth:.0f} MiB during the measured calls)"
        + (
            ""
            if ratio <= 2
            else f"; NOT met: stat's own listing takes {median_of(listing) * 1000:.0f} ms and the API "
            f"server's answers {waited_ms:.0f} ms, against a bare listing of "
            f"{min(bare) * 1000:.0f}-{max(bare) * 1000:.0f} ms in this run (pairs "
            f"{min(pairs):.2f}-{max(pairs):.2f}x)"
        ),
    )

"""6. Storage scale: stat + verify of an adapter directory of 10,000 files (paginated listing).

An admitted adapter whose directory holds 10,000 files (the real SeaweedFS filer, page size 1000):
`adapter.admitted` -> stat (paginated listing, one status write with every file) and its
`statcompleted` -> verify (declared MD5s against the listing, one status write). A fresh
adapter per repetition. The status records LORAFLOW_STATUS_MAX_FILES (1,000) of the files,
the declared ones first: all 10,000 would make a ~1.8 MB object, which a real API server
refuses (etcd's 1.5 MiB request limit). Reference: the bare paginated listing of the same directory (the
same GETs with `limit`/`lastFileName`, JSON decoded, nothing else). Peak memory: the growth
of this process's peak RSS during the measured calls (stand-ins included: conservative).
Target: <= 2x the bare listing.
"""

from __future__ import annotations

import json
import resource
from concurrent.futures import ThreadPoolExecutor

import httpx

from bench import world as w
from bench.common import Result, median_of, timed
from events.domain import ADAPTER_ADMITTED
from functions.resources.kinds import VLLM_ADAPTER
from functions.settings import Settings


def _rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() / (1 << 20)


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


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


def run(smoke: bool) -> Result:
    files = 200 if smoke else 10_000
    repeats = 1 if smoke else 3
    settings = Settings.from_env()
    page_size, recorded = settings.filer_page_size, min(files, settings.status_max_files)
    ours: list[float] = []
    bare: list[float] = []
    status_bytes = 0
    with w.world() as world:
        ns = world.namespace()
        names = [f"s{i}" for i in range(repeats)]
        declared: dict[str, set[str]] = {}
        for name in names:
            md5s = world.put_files(ns, name)
            declared[name] = set(md5s)
            base = world.adapter_dir(ns, name)
            with ThreadPoolExecutor(8) as pool:  # setup only: many small PUTs to the real filer
                list(pool.map(lambda i, b=base: world.files.put_file(f"{b}extra/part-{i:05d}.bin", b"x"),
                              range(files - len(md5s))))  # fmt: skip
            world.create(VLLM_ADAPTER, ns, {"metadata": {"name": name}, "spec": world.spec(md5s)})
            world.patch_status(VLLM_ADAPTER, ns, name, {"observedGeneration": 1})
        http = httpx.Client(timeout=60)
        assert bare_listing(
            http, world.seaweed.server.url, world.adapter_dir(ns, names[0]) + "extra/", page_size
        )
        rss_before, peak_before = _rss_mib(), _peak_mib()
        for name in names:
            admitted = w.event(ADAPTER_ADMITTED, {**w.adapter_data(VLLM_ADAPTER, ns, name), "generation": 1})

            def stat_and_verify(event: object = admitted) -> None:
                response = world.post("stat", event)  # type: ignore[arg-type]
                assert response.status_code == 200, response.text
                reply = w.reply_of(response)
                assert reply is not None and reply.get_data()["files"] == files
                verdict = world.post("verify", reply)
                assert verdict.status_code == 200, verdict.text

            ours.append(timed(stat_and_verify))
            obj = world.read(VLLM_ADAPTER, ns, name)
            assert len(obj["status"]["files"]) == recorded
            assert declared[name] <= set(obj["status"]["integrity"]["files"])
            status_bytes = len(json.dumps(obj["status"], separators=(",", ":")))
            assert any(c["type"] == "Ready" and c["status"] == "True" for c in obj["status"]["conditions"])
        peak_after = _peak_mib()
        for name in names:
            directory = world.adapter_dir(ns, name)
            bare.append(
                timed(
                    lambda d=directory: bare_listing(http, world.seaweed.server.url, d + "extra/", page_size)
                )
            )
        http.close()
    value, reference = median_of(ours), median_of(bare)
    ratio = value / reference
    growth = max(0.0, peak_after - max(peak_before, rss_before))
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
            "peak_rss_mib": round(peak_after, 1),
            "peak_rss_growth_mib": round(growth, 1),
            "status_files_recorded": recorded,
            "status_bytes": status_bytes,
        },
        note=f"status records {recorded:,} of {files:,} files ({status_bytes / 1024:.0f} KiB; all would be "
        "~1.8 MB, over etcd's 1.5 MiB); "
        f"peak RSS {peak_after:.0f} MiB (+{growth:.0f} MiB during stat+verify, stand-ins included)"
        + ("" if ratio <= 2 else "; NOT met: see bench/results/storage_scale.json samples"),
    )

"""7. Streaming MD5 fallback: hash a file through the real filer vs `md5sum` on disk.

When storage reports no MD5, verify hashes the file by streaming it from the filer
(FilerStorage.hash_file). The file is stored in the real SeaweedFS (split into 4 MiB chunks
by `-filer.maxMB=4`, so the filer assembles it from its volume server while it streams);
`md5sum` reads the same bytes from a local file. Each of our runs is followed by one of
`md5sum`, so both meet the machine as it is then (the filer may still be collecting an earlier
row's deleted chunks). Target: >= 0.9x the throughput of `md5sum`.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import tempfile
from pathlib import Path

import httpx

from bench.common import Result, median_of, timed
from devstack.seaweedfs import shared
from functions.adapters.storage import FilerStorage

TARGET = 0.9


def _write_random(path: Path, size: int) -> None:
    block = os.urandom(1 << 20)
    with path.open("wb") as out:
        for _ in range(size >> 20):
            out.write(block)


def run(smoke: bool) -> Result:
    size = (8 if smoke else 512) << 20
    repeats = 1 if smoke else 5
    filer = shared().server.url
    path = f"/loraadapters/bench-{secrets.token_hex(3)}/model/big/adapter_model.safetensors"
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / "file.bin"
        _write_random(local, size)
        with local.open("rb") as body:
            httpx.put(filer + path, content=body, timeout=600).raise_for_status()
        storage = FilerStorage(filer, page_size=1000)
        try:
            ours: list[float] = []
            reference: list[float] = []
            for _ in range(repeats):
                ours.append(timed(lambda: storage.hash_file(path, 1 << 40)))
                reference.append(
                    timed(lambda: subprocess.run(["md5sum", str(local)], check=True, capture_output=True))
                )
            expected = subprocess.run(["md5sum", str(local)], check=True, capture_output=True, text=True)
            assert storage.hash_file(path, 1 << 40) == expected.stdout.split()[0]
        finally:
            storage.close()
            httpx.delete(filer + path.rsplit("/", 3)[0], params={"recursive": "true"}, timeout=60)
    mib = size / (1 << 20)
    ours_rate, ref_rate = mib / median_of(ours), mib / median_of(reference)
    ratio = ours_rate / ref_rate
    return Result(
        name="md5_stream",
        title=f"Streaming MD5 of a {int(mib)} MiB file through the real filer",
        value=round(ours_rate, 1),
        unit="MiB/s",
        reference=round(ref_rate, 1),
        ratio=round(ratio, 3),
        target=f">= {TARGET}x md5sum",
        met=ratio >= TARGET,
        details={"size_mib": mib, "repeats": repeats, "ours_s": ours, "md5sum_s": reference},
    )

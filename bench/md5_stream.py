"""7. Streaming MD5 fallback: hash a file through the filer stand-in vs `md5sum` on disk.

When storage reports no MD5, verify hashes the file by streaming it from the filer
(FilerStorage.hash_file). Target: >= 0.7x the throughput of `md5sum` on the same file.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from bench.common import Result, median_of, timed
from devstack.standins.filer import FilerServer
from functions.adapters.storage import FilerStorage

PATH = "/loraadapters/bench/model/big/adapter_model.safetensors"


def _write_random(path: Path, size: int) -> None:
    block = os.urandom(1 << 20)
    with path.open("wb") as out:
        for _ in range(size >> 20):
            out.write(block)


def run(smoke: bool) -> Result:
    size = (8 if smoke else 512) << 20
    repeats = 1 if smoke else 3
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "filer"
        data_dir.mkdir()
        filer = FilerServer(data_dir=data_dir).start()
        try:
            local = Path(tmp) / "file.bin"
            _write_random(local, size)
            with local.open("rb") as body:
                filer.put_file(PATH, body.read()) if smoke else _upload_streaming(filer.url, local)
            storage = FilerStorage(filer.url, page_size=1000)
            on_disk = filer_path(data_dir)
            ours = [timed(lambda: storage.hash_file(PATH, 1 << 40)) for _ in range(repeats)]
            reference = [
                timed(lambda: subprocess.run(["md5sum", str(on_disk)], check=True, capture_output=True))
                for _ in range(repeats)
            ]
            assert (
                storage.hash_file(PATH, 1 << 40)
                == subprocess.run(
                    ["md5sum", str(on_disk)], check=True, capture_output=True, text=True
                ).stdout.split()[0]
            )
        finally:
            filer.stop()
    mib = size / (1 << 20)
    ours_rate, ref_rate = mib / median_of(ours), mib / median_of(reference)
    ratio = ours_rate / ref_rate
    return Result(
        name="md5_stream",
        title=f"Streaming MD5 of a {int(mib)} MiB file through the filer",
        value=round(ours_rate, 1),
        unit="MiB/s",
        reference=round(ref_rate, 1),
        ratio=round(ratio, 3),
        target=">= 0.7x md5sum",
        met=ratio >= 0.7,
        details={"size_mib": mib, "repeats": repeats, "ours_s": ours, "md5sum_s": reference},
    )


def filer_path(data_dir: Path) -> Path:
    return data_dir / PATH.lstrip("/")


def _upload_streaming(url: str, local: Path) -> None:
    import httpx

    with local.open("rb") as body:
        httpx.put(url + PATH, content=body, timeout=300).raise_for_status()

"""16. Freezing a verified file set: the ways the real SeaweedFS can copy it, for time and bytes.

A verified adapter's files are copied to a content-addressed directory that only loraflow
writes, and the engines load from there. One adapter file of 100 MiB and one of 1 GiB,
uploaded through the S3 gateway (multipart, so storage keeps no MD5 for it, the harder case),
are frozen by each mechanism the real SeaweedFS 4.48 offers:

- `filer cp.from`: the filer's server-side copy (`POST <dst>?cp.from=<src>`): it copies the
  chunks volume to volume, with preconditions on the source (`copy.srcSize` ...);
- `s3 CopyObject`: the S3 gateway's server-side copy into another key;
- `through the filer (Content-MD5)`: what loraflow does (`FilerStorage.copy_file`): GET the
  bytes and PUT them back with `Content-MD5` (the client moves every byte twice; the filer
  checks the digest as it stores them, so no second read checks the copy);
- `filer mv.from`: a rename (metadata only): it takes the file away from the tenant's
  directory, so it cannot freeze a copy; measured as the floor.

On a SeaweedFS of the row's own, with room for every copy, each figure is the median of three
rounds (a round copies by every mechanism, one after the other, so each meets the machine as it
is then): wall time, bytes through the client, bytes the volume servers grew by, and the
streamed MD5 of the copy (what loraflow checks before the first load). A hard link has no HTTP
or S3 call (only `weed mount` and gRPC CreateEntry with a HardLinkId make one).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import boto3
import httpx

from bench.common import Result
from devstack.seaweedfs.server import SeaweedServer
from functions.adapters.storage import FilerStorage, quote_path


def _volume_bytes(data: Path) -> int:
    return sum(p.stat().st_size for p in data.rglob("*.dat"))


def _ok(response: httpx.Response) -> None:
    if response.is_error:
        raise RuntimeError(
            f"{response.request.method} {response.request.url}: {response.status_code} {response.text}"
        )


def _ok_post(client: httpx.Client, path: str, params: dict[str, str]) -> None:
    _ok(client.post(quote_path(path), params=params))


def _copy_through(storage: FilerStorage, source: str, target: str, size: int, md5: str) -> None:
    if not storage.copy_file(source, target, size, md5):
        raise RuntimeError("the filer refused the copy")


def _timed(action: Callable[[], Any]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def _medians(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over the rounds, and the rounds' times."""
    figures = {k: round(statistics.median(e[k] for e in entries), 3) for k in entries[0]}
    return figures | {"samples_seconds": [round(e["seconds"], 3) for e in entries]}


def _measure(
    size: int, filer: str, s3: Any, bucket: str, data: Path, rounds: int
) -> dict[str, dict[str, Any]]:
    client = httpx.Client(base_url=filer, timeout=600)
    storage = FilerStorage(filer, page_size=1000)
    tag = secrets.token_hex(3)
    key = f"loraadapters/bench-{tag}/m/a/adapter_model.safetensors"
    source = f"/buckets/{bucket}/{key}"
    block = os.urandom(1 << 20)
    digest = hashlib.md5(usedforsecurity=False)
    for _ in range(size >> 20):
        digest.update(block)
    expected = digest.hexdigest()

    def body() -> Any:
        for _ in range(size >> 20):
            yield block

    config = boto3.s3.transfer.TransferConfig(multipart_threshold=8 << 20, multipart_chunksize=8 << 20)
    s3.upload_fileobj(_Reader(body()), bucket, key, Config=config)
    samples: dict[str, list[dict[str, Any]]] = {}
    failures: dict[str, dict[str, Any]] = {}

    def record(name: str, action: Callable[[], Any], client_bytes: int, copy_path: str | None) -> None:
        before = _volume_bytes(data)
        started = time.perf_counter()
        try:
            action()
        except Exception as err:  # a mechanism that fails is a figure too: how long, and why
            failures[name] = {
                "failed_after_seconds": round(time.perf_counter() - started, 3),
                "error": str(err)[:300],
            }
            return
        seconds = time.perf_counter() - started
        time.sleep(0.5)  # the volume files are appended to asynchronously
        grown = _volume_bytes(data) - before
        entry: dict[str, Any] = {
            "seconds": seconds,
            "client_mib": client_bytes / (1 << 20),
            "stored_mib": grown / (1 << 20),
        }
        if copy_path is not None:
            entry["md5_check_seconds"] = _timed(lambda: storage.hash_file(copy_path, 1 << 40))
            assert storage.hash_file(copy_path, 1 << 40) == expected, name
        samples.setdefault(name, []).append(entry)

    frozen = f"/loraflow-frozen/bench-{tag}"
    for round_ in range(rounds):
        copied = f"{frozen}/cp{round_}/adapter_model.safetensors"
        params = {"cp.from": source, "copy.srcSize": str(size)}
        record("filer cp.from", partial(_ok_post, client, copied, params), 0, copied)
        copy_key = f"loraflow-frozen/bench-{tag}/s3{round_}/adapter_model.safetensors"
        s3_copy = partial(
            s3.copy_object, Bucket=bucket, Key=copy_key, CopySource={"Bucket": bucket, "Key": key}
        )
        record("s3 CopyObject", s3_copy, 0, f"/buckets/{bucket}/{copy_key}")
        through = f"{frozen}/through{round_}/adapter_model.safetensors"
        ours = partial(_copy_through, storage, source, through, size, expected)
        record("through the filer (Content-MD5)", ours, 2 * size, None)
        assert storage.hash_file(through, 1 << 40) == expected
    for entry in samples["through the filer (Content-MD5)"]:
        entry["md5_check_seconds"] = 0.0  # the filer checked it
    moved = f"/buckets/{bucket}/{key}.moved"
    move = partial(_ok_post, client, moved, {"mv.from": source})
    record("filer mv.from", move, 0, None)  # last: it takes the source away
    figures = {name: _medians(entries) for name, entries in samples.items()} | failures
    client.delete(quote_path(frozen), params={"recursive": "true"})
    client.delete(quote_path(f"/buckets/{bucket}/loraadapters/bench-{tag}"), params={"recursive": "true"})
    client.delete(quote_path(f"/buckets/{bucket}/loraflow-frozen"), params={"recursive": "true"})
    client.close()
    storage.close()
    return figures


class _Reader:
    """A file-like view of a byte-block generator (boto3's upload_fileobj reads from it)."""

    def __init__(self, blocks: Any) -> None:
        self._blocks = blocks
        self._rest = b""

    def read(self, n: int = -1) -> bytes:
        out = bytearray(self._rest)
        while n < 0 or len(out) < n:
            block = next(self._blocks, None)
            if block is None:
                break
            out += block
        if n >= 0:
            self._rest = bytes(out[n:])
            return bytes(out[:n])
        self._rest = b""
        return bytes(out)


ROUNDS = 3
VOLUMES = 220
"""64 MB volumes for the row's own SeaweedFS: every round's three copies of 1 GiB, its source and
the 100 MiB size's, kept until the end (~11 GiB at most, on disk only as written)."""


def run(smoke: bool) -> Result:
    rounds = 1 if smoke else ROUNDS
    server = SeaweedServer(volumes=VOLUMES).start()
    try:
        s3 = boto3.client("s3", endpoint_url=server.s3_url, **server.s3_operator.boto())
        bucket = f"freeze-{secrets.token_hex(3)}"
        s3.create_bucket(Bucket=bucket)
        sizes = [8 << 20] if smoke else [100 << 20, 1 << 30]
        data = server.dir / "data"
        results = {
            f"{size >> 20} MiB": _measure(size, server.url, s3, bucket, data, rounds) for size in sizes
        }
    finally:
        server.stop()
    largest = results[f"{sizes[-1] >> 20} MiB"]
    chosen, s3_copy = largest["through the filer (Content-MD5)"], largest["s3 CopyObject"]
    reference = s3_copy.get("seconds", 0.0) + s3_copy.get("md5_check_seconds", 0.0)
    ratio = chosen["seconds"] / reference if reference else None
    return Result(
        name="freeze",
        title=f"Freeze a {sizes[-1] >> 20} MiB adapter file and check it (filer: copy with Content-MD5)",
        value=round(chosen["seconds"], 2),
        unit="s",
        reference=round(reference, 2),
        ratio=round(ratio, 3) if ratio is not None else None,
        target="<= 1.5x S3 CopyObject + hashing the copy",
        met=ratio is not None and ratio <= 1.5,
        details=results,
        note="reference: S3 CopyObject then a streamed MD5 of the copy (the S3 backend's way); medians of "
        f"{rounds} rounds, each copying by every mechanism",
    )

"""The engine stand-in's FilerReader (what an engine reads through its SeaweedFS mount, and what a
node's mount keeps of what its engines read), against the real filer, with faults from a
FaultProxy in front of it."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from devstack.seaweedfs import FaultProxy, shared
from devstack.standins.engines.base import FilerReader, FilerUnreadable, MountCache

CONFIG = b'{"peft_type": "LORA", "r": 8}'
WEIGHTS = b"w" * 3_000_000  # more than one 1 MiB chunk


@pytest.fixture()
def proxy() -> Iterator[FaultProxy]:
    with FaultProxy(shared().server.url) as running:
        yield running


@pytest.fixture()
def directory() -> str:
    base = f"/filer-reader/{secrets.token_hex(4)}/a1/"
    with httpx.Client(timeout=30) as http:
        for name, content in (("adapter_config.json", CONFIG), ("adapter_model.safetensors", WEIGHTS)):
            http.put(shared().server.url + base + name, content=content).raise_for_status()
    return base


def test_reads_config_and_md5s_of_every_file(proxy: FaultProxy, directory: str) -> None:
    reader = FilerReader(proxy.url)
    files = reader.read(directory)
    assert files is not None and files.config == CONFIG
    assert files.md5s == {
        "adapter_config.json": hashlib.md5(CONFIG, usedforsecurity=False).hexdigest(),
        "adapter_model.safetensors": hashlib.md5(WEIGHTS, usedforsecurity=False).hexdigest(),
    }
    assert reader.read(directory + "missing/") is None
    reader.close()


def test_many_readers_at_once_share_kept_alive_connections(proxy: FaultProxy, directory: str) -> None:
    reader = FilerReader(proxy.url)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: reader.read(directory), range(40)))
    assert all(r is not None and r.config == CONFIG and len(r.md5s) == 2 for r in results)
    # 3 requests per read; connections are reused, not one per request
    assert proxy.requests == 120
    reader.close()


def test_a_kept_alive_connection_closed_under_it_is_retried_on_a_new_one(
    proxy: FaultProxy, directory: str
) -> None:
    reader = FilerReader(proxy.url)
    assert reader.read(directory) is not None  # a connection is now pooled
    proxy.inject(reset=True, times=1)
    files = reader.read(directory)
    assert files is not None and files.config == CONFIG
    reader.close()


def test_a_new_connection_that_fails_is_the_mounts_io_error(proxy: FaultProxy, directory: str) -> None:
    reader = FilerReader(proxy.url)
    proxy.inject(reset=True, times=1)
    with pytest.raises(FilerUnreadable):
        reader.read(directory)
    proxy.inject(status=500, times=1)
    with pytest.raises(FilerUnreadable):
        reader.read(directory)
    assert reader.read(directory) is not None
    reader.close()


def test_engines_on_one_node_read_a_file_once_until_it_is_written_again(
    proxy: FaultProxy, directory: str
) -> None:
    node = MountCache()
    first, second = FilerReader(proxy.url, cache=node), FilerReader(proxy.url, cache=node)
    read = first.read(directory)
    assert proxy.requests == 3  # the listing, then each file
    # the real filer lists each file's chunks: a second engine on the node reads the listing only
    assert second.read(directory) == read
    assert proxy.requests == 4
    weights = b"v" * 2_000_000
    with httpx.Client(timeout=30) as http:
        put = http.put(shared().server.url + directory + "adapter_model.safetensors", content=weights)
        put.raise_for_status()
    # written again: new chunks, read again; the config's chunks are the same, not read again
    again = second.read(directory)
    assert again is not None and again.config == CONFIG
    assert again.md5s["adapter_model.safetensors"] == hashlib.md5(weights, usedforsecurity=False).hexdigest()
    assert proxy.requests == 6
    # an engine with a mount of its own (another node) reads every file
    third = FilerReader(proxy.url, cache=MountCache())
    assert third.read(directory) == again
    assert proxy.requests == 9
    for reader in (first, second, third):
        reader.close()


def _identity(entry: dict[str, object]) -> tuple[object, ...]:
    found = MountCache.identity(entry)
    assert found is not None
    return found


def test_the_mount_cache_keeps_the_most_recently_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(MountCache, "MAX_FILES", 2)
    node = MountCache()
    a, b, c = (_identity({"FileSize": 1, "chunks": [{"file_id": f"1,{n:x}", "size": 1}]}) for n in range(3))
    assert len({a, b, c}) == 3
    node.put(a, "a", None)
    node.put(b, "b", None)
    assert node.get(a) == ("a", None)  # used: b is now the least recent
    node.put(c, "c", None)
    assert node.get(b) is None
    assert node.get(a) == ("a", None) and node.get(c) == ("c", None)
    # no chunks named (content in the entry, or a filer that lists none): never cached
    assert MountCache.identity({"FileSize": 3, "Content": "YWJj"}) is None
    assert MountCache.identity({"FileSize": 3, "chunks": [{"size": 3}]}) is None

"""storage.ContentCache: adapter configs cached by (path, MD5), never stale."""

from __future__ import annotations

import hashlib

from functions.adapters.storage import ContentCache
from functions.logic.facts import config_md5


def md5(content: bytes) -> str:
    return hashlib.md5(content, usedforsecurity=False).hexdigest()


class Files:
    def __init__(self, **contents: bytes) -> None:
        self.contents = {f"/{k}": v for k, v in contents.items()}
        self.reads: list[str] = []

    def read(self, path: str) -> bytes | None:
        self.reads.append(path)
        return self.contents.get(path)


def test_a_file_is_read_once_per_md5() -> None:
    files = Files(a=b"one")
    cache = ContentCache(files.read)
    assert cache.get("/a", md5(b"one")) == b"one"
    assert cache.get("/a", md5(b"one").upper()) == b"one"
    assert files.reads == ["/a"]


def test_a_changed_file_is_read_again_and_a_mismatch_is_never_kept() -> None:
    files = Files(a=b"one")
    cache = ContentCache(files.read)
    assert cache.get("/a", md5(b"one")) == b"one"
    files.contents["/a"] = b"two"
    # stat has not seen the change yet: the status still says "one", the storage has "two"
    assert cache.get("/a", md5(b"old")) == b"two"
    assert cache.get("/a", md5(b"old")) == b"two"
    assert files.reads == ["/a", "/a", "/a"], "bytes that do not hash to the key are not cached"
    assert cache.get("/a", md5(b"two")) == b"two"
    assert cache.get("/a", md5(b"two")) == b"two"
    assert files.reads == ["/a"] * 4


def test_without_an_md5_or_a_file_nothing_is_cached() -> None:
    files = Files(a=b"one")
    cache = ContentCache(files.read)
    assert cache.get("/a", None) == b"one"
    assert cache.get("/a", None) == b"one"
    assert cache.get("/missing", md5(b"x")) is None
    assert cache.get("/missing", md5(b"x")) is None
    assert files.reads == ["/a", "/a", "/missing", "/missing"]


def test_least_recently_used_goes_first() -> None:
    files = Files(a=b"a", b=b"b", c=b"c")
    cache = ContentCache(files.read, entries=2)
    for name in ("a", "b", "a", "c"):  # c evicts b: a was used after b
        cache.get(f"/{name}", md5(name.encode()))
    files.reads.clear()
    cache.get("/a", md5(b"a"))
    cache.get("/b", md5(b"b"))
    assert files.reads == ["/b"]


def test_config_md5_is_what_stat_observed() -> None:
    directory = "/loraadapters/ns/m1/a/"
    adapter = {
        "metadata": {"name": "a", "namespace": "ns"},
        "spec": {"model": "m1"},
        "status": {
            "storageRef": {"path": directory},
            "integrity": {"files": {directory + "adapter_config.json": {"md5": "ab" * 16, "size": 2}}},
        },
    }
    assert config_md5(adapter) == "ab" * 16
    adapter["status"]["integrity"]["files"] = {directory + "adapter_config.json": {"size": 2}}
    assert config_md5(adapter) is None
    del adapter["status"]["integrity"]
    assert config_md5(adapter) is None

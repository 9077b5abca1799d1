"""The real SeaweedFS as the suites use it: the launcher, the fault proxy in front of its filer,
and the behaviour of its webhook queue and listings that loraflow is built around.

One server per test session (devstack.seaweedfs.shared()), a directory per test.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import httpx
import pytest

from devstack.seaweedfs import FaultProxy, Shared
from functions.adapters.storage import ContentTooLarge, FilerStorage, quote_path
from functions.errors import StorageUnavailable
from tests.support.filer import FilerClient

# Names that break a URL built without percent-encoding, and one that is a prefix of another.
AWKWARD = ["w", "w?x=1", "hash#tag.bin", "pct%41.bin", "sp ace.bin", "ünïcödé.bin", "w.bak"]


def md5(content: bytes) -> str:
    return hashlib.md5(content, usedforsecurity=False).hexdigest()


@pytest.fixture
def base(seaweed: Shared) -> Iterator[str]:
    directory = f"/loraadapters/sw-{secrets.token_hex(3)}/m/a/"
    yield directory
    httpx.delete(seaweed.server.url + quote_path(directory.rstrip("/")), params={"recursive": "true"})


def test_every_storage_url_is_percent_encoded(seaweed: Shared, base: str, filer: FilerClient) -> None:
    """Each name is read as itself: before the fix `w?x=1` was hashed from the file `w`, and `#`,
    `%` and space names listed fine but read as gone."""
    contents = {name: f"content of {name}".encode() for name in AWKWARD}
    for name, content in contents.items():
        filer.put_file(base + name, content)
    filer.write_without_md5(base + "w?x=1", contents["w?x=1"])  # so that hash_file must read it
    with closing(FilerStorage(seaweed.server.url, page_size=2)) as storage:
        listed = storage.stat_dir(base)
        assert [f.path for f in listed] == sorted(base + name for name in AWKWARD)
        for stored in listed:
            name = stored.path.removeprefix(base)
            assert stored.size == len(contents[name])
            assert stored.md5 in (md5(contents[name]), None)
            assert storage.hash_file(stored.path, 1 << 20) == md5(contents[name]), name
            assert storage.read_small(stored.path, 1 << 20) == contents[name], name
        assert storage.stat_dir(base + "w") == []  # a file is not a directory
        assert storage.stat_dir(base.rstrip("/") + "-not-there/") == []


def test_a_chunked_file_hashes_like_md5sum(base: str, filer: FilerClient, storage: FilerStorage) -> None:
    content = secrets.token_bytes((9 << 20) + 7)  # three chunks of -filer.maxMB=4
    filer.put_file(base + "big.bin", content)
    (stored,) = storage.stat_dir(base)
    assert stored.md5 == md5(content)
    assert storage.hash_file(base + "big.bin", 1 << 30) == md5(content)
    assert storage.hash_file(base + "big.bin", 1 << 20) is None  # over the limit: not read


def test_a_small_read_is_bounded_and_a_missing_file_is_none(
    base: str, filer: FilerClient, storage: FilerStorage
) -> None:
    """read_small (load's adapter_config.json) over the keep-alive connections: the cap holds
    on the declared length, a missing file is None, and the connections serve reads after both."""
    content = secrets.token_bytes(1000)
    filer.put_file(base + "adapter_config.json", content)
    assert storage.read_small(base + "adapter_config.json", 1000) == content
    with pytest.raises(ContentTooLarge):
        storage.read_small(base + "adapter_config.json", 999)
    assert storage.read_small(base + "not-there.json", 1000) is None
    for _ in range(3):
        assert storage.read_small(base + "adapter_config.json", 1000) == content


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param({"status": 503}, id="503"),
        pytest.param({"reset": True}, id="reset"),
        pytest.param({"stall": True}, id="stall"),
    ],
)
def test_a_small_read_that_the_filer_fails_is_storage_unavailable(
    seaweed: Shared, base: str, fault: dict[str, object], filer: FilerClient
) -> None:
    filer.put_file(base + "adapter_config.json", b"{}")
    with (
        FaultProxy(seaweed.server.url, stall_s=5) as proxy,
        closing(FilerStorage(proxy.url, page_size=1000, timeout=0.5)) as storage,
    ):
        assert storage.read_small(base + "adapter_config.json", 100) == b"{}"  # a kept connection
        proxy.inject(**fault, times=None, listing=False)  # type: ignore[arg-type]
        started = time.monotonic()
        with pytest.raises(StorageUnavailable):
            storage.read_small(base + "adapter_config.json", 100)
        assert time.monotonic() - started < 3  # a stalled filer is given up at the timeout
        proxy.clear_faults()
        assert storage.read_small(base + "adapter_config.json", 100) == b"{}"


@pytest.mark.parametrize(
    ("fault", "listing"),
    [
        pytest.param({"status": 503}, True, id="503"),
        pytest.param({"reset": True}, True, id="reset"),
        pytest.param({"stall": True}, True, id="stall"),
        pytest.param({"status": 503}, False, id="503-on-read"),
    ],
)
def test_filer_faults_are_storage_unavailable(
    seaweed: Shared, base: str, fault: dict[str, object], listing: bool, filer: FilerClient
) -> None:
    filer.put_file(base + "f.bin", b"x")
    with (
        FaultProxy(seaweed.server.url, stall_s=5) as proxy,
        closing(FilerStorage(proxy.url, page_size=1000, timeout=0.5)) as storage,
    ):
        proxy.inject(**fault, times=None, listing=listing)  # type: ignore[arg-type]
        with pytest.raises(StorageUnavailable):
            storage.stat_dir(base) if listing else storage.hash_file(base + "f.bin", 10)
        proxy.clear_faults()
        assert [f.path for f in storage.stat_dir(base)] == [base + "f.bin"]
        assert storage.hash_file(base + "f.bin", 10) == md5(b"x")


def test_a_download_cut_midway_is_storage_unavailable_and_leaves_nothing_running(
    seaweed: Shared, base: str, filer: FilerClient
) -> None:
    """The filer resets the connection after 5 MiB of a 9 MiB file, mid-buffer: the hash fails
    as the filer being unavailable (verify retries it), its receiving thread is gone, and the
    next hash over the same client reads the whole file."""
    content = secrets.token_bytes((9 << 20) + 7)
    filer.put_file(base + "big.bin", content)
    with (
        FaultProxy(seaweed.server.url) as proxy,
        closing(FilerStorage(proxy.url, page_size=1000)) as storage,
    ):
        proxy.inject(cut_after=5 << 20, listing=False)
        with pytest.raises(StorageUnavailable, match="stream broke"):
            storage.hash_file(base + "big.bin", 1 << 30)
        assert proxy.faults_fired == 1
        assert not [t for t in threading.enumerate() if t.name == "md5-receive"]
        assert storage.hash_file(base + "big.bin", 1 << 30) == md5(content)


def test_a_slow_listing_is_slow_but_answers(seaweed: Shared, base: str, filer: FilerClient) -> None:
    filer.put_file(base + "f.bin", b"x")
    with (
        FaultProxy(seaweed.server.url) as proxy,
        closing(FilerStorage(proxy.url, page_size=1000)) as storage,
    ):
        proxy.inject(delay_s=0.3, times=1, listing=True)
        assert [f.path for f in storage.stat_dir(base)] == [base + "f.bin"]
        assert proxy.faults_fired == 1


def test_the_webhook_queue_makes_one_attempt_then_dead_letters(
    seaweed: Shared, base: str, filer: FilerClient
) -> None:
    """SeaweedFS 4.48: a failed delivery (503 here: nobody subscribed to the relay) is never
    retried, whatever `max_retries` says; the filer only logs a dead letter. This is why ingest
    retries its own publish and resync repairs what is lost."""
    key = base + f"lost-{secrets.token_hex(3)}.bin"
    filer.put_file(key, b"x")
    assert seaweed.relay.await_key(key, 20)
    time.sleep(2.0)  # a retry with the default backoff would have come within this
    assert seaweed.relay.deliveries(key) == 1
    text = seaweed.server.log_text()
    assert "dead letter" in text and key in text


def test_the_webhook_is_told_only_of_the_notified_prefixes(
    seaweed: Shared, base: str, filer: FilerClient
) -> None:
    """A frozen set (written by verify under /loraflow-frozen/) reaches no one, as with the
    `path_prefixes` of knative/seaweedfs/notification.yaml; the queue keeps the filer's order,
    so once a later write under the adapter layout went through, the frozen one would have."""
    frozen = f"/loraflow-frozen/sw-{secrets.token_hex(3)}/m/a/digest/f.bin"
    later = base + f"after-{secrets.token_hex(3)}.bin"
    try:
        filer.put_file(frozen, b"x")
        filer.put_file(later, b"x")
        assert seaweed.relay.await_key(later, 20)
        assert seaweed.relay.deliveries(frozen) == 0
        assert seaweed.relay.deliveries(frozen.rsplit("/", 1)[0]) == 0  # nor its new folders
    finally:
        httpx.delete(seaweed.server.url + frozen.split("/m/")[0], params={"recursive": "true"})


def test_a_restart_keeps_the_data_and_stop_leaves_no_sockets(tmp_path: Path) -> None:
    """(The shared server restarts in tests/reliability's infra.filer-restart scenario.)"""
    from devstack.seaweedfs import SeaweedServer

    server = SeaweedServer(s3=False, base_dir=tmp_path / "sw")
    server.start()
    try:
        with FilerClient(server.url) as filer:
            filer.put_file("/kept/f.bin", b"kept")
        server.restart()
        with FilerClient(server.url) as filer:
            assert filer.read("/kept/f.bin") == b"kept"
    finally:
        server.stop()
    leftovers = [p for port in server.ports.values() for p in Path("/tmp").glob(f"seaweedfs-*-{port}.sock")]
    assert leftovers == []
    with pytest.raises(httpx.HTTPError):
        httpx.get(server.url, timeout=1)

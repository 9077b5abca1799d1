"""The storage and Broker clients over https, on their one production path: the real SeaweedFS
filer and the event sink each behind a TLS front whose certificate a private CA signed. The
clients trust what the process trusts (`SSL_CERT_FILE` here, the system's CAs in a cluster);
a server the process does not trust is no server at all. KubeApi over https: tests/kubernetes."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterator
from contextlib import closing

import pytest
from cloudevents.http import CloudEvent

from devstack.eventing.sink import EventSink
from devstack.kubernetes.pki import Certificate, issue
from devstack.seaweedfs import FaultProxy, Shared
from functions.adapters.broker import Broker
from functions.adapters.storage import FilerStorage
from functions.errors import Retryable, StorageUnavailable
from tests.support.filer import FilerClient


class TlsFront(FaultProxy):
    """The fault proxy serving https to clients, forwarding plain http to its upstream."""

    scheme = "https"

    def __init__(self, upstream: str, tls: Certificate) -> None:
        super().__init__(upstream)
        self._server.socket = tls.server_context().wrap_socket(
            self._server.socket, server_side=True, do_handshake_on_connect=False
        )


def md5(content: bytes) -> str:
    return hashlib.md5(content, usedforsecurity=False).hexdigest()


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Certificate:
    return issue(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def trusted(tls: Certificate, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(tls.ca_file))


@pytest.fixture
def filer(seaweed: Shared, tls: Certificate) -> Iterator[str]:
    front = TlsFront(seaweed.server.url, tls).start()
    yield front.url
    front.stop()


def test_the_filer_client_lists_hashes_reads_copies_and_deletes_over_https(
    seaweed: Shared, filer: str, trusted: None
) -> None:
    assert filer.startswith("https://")
    directory = f"/loraadapters/tls-{secrets.token_hex(3)}/m/a"
    weights = secrets.token_bytes(3 << 20)
    with FilerClient(seaweed.server.url) as plain, closing(FilerStorage(filer, page_size=2)) as storage:
        plain.put_file(f"{directory}/adapter_model.safetensors", weights)
        plain.put_file(f"{directory}/adapter_config.json", b'{"r": 8}')
        listed = storage.stat_dir(directory)
        assert [(f.path.rsplit("/", 1)[1], f.size) for f in listed] == [
            ("adapter_config.json", 8),
            ("adapter_model.safetensors", len(weights)),
        ]
        assert storage.read_small(f"{directory}/adapter_config.json", 1024) == b'{"r": 8}'
        assert storage.hash_file(f"{directory}/adapter_model.safetensors", 8 << 20) == md5(weights)
        copied = f"/loraflow-frozen/tls-{secrets.token_hex(3)}/m/a/d/adapter_model.safetensors"
        source = f"{directory}/adapter_model.safetensors"
        assert storage.copy_file(source, copied, len(weights), md5(weights))
        assert plain.read(copied) == weights
        storage.delete_tree(directory)
        assert storage.stat_dir(directory) == []
        storage.delete_tree(copied.rsplit("/", 1)[0])


def test_a_filer_whose_certificate_the_process_does_not_trust_is_unavailable(filer: str) -> None:
    with (
        closing(FilerStorage(filer, page_size=10)) as storage,
        pytest.raises(StorageUnavailable, match="CERTIFICATE_VERIFY_FAILED"),
    ):
        storage.stat_dir("/loraadapters/")


def test_the_broker_client_publishes_over_https(tls: Certificate, trusted: None) -> None:
    sink = EventSink().start()
    front = TlsFront(sink.url, tls).start()
    broker = Broker(front.url + "/default/ingress")
    try:
        event = CloudEvent({"type": "io.loraflow.test.v1", "source": "/test"}, {"n": 1})
        broker.publish(event)
        (got,) = sink.wait_for("io.loraflow.test.v1")
        assert got.get_data() == {"n": 1} and got["id"] == event["id"]
    finally:
        broker.close()
        front.stop()
        sink.stop()


def test_a_broker_whose_certificate_the_process_does_not_trust_is_unreachable(tls: Certificate) -> None:
    sink = EventSink().start()
    front = TlsFront(sink.url, tls).start()
    broker = Broker(front.url)
    try:
        with pytest.raises(Retryable, match="broker unreachable"):
            broker.publish(CloudEvent({"type": "t", "source": "/s"}, None))
        assert sink.events == []
    finally:
        broker.close()
        front.stop()
        sink.stop()

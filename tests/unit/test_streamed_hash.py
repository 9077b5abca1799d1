"""hash_file streams a file into a ring of buffers and hashes each as the next one is received:
the digest is hashlib's over the whole body whatever its size against the buffer size and
however little each receive brings, and a body longer than the cap (declared or not) is not
hashed."""

from __future__ import annotations

import hashlib
import io
import threading

import pytest

from functions.adapters.storage import CHUNK, FilerStorage, _pipelined_md5
from functions.transport import Answer
from tests.support.transport import FakeTransport, Sent


def storage_serving(body: bytes, declared: bool = True) -> FilerStorage:
    headers = {"content-length": str(len(body))} if declared else {}
    return FilerStorage(
        "http://filer", page_size=10, through=FakeTransport(lambda _: Answer(200, body, headers))
    )


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK, 4 * CHUNK + 7])
def test_a_file_hashes_like_hashlib_whatever_its_size(size: int) -> None:
    body = bytes(range(256)) * (size // 256) + bytes(size % 256)
    assert storage_serving(body).hash_file("/f", 1 << 40) == hashlib.md5(body).hexdigest()
    assert not [t for t in threading.enumerate() if t.name == "md5-receive"]


@pytest.mark.parametrize("declared", [True, False])
def test_a_file_past_the_cap_is_not_hashed(declared: bool) -> None:
    """Undeclared (chunked, or to the end): counted as it arrives and given up past the cap."""
    body = b"x" * (2 * CHUNK + 1)
    assert storage_serving(body, declared).hash_file("/f", 2 * CHUNK) is None
    assert storage_serving(body, declared).hash_file("/f", 2 * CHUNK + 1) == hashlib.md5(body).hexdigest()
    assert not [t for t in threading.enumerate() if t.name == "md5-receive"]


def test_a_missing_file_is_none() -> None:
    def answer(sent: Sent) -> Answer:
        return Answer(404, b"", {"content-length": "0"})

    assert (
        FilerStorage("http://filer", page_size=10, through=FakeTransport(answer)).hash_file("/f", 10) is None
    )


def test_a_stream_that_brings_little_at_a_time_fills_each_buffer() -> None:
    """S3's StreamingBody may bring fewer bytes than asked before its end (urllib3's read)."""
    body = bytes(range(256)) * ((2 * CHUNK + 3) // 256)
    source = io.BytesIO(body)
    digest = _pipelined_md5(lambda view: source.readinto(view[:65_000]), 1 << 40, "s3")
    assert digest == hashlib.md5(body).hexdigest()

"""The session's real SeaweedFS (devstack.seaweedfs.shared()) and the clients the tests use on it,
each closed when its test ends, passed or failed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from typing import Any

import boto3
import pytest

from devstack.seaweedfs import Shared, shared
from functions.adapters.storage import FilerStorage
from tests.support.filer import FilerClient


@pytest.fixture(scope="module")
def seaweed() -> Shared:
    return shared()


@pytest.fixture
def filer(seaweed: Shared) -> Iterator[FilerClient]:
    """A test's client of the filer's HTTP API."""
    with FilerClient(seaweed.server.url) as client:
        yield client


@pytest.fixture
def storage(seaweed: Shared) -> Iterator[FilerStorage]:
    """The production storage client of the filer (1,000 entries a listing page)."""
    with closing(FilerStorage(seaweed.server.url, page_size=1000)) as client:
        yield client


@pytest.fixture
def s3(seaweed: Shared) -> Iterator[Any]:
    """A boto3 client of the filer's S3 gateway, signed as the operator (it creates buckets)."""
    client = boto3.client("s3", endpoint_url=seaweed.server.s3_url, **seaweed.server.s3_operator.boto())
    with closing(client):
        yield client

"""Where `loraflow upload` puts files in the filer: where the functions will read them."""

from __future__ import annotations

import pytest

from functions.settings import Settings
from loraflow.connect import BUCKET, BUCKETS_DIR, Endpoints, filer_root


def test_the_defaults_are_the_functions_own() -> None:
    fields = Settings.model_fields
    assert (fields["s3_bucket"].default, fields["s3_buckets_dir"].default) == (BUCKET, BUCKETS_DIR)


@pytest.mark.parametrize(
    ("storage", "root"),
    [
        ({}, ""),
        ({"backend": "filer"}, ""),
        ({"backend": "s3"}, "/buckets/loraadapters"),
        ({"backend": "s3", "s3": {"bucket": "tenant-files"}}, "/buckets/tenant-files"),
    ],
)
def test_the_endpoints_file_says_which_backend(storage: dict[str, object], root: str) -> None:
    assert filer_root(Endpoints.from_json({"storage": storage})) == root


def test_without_an_endpoints_file_the_functions_settings_decide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LORAFLOW_STORAGE", raising=False)
    assert filer_root(None) == ""
    monkeypatch.setenv("LORAFLOW_STORAGE", "s3")
    assert filer_root(None) == "/buckets/loraadapters"
    monkeypatch.setenv("LORAFLOW_S3_BUCKET", "b1")
    monkeypatch.setenv("LORAFLOW_S3_BUCKETS_DIR", "/s3/")
    assert filer_root(None) == "/s3/b1"
    monkeypatch.setenv("LORAFLOW_STORAGE", "filer")
    assert filer_root(None) == ""

"""`loraflow upload` against the real SeaweedFS filer and the real API server."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import boto3
import pytest

from devstack.seaweedfs import shared
from functions.adapters.storage import S3Storage
from functions.resources.kinds import MODEL as MODEL_KIND
from functions.resources.kinds import VLLM_ADAPTER
from loraflow.cli import main
from loraflow.upload import md5_of, stored_md5s
from tests.support.cli import CliStack

MODEL = "llama3-8b"


def make_adapter(directory: Path) -> dict[str, bytes]:
    files = {
        "adapter_config.json": b'{"peft_type": "LORA", "r": 8, "target_modules": ["q_proj"]}',
        "adapter_model.safetensors": os.urandom(3 * (1 << 20) + 17),  # several read chunks
        "tokenizer/special_tokens_map.json": b"{}",
    }
    for relpath, content in files.items():
        target = directory / relpath
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    return files


def md5(content: bytes) -> str:
    return hashlib.md5(content, usedforsecurity=False).hexdigest()


def get_adapter(stack: CliStack, namespace: str, name: str) -> dict[str, object]:
    found: dict[str, object] = stack.custom.get_namespaced_custom_object(
        VLLM_ADAPTER.group, VLLM_ADAPTER.version, namespace, VLLM_ADAPTER.plural, name
    )
    return found


def integrity(stack: CliStack, namespace: str, name: str) -> dict[str, str]:
    spec = get_adapter(stack, namespace, name)["spec"]
    assert isinstance(spec, dict)
    result: dict[str, str] = spec["integrity"]["md5"]
    return result


def upload(stack: CliStack, directory: Path, namespace: str, name: str) -> int:
    return stack.run("upload", str(directory), "--model", MODEL, "--name", name, "--namespace", namespace)


def test_upload_stores_files_and_declares_integrity(
    stack: CliStack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    namespace = stack.namespace()
    files = make_adapter(tmp_path)

    assert upload(stack, tmp_path, namespace, "finance") == 0

    prefix = f"/loraadapters/{namespace}/{MODEL}/finance/"
    expected = {prefix + rel: md5(content) for rel, content in files.items()}
    adapter = get_adapter(stack, namespace, "finance")
    assert adapter["spec"] == {"model": MODEL, "integrity": {"md5": expected}}
    for path, digest in expected.items():
        entry = stack.filer.entry(path)
        assert entry is not None
        assert base64.b64decode(entry["Md5"]).hex() == digest
        assert entry["FileSize"] == len(files[path.removeprefix(prefix)])
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines()[:3]] == ["uploaded"] * 3
    assert "3 uploaded" in out
    assert f"LoRAAdapter {namespace}/finance created" in out
    # no Model in the namespace: the command says what to create for the adapter to be served
    assert f"No Model '{MODEL}' in namespace '{namespace}'" in " ".join(out.split())
    assert "kubectl apply -k examples/" in " ".join(out.split())


def test_upload_next_to_its_model_says_nothing_more(
    stack: CliStack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    namespace = stack.namespace()
    stack.custom.create_namespaced_custom_object(
        MODEL_KIND.group,
        MODEL_KIND.version,
        namespace,
        MODEL_KIND.plural,
        {
            "apiVersion": MODEL_KIND.api_version,
            "kind": MODEL_KIND.kind,
            "metadata": {"name": MODEL},
            "spec": {},
        },
    )
    make_adapter(tmp_path)
    assert upload(stack, tmp_path, namespace, "finance") == 0
    out = capsys.readouterr().out
    assert f"LoRAAdapter {namespace}/finance created" in out and "No Model" not in out


def test_reupload_skips_unchanged_and_sends_only_a_changed_file(
    stack: CliStack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    namespace = stack.namespace()
    files = make_adapter(tmp_path)
    assert upload(stack, tmp_path, namespace, "support") == 0
    prefix = f"/loraadapters/{namespace}/{MODEL}/support/"
    mtimes = {rel: stack.filer.entry(prefix + rel)["Mtime"] for rel in files}  # type: ignore[index]
    capsys.readouterr()

    assert upload(stack, tmp_path, namespace, "support") == 0
    out = capsys.readouterr().out
    assert sum(line.startswith("skipped (unchanged)") for line in out.splitlines()) == 3
    assert "0 uploaded" in out
    assert f"LoRAAdapter {namespace}/support updated" in out

    (tmp_path / "adapter_config.json").write_bytes(b'{"peft_type": "LORA", "r": 16}')
    assert upload(stack, tmp_path, namespace, "support") == 0
    out = capsys.readouterr().out
    assert f"uploaded             {prefix}adapter_config.json" in out
    assert "1 uploaded" in out and "2 skipped (unchanged)" in out
    assert integrity(stack, namespace, "support")[prefix + "adapter_config.json"] == md5(
        b'{"peft_type": "LORA", "r": 16}'
    )
    for rel in ("adapter_model.safetensors", "tokenizer/special_tokens_map.json"):
        assert stack.filer.entry(prefix + rel)["Mtime"] == mtimes[rel]  # type: ignore[index]


def test_reupload_drops_integrity_of_files_no_longer_uploaded(stack: CliStack, tmp_path: Path) -> None:
    namespace = stack.namespace()
    make_adapter(tmp_path)
    assert upload(stack, tmp_path, namespace, "slim") == 0
    (tmp_path / "tokenizer" / "special_tokens_map.json").unlink()

    assert upload(stack, tmp_path, namespace, "slim") == 0

    prefix = f"/loraadapters/{namespace}/{MODEL}/slim/"
    assert sorted(integrity(stack, namespace, "slim")) == [
        prefix + "adapter_config.json",
        prefix + "adapter_model.safetensors",
    ]


def test_a_stored_file_without_md5_is_uploaded_again(
    stack: CliStack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    namespace = stack.namespace()
    make_adapter(tmp_path)
    assert upload(stack, tmp_path, namespace, "nomd5") == 0
    path = f"/loraadapters/{namespace}/{MODEL}/nomd5/adapter_config.json"
    stack.filer.write_without_md5(path, (tmp_path / "adapter_config.json").read_bytes())
    capsys.readouterr()

    assert upload(stack, tmp_path, namespace, "nomd5") == 0

    assert f"uploaded             {path}" in capsys.readouterr().out


def test_listing_is_paginated(stack: CliStack, tmp_path: Path) -> None:
    directory = f"/loraadapters/pages/{MODEL}/many/"
    expected = {}
    for index in range(7):
        content = f"file {index}".encode()
        stack.filer.put_file(f"{directory}f{index}.bin", content)
        expected[f"{directory}f{index}.bin"] = md5(content)

    assert stored_md5s(stack.filer.url, directory, page_size=2) == expected


def test_md5_of_streams_in_chunks(tmp_path: Path) -> None:
    content = os.urandom((1 << 20) * 2 + 5)
    (tmp_path / "big").write_bytes(content)
    seen: list[int] = []

    assert md5_of(tmp_path / "big", seen.append) == md5(content)
    assert max(seen) <= 1 << 20 and sum(seen) == len(content)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--filer-url", "http://127.0.0.1:9"], "cannot list"),
        (["--name", "Not_A_Name"], "is not a DNS subdomain"),
    ],
)
def test_expected_failures_exit_1_with_a_clear_message(
    stack: CliStack, tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    make_adapter(tmp_path)
    base = ["upload", str(tmp_path), "--model", MODEL, "--namespace", "default"]
    if "--name" not in argv:
        base += ["--name", "x"]

    assert stack.run(*base, *argv) == 1

    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_missing_directory_and_unreachable_cluster(
    stack: CliStack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert stack.run("upload", str(tmp_path / "nope"), "--model", MODEL, "--name", "x") == 1
    assert "is not a directory" in capsys.readouterr().err

    make_adapter(tmp_path)
    broken = tmp_path / "endpoints.json"
    kube = {"url": "http://127.0.0.1:9", "token": "t"}
    broken.write_text(json.dumps({"kubernetes": kube, "filer": {"url": stack.filer.url}}))
    argv = ["upload", str(tmp_path), "--model", MODEL, "--name", "offline", "--endpoints", str(broken)]
    from loraflow.cli import main

    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "cannot reach the Kubernetes API" in err and "Traceback" not in err


@pytest.fixture
def s3() -> Iterator[Any]:
    """A boto3 client of the session's S3 gateway, closed afterwards."""
    server = shared().server
    client = boto3.client("s3", endpoint_url=server.s3_url, **server.s3_operator.boto())
    with closing(client):
        yield client


def test_with_the_s3_backend_the_files_are_objects_of_the_bucket(
    stack: CliStack, tmp_path: Path, capsys: pytest.CaptureFixture[str], s3: Any
) -> None:
    """The stack's storage backend is S3: the functions read the bucket through the real
    gateway (functions.adapters.storage.S3Storage over boto3), so that is where the files must
    be, keyed by their storage paths, with the MD5s the spec declares as their ETags."""
    bucket = f"b-{secrets.token_hex(4)}"
    s3.create_bucket(Bucket=bucket)
    endpoints = json.loads(stack.endpoints.read_text())
    endpoints["storage"] = {
        "backend": "s3", "filer": stack.filer.url, "s3": {"url": shared().server.s3_url, "bucket": bucket}
    }  # fmt: skip
    s3_endpoints = tmp_path / "s3-endpoints.json"
    s3_endpoints.write_text(json.dumps(endpoints))
    namespace, adapter = stack.namespace(), tmp_path / "adapter"
    files = make_adapter(adapter)
    argv = ["upload", str(adapter), "--model", MODEL, "--name", "finance", "--namespace", namespace]

    assert main([*argv, "--endpoints", str(s3_endpoints)]) == 0

    directory = f"/loraadapters/{namespace}/{MODEL}/finance/"
    stored = S3Storage(s3, bucket).stat_dir(directory)
    declared = integrity(stack, namespace, "finance")
    assert {f.path: f.md5 for f in stored} == declared
    assert declared == {directory + rel: md5(content) for rel, content in files.items()}
    assert stack.filer.entry(directory + "adapter_config.json") is None  # not beside the bucket
    capsys.readouterr()
    assert main([*argv, "--endpoints", str(s3_endpoints)]) == 0  # resumable there too
    assert "3 skipped" in capsys.readouterr().out

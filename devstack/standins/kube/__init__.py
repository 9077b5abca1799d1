"""A Kubernetes API server stand-in for the embedded stack and the tests.

It serves the real `kubernetes` Python client and the real `kubectl` over HTTP on loopback.
Production code (functions/, events/) never imports this package.
"""

from devstack.standins.kube.faults import Fault
from devstack.standins.kube.server import KubeServer

__all__ = ["Fault", "KubeServer"]

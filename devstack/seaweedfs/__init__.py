"""The real SeaweedFS for the stack, the tests and the benchmarks (no stand-in): the launcher
(`SeaweedServer`), a fault-injecting proxy in front of its filer (`FaultProxy`), and one server
shared by everything in a process (`shared()`), whose webhook goes to a `WebhookRelay`; its S3
gateway signs in only the identities of `s3_iam` (the operator, loraflow, tenants added)."""

from __future__ import annotations

import atexit
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path

from devstack.seaweedfs.faultproxy import Fault, FaultProxy
from devstack.seaweedfs.relay import WebhookRelay
from devstack.seaweedfs.s3_iam import BUCKET, S3Identity
from devstack.seaweedfs.server import SeaweedServer, Webhook, settle_marker, weed_binary

__all__ = [
    "BUCKET",
    "MOUNT_ROOT",
    "Fault",
    "FaultProxy",
    "S3Identity",
    "SeaweedServer",
    "Shared",
    "Webhook",
    "WebhookRelay",
    "settle_marker",
    "shared",
    "weed_binary",
]


MOUNT_ROOT = Path("/mnt/seaweedfs")
"""Where the functions and the engines see the filer's root, as a SeaweedFS mount in a cluster
(the functions' LORAFLOW_MOUNT_ROOT default). Nothing is there on this machine: the engine
stand-ins read what lies under it through the filer's HTTP API."""


@dataclass(frozen=True)
class Shared:
    """A running server whose webhook posts to `relay` with `webhook_token`."""

    server: SeaweedServer
    relay: WebhookRelay
    webhook_token: str


_shared: Shared | None = None
_lock = threading.Lock()


def shared() -> Shared:
    """The process's one SeaweedFS (with its S3 gateway), started on first use and stopped when
    the interpreter exits: starting one takes 3-7 s, so the test session and the benchmarks
    share it. Each user keeps to its own directories (a namespace per test) and subscribes its
    ingest to the relay while it runs."""
    global _shared
    with _lock:
        if _shared is None:
            relay = WebhookRelay().start()
            token = "shared-" + secrets.token_hex(16)
            server = SeaweedServer(webhook=Webhook(relay.url, bearer_token=token)).start()
            _shared = Shared(server, relay, token)
            atexit.register(_stop_shared)
        return _shared


def _stop_shared() -> None:
    global _shared
    with _lock:
        if _shared is not None:
            _shared.server.stop()
            _shared.relay.stop()
            _shared = None

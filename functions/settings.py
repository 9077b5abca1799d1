"""One typed Settings object, read from the environment once at the edge and passed down.

`Settings.from_env(env)` reads a mapping (the process environment by default); tests build
`Settings(load_concurrency=3)` directly and never touch os.environ. pydantic parses and bounds
the values; pydantic-settings is not used: its sources read os.environ whatever they are
given, and importing it lengthens every cold start for a handful of variables.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from events.schema_urls import DEFAULT_SCHEMA_BASE_URL

ENV_PREFIX = "LORAFLOW_"
FALLBACKS = {"broker_url": "K_SINK", "kubeconfig": "KUBECONFIG"}
"""Variables that others set (Knative's SinkBinding, kubectl's convention), read when ours are unset."""


class SettingsError(ValueError):
    """The environment holds a value that does not fit; the message names each variable."""


class Settings(BaseModel):
    """Every knob of the functions; docs/contracts.md lists them with their defaults."""

    # Not strict: the environment is text, and "10" is how an integer arrives there.
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    storage: Literal["filer", "s3"] = "filer"
    filer_url: str = "http://seaweedfs-filer.seaweedfs:8888"
    filer_page_size: int = Field(default=1000, ge=1, le=100000)
    status_max_files: int = Field(default=1000, ge=1, le=5000)
    filer_token_file: str | None = None
    """A file holding the filer write token (a JWT signed with the filer's `jwt.filer_signing`
    key): sent as `Authorization: Bearer` on every write and delete, read again each time so
    that a mounted Secret rotates it. Unset, or the file absent: no header."""
    s3_endpoint: str | None = None
    s3_bucket: str = "loraadapters"
    s3_region: str = "us-east-1"
    s3_buckets_dir: str = "/buckets"
    """The filer folder that holds the S3 gateway's buckets (filer.toml `buckets_folder`)."""
    hash_max_bytes: int = Field(default=1 << 30, ge=0)
    frozen_grace: float = Field(default=600.0, ge=0)
    """Seconds a retired frozen file set is kept after no pod serves it, before it is deleted."""
    mount_root: str = "/mnt/seaweedfs"
    load_concurrency: int = Field(default=10, ge=1, le=1000)
    list_page_size: int = Field(default=500, ge=1, le=10000)
    """Objects per list request (limit/continue): resync holds one page of adapters at a time."""
    resync_shards: int = Field(default=1, ge=1, le=1000)
    """Parts a resync tick is split into, by namespace: each is an `io.loraflow.resync.shard.v1`
    event that a request of its own judges (with the Service's containerConcurrency 1, an
    instance of its own), so a tick uses as many cores as it has parts. 1: the request that got
    the tick judges it all."""
    engine_timeout: float = Field(default=30.0, gt=0)
    max_lora_rank: int = Field(default=64, ge=1)
    engine_deny: str = ""
    """More networks engines are never called at (comma-separated). Link-local (cloud metadata),
    multicast and the API server's own address always are."""
    loopback_engines: Literal["deny", "allow"] = "deny"
    """A Pod's podIP is written by its kubelet and is never loopback in a cluster: a loopback
    engine address means a forged status. The embedded stack runs its engines on 127.0.0.x."""
    vllm_replace: Literal["inplace", "reload"] = "inplace"
    """How a newer verified file set replaces a loaded one in vLLM: `load_inplace` (no gap), or
    unload then load (vLLM issue #33791: in-place loads re-read weights on every request in some
    releases)."""
    sglang_roots: str = "/"
    """Comma-separated roots sglang `spec.path` must lie under (absolute, normalised, no `..`)."""
    webhook_token: SecretStr | None = None
    """Shown as '**********' in reprs and logs; `.get_secret_value()` where it is compared."""
    publish_budget: float = Field(default=5.0, gt=0, le=60)
    """Seconds ingest keeps retrying a publish to the Broker before it answers the filer 503."""
    broker_url: str | None = None
    kubeconfig: str | None = None
    schema_base_url: str = Field(default=DEFAULT_SCHEMA_BASE_URL, pattern=r"^https?://[^/]+")
    # The filer source (python -m functions.filer_source); the steps never read these.
    filer_grpc: str | None = Field(default=None, pattern=r"^[^\s/]+:\d{1,5}$")
    """`host:port` of the filer's gRPC API; unset: the filer URL's host, its port + 10000."""
    source_lease: str = Field(
        default="loraflow/loraflow-filer-source",
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-.a-z0-9]*[a-z0-9])?$",
    )
    """`namespace/name` of the Lease whose annotations keep the source's cursor."""
    source_checkpoint: float = Field(default=1.0, gt=0, le=60)
    """Seconds between two writes of the cursor (a crash replays at most that much, and a
    heartbeat's 5 s when the log is quiet: duplicates only)."""
    source_stall: float = Field(default=30.0, ge=6, le=600)
    """Seconds without any response (the filer sends a heartbeat every 5 s) before the source
    takes the subscription for dead and subscribes again."""

    def sglang_root_paths(self) -> tuple[str, ...]:
        """`sglang_roots` as absolute paths ("/" when none is given)."""
        roots = tuple(part.strip() for part in self.sglang_roots.split(",") if part.strip().startswith("/"))
        return roots or ("/",)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """LORAFLOW_<NAME> for each field, K_SINK and KUBECONFIG as fallbacks; an empty value is
        unset (Knative renders an absent ConfigMap key as ""). SettingsError names every bad one."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        origin: dict[str, str] = {}
        for name in cls.model_fields:
            for key in (ENV_PREFIX + name.upper(), FALLBACKS.get(name)):
                if key and env.get(key):
                    values[name], origin[name] = env[key], key
                    break
        try:
            return cls.model_validate(values)
        except ValidationError as err:
            # The variable's name and pydantic's reason, never the value (it may be the token).
            problems = [f"{origin.get(str(e['loc'][0]), e['loc'][0])}: {e['msg']}" for e in err.errors()]
            raise SettingsError("; ".join(problems)) from None

"""One typed Settings object, read from the environment once at the edge and passed down."""

from __future__ import annotations

import os
import typing
from collections.abc import Mapping
from typing import Any, Literal

from events.records import Invalid, Record, field, record_fields
from events.schema_urls import DEFAULT_SCHEMA_BASE_URL

ENV_PREFIX = "LORAFLOW_"


class Settings(Record):
    """Every knob of the functions; docs/contracts.md lists them with their defaults."""

    hashable = True

    storage: Literal["filer", "s3"] = "filer"
    filer_url: str = "http://seaweedfs-filer.seaweedfs:8888"
    filer_page_size: int = field(default=1000, ge=1, le=100000)
    status_max_files: int = field(default=1000, ge=1, le=5000)
    s3_endpoint: str | None = None
    s3_bucket: str = "loraadapters"
    s3_region: str = "us-east-1"
    hash_max_bytes: int = field(default=1 << 30, ge=0)
    mount_root: str = "/mnt/seaweedfs"
    load_concurrency: int = field(default=10, ge=1, le=1000)
    engine_timeout: float = field(default=30.0, gt=0)
    max_lora_rank: int = field(default=64, ge=1)
    webhook_token: str | None = None
    broker_url: str | None = None
    kubeconfig: str | None = None
    schema_base_url: str = field(default=DEFAULT_SCHEMA_BASE_URL, pattern=r"^https?://[^/]+")

    def __repr__(self) -> str:
        """The webhook token stays out of logs and tracebacks."""
        shown = self.replace(webhook_token="**********") if self.webhook_token else self
        return Record.__repr__(shown)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """LORAFLOW_<NAME> for each field (numbers parsed), K_SINK and KUBECONFIG as fallbacks."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        problems: list[tuple[tuple[str | int, ...], str]] = []
        for f in record_fields(cls):
            key = ENV_PREFIX + f.name.upper()
            if env.get(key):
                try:
                    values[f.name] = _from_string(env[key], f.hint)
                except ValueError:
                    problems.append(((key,), f"{env[key]!r} is not a number"))
        if problems:
            raise Invalid(problems)
        if env.get("K_SINK"):
            values.setdefault("broker_url", env["K_SINK"])
        if env.get("KUBECONFIG"):
            values.setdefault("kubeconfig", env["KUBECONFIG"])
        return cls(**values)


def _from_string(text: str, hint: Any) -> Any:
    """An environment variable's text as the field's type (int and float are parsed)."""
    members = set(typing.get_args(hint)) or {hint}
    if int in members:
        return int(text)
    if float in members:
        return float(text)
    return text

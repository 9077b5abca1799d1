"""One typed Settings object, read from the environment once at the edge and passed down."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

ENV_PREFIX = "LORAFLOW_"


class Settings(BaseModel):
    """Every knob of the functions; docs/contracts.md lists them with their defaults."""

    model_config = ConfigDict(frozen=True)

    storage: Literal["filer", "s3"] = "filer"
    filer_url: str = "http://seaweedfs-filer.seaweedfs:8888"
    filer_page_size: int = Field(default=1000, ge=1, le=100000)
    status_max_files: int = Field(default=1000, ge=1, le=5000)
    s3_endpoint: str | None = None
    s3_bucket: str = "loraadapters"
    s3_region: str = "us-east-1"
    hash_max_bytes: int = Field(default=1 << 30, ge=0)
    mount_root: str = "/mnt/seaweedfs"
    load_concurrency: int = Field(default=10, ge=1, le=1000)
    engine_timeout: float = Field(default=30.0, gt=0)
    max_lora_rank: int = Field(default=64, ge=1)
    webhook_token: SecretStr | None = None
    broker_url: str | None = None
    kubeconfig: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        values: dict[str, str] = {}
        for name in cls.model_fields:
            key = ENV_PREFIX + name.upper()
            if env.get(key):
                values[name] = env[key]
        if env.get("K_SINK"):
            values.setdefault("broker_url", env["K_SINK"])
        if env.get("KUBECONFIG"):
            values.setdefault("kubeconfig", env["KUBECONFIG"])
        return cls.model_validate(values)

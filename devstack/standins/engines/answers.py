"""What an engine stand-in answers: a response, or a dropped connection (shared by the
replicas' routes in ``base.py``, ``vllm.py`` and ``sglang.py`` and the admin API in ``admin.py``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

JSON = "application/json"


@dataclass(frozen=True)
class Response:
    """An HTTP answer. ``content_type=None`` sends no Content-Type (Starlette ``Response``
    without ``media_type``, as vLLM's plain-text success bodies)."""

    status: int
    body: bytes = b""
    content_type: str | None = None

    @classmethod
    def json(cls, status: int, payload: Any) -> Response:
        return cls(status, json.dumps(payload, separators=(",", ":")).encode(), JSON)


class Drop:
    """Sentinel: close the connection without answering (TCP reset)."""


DROP = Drop()
Answer = Response | Drop

NOT_FOUND = Response.json(404, {"detail": "Not Found"})  # FastAPI/Starlette default 404
METHOD_NOT_ALLOWED = Response.json(405, {"detail": "Method Not Allowed"})

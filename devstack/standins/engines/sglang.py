"""SGLang stand-in replica (SRT HTTP server with ``--enable-lora``).

Mirrors, per route:

* ``POST /load_lora_adapter`` / ``POST /unload_lora_adapter`` (no ``/v1``):
  python/sglang/srt/entrypoints/http_server.py (``200 if result.success else 400``),
  python/sglang/srt/managers/tokenizer_manager.py (or tokenizer_control_mixin.py)
  ``load_lora_adapter`` / ``unload_lora_adapter`` ("LoRA is not enabled" check),
  python/sglang/srt/lora/lora_manager.py ``LoRAManager.validate_new_adapter`` /
  ``create_lora_update_result`` and python/sglang/srt/lora/lora_registry.py
  ``LoRARegistry.unregister``. Body: ``LoRAUpdateOutput`` = ``{"success", "error_message",
  "loaded_adapters"}``.
* ``GET /v1/models``: python/sglang/srt/entrypoints/openai/serving_models (PR #12229): base card
  (``root`` = served model name) then ``{"id": lora_name, "root": lora_path, "parent": base}``.
* ``GET /health``: http_server.py ``health`` (200 empty; 503 while starting).
* Body validation: FastAPI (``LoadLoRAAdapterReqInput`` dataclass) -> 422 ``{"detail": [...]}``.

Choices where versions / the seed differ (switchable):

* ``duplicate_status=400`` (SGLang) or ``409`` (what the seed documents).
* ``serialize_updates=False``: upstream holds one ``lora_update_lock`` for every load/unload
  (the scheduler is single-threaded); the stand-in serialises per name only so that unrelated
  loads overlap (benchmarks); ``True`` restores the global lock.
* ``loaded_adapters`` is the full map on success and on failures raised by the LoRA manager
  (duplicate, bad path, rank, pinned slots); ``null`` on tokenizer-level failures (LoRA not
  enabled, unknown name on unload), as upstream.
* ``--max-loaded-loras`` LRU eviction is not modelled.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from email.message import Message
from pathlib import Path
from typing import Any, ClassVar

from devstack.standins.engines.answers import DROP, JSON, METHOD_NOT_ALLOWED, NOT_FOUND, Answer, Response
from devstack.standins.engines.base import (
    AdapterInvalid,
    AdapterNotFound,
    AdapterRankTooHigh,
    EngineReplica,
    LoadedAdapter,
    media_type,
    parse_json_object,
)
from devstack.standins.engines.base import check_adapter_dir as _check

_ROUTES = {
    "/health": ("GET", "health"),
    "/health_generate": ("GET", "health"),
    "/v1/models": ("GET", "models"),
    "/load_lora_adapter": ("POST", "load"),
    "/unload_lora_adapter": ("POST", "unload"),
}
LORA_NOT_ENABLED = "LoRA is not enabled. Please set `--enable-lora` to enable LoRA."


class SglangReplica(EngineReplica):
    """An SGLang replica (see module docstring for the rules)."""

    engine: ClassVar[str] = "sglang"
    CONFIGURABLE: ClassVar[dict[str, type]] = {
        **EngineReplica.CONFIGURABLE,
        "duplicate_status": int,
        "lora_enabled": bool,
        "serialize_updates": bool,
        "max_loras_per_batch": int,
    }

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        served_model: str = "base-model",
        mount_root: Path | str | None = None,
        max_lora_rank: int = 64,
        static_adapters: dict[str, str] | None = None,
        load_latency_s: float = 0.0,
        *,
        duplicate_status: int = 400,
        lora_enabled: bool = True,
        serialize_updates: bool = False,
        max_loras_per_batch: int = 8,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            host=host,
            port=port,
            served_model=served_model,
            mount_root=mount_root,
            max_lora_rank=max_lora_rank,
            static_adapters=static_adapters,
            load_latency_s=load_latency_s,
            **kwargs,
        )
        self._validate_setting("duplicate_status", duplicate_status)
        self.duplicate_status = duplicate_status
        self.lora_enabled = lora_enabled
        self.serialize_updates = serialize_updates
        self.max_loras_per_batch = max_loras_per_batch
        self._update_lock = threading.Lock()

    def _validate_setting(self, key: str, value: Any) -> None:
        super()._validate_setting(key, value)
        if key == "duplicate_status" and value not in (400, 409):
            raise ValueError("duplicate_status must be 400 or 409")
        if key == "max_loras_per_batch" and value < 1:
            raise ValueError("max_loras_per_batch must be >= 1")

    # ---- bodies ------------------------------------------------------------------------

    def _map(self) -> dict[str, str]:
        return {a.name: a.path for a in self._adapters.values()}

    def result(
        self,
        success: bool,
        error_message: str | None = None,
        *,
        with_adapters: bool = True,
        status: int | None = None,
    ) -> Response:
        """``LoRAUpdateOutput`` as http_server.py serialises it (200 if success else 400)."""
        with self._lock:
            adapters = self._map() if with_adapters else None
        body = {"success": success, "error_message": error_message, "loaded_adapters": adapters}
        return Response.json(status or (200 if success else 400), body)

    def error_answer(self, route: str, status: int, message: str) -> Response:
        if route == "health":
            return Response(status)
        if route == "models":  # sglang/srt/entrypoints/openai/protocol.py ErrorResponse
            return Response.json(
                status,
                {"object": "error", "message": message, "type": "error", "param": None, "code": status},
            )
        body = {"success": False, "error_message": message, "loaded_adapters": None}
        return Response.json(status, body)

    @staticmethod
    def _validation_error(loc: str, msg: str, err_type: str, given: Any) -> Response:
        """FastAPI ``RequestValidationError`` default handler (422)."""
        detail = [{"type": err_type, "loc": ["body", loc] if loc else ["body"], "msg": msg, "input": given}]
        return Response.json(422, {"detail": detail})

    # ---- routing -----------------------------------------------------------------------

    def route_name(self, method: str, path: str) -> str | None:
        entry = _ROUTES.get(path)
        return entry[1] if entry else None

    def route(self, method: str, path: str, headers: Message, body: bytes) -> Answer:
        entry = _ROUTES.get(path)
        if entry is None:
            return NOT_FOUND
        if method != entry[0]:
            return METHOD_NOT_ALLOWED
        name = entry[1]
        if name == "health":
            return Response(200)
        if name == "models":
            return self.listing_answer(self.models_payload)
        if media_type(headers) != JSON:
            return self._validation_error(
                "",
                "Input should be a valid dictionary or object to extract fields from",
                "model_attributes_type",
                body.decode("utf-8", "replace"),
            )
        data = parse_json_object(body)
        if data is None:
            return self._validation_error("", "JSON decode error", "json_invalid", {})
        required = ("lora_name", "lora_path") if name == "load" else ("lora_name",)
        for key in required:
            if key not in data:
                return self._validation_error(key, "Field required", "missing", data)
            if not isinstance(data[key], str):
                return self._validation_error(key, "Input should be a valid string", "string_type", data[key])
        if not self.lora_enabled:
            return self.result(False, LORA_NOT_ENABLED, with_adapters=False)
        with self._maybe_global_lock():
            if name == "load":
                return self._load(data["lora_name"], data["lora_path"], bool(data.get("pinned")))
            return self._unload(data["lora_name"])

    @contextlib.contextmanager
    def _maybe_global_lock(self) -> Iterator[None]:
        if self.serialize_updates:
            with self._update_lock:
                yield
        else:
            yield

    # ---- /v1/models --------------------------------------------------------------------

    def models_payload(self) -> dict[str, Any]:
        cards: list[dict[str, Any]] = [
            {
                "id": self.served_model,
                "object": "model",
                "created": self.created,
                "owned_by": "sglang",
                "root": self.served_model,
                "parent": None,
                "max_model_len": self.max_model_len,
            }
        ]
        for adapter in self.adapters():
            cards.append(
                {
                    "id": adapter.name,
                    "object": "model",
                    "created": self.created,
                    "owned_by": "sglang",
                    "root": adapter.path,
                    "parent": self.served_model,
                    "max_model_len": None,
                }
            )
        return {"object": "list", "data": cards}

    # ---- load / unload -----------------------------------------------------------------

    def _load(self, name: str, path: str, pinned: bool) -> Answer:
        with self.name_lock(name):
            with self._lock:
                exists = name in self._adapters
                pinned_count = sum(1 for a in self._adapters.values() if a.pinned)
            if exists:  # LoRAManager.validate_new_adapter
                return self.result(
                    False,
                    f"Failed to load LoRA adapter {name} because it is already loaded",
                    status=self.duplicate_status,
                )
            if pinned and pinned_count >= self.max_loras_per_batch - 1:
                return self.result(
                    False,
                    f"Failed to load LoRA adapter {name} as a pinned adapter. It is not allowed "
                    "to pin all slots in the LoRA memory pool to avoid starvation for unpinned "
                    "adapters and base models. Please increase your `--max-loras-per-batch` or "
                    "load it as unpinned LoRA adapters.",
                )
            with self.load_window() as (gen, start):
                failure: Answer | None = None
                try:
                    checked = _check(self.read_adapter(path), self.max_lora_rank)
                except AdapterNotFound:
                    failure = self.result(
                        False,
                        f"Failed to load LoRA adapter {name}: Can't find 'adapter_config.json' at '{path}'",
                    )
                except AdapterRankTooHigh as exc:
                    failure = self.result(
                        False,
                        f"LoRA adapter {name} with rank {exc.rank} is incompatible with the current "
                        "LoRA memory pool configuration. Please ensure that the LoRA adapter's rank "
                        "is within the configured `--max-lora-rank` and that the target modules are "
                        "included in `--lora-target-modules`.",
                    )
                except AdapterInvalid as exc:
                    failure = self.result(False, f"Failed to load LoRA adapter {name}: {exc}")
            if failure is not None:  # answered once the load's time is up, as a success is
                self.record_load(name, start, False)
                return failure
            with self._lock:
                lost = self._generation != gen
                if not lost:
                    self.put_adapter(LoadedAdapter(name, path, pinned=pinned, md5s=checked.md5s))
            self.record_load(name, start, not lost)
            if lost:
                return DROP
        return self.result(True)

    def _unload(self, name: str) -> Answer:
        with self.name_lock(name):
            with self._lock:
                exists = name in self._adapters
                keys = list(self._adapters)
            if not exists:  # LoRARegistry.unregister -> ValueError -> success=False, 400
                return self.result(
                    False,
                    f"LoRA with name {name} does not exist. Loaded LoRAs: odict_keys({keys!r})",
                    with_adapters=False,
                )
            if self.unload_latency_s > 0:
                time.sleep(self.unload_latency_s)
            with self._lock:
                self.drop_adapter(name)
        return self.result(True)

"""vLLM stand-in replica (OpenAI-compatible server with runtime LoRA updating).

Mirrors, per route:

* ``POST /v1/load_lora_adapter`` / ``POST /v1/unload_lora_adapter``:
  vllm/entrypoints/serve/lora/api_router.py (routes registered only when
  ``envs.VLLM_ALLOW_RUNTIME_LORA_UPDATING``; ``Depends(validate_json_request)``) and
  vllm/entrypoints/openai/models/serving.py ``OpenAIServingModels.load_lora_adapter`` /
  ``unload_lora_adapter`` / ``_check_load_lora_adapter_request`` /
  ``_check_unload_lora_adapter_request`` (older: vllm/entrypoints/openai/serving_models.py).
* ``GET /v1/models``: ``OpenAIServingModels.show_available_models`` (base cards, then LoRA cards).
* ``GET /health``: vllm/entrypoints/openai/api_server.py ``health`` (200, empty body).
* Error bodies: vllm/entrypoints/serve/utils/error_response.py / ``ErrorResponse``
  (nested ``{"error": {...}}`` since v0.10.1, PR #22099; flat ``{"object": "error", ...}`` before).

Choices where versions differ (all switchable):

* ``error_shape="nested"`` (current) or ``"flat"`` (< v0.10.1).
* ``old_content_type_415=False``: a non-JSON Content-Type answers 400 ``BadRequestError``
  (current: ``RequestValidationError``); ``True`` answers 415 ``{"detail": "Unsupported Media
  Type: Only 'application/json' is allowed"}`` (older ``HTTPException``).
* ``invalid_adapter_status=400``: an unreadable / non-LoRA ``adapter_config.json`` answers 400
  ``BadRequestError`` (older releases); 500 gives ``InternalServerError`` (current code). A rank
  above ``max_lora_rank`` is always 400 ``BadRequestError`` (upstream ``BADREQUEST_CASES``).
* ``supports_load_inplace=True``: ``load_inplace`` honoured (PR #31326) and the "already loaded"
  message carries the in-place hint; ``False`` gives the older short message and ignores it.
"""

from __future__ import annotations

import time
from email.message import Message
from http import HTTPStatus
from pathlib import Path
from typing import Any, ClassVar, Literal

from devstack.standins.engines.answers import DROP, JSON, METHOD_NOT_ALLOWED, NOT_FOUND, Answer, Response
from devstack.standins.engines.base import (
    AdapterInvalid,
    AdapterNotFound,
    AdapterRankTooHigh,
    EngineReplica,
    LoadedAdapter,
    check_adapter_dir,
    media_type,
    parse_json_object,
)

_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}
_ROUTES = {
    "/health": ("GET", "health"),
    "/v1/models": ("GET", "models"),
    "/v1/load_lora_adapter": ("POST", "load"),
    "/v1/unload_lora_adapter": ("POST", "unload"),
}
_LORA_PATHS = frozenset({"/v1/load_lora_adapter", "/v1/unload_lora_adapter"})
UNSUPPORTED_MEDIA = "Unsupported Media Type: Only 'application/json' is allowed"


class VllmReplica(EngineReplica):
    """A vLLM replica with ``--enable-lora`` (see module docstring for the rules)."""

    engine: ClassVar[str] = "vllm"
    CONFIGURABLE: ClassVar[dict[str, type]] = {
        **EngineReplica.CONFIGURABLE,
        "runtime_lora_updating": bool,
        "error_shape": str,
        "old_content_type_415": bool,
        "invalid_adapter_status": int,
        "supports_load_inplace": bool,
    }

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        served_model: str = "base-model",
        mount_root: Path | str | None = None,
        max_lora_rank: int = 64,
        static_adapters: dict[str, str] | None = None,
        runtime_lora_updating: bool = True,
        load_latency_s: float = 0.0,
        *,
        error_shape: Literal["nested", "flat"] = "nested",
        old_content_type_415: bool = False,
        invalid_adapter_status: int = 400,
        supports_load_inplace: bool = True,
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
        self.runtime_lora_updating = runtime_lora_updating
        self.error_shape: str = error_shape
        self.old_content_type_415 = old_content_type_415
        self.invalid_adapter_status = invalid_adapter_status
        self.supports_load_inplace = supports_load_inplace
        self._validate_setting("error_shape", error_shape)
        self._validate_setting("invalid_adapter_status", invalid_adapter_status)

    def _validate_setting(self, key: str, value: Any) -> None:
        super()._validate_setting(key, value)
        if key == "error_shape" and value not in ("nested", "flat"):
            raise ValueError("error_shape must be 'nested' or 'flat'")
        if key == "invalid_adapter_status" and value not in (400, 500):
            raise ValueError("invalid_adapter_status must be 400 or 500")

    # ---- errors ------------------------------------------------------------------------

    def error(self, status: int, message: str, err_type: str | None = None) -> Response:
        """``create_error_response`` in vLLM's serving base: ErrorResponse JSON, HTTP ``status``."""
        if err_type is None:
            err_type = _ERROR_TYPES.get(status) or HTTPStatus(status).phrase.replace(" ", "")
        if self.error_shape == "flat":
            body: dict[str, Any] = {
                "object": "error",
                "message": message,
                "type": err_type,
                "param": None,
                "code": status,
            }
        else:
            body = {"error": {"message": message, "type": err_type, "param": None, "code": status}}
        return Response.json(status, body)

    def error_answer(self, route: str, status: int, message: str) -> Response:
        if route == "health":
            return Response(status)
        return self.error(status, message)

    # ---- routing -----------------------------------------------------------------------

    def route_name(self, method: str, path: str) -> str | None:
        entry = _ROUTES.get(path)
        return entry[1] if entry else None

    def route(self, method: str, path: str, headers: Message, body: bytes) -> Answer:
        entry = _ROUTES.get(path)
        if entry is None or (path in _LORA_PATHS and not self.runtime_lora_updating):
            return NOT_FOUND  # route not registered (VLLM_ALLOW_RUNTIME_LORA_UPDATING unset)
        if method != entry[0]:
            return METHOD_NOT_ALLOWED
        name = entry[1]
        if name == "health":
            return Response(200)
        if name == "models":
            return self.listing_answer(self.models_payload)
        if media_type(headers) != JSON:  # validate_json_request
            if self.old_content_type_415:
                return Response.json(415, {"detail": UNSUPPORTED_MEDIA})
            return self.error(400, UNSUPPORTED_MEDIA, "BadRequestError")
        data = parse_json_object(body)
        if data is None:  # FastAPI RequestValidationError -> 400 in vLLM's handler
            return self.error(400, "Request body must be a JSON object.", "BadRequestError")
        if name == "load":
            return self._load(data)
        return self._unload(data)

    # ---- /v1/models --------------------------------------------------------------------

    def _permission(self) -> list[dict[str, Any]]:
        return [
            {
                "id": f"modelperm-{self.host.replace('.', '')}{self.port}",
                "object": "model_permission",
                "created": self.created,
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ]

    def models_payload(self) -> dict[str, Any]:
        """``show_available_models``: base card, then one card per adapter (load order)."""
        cards: list[dict[str, Any]] = [
            {
                "id": self.served_model,
                "object": "model",
                "created": self.created,
                "owned_by": "vllm",
                "root": self.model_path,
                "parent": None,
                "max_model_len": self.max_model_len,
                "permission": self._permission(),
            }
        ]
        for adapter in self.adapters():
            cards.append(
                {
                    "id": adapter.name,
                    "object": "model",
                    "created": self.created,
                    "owned_by": "vllm",
                    "root": adapter.path,
                    "parent": self.served_model,
                    "max_model_len": None,
                    "permission": self._permission(),
                }
            )
        return {"object": "list", "data": cards}

    # ---- load / unload -----------------------------------------------------------------

    def _already_loaded(self, name: str) -> str:
        if self.supports_load_inplace:
            return (
                f"The lora adapter '{name}' has already been loaded. If you want to load the "
                "adapter in place, set 'load_inplace' to True."
            )
        return f"The lora adapter '{name}' has already been loaded."

    def _load(self, data: dict[str, Any]) -> Answer:
        """``OpenAIServingModels.load_lora_adapter`` (+ ``_check_load_lora_adapter_request``)."""
        name, path = data.get("lora_name"), data.get("lora_path")
        if (name is not None and not isinstance(name, str)) or (
            path is not None and not isinstance(path, str)
        ):
            return self.error(400, "lora_name and lora_path must be strings.", "BadRequestError")
        if not name or not path:
            return self.error(400, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput")
        inplace = bool(data.get("load_inplace", False)) and self.supports_load_inplace
        with self.name_lock(name):  # lora_resolver_lock[lora_name]
            with self._lock:
                exists = name in self._adapters
            if exists and not inplace:
                return self.error(400, self._already_loaded(name), "InvalidUserInput")
            with self.load_window() as (gen, start):
                failure: Answer | None = None
                try:
                    checked = check_adapter_dir(self.read_adapter(path), self.max_lora_rank)
                except AdapterNotFound:
                    # vllm/lora/worker_manager.py: LoRAAdapterNotFoundError -> 404 NotFoundError
                    failure = self.error(
                        404, f"Loading lora {name} failed: No adapter found for {path}", "NotFoundError"
                    )
                except AdapterRankTooHigh as exc:
                    # vllm/lora/peft_helper.py PEFTHelper.validate_legacy
                    failure = self.error(
                        400,
                        f"LoRA rank {exc.rank} is greater than max_lora_rank {exc.max_rank}.",
                        "BadRequestError",
                    )
                except AdapterInvalid as exc:
                    failure = self.error(self.invalid_adapter_status, f"Loading lora {name} failed: {exc}")
            if failure is not None:  # answered once the load's time is up, as a success is
                self.record_load(name, start, False)
                return failure
            with self._lock:
                if self._generation != gen:  # engine restarted while loading
                    lost = True
                else:
                    lost = False
                    current = self._adapters.get(name)
                    if current is not None:  # in place: same lora_int_id, same position
                        current.path = path
                        current.static = False
                        current.md5s = checked.md5s
                    else:
                        self.put_adapter(LoadedAdapter(name, path, md5s=checked.md5s))
            self.record_load(name, start, not lost)
            if lost:
                return DROP
        return Response(200, f"Success: LoRA adapter '{name}' added successfully.".encode())

    def _unload(self, data: dict[str, Any]) -> Answer:
        """``OpenAIServingModels.unload_lora_adapter`` (``lora_int_id`` is accepted, ignored)."""
        name = data.get("lora_name")
        if not isinstance(name, str) or not name:
            return self.error(
                400,
                "'lora_name' needs to be provided to unload a LoRA adapter.",
                "InvalidUserInput",
            )
        with self.name_lock(name):
            with self._lock:
                exists = name in self._adapters
            if not exists:
                return self.error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
            if self.unload_latency_s > 0:
                time.sleep(self.unload_latency_s)
            with self._lock:
                self.drop_adapter(name)
        return Response(200, f"Success: LoRA adapter '{name}' removed successfully.".encode())

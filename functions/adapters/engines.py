"""vLLM and SGLang replicas behind one client interface, over httpx.

The engine's own `GET /v1/models` is the truth for "loaded". "Already loaded" on load and
"not found" on unload are success. Calls fan out with bounded concurrency and a timeout
each; a failing replica yields a result, never an exception, so it cannot block the others.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple, Protocol, TypeVar

import httpx
from pydantic import BaseModel, ConfigDict

from functions.adapters.pod_pools import PodPools
from functions.adapters.tls import never_used
from functions.logic.pods import Endpoint, Runtime
from functions.observability import ENGINE_FAILURES, ENGINE_SECONDS
from functions.settings import Settings

T = TypeVar("T")
R = TypeVar("R")
Task = Callable[[], None]


class CallResult(NamedTuple):
    ok: bool
    reason: str
    message: str = ""
    retryable: bool = False


OK = CallResult(True, "Loaded")
POD_POOL_IDLE_S = 600.0
"""A pod not called for this long has its connections closed (resync calls every pod each tick)."""


class RuntimeProtocol(Protocol):
    """How one runtime spells load and unload (paths and answers differ, meaning does not)."""

    load_path: str
    unload_path: str

    def load_body(self, name: str, path: str) -> dict[str, Any]: ...


class VllmProtocol:
    """vllm/entrypoints/serve/lora/api_router.py: /v1/load_lora_adapter, plain-text 200."""

    load_path = "/v1/load_lora_adapter"
    unload_path = "/v1/unload_lora_adapter"

    def load_body(self, name: str, path: str) -> dict[str, Any]:
        return {"lora_name": name, "lora_path": path}


class SglangProtocol:
    """sglang/srt/entrypoints/http_server.py: /load_lora_adapter (no /v1), JSON {success,...}."""

    load_path = "/load_lora_adapter"
    unload_path = "/unload_lora_adapter"

    def load_body(self, name: str, path: str) -> dict[str, Any]:
        return {"lora_name": name, "lora_path": path}


PROTOCOLS: dict[Runtime, RuntimeProtocol] = {"vllm": VllmProtocol(), "sglang": SglangProtocol()}


def error_message(response: httpx.Response) -> str:
    """The human message of an engine error, whichever of its shapes the engine used."""
    try:
        body = response.json()
    except (ValueError, json.JSONDecodeError):
        return response.text.strip()[:500]
    if isinstance(body, dict):
        nested = body.get("error")
        if isinstance(nested, dict) and nested.get("message"):
            return str(nested["message"])
        for key in ("message", "error_message", "detail"):
            if body.get(key):
                return str(body[key])
    return response.text.strip()[:500]


def _succeeded(response: httpx.Response) -> bool:
    if response.status_code != 200:
        return False
    if "json" in response.headers.get("content-type", ""):
        try:
            body = response.json()
        except ValueError:
            return True
        return not (isinstance(body, dict) and body.get("success") is False)
    return True


def classify_load(response: httpx.Response) -> CallResult:
    if _succeeded(response):
        return OK
    message = error_message(response)
    lowered = message.lower()
    if response.status_code in (400, 409) and "already" in lowered and "loaded" in lowered:
        return CallResult(True, "AlreadyLoaded", message)
    if response.status_code == 404 and lowered == "not found":
        return CallResult(
            False,
            "RuntimeUpdatesDisabled",
            "engine has no LoRA routes (vLLM needs VLLM_ALLOW_RUNTIME_LORA_UPDATING=true)",
        )
    if response.status_code == 404:
        return CallResult(False, "AdapterPathNotFound", message)
    if response.status_code >= 500 or response.status_code == 429:
        return CallResult(False, "EngineError", f"HTTP {response.status_code}: {message}", retryable=True)
    return CallResult(False, "LoadRejected", f"HTTP {response.status_code}: {message}")


def classify_unload(response: httpx.Response) -> CallResult:
    if _succeeded(response):
        return CallResult(True, "Unloaded")
    message = error_message(response)
    lowered = message.lower()
    if response.status_code in (400, 404) and ("cannot be found" in lowered or "does not exist" in lowered):
        return CallResult(True, "NotLoaded", message)
    retryable = response.status_code >= 500 or response.status_code == 429
    return CallResult(False, "UnloadFailed", f"HTTP {response.status_code}: {message}", retryable=retryable)


class ModelCard(BaseModel):
    """One entry of `GET /v1/models`: vLLM's ModelCard (vllm/entrypoints/openai/protocol.py) and
    SGLang's (sglang/srt/entrypoints/openai/protocol.py) agree on these; an adapter's card has
    the base model as `parent` and its path as `root`. The other fields are not read at all."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True, defer_build=True)

    id: str
    root: str | None = None
    parent: str | None = None


class ModelList(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True, defer_build=True)

    data: list[ModelCard] | None = None


def adapters_listed(body: bytes) -> dict[str, str]:
    """The adapters of a `GET /v1/models` answer, name -> path (the cards with a `parent`).

    Parsed and validated in one pass by pydantic (its JSON parser skips the fields we do not
    model), ~0.6x json.loads of the whole answer for 500 adapters (bench 10). Raises
    ValueError (pydantic's ValidationError) for an answer that is not such a listing."""
    listing = ModelList.model_validate_json(body)
    return {card.id: card.root or "" for card in listing.data or () if card.parent}


class Engines:
    def __init__(self, settings: Settings) -> None:
        # In-flight calls are bounded by the fan-out pools, not by the connection pools. Each
        # pod keeps up to load_concurrency idle connections (a reload's burst into one pod) for
        # the next fan-out; a pod's pool outlives its longest call (two engine timeouts at least).
        pools = PodPools(
            keepalive_per_pod=settings.load_concurrency,
            idle_after_s=max(POD_POOL_IDLE_S, 2 * settings.engine_timeout),
        )
        # engines are reached at http://<pod IP>:<port> (logic/pods.endpoint): no TLS to set up
        self._http = httpx.Client(timeout=settings.engine_timeout, transport=pools, verify=never_used())
        self._concurrency = settings.load_concurrency

    def healthy(self, endpoint: Endpoint) -> bool:
        try:
            return self._http.get(endpoint.url + "/health").status_code == 200
        except httpx.HTTPError:
            return False

    def listing(self, endpoint: Endpoint) -> dict[str, str] | None:
        """Adapters the engine serves now, name -> path (cards with a `parent`); None if unreachable."""
        started = time.perf_counter()
        try:
            response = self._http.get(endpoint.url + "/v1/models")
            response.raise_for_status()
            return adapters_listed(response.content)
        except (httpx.HTTPError, ValueError, AttributeError):
            ENGINE_FAILURES.labels(endpoint.runtime, "list", "unreachable").inc()
            return None
        finally:
            ENGINE_SECONDS.labels(endpoint.runtime, "list").observe(time.perf_counter() - started)

    def load(self, endpoint: Endpoint, name: str, path: str) -> CallResult:
        protocol = PROTOCOLS[endpoint.runtime]
        return self._post(endpoint, "load", protocol.load_path, protocol.load_body(name, path), classify_load)

    def unload(self, endpoint: Endpoint, name: str) -> CallResult:
        protocol = PROTOCOLS[endpoint.runtime]
        return self._post(endpoint, "unload", protocol.unload_path, {"lora_name": name}, classify_unload)

    def _post(
        self,
        endpoint: Endpoint,
        operation: str,
        path: str,
        body: dict[str, Any],
        classify: Callable[[httpx.Response], CallResult],
    ) -> CallResult:
        started = time.perf_counter()
        try:
            result = classify(self._http.post(endpoint.url + path, json=body))
        except httpx.TimeoutException:
            result = CallResult(False, "EngineTimeout", f"{operation} timed out", retryable=True)
        except httpx.HTTPError as err:
            result = CallResult(False, "EngineUnreachable", f"{operation}: {err}", retryable=True)
        ENGINE_SECONDS.labels(endpoint.runtime, operation).observe(time.perf_counter() - started)
        if not result.ok:
            ENGINE_FAILURES.labels(endpoint.runtime, operation, result.reason).inc()
        return result

    def fan_out(self, items: Iterable[T], call: Callable[[T], R]) -> list[tuple[T, R]]:
        """Run `call` over `items` with bounded concurrency; results in input order."""
        work = list(items)
        if len(work) <= 1:
            return [(item, call(item)) for item in work]
        with ThreadPoolExecutor(max_workers=min(self._concurrency, len(work))) as pool:
            return list(zip(work, pool.map(call, work), strict=True))

    def pipeline(self, items: Iterable[T], observe: Callable[[T], list[Task]]) -> None:
        """Run `observe(item)` (a listing) over `items`, and the tasks (loads) each returns.

        Listings and loads run on two pools of `load_concurrency` workers each: a listing (a
        dictionary read in the engine) never waits behind a load (weights read, GPU memory
        allocated, ~100 ms to seconds), so the load slots stay busy back to back, and a pod's
        loads start as soon as its own listing is in. Wider listing bursts measured slower on
        2 cores (bench/fanout.py: 4x wide 650-700 ms, as wide 580-615 ms for 50 pods). Returns
        when everything has finished (re-raising the first exception of a task).
        """
        work = list(items)
        if not work:
            return
        with (
            ThreadPoolExecutor(max_workers=self._concurrency) as loads,
            ThreadPoolExecutor(max_workers=min(len(work), self._concurrency)) as listings,
        ):

            def observe_then_queue(item: T) -> list[Future[None]]:
                return [loads.submit(task) for task in observe(item)]

            queued = [listings.submit(observe_then_queue, item) for item in work]
            for load in [future for listed in queued for future in listed.result()]:
                load.result()

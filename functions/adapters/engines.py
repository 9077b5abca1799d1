"""vLLM and SGLang replicas over keep-alive connections per pod; every answer bounded.

The engine's own `GET /v1/models` is the truth for "loaded". "Already loaded" on load and
"not found" on unload are success. A pod is another tenant's process and may be hostile: every
call has a wall-clock deadline (a trickled answer is cut off, not waited for per read), every
answer a byte cap and no decompression, and a malformed answer is that pod's failure (a value),
never an exception, so one pod cannot stall or fail the others.

The calls go out on the transport's exchanges, over a small stack of idle connections per pod
(functions/transport/pods.py). A load or unload that may have reached the engine is never sent
again by the transport (a vLLM load sent twice answers "already loaded"); the broker's retry of
the event is what repeats it.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Literal, NamedTuple, NotRequired, Protocol

from pydantic import ConfigDict, TypeAdapter, ValidationError
from typing_extensions import TypedDict

from functions.errors import problems
from functions.logic import capacity, reasons
from functions.logic.capacity import Capacity
from functions.logic.pods import Endpoint, Runtime
from functions.logic.serving import ListingFailure
from functions.observability import ENGINE_FAILURES, ENGINE_SECONDS
from functions.ports import CallResult
from functions.transport import (
    BodyEncoded,
    BodyTooLarge,
    Deadline,
    Streamed,
    TransportError,
    TransportTimeout,
)
from functions.transport.pods import PodConnections

LISTING_MAX_BYTES = 8 << 20
"""`GET /v1/models` of an engine with 1,000 adapters is ~300 KiB; far more is not a listing."""
ANSWER_MAX_BYTES = 64 << 10
"""Load and unload answer with a sentence (vLLM) or a small JSON object (SGLang)."""
POD_IDLE_S = 600.0
"""A pod not called for this long has its connections closed (resync calls every pod each tick)."""
IDLE_CONNECTIONS_MAX = 512
"""Idle engine connections kept across all pods at most, each an open file (a container's soft
limit can be 1,024): the pods that keep any are capped at this over `keepalive_per_pod`."""
INFO_PATHS = ("/server_info", "/get_server_info")
"""SGLang's server info (the second is the older name, a deprecated alias since)."""
INFO_CACHED_MAX = 8192
"""Replicas whose reported capacity is kept: it changes only with a restart (new arguments)."""
HEADERS = {"Accept-Encoding": "identity"}
POST_HEADERS = {**HEADERS, "Content-Type": "application/json"}
ReplaceMode = Literal["inplace", "reload"]


OK = CallResult(True, reasons.POD_LOADED)


class AnswerError(Exception):
    """The answer broke its bounds (too large, too slow, compressed): the pod's failure."""

    def __init__(self, reason: str, message: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.reason = reason
        self.retryable = retryable


class Answer(NamedTuple):
    status: int
    content_type: str
    body: bytes

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.body)


class RuntimeProtocol(Protocol):
    """How one runtime spells load and unload (paths and answers differ, meaning does not)."""

    load_path: str
    unload_path: str
    inplace: bool
    """Load can replace a loaded adapter's weights under its name (vLLM `load_inplace`)."""


class VllmProtocol:
    """vllm/entrypoints/serve/lora/api_router.py: /v1/load_lora_adapter, plain-text 200;
    `load_inplace: true` replaces the weights of a loaded name (vLLM PR #31326; releases before
    it ignore the field and answer 400 "has already been loaded")."""

    load_path = "/v1/load_lora_adapter"
    unload_path = "/v1/unload_lora_adapter"
    inplace = True


class SglangProtocol:
    """sglang/srt/entrypoints/http_server.py: /load_lora_adapter (no /v1), JSON {success,...};
    no in-place reload: unload, then load."""

    load_path = "/load_lora_adapter"
    unload_path = "/unload_lora_adapter"
    inplace = False


PROTOCOLS: dict[Runtime, RuntimeProtocol] = {"vllm": VllmProtocol(), "sglang": SglangProtocol()}


# -- reading answers -----------------------------------------------------------------------------------
def read_bounded(response: Streamed, limit: int) -> bytes:
    """The raw body, or AnswerError once it passes `limit` bytes or its exchange's deadline
    (each receive is bounded by what is left of it: a trickled answer ends at the deadline)."""
    try:
        return response.read(limit)
    except BodyEncoded as err:
        raise AnswerError(reasons.ENGINE_ANSWER_INVALID, str(err)) from err
    except BodyTooLarge as err:
        raise AnswerError(reasons.ENGINE_ANSWER_TOO_LARGE, str(err)) from err
    except TransportTimeout as err:
        raise AnswerError(reasons.ENGINE_TIMEOUT, "answer still arriving at the deadline", True) from err


class ModelCard(TypedDict):
    """One entry of `GET /v1/models`: vLLM's ModelCard (vllm/entrypoints/openai/protocol.py) and
    SGLang's (sglang/srt/entrypoints/openai/protocol.py) agree on these; an adapter's card has
    the base model as `parent` and its path as `root`. The other fields are not read at all."""

    __pydantic_config__ = ConfigDict(extra="ignore", strict=True)  # type: ignore[misc]

    id: str
    root: NotRequired[str | None]
    parent: NotRequired[str | None]


class ModelList(TypedDict):
    __pydantic_config__ = ConfigDict(extra="ignore", strict=True)  # type: ignore[misc]

    data: NotRequired[list[ModelCard] | None]


_LISTING = TypeAdapter(ModelList)


def adapters_listed(body: bytes) -> dict[str, str]:
    """The adapters of a `GET /v1/models` answer, name -> path (the cards with a `parent`).

    Parsed and validated in one pass by pydantic (its JSON parser skips the fields we do not
    model) into plain dicts: faster than json.loads of the whole answer, and cheaper than
    building a model per card (resync lists thousands of pods a tick).
    Raises ValueError (pydantic's ValidationError) for an answer that is not such a listing."""
    listing = _LISTING.validate_json(body)
    return {card["id"]: card.get("root") or "" for card in listing.get("data") or () if card.get("parent")}


def parse_listing(body: bytes) -> dict[str, str] | ListingFailure:
    """The adapters of a `/v1/models` answer (name -> root), or the pod's failure to list them."""
    try:
        return adapters_listed(body)
    except ValidationError as err:  # never echoes the answer back (a hostile pod's text)
        return ListingFailure(
            reasons.ENGINE_ANSWER_INVALID, f"GET /v1/models is not a listing: {problems(err, 3)}", False
        )
    except (ValueError, RecursionError) as err:
        return ListingFailure(
            reasons.ENGINE_ANSWER_INVALID, f"GET /v1/models is not a listing ({type(err).__name__})", False
        )


def error_message(answer: Answer) -> str:
    """The human message of an engine error, whichever of its shapes the engine used."""
    try:
        body = answer.json()
    except (ValueError, UnicodeDecodeError, RecursionError):
        return answer.text().strip()[:500]
    if isinstance(body, dict):
        nested = body.get("error")
        if isinstance(nested, dict) and nested.get("message"):
            return str(nested["message"])[:500]
        for key in ("message", "error_message", "detail"):
            if body.get(key):
                return str(body[key])[:500]
    return answer.text().strip()[:500]


def _json_body(answer: Answer) -> Any:
    """The answer's JSON body; None when it is not JSON (vLLM's plain text) or not parseable."""
    if "json" not in answer.content_type:
        return None
    try:
        return answer.json()
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None


def _succeeded(answer: Answer, body: Any) -> bool:
    return answer.status == 200 and not (isinstance(body, dict) and body.get("success") is False)


def holds_after(body: Any) -> dict[str, str] | None:
    """What a load's answer says the engine holds after it, name -> path: SGLang's
    `loaded_adapters` (tokenizer_control_mixin.py `load_lora_adapter` drops from it what it
    evicted to make room). None when the answer does not say, or says it in another shape."""
    held = body.get("loaded_adapters") if isinstance(body, dict) else None
    if not isinstance(held, dict):
        return None
    if not all(isinstance(name, str) and isinstance(path, str) for name, path in held.items()):
        return None
    return held


def classify_load(answer: Answer) -> CallResult:
    body = _json_body(answer)
    if _succeeded(answer, body):
        held = holds_after(body)
        return OK if held is None else OK._replace(holds=held)
    message = error_message(answer)
    lowered = message.lower()
    if answer.status in (400, 409) and "already" in lowered and "loaded" in lowered:
        return CallResult(True, reasons.POD_ALREADY_LOADED, message)
    if answer.status == 400 and "maximum number of loaded lora adapters" in lowered:
        return CallResult(False, reasons.ENGINE_FULL, f"HTTP 400: {message}", retryable=True)
    if answer.status == 404 and lowered == "not found":
        return CallResult(
            False,
            reasons.RUNTIME_UPDATES_DISABLED,
            "engine has no LoRA routes (vLLM needs VLLM_ALLOW_RUNTIME_LORA_UPDATING=true)",
        )
    if answer.status == 404:
        return CallResult(False, reasons.ADAPTER_PATH_NOT_FOUND, message)
    if answer.status >= 500 or answer.status == 429:
        return CallResult(False, reasons.ENGINE_ERROR, f"HTTP {answer.status}: {message}", retryable=True)
    return CallResult(False, reasons.LOAD_REJECTED, f"HTTP {answer.status}: {message}")


def classify_unload(answer: Answer) -> CallResult:
    if _succeeded(answer, _json_body(answer)):
        return CallResult(True, reasons.POD_UNLOADED)
    message = error_message(answer)
    lowered = message.lower()
    if answer.status in (400, 404) and ("cannot be found" in lowered or "does not exist" in lowered):
        return CallResult(True, reasons.POD_NOT_LOADED, message)
    retryable = answer.status >= 500 or answer.status == 429
    return CallResult(False, reasons.UNLOAD_FAILED, f"HTTP {answer.status}: {message}", retryable=retryable)


class Engines:
    def __init__(
        self,
        timeout: float,
        keepalive_per_pod: int,
        replace: ReplaceMode = "inplace",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # Each pod keeps up to keepalive_per_pod idle connections (a reload's burst into one pod)
        # for the next fan-out; a pod's connections outlive its longest call (two timeouts at least).
        self._pods = PodConnections(
            keepalive_per_pod=keepalive_per_pod,
            idle_after_s=max(POD_IDLE_S, 2 * timeout),
            max_pods=max(1, IDLE_CONNECTIONS_MAX // keepalive_per_pod),
            timeout=timeout,
            clock=clock,
        )
        self._timeout = timeout
        self._replace = replace
        self._clock = clock
        self._capacities: OrderedDict[tuple[str, int], Capacity | None] = OrderedDict()
        self._capacities_lock = threading.Lock()

    def close(self) -> None:
        self._pods.close()

    # -- transport -------------------------------------------------------------------------------------
    def _call(
        self, method: str, endpoint: Endpoint, path: str, limit: int, body: Mapping[str, Any] | None = None
    ) -> Answer:
        """One bounded round trip. Raises TransportTimeout or TransportError (the pod did
        not answer), AnswerError (an answer out of bounds) or ValueError (not an engine address)."""
        deadline = Deadline(self._clock() + self._timeout, self._clock)
        payload = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        headers = HEADERS if payload is None else POST_HEADERS
        with self._pods.to(endpoint.url).exchange(method, path, headers, payload, deadline) as response:
            content = read_bounded(response, limit)
            return Answer(response.status, response.headers.get("content-type", ""), content)

    def healthy(self, endpoint: Endpoint) -> bool:
        try:
            return self._call("GET", endpoint, "/health", ANSWER_MAX_BYTES).status == 200
        except (TransportError, ValueError, AnswerError):
            return False

    def listing(self, endpoint: Endpoint) -> dict[str, str] | ListingFailure:
        """Adapters the engine serves now, name -> root; a ListingFailure says why not."""
        started = time.perf_counter()
        try:
            answer = self._call("GET", endpoint, "/v1/models", LISTING_MAX_BYTES)
        except TransportTimeout:
            result: dict[str, str] | ListingFailure = ListingFailure(
                reasons.ENGINE_TIMEOUT, "GET /v1/models timed out"
            )
        except (TransportError, ValueError) as err:
            detail = str(err)[:200] or type(err).__name__
            result = ListingFailure(reasons.ENGINE_UNREACHABLE, f"GET /v1/models failed: {detail}")
        except AnswerError as err:
            result = ListingFailure(err.reason, f"GET /v1/models: {err}", err.retryable)
        else:
            if answer.status != 200:
                retry = answer.status >= 500 or answer.status == 429
                result = ListingFailure(
                    reasons.ENGINE_UNREACHABLE, f"GET /v1/models answered {answer.status}", retry
                )
            else:
                result = parse_listing(answer.body)
        ENGINE_SECONDS.labels(endpoint.runtime, "list").observe(time.perf_counter() - started)
        if isinstance(result, ListingFailure):
            ENGINE_FAILURES.labels(endpoint.runtime, "list", result.reason).inc()
        return result

    def capacity(self, endpoint: Endpoint) -> Capacity | None:
        """The capacity an SGLang replica reports (`/server_info`), once per replica and restart;
        None when it reports none (vLLM, an older release, a failed read: not kept, asked again)."""
        if endpoint.runtime != "sglang":
            return None
        key = (endpoint.url, endpoint.restarts)
        with self._capacities_lock:
            if key in self._capacities:
                return self._capacities[key]
        found: Capacity | None = None
        for path in INFO_PATHS:
            try:
                answer = self._call("GET", endpoint, path, capacity.INFO_MAX_BYTES)
            except (TransportError, ValueError, AnswerError):
                return None
            if answer.status == 404:
                continue
            if answer.status != 200:
                return None
            found = capacity.from_server_info(answer.body)
            break
        with self._capacities_lock:
            self._capacities[key] = found
            while len(self._capacities) > INFO_CACHED_MAX:
                self._capacities.popitem(last=False)
        return found

    def load(self, endpoint: Endpoint, name: str, path: str, inplace: bool = False) -> CallResult:
        protocol = PROTOCOLS[endpoint.runtime]
        body: dict[str, Any] = {"lora_name": name, "lora_path": path}
        if inplace:
            body["load_inplace"] = True
        return self._post(endpoint, "load", protocol.load_path, body, classify_load)

    def unload(self, endpoint: Endpoint, name: str) -> CallResult:
        protocol = PROTOCOLS[endpoint.runtime]
        return self._post(endpoint, "unload", protocol.unload_path, {"lora_name": name}, classify_unload)

    def replace(self, endpoint: Endpoint, name: str, path: str) -> CallResult:
        """Put `path`'s current weights under `name` in place of the copy the pod serves.

        vLLM with `load_inplace`: no moment without the name. Otherwise (SGLang, older vLLM, or
        the "reload" setting) unload then load, back to back: the name is absent for one load.
        """
        protocol = PROTOCOLS[endpoint.runtime]
        if protocol.inplace and self._replace == "inplace":
            result = self.load(endpoint, name, path, inplace=True)
            if result.ok and result.reason != reasons.POD_ALREADY_LOADED:
                return result._replace(reason=reasons.POD_REPLACED)
            if not result.ok:
                return result
            # "already loaded": this release ignores load_inplace
        unloaded = self.unload(endpoint, name)
        if not unloaded.ok:
            return unloaded
        loaded = self.load(endpoint, name, path)
        if loaded.ok and loaded.reason != reasons.POD_ALREADY_LOADED:
            return loaded._replace(reason=reasons.POD_REPLACED)
        if loaded.ok:  # someone loaded it between our two calls: whose copy is unknown
            return CallResult(
                False, reasons.LOAD_REJECTED, "loaded again by another caller during the replacement", True
            )
        return loaded

    def _post(
        self,
        endpoint: Endpoint,
        operation: str,
        path: str,
        body: dict[str, Any],
        classify: Callable[[Answer], CallResult],
    ) -> CallResult:
        started = time.perf_counter()
        try:
            result = classify(self._call("POST", endpoint, path, ANSWER_MAX_BYTES, body))
        except TransportTimeout:
            result = CallResult(False, reasons.ENGINE_TIMEOUT, f"{operation} timed out", retryable=True)
        except (TransportError, ValueError) as err:
            detail = str(err)[:200] or type(err).__name__
            result = CallResult(False, reasons.ENGINE_UNREACHABLE, f"{operation}: {detail}", retryable=True)
        except AnswerError as err:
            result = CallResult(False, err.reason, f"{operation}: {err}", err.retryable)
        ENGINE_SECONDS.labels(endpoint.runtime, operation).observe(time.perf_counter() - started)
        if not result.ok:
            ENGINE_FAILURES.labels(endpoint.runtime, operation, result.reason).inc()
        return result

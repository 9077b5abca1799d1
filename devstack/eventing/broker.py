"""A local Knative Broker: HTTP ingress, routing by Triggers, delivery.

Its Triggers are set at start (`Broker(triggers)`, manifests) and replaced at any time by
`set_triggers`: the embedded stack's TriggerWatch (triggerwatch.py) keeps them equal to the
Trigger objects in the API server, as the MT broker's filter keeps its Trigger informer; a
retry is delivered by the Trigger's current spec, and not at all once it is gone.

Each rule mirrors the multi-tenant broker (`pkg/broker/ingress/ingress_handler.go`,
`pkg/broker/filter/filter_handler.go`, `pkg/kncloudevents/retries.go`):
- ingress accepts POST only (OPTIONS 200, other methods 405), answers 400 to a request that
  is not a valid CloudEvent or whose `knativebrokerttl` is exhausted, sets the TTL to 255 when
  absent, adds `knativearrivaltime`, and answers 202 Accepted;
- every Trigger whose filter matches gets one delivery (binary mode unless `format: json`),
  concurrently on a worker pool; ordering between deliveries is not guaranteed;
- no response, 5xx, 404, 408, 409 and 429 are retried `retry` times with `backoffPolicy`
  and `backoffDelay`; any other status is final; a failed delivery goes to the dead-letter
  sink with `knativeerrordest`, `knativeerrorcode` and `knativeerrordata`;
- a 2xx reply that is a CloudEvent is republished into this broker with the TTL decremented;
  a non-empty 2xx body that is not a CloudEvent is a failed delivery (the filter answers 502);
- trace context is W3C over HTTP (Knative's data plane; docs/spec/broker.md "preserve that
  trace header on delivery to subscribers and on reply events, unless the reply is sent with a
  different set of tracing attributes"): the `traceparent`/`tracestate` headers an event came
  in with go out on each of its deliveries and dead letters, and on its replies unless the
  reply carries trace attributes of its own. No spans of its own (tracing backend `none`):
  the context passes through unchanged.

For tests: a time-scale factor for backoffs, counters, `wait_idle`, an event log served at
`GET /_devstack/events?since=N`, and seeded fault injection (`Faults`).
"""

from __future__ import annotations

import base64
import heapq
import itertools
import json
import logging
import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from cloudevents.conversion import to_binary, to_structured
from cloudevents.exceptions import GenericException
from cloudevents.http import CloudEvent, from_http

from devstack.eventing.triggers import Trigger
from devstack.http_handler import StandInHandler
from devstack.keepalive import Answer, Pools, SendError
from functions import tracing
from functions.tracing import Trace

log = logging.getLogger("devstack.eventing.broker")

TTL_EXTENSION = "knativebrokerttl"
DEFAULT_TTL = 255
RETRIED_STATUSES = frozenset({404, 408, 409, 429})
ERROR_DATA_MAX = 1024
Resolver = Callable[[Mapping[str, Any]], str]


class InvalidEvent(ValueError):
    """The ingress answers 400."""


# -- observability --------------------------------------------------------------------------------
@dataclass
class Counters:
    received: int = 0
    delivered: int = 0
    retried: int = 0
    dead_lettered: int = 0
    failed: int = 0
    replies: int = 0
    dropped: int = 0
    rejected: int = 0


@dataclass(frozen=True)
class Faults:
    """Seeded chaos: `duplicate` delivers each event 2-3 times, `shuffle` delays each delivery
    by up to that many seconds (reordering), `drop` loses that fraction of deliveries."""

    duplicate: bool = False
    shuffle: float = 0.0
    drop: float = 0.0
    seed: int = 0


class EventLog:
    """Bounded, sequence-numbered log of what the broker did, tailed by `?since=N`."""

    def __init__(self, size: int = 20000) -> None:
        self._entries: deque[dict[str, Any]] = deque(maxlen=size)
        self._seq = itertools.count(1)
        self._lock = threading.Lock()

    def add(self, event: CloudEvent, outcome: str, trace: Trace | None = None, **fields: Any) -> None:
        entry = {
            "seq": 0,
            "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "id": event["id"],
            "type": event["type"],
            "subject": event.get("subject"),
            "outcome": outcome,
            "trace_id": trace.trace_id if trace is not None else None,
            **fields,
        }
        with self._lock:
            entry["seq"] = next(self._seq)
            self._entries.append(entry)

    def last_seq(self) -> int:
        """The sequence number of the newest entry (0 when empty): where a tail starts."""
        with self._lock:
            return int(self._entries[-1]["seq"]) if self._entries else 0

    def since(self, seq: int = 0) -> list[dict[str, Any]]:
        """The entries after `seq`, oldest first. Sequence numbers are consecutive in the deque,
        so the first one wanted is found by arithmetic: a tail costs what it returns, not the
        whole log (a benchmark tails it every few milliseconds while the broker delivers)."""
        with self._lock:
            if not self._entries:
                return []
            skip = max(0, seq - self._entries[0]["seq"] + 1)
            return list(itertools.islice(self._entries, skip, None))


# -- scheduling -----------------------------------------------------------------------------------
class _Scheduler:
    """Runs callables on `workers` threads, now or after a delay, without blocking a worker.
    The threads take their work from one queue (no Future per delivery: the benchmarks'
    bursts put every delivery through here, in the process that measures them)."""

    def __init__(self, workers: int) -> None:
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._workers = [
            threading.Thread(target=self._work, name=f"broker-worker-{n}", daemon=True)
            for n in range(workers)
        ]
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="broker-timer", daemon=True)
        for thread in (*self._workers, self._thread):
            thread.start()

    def submit(self, fn: Callable[[], None], delay: float = 0.0) -> None:
        if delay <= 0:
            self._queue.put(fn)
            return
        with self._cv:
            heapq.heappush(self._heap, (time.monotonic() + delay, next(self._order), fn))
            self._cv.notify()

    def _work(self) -> None:
        while (fn := self._queue.get()) is not None:
            if not self._closed:  # closing: what is still queued is dropped, as it was never begun
                fn()  # Broker._run: a delivery never raises out of it

    def _run(self) -> None:
        with self._cv:
            while not self._closed:
                if not self._heap:
                    self._cv.wait()
                    continue
                due, _, fn = self._heap[0]
                wait = due - time.monotonic()
                if wait > 0:
                    self._cv.wait(wait)
                    continue
                heapq.heappop(self._heap)
                self._queue.put(fn)

    def close(self) -> None:
        """Pending retries and queued deliveries are dropped; those under way finish."""
        with self._cv:
            self._closed = True
            self._heap.clear()
            self._cv.notify()
        self._thread.join(timeout=5)
        for _ in self._workers:
            self._queue.put(None)
        for thread in self._workers:
            thread.join(timeout=5)


@dataclass
class _Task:
    event: CloudEvent
    trigger: Trigger
    url: str
    trace: Trace | None = None
    attempts: int = 0
    started: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class _Outcome:
    status: int | None
    body: bytes = b""
    reply: CloudEvent | None = None
    error: str = ""
    answered_s: float = 0.0
    """The attempt's POST, from its start to the subscriber's whole answer (its own time)."""

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    @property
    def retryable(self) -> bool:
        """`SelectiveRetry`: no response, 5xx, 404, 408, 409, 429."""
        return self.status is None or self.status >= 500 or self.status in RETRIED_STATUSES


# -- the broker -------------------------------------------------------------------------------------
class Broker:
    """One broker (`name`) routing to `triggers`; `resolve` turns a Destination into a URL."""

    def __init__(
        self,
        triggers: Sequence[Trigger],
        resolve: Resolver,
        *,
        name: str = "default",
        time_scale: float = 1.0,
        workers: int = 32,
        default_timeout_s: float = 30.0,
        dead_letter_url: str | None = None,
        faults: Faults | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.name = name
        self.triggers = list(triggers)
        self.resolve = resolve
        self.time_scale = time_scale
        self.default_timeout_s = default_timeout_s
        self.dead_letter_url = dead_letter_url
        self.counters = Counters()
        self.log = EventLog()
        self._workers = workers
        self._routes: dict[tuple[str, str], tuple[Trigger, str]] = {}
        self._lock = threading.Condition()
        self._busy = 0
        self._last_activity = time.monotonic()
        self.set_faults(faults)
        self._clients = Pools(default_timeout_s)
        self._scheduler: _Scheduler | None = None
        self._server = _Server((host, port), _Handler)
        self._server.broker = self
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/"

    def start(self) -> Broker:
        """Resolve every subscriber (a Destination that cannot be resolved fails here), serve."""
        self.set_triggers(self.triggers, strict=True)
        self._scheduler = _Scheduler(self._workers)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="broker-http", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()
        if self._scheduler is not None:
            self._scheduler.close()
        self._clients.close()

    def __enter__(self) -> Broker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def set_triggers(self, triggers: Sequence[Trigger], strict: bool = False) -> dict[str, str]:
        """Route by `triggers` from now on (the Trigger objects as the API server holds them, or
        manifests); the routes are swapped at once, so a publish sees the old set or the new.
        Returns each Trigger's subscriber URL, or why it has none: `strict` raises instead (a
        Trigger of the stack's own manifests that cannot be resolved is a broken stack), else
        that Trigger gets no delivery, as Knative's filter answers 404 to a Trigger without
        `status.subscriberUri`."""
        routes: dict[tuple[str, str], tuple[Trigger, str]] = {}
        outcome: dict[str, str] = {}
        for trigger in triggers:
            try:
                url = self.resolve(trigger.subscriber)
            except ValueError as err:
                if strict:
                    raise
                outcome[trigger.name] = f"unresolved: {err}"
                continue
            routes[(trigger.namespace, trigger.name)] = (trigger, url)
            outcome[trigger.name] = url
        self.triggers = list(triggers)
        self._routes = routes
        return outcome

    def route(self, trigger: Trigger) -> tuple[Trigger, str] | None:
        """The current route of the Trigger `trigger` was (None: it is gone, or was recreated)."""
        found = self._routes.get((trigger.namespace, trigger.name))
        if found is None or found[0].uid != trigger.uid:
            return None
        return found

    def set_faults(self, faults: Faults | None) -> None:
        self.faults = faults or Faults()
        self._rng = random.Random(self.faults.seed)

    # -- quiescence -------------------------------------------------------------------------------
    def wait_idle(self, timeout: float = 10.0, quiet: float = 0.0) -> bool:
        """True once no delivery is in flight or pending a retry (and, with `quiet`, nothing
        arrived for that many seconds); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                now = time.monotonic()
                calm = quiet - (now - self._last_activity)
                if self._busy == 0 and calm <= 0:
                    return True
                if now >= deadline:
                    return False
                self._lock.wait(min(deadline - now, calm if self._busy == 0 else deadline - now))

    def _begin(self) -> None:
        with self._lock:
            self._busy += 1
            self._last_activity = time.monotonic()

    def _end(self) -> None:
        with self._lock:
            self._busy -= 1
            self._last_activity = time.monotonic()
            self._lock.notify_all()

    def _count(self, name: str) -> None:
        with self._lock:
            setattr(self.counters, name, getattr(self.counters, name) + 1)

    # -- ingress ----------------------------------------------------------------------------------
    def publish(self, event: CloudEvent, trace: Trace | None = None) -> None:
        """Ingress: validate the TTL, stamp arrival time, fan out to matching Triggers; `trace`
        is the W3C context the event came in with (its HTTP headers)."""
        ttl = _ttl(event)
        if ttl is not None and ttl <= 0:
            self._count("rejected")
            self.log.add(event, "ttl-exhausted", trace)
            raise InvalidEvent(f"{TTL_EXTENSION} exhausted")
        event[TTL_EXTENSION] = str(DEFAULT_TTL if ttl is None else ttl)
        event["knativearrivaltime"] = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        self._count("received")
        attrs = {k: str(v) for k, v in event.get_attributes().items()}
        matched = [(t, url) for t, url in self._routes.values() if t.matches(attrs)]
        self.log.add(event, "received", trace, triggers=[t.name for t, _ in matched])
        for trigger, url in matched:
            self._fan_out(event, trigger, url, trace)

    def _fan_out(self, event: CloudEvent, trigger: Trigger, url: str, trace: Trace | None = None) -> None:
        with self._lock:
            copies = self._rng.choice((2, 3)) if self.faults.duplicate else 1
            plan = [
                (self._rng.random() < self.faults.drop, self._rng.uniform(0, self.faults.shuffle))
                for _ in range(copies)
            ]
        for dropped, delay in plan:
            if dropped:
                self._count("dropped")
                self.log.add(event, "dropped", trace, trigger=trigger.name, subscriber=url)
                continue
            self._begin()
            task = _Task(_copy(event), trigger, url, trace)
            self._submit(task, delay)

    def _submit(self, task: _Task, delay: float) -> None:
        assert self._scheduler is not None, "broker not started"
        self._scheduler.submit(lambda: self._run(task), delay)

    # -- delivery ---------------------------------------------------------------------------------
    def _run(self, task: _Task) -> None:
        try:
            self._deliver(task)
        except Exception:
            log.exception("delivery of %s to %s crashed", task.event["id"], task.url)
            self._end()

    def _deliver(self, task: _Task) -> None:
        if task.attempts and not self._still_routed(task):
            self._end()
            return
        task.attempts += 1
        outcome = self._attempt(task)
        delivery = task.trigger.delivery
        if outcome.ok:
            self._succeed(task, outcome)
        elif outcome.retryable and task.attempts <= delivery.retry:
            self._count("retried")
            self.log.add(task.event, "retrying", task.trace, **self._fields(task, outcome))
            self._submit(task, delivery.backoff(task.attempts) * self.time_scale)
            return
        else:
            self._dead_letter(task, outcome)
        self._end()

    def _still_routed(self, task: _Task) -> bool:
        """Before a retry: Knative's filter reads the Trigger from its informer on every attempt,
        so a deleted Trigger gets no more (it answers 404 and the Subscription carrying the
        retries is deleted with it), and a changed one is delivered by its current spec (a
        filter that no longer matches is answered 200 without a delivery)."""
        current = self.route(task.trigger)
        if current is None:
            self.log.add(
                task.event, "trigger-gone", task.trace, trigger=task.trigger.name, attempts=task.attempts
            )
            return False
        task.trigger, task.url = current
        attrs = {k: str(v) for k, v in task.event.get_attributes().items()}
        if not task.trigger.matches(attrs):
            self.log.add(
                task.event, "filtered", task.trace, trigger=task.trigger.name, attempts=task.attempts
            )
            return False
        return True

    def _attempt(self, task: _Task) -> _Outcome:
        delivery = task.trigger.delivery
        headers, body = (to_structured if delivery.structured else _to_binary)(task.event)
        if task.trace is not None:
            headers.update(task.trace.attributes())
        timeout = delivery.timeout_s or self.default_timeout_s
        sent = time.perf_counter()
        try:
            answer = self._clients.post(task.url, headers, body, timeout=timeout)
        except SendError as err:
            return _Outcome(None, error=str(err), answered_s=time.perf_counter() - sent)
        answered = time.perf_counter() - sent
        if not 200 <= answer.status < 300:
            return _Outcome(answer.status, answer.body, answered_s=answered)
        return replace(_reply_outcome(answer), answered_s=answered)

    def _succeed(self, task: _Task, outcome: _Outcome) -> None:
        self._count("delivered")
        self.log.add(task.event, "delivered", task.trace, **self._fields(task, outcome))
        if outcome.reply is None:
            return
        self._count("replies")
        reply = outcome.reply
        reply[TTL_EXTENSION] = str((_ttl(task.event) or DEFAULT_TTL) - 1)
        own = tracing.parse(reply.get(tracing.TRACEPARENT), reply.get(tracing.TRACESTATE))
        try:
            self.publish(reply, own or task.trace)
        except InvalidEvent:
            log.info("reply %s to %s dropped: TTL exhausted", reply["type"], task.event["id"])

    def _dead_letter(self, task: _Task, outcome: _Outcome) -> None:
        destination = task.trigger.delivery.dead_letter
        url = self.resolve(destination) if destination else self.dead_letter_url
        fields = self._fields(task, outcome)
        if url is None:
            self._count("failed")
            self.log.add(task.event, "failed", task.trace, **fields)
            return
        event = _copy(task.event)
        event["knativeerrordest"] = task.url
        event["knativeerrorcode"] = str(outcome.status if outcome.status is not None else 0)
        data = outcome.body[:ERROR_DATA_MAX] or outcome.error.encode()[:ERROR_DATA_MAX]
        if data:
            event["knativeerrordata"] = base64.b64encode(data).decode()
        headers, body = _to_binary(event)
        if task.trace is not None:
            headers.update(task.trace.attributes())
        try:
            self._clients.post(url, headers, body)
        except SendError as err:
            log.warning("dead-letter sink %s unreachable: %s", url, err)
        self._count("dead_lettered")
        self.log.add(task.event, "dead-lettered", task.trace, dead_letter=url, **fields)

    @staticmethod
    def _fields(task: _Task, outcome: _Outcome) -> dict[str, Any]:
        return {
            "trigger": task.trigger.name,
            "subscriber": task.url,
            "status": outcome.status,
            "attempts": task.attempts,
            "duration_ms": round((time.monotonic() - task.started) * 1000, 1),
            "answer_ms": round(outcome.answered_s * 1000, 2),
            **({"error": outcome.error} if outcome.error else {}),
        }

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {**asdict(self.counters), "in_flight": self._busy}


# -- CloudEvent helpers ------------------------------------------------------------------------------
def _ttl(event: CloudEvent) -> int | None:
    raw = event.get(TTL_EXTENSION)
    if raw is None:
        return None
    try:
        return int(raw)
    except (TypeError, ValueError) as err:
        raise InvalidEvent(f"{TTL_EXTENSION} {raw!r} is not an integer") from err


def _to_binary(event: CloudEvent) -> tuple[dict[str, str], bytes]:
    """Binary mode by the SDK (the functions read it with their own codec: two implementations)."""
    headers, body = to_binary(event)
    return headers, body or b""


def _copy(event: CloudEvent) -> CloudEvent:
    return CloudEvent(dict(event.get_attributes()), event.get_data())


def _is_cloudevent_response(headers: Mapping[str, str]) -> bool:
    return "ce-specversion" in headers or headers.get("content-type", "").startswith(
        "application/cloudevents+json"
    )


def _reply_outcome(answer: Answer) -> _Outcome:
    """2xx: empty body = done; a CloudEvent = reply; anything else = failure (the MT broker's
    filter answers 502 "received a non-empty response not recognized as CloudEvent")."""
    body = answer.body
    if _is_cloudevent_response(answer.headers):
        try:
            reply = from_http(answer.headers, body)
        except GenericException as err:
            return _Outcome(502, body, error=f"invalid CloudEvent reply: {err}")
        return _Outcome(answer.status, reply=reply)
    if body:
        return _Outcome(502, body, error="non-empty response not recognized as CloudEvent")
    return _Outcome(answer.status)


def parse_request(headers: Mapping[str, str], body: bytes) -> CloudEvent:
    """The CloudEvent of an ingress request, read by the SDK (errors and all)."""
    try:
        event = from_http(dict(headers), body)
    except GenericException as err:
        raise InvalidEvent(str(err)) from err
    for required in ("id", "source", "type", "specversion"):
        if not event.get(required):
            raise InvalidEvent(f"missing CloudEvent attribute {required!r}")
    return event


# -- the sources' side ---------------------------------------------------------------------------------
class BrokerClient:
    """How a source adapter sends to its sink: binary mode, retried on failure with exponential
    backoff from 50 ms, 5 times (ApiServerSource adapter send retries). Knative's adapters send
    through the CloudEvents SDK's observed client, which injects the W3C context of its send
    span as headers: each event starts a trace here (unsampled: no tracing backend), unless it
    carries trace attributes of its own."""

    def __init__(self, url: str, retries: int = 5, backoff_s: float = 0.05, timeout_s: float = 10.0) -> None:
        self.url = url
        self.retries = retries
        self.backoff_s = backoff_s
        self._http = Pools(timeout_s)
        self._closed = threading.Event()

    def send(self, event: CloudEvent) -> bool:
        headers, body = _to_binary(event)  # as the deliveries: the SDK's encoding is slower
        trace = tracing.parse(event.get(tracing.TRACEPARENT), event.get(tracing.TRACESTATE))
        headers.update((trace or tracing.new_trace()).attributes())
        for attempt in range(self.retries + 1):
            try:
                status = self._http.post(self.url, headers, body).status
            except SendError as err:
                status, error = 0, str(err)
            else:
                error = f"HTTP {status}"
                if 200 <= status < 300:
                    return True
                if 400 <= status < 500 and status not in RETRIED_STATUSES:
                    break
            if self._closed.wait(self.backoff_s * 2**attempt):
                break
        log.warning("could not send %s to %s: %s", event["type"], self.url, error)
        return False

    def close(self) -> None:
        self._closed.set()
        self._http.close()


# -- HTTP -----------------------------------------------------------------------------------------------
class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256
    broker: Broker


class _Handler(StandInHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed ACK
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _answer(self, status: int, payload: Any = None) -> None:
        body = b"" if payload is None else json.dumps(payload).encode()
        head = [("Content-Type", "application/json")] if body else []
        self.respond(status, [*head, ("Content-Length", str(len(body)))], body)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            event = parse_request(dict(self.headers.items()), body)
            self.server.broker.publish(event, tracing.incoming(self.headers))
        except InvalidEvent as err:
            self._answer(400, {"error": str(err)})
            return
        self._answer(202)

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        broker = self.server.broker
        if parts.path == "/_devstack/events":
            since = int((parse_qs(parts.query).get("since") or ["0"])[0] or 0)
            self._answer(200, broker.log.since(since))
        elif parts.path == "/_devstack/stats":
            self._answer(200, broker.stats())
        elif parts.path in ("/healthz", "/readyz"):
            self._answer(200, {"status": "ok"})
        else:
            self._answer(405)

    def do_OPTIONS(self) -> None:
        self._answer(200)

    def do_PUT(self) -> None:
        self._answer(405)

    def do_DELETE(self) -> None:
        self._answer(405)

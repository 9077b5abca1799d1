"""filer source: loss-free file notifications, read from the filer's replayable metadata log.

Runs as its own long-lived process, `python -m functions.filer_source` (a Knative
ContainerSource in the functions' image: knative/components/filer-source; K_SINK is the Broker).
Reads: SeaweedFS `SubscribeMetadata` over gRPC (LORAFLOW_FILER_GRPC, else the filer URL's port
    + 10000) for the adapter layout's prefix (functions.logic.file_events.watched_prefixes), the
    filer's configuration (its store's signature) and the first record of its oldest log file.
Writes: its cursor, two annotations of one Lease (LORAFLOW_SOURCE_LEASE).
Publishes: `io.loraflow.file.changed.v1` for every create, update, delete and rename of a file,
    exactly as ingest maps it (functions.logic.file_events; source `/loraflow/filer-source`); a
    `dev.knative.sources.ping` with `full: true` (resync's full pass) when the log no longer
    covers the cursor (functions.logic.filer_log says when).
Delivery: one event at a time in the log's order (so in order per path), each published until
    the Broker accepts it (backoff 50 ms doubling to 5 s); only then does the cursor move past
    it, and the cursor is written at most every LORAFLOW_SOURCE_CHECKPOINT seconds and on
    SIGTERM. After a crash, an eviction or a redeploy it resumes at the cursor: at least once,
    nothing lost; the duplicates are nudges like any other.
Bad input: a response that does not decode is logged and skipped; an event whose path or
    payload we refuse (functions.logic.file_events) is logged with its ts_ns and skipped.
Failures: the filer down or restarted, a stalled stream (no response for LORAFLOW_SOURCE_STALL
    seconds, where the filer sends a heartbeat every 5): subscribe again from the cursor, backing
    off 0.1 s doubling to 5 s. The Lease missing at start: exit 1 (the manifests were not applied).
"""

from __future__ import annotations

import logging
import os
import random
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TYPE_CHECKING, NamedTuple
from uuid import uuid4

from cloudevents.http import CloudEvent

from events.external import PING, ResyncTick
from functions.adapters.lease_cursor import LeaseMissing
from functions.errors import LoraflowError, Reject
from functions.logic import file_events, filer_log
from functions.logic.filer_log import CHANGE, HEARTBEAT, Cursor
from functions.logic.seaweed_event import classify, from_proto, join_path
from functions.settings import Settings

if TYPE_CHECKING:
    import grpc

    from functions.adapters.filer_log import FilerLog
    from functions.adapters.lease_cursor import LeaseCursor
    from functions.ports import BrokerPort
    from functions.proto import filer_pb2

NAME = "filer-source"
log = logging.getLogger("loraflow.filer_source")


class Backoff(NamedTuple):
    first: float
    most: float

    def after(self, delay: float) -> float:
        return min(delay * 2, self.most)


PUBLISH_BACKOFF = Backoff(0.05, 5.0)
RESUBSCRIBE_BACKOFF = Backoff(0.1, 5.0)


class Stopped(Exception):
    """The source was asked to stop while it waited (the event in hand stays unaccepted)."""


class Source:
    """Follows the log until `stop()`; `run()` returns the process's exit code."""

    def __init__(
        self,
        settings: Settings,
        filer: FilerLog,
        cursor: LeaseCursor,
        broker: BrokerPort,
        *,
        now_ns: Callable[[], int] = time.time_ns,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.filer = filer
        self.cursor = cursor
        self.broker = broker
        self._now_ns = now_ns
        self._monotonic = monotonic
        self._folder = file_events.bucket_folder(settings)
        self._prefixes = file_events.watched_prefixes(settings)
        self._stopping = threading.Event()
        self._call: grpc.Call | None = None
        self._waiting_since: float | None = None
        self.position: Cursor | None = None
        """The last ts_ns the Broker accepted (or that needed nothing sent), in memory."""
        self._saved: Cursor | None = None
        self._saved_at = 0.0
        self._saving = threading.Lock()  # the reader and the watcher both write the cursor
        self.client_name = f"loraflow-{NAME}@{socket.gethostname()}"
        self._client_id = random.randint(1, 2**31 - 1)  # the filer refuses a duplicated one

    # -- lifecycle ------------------------------------------------------------------------------
    def stop(self) -> None:
        self._stopping.set()
        call = self._call
        if call is not None:
            call.cancel()

    def run(self) -> int:
        try:
            self.position = self._saved = self._load_cursor()
        except Stopped:
            return 0
        except LoraflowError as err:  # LeaseMissing: nothing to resume from, nowhere to write
            log.error("filer source cannot start: %s", err)
            return 1
        delay, failures = RESUBSCRIBE_BACKOFF.first, 0
        while not self._stopping.is_set():
            try:
                if self._follow():
                    delay, failures = RESUBSCRIBE_BACKOFF.first, 0
            except Stopped:
                break
            except Exception as err:  # the filer, the network, the Broker: subscribe again
                failures += 1
                if failures == 1 or failures % 20 == 0:  # a filer down for long: a line a minute or so
                    log.warning(
                        "subscription to the filer's metadata log ended: %s; subscribing again from "
                        "the cursor (attempt %d)",
                        _describe(err),
                        failures,
                        extra=self._where(),
                    )
            self._checkpoint(force=True)
            if self._stopping.wait(delay):
                break
            delay = RESUBSCRIBE_BACKOFF.after(delay)
        self._checkpoint(force=True)
        log.info("filer source stopped", extra=self._where())
        return 0

    def _load_cursor(self) -> Cursor | None:
        delay = RESUBSCRIBE_BACKOFF.first
        while True:
            try:
                return self.cursor.load()
            except LeaseMissing:
                raise
            except LoraflowError as err:  # the API is down or slow: the cursor is there, wait for it
                log.warning("cannot read the cursor yet: %s", err, extra={"lease": self.cursor.where})
            if self._stopping.wait(delay):
                raise Stopped
            delay = RESUBSCRIBE_BACKOFF.after(delay)

    # -- one subscription -------------------------------------------------------------------------
    def _follow(self) -> bool:
        """Subscribe and handle responses until the stream ends; True once it delivered one."""
        configuration = self.filer.configuration()
        signature = configuration.signature
        start = filer_log.plan_start(self.position, signature, self.filer.log_begins_ns(), self._now_ns())
        if start.resync is not None:
            log.warning(
                "the filer's metadata log cannot replay from the cursor: %s; nudging a full "
                "resync, then following the log from %s",
                start.resync,
                filer_log.iso(start.since_ns),
                extra={**self._where(), "filer_signature": signature},
            )
            self._publish(self._full_resync(start.resync))
            self.position = Cursor(start.since_ns, signature)
            self._checkpoint(force=True)
        call = self.filer.subscribe(self.client_name, self._client_id, start.since_ns, self._prefixes)
        self._call = call
        if self._stopping.is_set():
            call.cancel()
        log.info(
            "following the filer's metadata log",
            extra={**self._where(), "since_ns": start.since_ns, "prefixes": list(self._prefixes)},
        )
        threading.Thread(target=self._watch, args=(call,), name="filer-source-watch", daemon=True).start()
        delivered = False
        try:
            for raw in self._responses(call):
                delivered = True
                self._handle(raw, signature)
                self._checkpoint()
        except Exception as err:
            if self._stopping.is_set():
                raise Stopped from err
            raise
        finally:
            self._call = None
            call.cancel()
        return delivered

    def _responses(self, call: grpc.Call) -> Iterator[bytes]:
        from functions.adapters.filer_log import iterate

        stream = iterate(call)
        while True:
            self._waiting_since = self._monotonic()
            try:
                raw = next(stream)
            except StopIteration:
                return
            finally:
                self._waiting_since = None
            yield raw

    def _watch(self, call: grpc.Call) -> None:
        """Write the cursor when the log goes quiet (the reader writes it only as responses come),
        and cancel a stream that went silent: a caught-up filer sends a heartbeat every 5 s, so
        silence longer than `source_stall` is a dead connection that TCP has not noticed."""
        stall = self.settings.source_stall
        while call.is_active():
            time.sleep(min(1.0, self.settings.source_checkpoint))
            self._checkpoint()
            since = self._waiting_since
            if since is not None and self._monotonic() - since > stall:
                log.warning("the filer sent nothing for %.0f s: resubscribing", stall, extra=self._where())
                call.cancel()
                return

    # -- one response -------------------------------------------------------------------------------
    def _handle(self, raw: bytes, signature: int) -> None:
        from google.protobuf.message import DecodeError

        try:
            response = self.filer.decode(raw)
        except DecodeError as err:
            # its own ts_ns is in the bytes that do not decode: name the last one that did
            after = self.position.since_ns if self.position is not None else None
            log.error(
                "skipping a response of %d bytes that does not decode (after ts_ns=%s): %s",
                len(raw),
                after,
                err,
                extra=self._where(),
            )
            return
        for one in (response, *response.events):
            self._handle_one(one, signature)

    def _handle_one(self, one: filer_pb2.SubscribeMetadataResponse, signature: int) -> None:
        notification = one.event_notification
        has_entry = notification.HasField("old_entry") or notification.HasField("new_entry")
        step = filer_log.step_of(one.HasField("event_notification"), has_entry, one.ts_ns)
        if step.kind == HEARTBEAT:
            return
        if step.kind == CHANGE:
            try:
                event = self._event(one, signature)
            except Reject as err:  # InvalidNotification among them
                log.error(
                    "skipping event ts_ns=%d: %s",
                    one.ts_ns,
                    err,
                    extra={"ts_ns": one.ts_ns, "directory": one.directory},
                )
                event = None
            if event is not None:
                self._publish(event)
        self._advance(Cursor(step.ts_ns, signature))

    def _event(self, one: filer_pb2.SubscribeMetadataResponse, signature: int) -> CloudEvent | None:
        notification = from_proto(one.event_notification)
        entry = notification.old_entry or notification.new_entry
        assert entry is not None  # step_of said CHANGE
        key = file_events.check_path(join_path(one.directory, entry.name), "event path")
        payload = file_events.file_changed(classify(key, notification), self._folder)
        if payload is None:
            return None
        name, when = filer_log.event_id(signature, one.ts_ns), filer_log.rfc3339_ns(one.ts_ns)
        base = self.settings.schema_base_url
        return file_events.cloud_event(payload, NAME, base, event_id=name, time=when)

    def _full_resync(self, reason: str) -> CloudEvent:
        data = ResyncTick.model_validate({"resync": True, "full": True, "reason": reason[:1024]})
        attributes = {
            "type": PING,
            "source": f"/loraflow/{NAME}",
            "id": str(uuid4()),
            "datacontenttype": "application/json",
        }
        return CloudEvent(attributes, data.model_dump(mode="json", exclude_none=True))

    # -- the Broker and the cursor ------------------------------------------------------------------
    def _publish(self, event: CloudEvent) -> None:
        """Until the Broker accepts it; raises Stopped if asked to stop first."""
        delay, failures = PUBLISH_BACKOFF.first, 0
        while True:
            try:
                self.broker.publish(event)
            except LoraflowError as err:  # Retryable: the Broker is down or refused it
                failures += 1
                if failures == 1 or failures % 100 == 0:
                    log.warning(
                        "the Broker did not take %s (%s, %d attempts): retrying until it does",
                        event["type"],
                        err,
                        failures,
                        extra={**self._where(), "subject": event.get("subject")},
                    )
                if self._stopping.wait(delay):
                    raise Stopped from err
                delay = PUBLISH_BACKOFF.after(delay)
                continue
            if failures:
                log.info("the Broker took %s at attempt %d", event["type"], failures + 1, extra=self._where())
            return

    def _advance(self, reached: Cursor) -> None:
        if self.position is None or reached.since_ns >= self.position.since_ns:
            self.position = reached

    def _checkpoint(self, force: bool = False) -> None:
        with self._saving:
            position = self.position
            if position is None or position == self._saved:
                return
            if not force and self._monotonic() - self._saved_at < self.settings.source_checkpoint:
                return
            self._saved_at = self._monotonic()
            try:
                self.cursor.save(position)
            except LoraflowError as err:
                log.warning(
                    "cannot write the cursor (kept in memory, tried again): %s", err, extra=self._where()
                )
                return
            self._saved = position

    def _where(self) -> dict[str, object]:
        position = self.position
        return {
            "function": NAME,
            "cursor_ns": position.since_ns if position is not None else None,
            "lease": self.cursor.where,
        }


def _describe(err: BaseException) -> str:
    details = getattr(err, "details", None)
    code = getattr(err, "code", None)
    if callable(details) and callable(code):  # a grpc.RpcError
        return f"{code()} {details()}"
    return f"{type(err).__name__}: {err}"


def build(settings: Settings) -> Source:
    """The source wired to the real filer, Kubernetes API and Broker from `settings`."""
    from functions.adapters.broker import Broker
    from functions.adapters.filer_log import FilerLog, grpc_target
    from functions.adapters.kube import Kube, connect
    from functions.adapters.lease_cursor import LeaseCursor

    namespace, name = settings.source_lease.split("/", 1)
    filer = FilerLog(grpc_target(settings.filer_url, settings.filer_grpc), settings.filer_url)
    cursor = LeaseCursor(Kube(connect(settings.kubeconfig)), namespace, name)
    return Source(settings, filer, cursor, Broker(settings.broker_url))


def main(argv: list[str] | None = None) -> int:
    from functions.observability import configure_logging

    configure_logging()
    try:
        settings = Settings.from_env()
    except ValueError as err:  # SettingsError: the variable's name and why, never its value
        log.error("filer source cannot start: %s", err)
        return 1
    if not settings.broker_url:
        log.error("filer source cannot start: no broker URL (K_SINK or LORAFLOW_BROKER_URL)")
        return 1
    source = build(settings)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        source.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    log.info("filer source starting", extra={"function": NAME, "pid": os.getpid()})
    return source.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

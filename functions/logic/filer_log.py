"""The filer source's decisions (pure): where to resume the filer's metadata log, whether the log
still covers that point, and what one response of the log asks of us.

The cursor is the `ts_ns` of the last response the Broker accepted (or that needed nothing
sent), with the signature of the filer store it came from. SeaweedFS replays its log from a
`since_ns` inclusively (measured on 4.48: a subscription from an event's own ts_ns gets that
event again), so resuming from the cursor sends its event once more: a duplicate, which every
step takes as a nudge like any other.

When the log no longer covers the cursor, changes may be gone for good, and the only repair is
to look at everything again: a full resync (functions.resync, a tick with `full: true`), then
the log from now on. That is the case when
- there is no cursor (a first start, or the Lease was reset): nothing says where we were;
- the filer's store signature differs from the cursor's (`filer.store.id`, kept in the store:
  weed/filer/filer.go `setOrLoadFilerStoreSignature`): a new or restored filer, whose log is not
  the one the cursor points into;
- the retained log begins after the cursor: the first record of the oldest file under
  /topics/.system/log is newer (an operator's retention deleted older days);
- no log file is left at all while the cursor is older than what a filer keeps in memory only
  (it flushes its log once a minute, `LogFlushInterval` in weed/filer/filer.go): the files that
  held the cursor's minute were deleted, or lost with the filer's disk.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import NamedTuple

SINCE_ANNOTATION = "loraflow.io/filer-since-ns"
SIGNATURE_ANNOTATION = "loraflow.io/filer-signature"

LOG_FLUSH_NS = 60 * 10**9
"""SeaweedFS flushes its in-memory metadata log to /topics/.system/log once a minute."""
MEMORY_HORIZON_NS = 2 * LOG_FLUSH_NS
"""How old a cursor may be and still lie only in a filer's memory (twice the flush interval)."""


class Cursor(NamedTuple):
    since_ns: int
    signature: int


class Start(NamedTuple):
    """Where to subscribe from, and why a full resync must come first (None: it need not)."""

    since_ns: int
    resync: str | None


def iso(ts_ns: int) -> str:
    return datetime.fromtimestamp(ts_ns / 1e9, UTC).isoformat(timespec="milliseconds")


def rfc3339_ns(ts_ns: int) -> str:
    """A log position as an RFC 3339 time with every nanosecond (a CloudEvent's `time`)."""
    seconds, nanos = divmod(ts_ns, 10**9)
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{nanos:09d}Z"


def event_id(signature: int, ts_ns: int) -> str:
    """One change's name: its filer store and its place in that store's log. A replay of the
    same change gets the same id (a filer's log has one entry per ts_ns)."""
    return f"{signature}-{ts_ns}"


def cursor_of(annotations: Mapping[str, str] | None) -> Cursor | None:
    """The cursor in a Lease's annotations; None when there is none or it is not two integers
    (a hand-edited value is treated as no cursor: a full resync, never a guess)."""
    annotations = annotations or {}
    since, signature = annotations.get(SINCE_ANNOTATION), annotations.get(SIGNATURE_ANNOTATION)
    try:
        cursor = Cursor(int(str(since)), int(str(signature)))
    except ValueError:
        return None
    return cursor if cursor.since_ns > 0 else None


def annotations_of(cursor: Cursor) -> dict[str, str]:
    return {SINCE_ANNOTATION: str(cursor.since_ns), SIGNATURE_ANNOTATION: str(cursor.signature)}


def plan_start(cursor: Cursor | None, signature: int, log_begins_ns: int | None, now_ns: int) -> Start:
    """Resume at the cursor while the filer's log covers it; else from now, after a full resync.

    `log_begins_ns`: the ts_ns of the oldest record in the filer's log files, None when it has
    none on disk (a young filer, or every file deleted)."""
    if cursor is None:
        return Start(now_ns, "no cursor yet (a first start, or the Lease was reset)")
    if cursor.signature != signature:
        return Start(
            now_ns,
            f"the filer's store is not the one of the cursor (signature {cursor.signature}, now "
            f"{signature}): a new or restored filer, whose metadata log does not hold the cursor",
        )
    if log_begins_ns is not None and log_begins_ns > cursor.since_ns:
        return Start(
            now_ns,
            f"the filer's metadata log begins at {iso(log_begins_ns)}, after the cursor "
            f"{iso(cursor.since_ns)}: what changed in between is no longer retained",
        )
    if log_begins_ns is None and cursor.since_ns < now_ns - MEMORY_HORIZON_NS:
        return Start(
            now_ns,
            f"the filer has no metadata log on disk, and the cursor {iso(cursor.since_ns)} is older "
            "than what it keeps in memory: its log files were deleted or lost",
        )
    return Start(cursor.since_ns, None)


class Step(NamedTuple):
    """What one response of the log is (HEARTBEAT, PROGRESS or CHANGE) and the ts_ns it carries."""

    kind: str
    ts_ns: int


HEARTBEAT = "heartbeat"
"""No notification: an idle heartbeat (ts_ns = the filer's now) or a flush report (ts_ns 0).
Liveness only: upstream's filer.sync does not move its checkpoint on one either."""
PROGRESS = "progress"
"""An empty notification: the filer skipped events the prefixes filter out and says how far it
got (weed/server/filer_grpc_server_sub_meta.go, MaxUnsyncedEvents): the cursor may move there."""
CHANGE = "change"
"""A notification with an entry: a change to classify and perhaps publish."""


def step_of(has_notification: bool, has_entry: bool, ts_ns: int) -> Step:
    if not has_notification or ts_ns <= 0:
        return Step(HEARTBEAT, ts_ns)
    return Step(CHANGE if has_entry else PROGRESS, ts_ns)

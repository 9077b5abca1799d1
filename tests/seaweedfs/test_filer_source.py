"""The filer source (`python -m functions.filer_source`, its own process) against the real
SeaweedFS 4.48: the real kube-apiserver holds its Lease under the component's RBAC, and an EventSink
behind a FaultProxy is its Broker.

What a consumer of the events can count on, checked from outside the process: every change
arrives, in the filer's order per path, once the duplicates are dropped by CloudEvent id (a
replay is the same event again: same id, same data); nothing is lost while the source is killed
or the Broker is down; the cursor never passes an event the Broker did not take; a log that
cannot replay from the cursor gives one clear line and a full-resync tick; a filer restart is
followed by itself.

The session's shared filer (devstack.seaweedfs.shared()) serves the tests that do not stop it,
each in a directory of its own; the restarts, the retained-log and the lost-log cases run on a
server of their own.
"""

from __future__ import annotations

import base64
import contextlib
import json
import secrets
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from cloudevents.http import CloudEvent

from devstack.eventing.sink import EventSink
from devstack.kubernetes import Kube
from devstack.seaweedfs import FaultProxy, SeaweedServer, Shared, weed_binary
from events.domain import FILE_CHANGED
from events.external import PING
from functions.adapters.filer_log import FilerLog, grpc_target, iterate
from functions.adapters.storage import quote_path
from functions.logic.filer_log import Cursor
from tests.support.filer import FilerClient
from tests.support.filer_source import SourceRig, read_cursor, source_kube, write_cursor
from tests.support.wait import eventually

FOLLOWING = "following the filer's metadata log"
GAP = "cannot replay from the cursor"


@dataclass
class Broker:
    sink: EventSink
    proxy: FaultProxy

    @property
    def url(self) -> str:
        return self.proxy.url + "/"


@pytest.fixture(scope="module")
def kube() -> Iterator[Kube]:
    server = source_kube()
    yield server
    server.stop()


@pytest.fixture
def broker() -> Iterator[Broker]:
    sink = EventSink().start()
    proxy = FaultProxy(sink.url).start()
    yield Broker(sink, proxy)
    proxy.stop()
    sink.stop()


@pytest.fixture
def directory(seaweed: Shared) -> Iterator[str]:
    found = f"/loraadapters/src-{secrets.token_hex(3)}/m/a"
    yield found
    httpx.delete(seaweed.server.url + quote_path(found), params={"recursive": "true"})


def rig_for(server: SeaweedServer, kube: Kube, broker: Broker, work: Path) -> SourceRig:
    write_cursor(kube, None)  # each test starts as a first deployment does
    return SourceRig(server, kube, broker.url, work)


@pytest.fixture
def rig(seaweed: Shared, kube: Kube, broker: Broker, tmp_path: Path) -> Iterator[SourceRig]:
    started = rig_for(seaweed.server, kube, broker, tmp_path)
    yield started
    started.stop()


def changes(sink: EventSink, under: str) -> list[CloudEvent]:
    """file.changed events about paths under `under`, as they arrived."""
    return [e for e in sink.of_type(FILE_CHANGED) if str(e["subject"]).startswith(under + "/")]


def data(event: CloudEvent) -> dict[str, Any]:
    found = event.get_data()
    assert isinstance(found, dict)
    return found


def distinct(events: list[CloudEvent]) -> list[CloudEvent]:
    """Drop replays by id, keeping the first arrival; a replay must be the same event."""
    first: dict[str, CloudEvent] = {}
    for event in events:
        seen = first.setdefault(event["id"], event)
        assert data(seen) == data(event) and seen["subject"] == event["subject"], "a replay differs"
        assert seen["time"] == event["time"]
    return list(first.values())


def per_path(events: list[CloudEvent]) -> dict[str, list[tuple[str, str | None]]]:
    """subject -> [(eventType, newPath)] in arrival order, each path's times strictly rising."""
    out: dict[str, list[tuple[str, str | None]]] = {}
    last: dict[str, str] = {}
    for event in events:
        subject = str(event["subject"])
        assert event["time"] > last.get(subject, ""), f"{subject}: out of order"
        last[subject] = event["time"]
        out.setdefault(subject, []).append((data(event)["eventType"], data(event).get("newPath")))
    return out


def started(rig: SourceRig) -> SourceRig:
    rig.start().wait_logged(FOLLOWING, count=len(rig.logged(FOLLOWING)) + 1)
    return rig


# -- on the shared filer --------------------------------------------------------------------------
def test_a_first_start_nudges_a_full_resync_then_follows(
    rig: SourceRig, broker: Broker, directory: str, filer: FilerClient
) -> None:
    started(rig)
    (line,) = rig.logged(GAP)
    assert "no cursor yet" in line["msg"] and line["level"] == "warning"
    (tick,) = broker.sink.wait_for(PING)
    assert tick["source"] == "/loraflow/filer-source"
    assert data(tick)["full"] is True and "no cursor yet" in data(tick)["reason"]
    filer.put_file(f"{directory}/adapter_config.json", b"{}")
    (event,) = eventually(lambda: changes(broker.sink, directory), what="the change at the Broker")
    assert event["source"] == "/loraflow/filer-source"
    assert data(event) == {
        "path": f"{directory}/adapter_config.json",
        "eventType": "create",
        "size": 2,
        "md5": "99914b932bd37a50b983c5e7c90ae93b",
    }
    saved = eventually(lambda: read_cursor(rig.kube), what="a cursor in the Lease")
    assert saved.since_ns > 0


def test_a_killed_source_resumes_at_its_cursor_and_every_change_arrives_in_order(
    rig: SourceRig, broker: Broker, directory: str, filer: FilerClient
) -> None:
    started(rig)
    filer.put_file(f"{directory}/a.bin", b"a1")
    filer.put_file(f"{directory}/b.bin", b"b1")
    eventually(lambda: len(changes(broker.sink, directory)) == 2, what="the first two changes")
    assert rig.kill() == -9
    # while it is down: an overwrite, a rename, a create, a delete
    filer.put_file(f"{directory}/a.bin", b"a2")
    filer.move(f"{directory}/b.bin", f"{directory}/c.bin")
    filer.put_file(f"{directory}/d.bin", b"d1")
    filer.delete(f"{directory}/a.bin")
    started(rig)
    expected = {
        f"{directory}/a.bin": [("create", None), ("update", None), ("delete", None)],
        f"{directory}/b.bin": [("create", None), ("rename", f"{directory}/c.bin")],
        f"{directory}/d.bin": [("create", None)],
    }
    eventually(
        lambda: per_path(distinct(changes(broker.sink, directory))) == expected,
        what="every change, in order per path",
    )
    assert len(rig.logged(GAP)) == 1, "the second start resumed at the cursor: no full resync"


def test_the_broker_down_for_a_while_loses_nothing_and_holds_the_cursor(
    rig: SourceRig, broker: Broker, directory: str, filer: FilerClient
) -> None:
    started(rig)
    broker.sink.wait_for(PING)
    broker.proxy.inject(503, times=None)
    names = [f"f{i}.bin" for i in range(5)]
    for name in names:
        filer.put_file(f"{directory}/{name}", name.encode())
    eventually(lambda: broker.proxy.faults_fired >= 3, what="503s answered")
    broker.proxy.clear_faults()
    broker.proxy.inject(reset=True, times=None)  # then the connection itself fails
    eventually(lambda: broker.proxy.faults_fired >= 6, what="connection resets")
    during = read_cursor(rig.kube)
    assert rig.terminate() == 0  # a redeploy in the middle of the outage
    after_stop = read_cursor(rig.kube)
    assert changes(broker.sink, directory) == []
    broker.proxy.clear_faults()
    started(rig)

    def all_arrived() -> list[CloudEvent] | None:
        got = distinct(changes(broker.sink, directory))
        return got if len(got) == len(names) else None

    arrived = eventually(all_arrived, what="every file once the Broker is back")
    assert [data(e)["path"].rsplit("/", 1)[1] for e in arrived] == names
    positions = [int(e["id"].rsplit("-", 1)[1]) for e in arrived]
    # the directories' creations needed nothing sent, the first file waited for the Broker
    assert during is not None and after_stop is not None
    assert during.since_ns < positions[0] and after_stop.since_ns < positions[0]
    eventually(lambda: (read_cursor(rig.kube) or during).since_ns >= positions[-1], what="the cursor moves")
    assert len(rig.logged(GAP)) == 1


def test_an_event_it_refuses_is_logged_with_its_ts_and_skipped(
    rig: SourceRig, broker: Broker, directory: str, filer: FilerClient
) -> None:
    """A name with percent-encoded dots is a real file to the filer and never ours (ingest refuses
    it too): the source says which log entry it skipped and goes on."""
    started(rig)
    filer.put_file(f"{directory}/x%2e%2e", b"sneaky")
    filer.put_file(f"{directory}/good.bin", b"fine")
    (event,) = eventually(lambda: changes(broker.sink, directory), what="the good file")
    assert data(event)["path"] == f"{directory}/good.bin"
    (skipped,) = rig.logged("skipping event ts_ns=")
    assert skipped["level"] == "error" and "percent-encoded" in skipped["msg"]
    assert skipped["ts_ns"] < int(event["id"].rsplit("-", 1)[1])


# -- on a server of their own -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def own() -> Iterator[list[SeaweedServer]]:
    """A server these tests may stop, restart and replace (the list holds the current one)."""
    servers = [SeaweedServer(s3=False).start()]
    yield servers
    servers[-1].stop()


def filer_log(server: SeaweedServer) -> FilerLog:
    return FilerLog(grpc_target(server.url, f"{server.host}:{server.ports['filer_grpc']}"), server.url)


def test_a_cursor_older_than_the_retained_log_asks_for_a_full_resync(
    own: list[SeaweedServer], kube: Kube, broker: Broker, tmp_path: Path
) -> None:
    server = own[-1]
    with FilerClient(server.url) as filer:
        filer.put_file("/loraadapters/ns/m/old/x.bin", b"x")
    # A graceful stop flushes the log to its files (else once a minute). It waits up to ~15 s on
    # the filer's own aggregator, which subscribes to the filer itself (seaweedfs/server.py).
    server.halt(grace=25)
    server.start()
    with contextlib.closing(filer_log(server)) as log:
        begins, signature = log.log_begins_ns(), log.configuration().signature
    assert begins is not None, "a graceful stop writes the log's files"
    rig = rig_for(server, kube, broker, tmp_path)
    try:
        write_cursor(kube, Cursor(begins, signature))  # covered: resumes quietly
        started(rig)
        assert rig.logged(GAP) == []
        assert rig.terminate() == 0
        write_cursor(kube, Cursor(begins - 1, signature))  # what retention deleted
        started(rig)
        (line,) = rig.logged(GAP)
        assert "no longer retained" in line["msg"]
        (tick,) = broker.sink.wait_for(PING)
        assert data(tick)["full"] is True and "no longer retained" in data(tick)["reason"]
        moved = eventually(lambda: (c := read_cursor(kube)) is not None and c.since_ns > begins and c)
        assert moved.signature == signature
    finally:
        rig.stop()


def test_a_filer_restart_is_followed_by_itself(
    own: list[SeaweedServer], kube: Kube, broker: Broker, tmp_path: Path
) -> None:
    server = own[-1]
    rig = rig_for(server, kube, broker, tmp_path)
    try:
        started(rig)
        with FilerClient(server.url) as filer:
            filer.put_file("/loraadapters/ns/m/r/before.bin", b"1")
            eventually(lambda: changes(broker.sink, "/loraadapters/ns/m/r"), what="the change before")
            server.restart()
            filer.put_file("/loraadapters/ns/m/r/after.bin", b"2")
        eventually(lambda: len(changes(broker.sink, "/loraadapters/ns/m/r")) >= 2, what="the change after")
        assert rig.logged("subscription to the filer's metadata log ended")
        assert len(rig.logged(FOLLOWING)) >= 2 and len(rig.logged(GAP)) == 1
        assert rig.process is not None and rig.process.poll() is None
    finally:
        rig.stop()


def test_a_filer_that_lost_its_log_asks_for_a_full_resync(
    own: list[SeaweedServer], kube: Kube, broker: Broker, tmp_path: Path
) -> None:
    old = own[-1]
    rig = rig_for(old, kube, broker, tmp_path)
    try:
        started(rig)
        before = eventually(lambda: read_cursor(kube), what="a cursor")
        assert rig.terminate() == 0
        old.halt()
        fresh = SeaweedServer(s3=False)  # the same address, an empty disk: a new store
        fresh.ports = dict(old.ports)
        own.append(fresh.start())
        rig.seaweed = fresh
        started(rig)
        lines = rig.logged(GAP)
        assert len(lines) == 2 and "not the one of the cursor" in lines[1]["msg"]
        assert str(before.signature) in lines[1]["msg"]
        ticks = broker.sink.wait_for(PING, count=2)
        assert "signature" in data(ticks[-1])["reason"]
        with FilerClient(fresh.url) as filer:
            filer.put_file("/loraadapters/ns/m/new/y.bin", b"y")
        eventually(lambda: changes(broker.sink, "/loraadapters/ns/m/new"), what="a change on the new filer")
    finally:
        rig.stop()
        old.stop()


# -- our filer.proto against the real binary's own descriptors ------------------------------------
def weed_tail(server: SeaweedServer, prefix: str, seconds: float = 3.0) -> list[dict[str, Any]]:
    """`weed filer.meta.tail`: the filer's log as weed itself decodes it (protojson, camelCase,
    every field emitted), a stream of JSON documents."""
    address = f"{server.host}:{server.ports['filer']}.{server.ports['filer_grpc']}"
    command = [weed_binary(), "filer.meta.tail", f"-filer={address}", f"-pathPrefix={prefix}", "-timeAgo=1h"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    time.sleep(seconds)
    process.terminate()
    out, _ = process.communicate(timeout=10)
    text, docs, decoder, at = out.decode(), [], json.JSONDecoder(), 0
    while (at := _skip_space(text, at)) < len(text):
        doc, at = decoder.raw_decode(text, at)
        docs.append(doc)
    return docs


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


def ours(server: SeaweedServer, prefix: str, since_ns: int, seconds: float = 3.0) -> list[Any]:
    """The same log through functions/proto, as the source reads it."""
    got: list[Any] = []
    with contextlib.closing(filer_log(server)) as log:
        call = log.subscribe("loraflow-test", 7, since_ns, (prefix,))

        def read() -> None:
            with contextlib.suppress(grpc.RpcError):
                for raw in iterate(call):
                    got.append(log.decode(raw))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        time.sleep(seconds)
        call.cancel()
        reader.join(5)
    return [r for r in got if r.HasField("event_notification")]


def entry_as_weed(entry: Any) -> dict[str, Any]:
    attributes = entry.attributes
    return {
        "name": entry.name,
        "isDirectory": entry.is_directory,
        "fileSize": str(attributes.file_size),
        "mtime": str(attributes.mtime),
        "fileMode": attributes.file_mode,
        "crtime": str(attributes.crtime),
        "mime": attributes.mime,
        "md5": base64.b64encode(attributes.md5).decode(),
    }


def entry_of(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    if doc is None:
        return None
    a = doc["attributes"]
    return {
        "name": doc["name"],
        "isDirectory": doc["isDirectory"],
        **{k: a[k] for k in ("fileSize", "mtime", "fileMode", "crtime", "mime", "md5")},
    }


def test_our_messages_read_the_real_filers_bytes_as_weed_itself_does(
    seaweed: Shared, directory: str, filer: FilerClient
) -> None:
    """Every field filer.proto declares, decoded from the real log, equals what `weed` (compiled
    from upstream's filer.proto) prints for the same entry: the numbers and types agree."""
    server = seaweed.server
    since = time.time_ns()
    filer.put_file(f"{directory}/adapter_config.json", b'{"r": 8}')
    filer.write_without_md5(f"{directory}/appended.bin", b"two appends")
    filer.move(f"{directory}/adapter_config.json", f"{directory}/renamed.json")
    filer.delete(f"{directory}/appended.bin")
    prefix = directory.rsplit("/", 2)[0] + "/"  # the namespace folder: the directories' events too
    expected = {
        doc["tsNs"]: doc
        for doc in weed_tail(server, prefix)
        if int(doc["tsNs"]) >= since and doc["eventNotification"]
    }
    decoded = {str(r.ts_ns): r for r in ours(server, prefix, since)}
    assert len(expected) >= 6 and set(decoded) == set(expected)
    for ts, response in decoded.items():
        weed, en = expected[ts], response.event_notification
        assert response.directory == weed["directory"]
        assert en.new_parent_path == weed["eventNotification"]["newParentPath"]
        assert en.delete_chunks == weed["eventNotification"]["deleteChunks"]
        assert list(en.signatures) == weed["eventNotification"]["signatures"]
        for ours_entry, field in ((en.old_entry, "oldEntry"), (en.new_entry, "newEntry")):
            present = en.HasField("old_entry" if field == "oldEntry" else "new_entry")
            assert (entry_as_weed(ours_entry) if present else None) == entry_of(
                weed["eventNotification"][field]
            )
    md5s = [
        e["attributes"]["md5"] for d in expected.values() for e in [d["eventNotification"]["newEntry"]] if e
    ]
    assert any(md5s) and "" in md5s  # an uploaded file's digest, and the appended file's none

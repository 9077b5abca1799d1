"""Frozen file sets, the pure part: their paths, who owns a frozen root an engine lists, and
which retired copies may go."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from functions.errors import Reject
from functions.logic import frozen
from functions.logic.facts import vllm_adapter
from functions.logic.paths import frozen_dir, frozen_owner, frozen_path
from functions.logic.serving import vllm_layout_owner
from functions.resources.rackai import FrozenSet
from tests.support.objects import MOUNT
from tests.support.objects import vllm_adapter as adapter_obj

NOW = datetime(2026, 6, 1, tzinfo=UTC)
DIGEST = "0123456789abcdef"


def test_a_frozen_directory_is_named_by_the_digest_and_checked_names() -> None:
    assert frozen_dir("ns", "m.1", "a", "md5set:" + DIGEST) == f"/loraflow-frozen/ns/m.1/a/{DIGEST}/"
    for bad in ("md5set:../../x", "md5set:", "md5set:0123456789ABCDEF", "md5set:0123/456789abcdef"):
        with pytest.raises(Reject):
            frozen_dir("ns", "m", "a", bad)
    with pytest.raises(Reject):
        frozen_dir("NS", "m", "a", "md5set:" + DIGEST)


def test_a_declared_file_maps_into_the_frozen_directory_only_from_inside_the_upload() -> None:
    up, fz = "/loraadapters/ns/m/a/", f"/loraflow-frozen/ns/m/a/{DIGEST}/"
    assert frozen_path(up, fz, up + "sub/w.bin") == fz + "sub/w.bin"
    assert frozen_path(up, fz, "/loraadapters/ns/m/a/../b/w.bin") is None
    assert frozen_path(up, fz, "/loraadapters/ns/m/ab/w.bin") is None
    with pytest.raises(Reject):
        frozen.plan("ns", "m", "a", up, {"/loraadapters/ns/m/other/w": "a" * 32}, "md5set:" + DIGEST)


def test_a_listed_frozen_root_is_ours_and_names_its_adapter() -> None:
    root = f"{MOUNT}/loraflow-frozen/ns/m/a/{DIGEST}"
    assert frozen_owner(root, "ns", MOUNT) == ("m", "a")
    assert vllm_layout_owner(root, "ns", MOUNT) == ("m", "a")  # the planner replaces/unloads it
    assert vllm_layout_owner(root, "other", MOUNT) is None  # never another namespace's
    assert frozen_owner(f"{MOUNT}/loraflow-frozen/ns/m/a", "ns", MOUNT) is None
    assert frozen_owner(f"{MOUNT}/loraflow-frozen/ns/m/a/{DIGEST}/../../b/x", "ns", MOUNT) is None


def record(file_set: str, retired: datetime | None = None) -> FrozenSet:
    return FrozenSet(
        file_set=file_set,
        path=f"/loraflow-frozen/ns/m/a/{file_set[-16:]}/",
        size=10,
        frozen_at=frozen.stamp(NOW - timedelta(days=1)),
        retired_at=frozen.stamp(retired) if retired else None,
    )


def test_only_retired_sets_no_pod_serves_go_and_only_after_the_grace_period() -> None:
    current = record("md5set:" + "1" * 16)
    old = record("md5set:" + "2" * 16, retired=NOW - timedelta(minutes=20))
    young = record("md5set:" + "3" * 16, retired=NOW - timedelta(minutes=1))
    served_old = record("md5set:" + "4" * 16, retired=NOW - timedelta(hours=5))
    records = [current, old, young, served_old]
    gone = frozen.collectable(records, {"pod-0": served_old.file_set}, NOW, timedelta(minutes=10))
    assert gone == [old]


def test_a_new_current_set_retires_the_others_once() -> None:
    first = record("md5set:" + "1" * 16)
    second = record("md5set:" + "2" * 16)
    records = frozen.with_current([first], second, NOW)
    assert [(r.file_set, r.retired_at) for r in records] == [
        (second.file_set, None),
        (first.file_set, frozen.stamp(NOW)),
    ]
    later = frozen.with_current(records, second, NOW + timedelta(hours=1))
    assert later == records  # a retirement time is not moved
    assert all(r.retired_at for r in frozen.with_current(records, None, NOW))


def test_the_engines_are_given_the_frozen_copy_of_the_set_they_should_serve() -> None:
    obj = adapter_obj("ns", "a", model="m")
    fs = obj["status"]["fileSet"]
    directory = f"/loraflow-frozen/ns/m/a/{fs.removeprefix('md5set:')}/"
    obj["status"]["frozen"] = [{"fileSet": fs, "path": directory, "size": 1, "frozenAt": "x"}]
    assert vllm_adapter(obj, MOUNT).lora_path == MOUNT + directory.rstrip("/")
    obj["status"]["frozen"][0]["path"] = "/loraadapters/ns/m/a/"  # a record outside the frozen area
    assert vllm_adapter(obj, MOUNT).lora_path == MOUNT + "/loraadapters/ns/m/a"

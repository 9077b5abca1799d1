"""How a resync tick is dealt into parts (functions/resync.py `deal`), and the API's list order
the parts keep (`list_order`)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from events.domain import MAX_SHARD_NAMESPACES, ResyncShard
from functions.resync import deal, list_order, listed_before

NAMESPACES = st.lists(st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,8}[a-z0-9])?\Z"), max_size=60)


@given(NAMESPACES, st.integers(1, 8))
def test_every_namespace_lands_in_exactly_one_part_in_list_order(namespaces: list[str], shards: int) -> None:
    parts = deal(namespaces, shards)
    dealt = [ns for part in parts for ns in part]
    assert sorted(dealt) == sorted(set(namespaces))
    assert len(parts) == min(shards, len(set(namespaces)))
    assert all(part == sorted(part, key=list_order) for part in parts)
    sizes = [len(part) for part in parts]
    assert not sizes or max(sizes) - min(sizes) <= 1  # dealt like cards


def test_neighbours_in_the_list_land_in_different_parts() -> None:
    """A big tenant's namespaces (team-a, team-a-dev, ...) are spread, not kept in one part."""
    parts = deal(["t1", "t2", "t3", "t4"], 2)
    assert parts == [["t1", "t3"], ["t2", "t4"]]


def test_more_parts_when_one_would_name_too_many_namespaces() -> None:
    namespaces = [f"ns-{i:05d}" for i in range(2 * MAX_SHARD_NAMESPACES + 1)]
    parts = deal(namespaces, 2)
    assert len(parts) == 3 and all(len(part) <= MAX_SHARD_NAMESPACES for part in parts)
    for index, part in enumerate(parts):  # each fits the event that carries it
        ResyncShard(namespaces=part, shard=index, shards=len(parts))


def test_list_order_is_etcds_key_order() -> None:
    """etcd compares .../<namespace>/<name> as bytes: '-' (0x2d) sorts before '/' (0x2f)."""
    assert listed_before("team-b", "team")
    assert not listed_before("team", "team-b")
    assert sorted(["team", "team-b", "tea", "team0"], key=list_order) == ["tea", "team-b", "team", "team0"]

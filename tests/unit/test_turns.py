"""Turns on bounded engine pods: one holder at a time, stamps that say what changed, no memory
kept for engines nobody waits on."""

from __future__ import annotations

import threading

import pytest

from functions.adapters.turns import Turns
from functions.errors import EngineUnavailable


def test_a_turn_taken_after_a_stamp_marks_only_its_engines_changed() -> None:
    turns = Turns()
    stamp = turns.stamp()
    assert not turns.changed_since("http://a", stamp)
    with turns.taking(["http://a"], timeout=1):
        assert not turns.changed_since("http://a", stamp)  # not until its holder is done
    assert turns.changed_since("http://a", stamp)
    assert not turns.changed_since("http://b", stamp)
    assert not turns.changed_since("http://a", turns.stamp())


def test_a_second_taker_waits_for_the_first_and_sees_its_change() -> None:
    turns = Turns()
    order: list[str] = []
    first_in = threading.Event()
    release = threading.Event()

    def first() -> None:
        with turns.taking(["http://a", "http://b"], timeout=1):
            order.append("first in")
            first_in.set()
            release.wait(5)
            order.append("first out")

    thread = threading.Thread(target=first)
    thread.start()
    first_in.wait(5)
    stamp = turns.stamp()
    release.set()
    with turns.taking(["http://b"], timeout=5):
        order.append("second in")
        assert turns.changed_since("http://b", stamp)
    thread.join(5)
    assert order == ["first in", "first out", "second in"]


def test_a_turn_not_free_in_time_is_a_retryable_answer_and_holds_nothing() -> None:
    turns = Turns()
    held = threading.Event()
    done = threading.Event()

    def holder() -> None:
        with turns.taking(["http://b"], timeout=1):
            held.set()
            done.wait(5)

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait(5)
    both = ["http://a", "http://b"]
    with pytest.raises(EngineUnavailable, match="http://b"), turns.taking(both, timeout=0.05):
        pass
    with turns.taking(["http://a"], timeout=0.05):  # the one it got before giving up is free again
        pass
    done.set()
    thread.join(5)


def test_engines_are_forgotten_past_the_bound_and_then_count_as_changed() -> None:
    turns = Turns(remembered=2)
    stamp = turns.stamp()
    for engine in ("http://a", "http://b", "http://c"):
        with turns.taking([engine], timeout=1):
            pass
    assert len(turns._last) == 2 and turns._turns == {}
    later = turns.stamp()
    assert turns.changed_since("http://a", stamp)  # forgotten after it changed: changed
    assert not turns.changed_since("http://a", later)
    assert not turns.changed_since("http://zzz", later)

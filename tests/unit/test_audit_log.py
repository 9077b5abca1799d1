"""The audit log's reading: a request's entry, and the time a client waited on the server."""

from __future__ import annotations

import json
from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from devstack.kubernetes.audit import Request, parse, time_on_server

ENTRY = {
    "kind": "Event",
    "level": "Metadata",
    "stage": "ResponseComplete",
    "verb": "patch",
    "user": {"username": "system:serviceaccount:loraflow:load"},
    "objectRef": {
        "resource": "loraadapters",
        "subresource": "status",
        "namespace": "t1",
        "apiGroup": "rackai.rackspace.com",
    },
    "responseStatus": {"code": 200},
    "requestReceivedTimestamp": "2026-12-05T07:30:00.250000Z",
    "stageTimestamp": "2026-12-05T07:30:00.258500Z",
    "annotations": {"authorization.k8s.io/decision": "allow"},
}


def test_an_entry_says_who_did_what_when_and_for_how_long() -> None:
    request = parse(json.dumps(ENTRY))
    assert request is not None
    assert request.key == ("patch", "loraadapters/status")
    assert request.user == "system:serviceaccount:loraflow:load"
    assert request.allowed and request.code == 200
    assert abs(request.seconds - 0.0085) < 1e-6
    later = parse(json.dumps(ENTRY | {"requestReceivedTimestamp": "2026-12-05T07:30:01.250000Z"}))
    assert later is not None and abs(later.received - request.received - 1.0) < 1e-6


def test_a_non_resource_request_is_not_one() -> None:
    assert parse(json.dumps({k: v for k, v in ENTRY.items() if k != "objectRef"})) is None


def _request(received: float, seconds: float, verb: str = "get") -> Request:
    return Request("u", verb, "", "pods", "", "ns", 200, "allow", seconds, received)


def test_requests_side_by_side_are_waited_on_once() -> None:
    # two reads side by side (2 ms each, the second from 0.5 ms on), one after them (4 ms), a write
    made = [_request(0.0, 0.002), _request(0.0005, 0.002), _request(0.003, 0.004), _request(0.5, 0.008)]
    assert abs(time_on_server(made) - (0.0025 + 0.004 + 0.008)) < 1e-9
    assert time_on_server([]) == 0.0


def test_a_watch_ending_meanwhile_is_not_waited_on() -> None:
    # a source's watch, open for five minutes, answered its end while the reads ran
    made = [_request(0.0, 0.002), _request(-300.0, 300.001, verb="watch")]
    assert abs(time_on_server(made) - 0.002) < 1e-9


def _covered(intervals: list[tuple[float, float]]) -> float:
    """Another way to the same: each piece between two consecutive ends, counted when some
    request spans it."""
    points = sorted({p for start, end in intervals for p in (start, end)})
    return sum(b - a for a, b in pairwise(points) if any(start <= a and b <= end for start, end in intervals))


@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 300)), max_size=12))
def test_the_time_waited_is_the_union_of_the_requests_times(spans: list[tuple[int, int]]) -> None:
    made = [_request(start / 1000, length / 1000) for start, length in spans]
    expected = _covered([(r.received, r.received + r.seconds) for r in made])
    assert abs(time_on_server(made) - expected) < 1e-9
    assert time_on_server(made) <= sum(r.seconds for r in made) + 1e-9
